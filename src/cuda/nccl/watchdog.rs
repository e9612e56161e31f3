//! PyTorch's NCCL watchdog for one communicator. A rank whose peer died stays
//! blocked inside the collective (NCCL does not fail it), so a thread beside
//! the trainer watches each collective's completion event and the
//! communicator's asynchronous error. A collective still running after
//! `parallel.timeout_s`, or an asynchronous error (a lost connection), makes
//! it abort the communicator, which is the only way to free the blocked
//! streams, and end the process, as PyTorch does with
//! TORCH_NCCL_ASYNC_ERROR_HANDLING: after an abort the interrupted
//! collective's output is garbage, and the trainer must not go on to use or
//! checkpoint it.

use cudarc::driver::sys::{CUevent_flags, CUstream};
use cudarc::driver::{CudaContext, CudaEvent};
use cudarc::nccl::sys;
use std::collections::VecDeque;
use std::ffi::{c_char, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One collective, as the error names it. Plain data, formatted only when
/// something went wrong, so watching costs no allocation per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Op {
    pub name: &'static str,
    pub dtype: &'static str,
    pub n: usize,
    pub root: Option<usize>,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} x{}", self.name, self.dtype, self.n)?;
        match self.root {
            Some(r) => write!(f, " from rank {r}"),
            None => Ok(()),
        }
    }
}

struct Pending {
    event: CudaEvent,
    op: Op,
    seq: u64,
    since: Instant,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    /// Completed events, recorded again for later collectives.
    spare: Vec<CudaEvent>,
    seq: u64,
    stop: bool,
}

/// The raw communicator, shared with the watchdog thread.
#[derive(Clone, Copy)]
struct CommPtr(sys::ncclComm_t);
// SAFETY: ncclCommGetAsyncError and ncclCommAbort may be called from any
// thread while another uses the communicator (what NCCL documents them for).
unsafe impl Send for CommPtr {}
unsafe impl Sync for CommPtr {}

struct Shared {
    comm: CommPtr,
    rank: usize,
    world: usize,
    timeout: Duration,
    queue: Mutex<Queue>,
    wake: Condvar,
    aborted: AtomicBool,
}

pub(super) struct Watchdog {
    shared: Arc<Shared>,
    ctx: Arc<CudaContext>,
    thread: Option<JoinHandle<()>>,
}

/// How often the thread looks; small beside any sensible `timeout_s`.
const POLL: Duration = Duration::from_millis(100);

/// Why the watchdog gives up: the communicator's asynchronous error (raw
/// `ncclResult_t`, 0 = none) or the oldest collective's age.
pub(super) fn verdict(
    async_error: u32,
    last_error: &str,
    oldest: Option<(Op, u64, Duration)>,
    timeout: Duration,
) -> Option<String> {
    let during = match oldest {
        Some((op, seq, age)) => {
            format!("{op} (collective #{seq} of this communicator, enqueued {:.1} s ago)", age.as_secs_f64())
        }
        None => "no collective in flight".to_string(),
    };
    if async_error != 0 {
        let detail = if last_error.is_empty() { String::new() } else { format!(": {last_error}") };
        return Some(format!("{during}: NCCL reported {}{detail}", result_name(async_error)));
    }
    match oldest {
        Some((_, _, age)) if age > timeout => Some(format!(
            "{during} did not complete within parallel.timeout_s = {} s: a peer rank died or stalled",
            timeout.as_secs()
        )),
        _ => None,
    }
}

/// `ncclResult_t` by value, without trusting it to be one of the enum's.
fn result_name(r: u32) -> String {
    const NAMES: [&str; 8] = [
        "ncclSuccess",
        "ncclUnhandledCudaError",
        "ncclSystemError",
        "ncclInternalError",
        "ncclInvalidArgument",
        "ncclInvalidUsage",
        "ncclRemoteError (a remote process exited or there was a network error)",
        "ncclInProgress",
    ];
    NAMES.get(r as usize).map_or_else(|| format!("NCCL error {r}"), |s| s.to_string())
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: NCCL returns NUL-terminated strings it owns.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    // A poisoned queue is still a consistent queue: every update is one push or pop.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watchdog {
    pub(super) fn start(
        ctx: &Arc<CudaContext>,
        comm: sys::ncclComm_t,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> std::io::Result<Watchdog> {
        let shared = Arc::new(Shared {
            comm: CommPtr(comm),
            rank,
            world,
            timeout,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            aborted: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread =
            std::thread::Builder::new().name(format!("nccl-watchdog-{rank}")).spawn(move || s.run())?;
        Ok(Watchdog { shared, ctx: ctx.clone(), thread: Some(thread) })
    }

    /// Watches `op`, just enqueued on `stream`: an event after it tells when it is done.
    pub(super) fn watch(&self, op: Op, stream: CUstream) -> Result<(), cudarc::driver::DriverError> {
        let mut q = lock(&self.shared.queue);
        let event = match q.spare.pop() {
            Some(e) => e,
            None => self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
        };
        // SAFETY: a live event of this context and the stream the collective went to.
        if let Err(e) = unsafe { cudarc::driver::result::event::record(event.cu_event(), stream) } {
            q.spare.push(event);
            return Err(e);
        }
        q.seq += 1;
        let seq = q.seq;
        q.pending.push_back(Pending { event, op, seq, since: Instant::now() });
        Ok(())
    }

    /// Whether the watchdog aborted the communicator (it is then gone).
    pub(super) fn aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::SeqCst)
    }
}

impl Watchdog {
    /// Ends the thread and waits for it (done once; later calls do nothing).
    pub(super) fn stop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn run(&self) {
        loop {
            let oldest = {
                let q = lock(&self.queue);
                let (mut q, _) =
                    self.wake.wait_timeout_while(q, POLL, |q| !q.stop).unwrap_or_else(|p| p.into_inner());
                if q.stop {
                    return;
                }
                // Done (or failed: the trainer reports a sticky CUDA error itself) from the front.
                while q.pending.front().is_some_and(|p| p.event.try_is_complete().unwrap_or(true)) {
                    if let Some(p) = q.pending.pop_front() {
                        q.spare.push(p.event);
                    }
                }
                q.pending.front().map(|p| (p.op, p.seq, p.since.elapsed()))
            };
            let mut raw: u32 = 0;
            // SAFETY: a live communicator (the owner joins this thread before
            // aborting it); a u32 out-slot, so a value outside cudarc's
            // ncclResult_t enum is never read as one.
            let rc = unsafe { sys::ncclCommGetAsyncError(self.comm.0, (&mut raw as *mut u32).cast()) };
            if rc != sys::ncclResult_t::ncclSuccess {
                raw = rc as u32;
            }
            let last =
                if raw != 0 { text(unsafe { sys::ncclGetLastError(self.comm.0) }) } else { String::new() };
            if let Some(why) = verdict(raw, &last, oldest, self.timeout) {
                self.fail(&why);
            }
        }
    }

    /// Aborts the communicator, says why, and ends the process.
    fn fail(&self, why: &str) -> ! {
        self.aborted.store(true, Ordering::SeqCst);
        crate::errln!(
            "error: NCCL watchdog, rank {} of {}: {why}; aborting the NCCL communicator and exiting, as \
             PyTorch's NCCL watchdog does",
            self.rank,
            self.world
        );
        // SAFETY: the communicator is live; the owner does not abort it after us.
        unsafe {
            let _ = sys::ncclCommAbort(self.comm.0);
        }
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // _exit, not exit: the main thread is still running, and static
        // destructors (the CUDA and NCCL libraries') must not race it.
        // SAFETY: ends the process; nothing after it runs.
        unsafe { libc::_exit(1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AR: Op = Op { name: "ncclAllReduce avg", dtype: "f16", n: 1234, root: None };

    #[test]
    fn a_collective_past_the_timeout_is_named() {
        let t = Duration::from_secs(5);
        assert_eq!(verdict(0, "", Some((AR, 7, Duration::from_secs(4))), t), None);
        assert_eq!(verdict(0, "", None, t), None);
        let why = verdict(0, "", Some((AR, 7, Duration::from_millis(5200))), t).unwrap();
        assert!(why.starts_with("ncclAllReduce avg f16 x1234 (collective #7 of this communicator"), "{why}");
        assert!(why.contains("did not complete within parallel.timeout_s = 5 s"), "{why}");
    }

    #[test]
    fn an_asynchronous_error_is_reported_at_once_with_nccls_message() {
        let t = Duration::from_secs(60);
        let bc = Op { name: "ncclBroadcast", dtype: "f32", n: 8, root: Some(0) };
        let why =
            verdict(6, "rank 0 lost its connection to rank 2", Some((bc, 3, Duration::ZERO)), t).unwrap();
        assert!(why.starts_with("ncclBroadcast f32 x8 from rank 0 (collective #3"), "{why}");
        assert!(why.contains("ncclRemoteError"), "{why}");
        assert!(why.ends_with(": rank 0 lost its connection to rank 2"), "{why}");
        let why = verdict(42, "", None, t).unwrap();
        assert_eq!(why, "no collective in flight: NCCL reported NCCL error 42");
    }
}
