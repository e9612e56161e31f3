//! The MPI transport (`parallel.backend = "mpi"`, cargo feature `mpi`): the
//! collectives of the MPI library `mpirun` belongs to, through rsmpi's
//! bindings (`mpi::ffi`), so a cluster's own interconnect and tuned
//! collectives carry the job. MPI itself says who this rank is and how many
//! there are; there is no rendezvous of ours.
//!
//! One communication thread initializes MPI (`MPI_THREAD_FUNNELED`: every MPI
//! call, `MPI_Finalize` included, is made by it) and starts each issued
//! collective at once as a non-blocking operation (`MPI_Iallreduce`,
//! `MPI_Ibcast`, `MPI_Iallgather`, `MPI_Ibarrier`), so the gradient buckets'
//! all-reduces run while backward goes on. The thread then drives MPI's
//! progress with `MPI_Test` on the oldest operation and hands results back in
//! issue order. An operation that has not completed within
//! `parallel.timeout_s` of becoming the oldest means a rank is stopped, hung
//! or cut off: the thread names the operation on stderr and calls
//! `MPI_Abort`, which ends every rank of the job, so nothing waits forever.
//! A rank that dies is MPI's to notice: `mpirun` then ends the job.
//!
//! MPI has no half-precision type: f16 buffers travel as 16-bit words and are
//! summed by a user operation that adds two f16 values in f32 and rounds, as
//! the tcp transport and NCCL do per hop. `Avg` is the sum divided by the
//! world size on every rank. MPI does not check that ranks issue matching
//! operations; a mismatch in length or type is an MPI error, and MPI's default
//! error handler aborts the job.

use super::queue::{Job, OpKind, Queue, Queued};
use super::{Buffer, DType, ReduceOp, WorkCompleter};
use crate::error::{Error, Result};
use half::f16;
use mpi::ffi;
use mpi::traits::{AsRaw, Communicator as _};
use mpi::Threading;
use std::collections::VecDeque;
use std::io::Write;
use std::os::raw::{c_int, c_void};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the communication thread waits for a new operation between two
/// `MPI_Test`s while operations are in flight: MPI progresses only inside its calls.
const POLL: Duration = Duration::from_micros(50);
/// The exit status `MPI_Abort` asks `mpirun` to report.
const ABORT_CODE: c_int = 1;

/// The MPI transport, as [`Queued`]'s marker.
pub enum Mpi {}

/// Collectives over MPI; see the module docs.
pub type MpiCommunicator = Queued<Mpi>;

impl Queued<Mpi> {
    /// Initializes MPI on a new communication thread; `timeout` bounds every
    /// collective (see the module docs).
    pub fn init(timeout: Duration) -> Result<MpiCommunicator> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let queue = Queue::spawn("ddp-comm-mpi".into(), move |rx| comm_thread(ready_tx, rx, timeout))?;
        match ready_rx.recv() {
            Ok(Ok((rank, world))) => Ok(Queued::new(rank, world, queue)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Training("MPI initialization: the communication thread is gone".into())),
        }
    }
}

/// f16 addition for `MPI_Op_create`: in f32, rounded once (per hop).
unsafe extern "C" fn sum_f16(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    // MPI passes `len` elements of the operation's 16-bit datatype in both buffers.
    let n = usize::try_from(*len).unwrap_or(0);
    let (a, b) = (invec as *const u16, inoutvec as *mut u16);
    for i in 0..n {
        let x = f16::from_bits(a.add(i).read_unaligned()).to_f32();
        let y = f16::from_bits(b.add(i).read_unaligned()).to_f32();
        b.add(i).write_unaligned(f16::from_f32(x + y).to_bits());
    }
}

fn datatype(d: DType) -> ffi::MPI_Datatype {
    // SAFETY: rsmpi's handles for MPI's predefined datatypes, valid once MPI is initialized.
    unsafe {
        match d {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F16 => ffi::RSMPI_UINT16_T,
        }
    }
}

fn zeros(d: DType, n: usize) -> Buffer {
    match d {
        DType::F32 => Buffer::F32(vec![0.0; n]),
        DType::F16 => Buffer::F16(vec![f16::ZERO; n]),
    }
}

fn ptr(b: &Buffer) -> *const c_void {
    match b {
        Buffer::F32(v) => v.as_ptr().cast(),
        Buffer::F16(v) => v.as_ptr().cast(),
    }
}

fn ptr_mut(b: &mut Buffer) -> *mut c_void {
    match b {
        Buffer::F32(v) => v.as_mut_ptr().cast(),
        Buffer::F16(v) => v.as_mut_ptr().cast(),
    }
}

/// A started operation. MPI reads `send` and writes `recv` until the request
/// completes; both are heap buffers, so moving this struct moves no data.
struct InFlight {
    kind: OpKind,
    desc: String,
    request: ffi::MPI_Request,
    send: Buffer,
    recv: Buffer,
    done: WorkCompleter,
}

struct Engine {
    comm: ffi::MPI_Comm,
    rank: usize,
    world: usize,
    sum_f16: ffi::MPI_Op,
    timeout: Duration,
    inflight: VecDeque<InFlight>,
    /// When the oldest operation in flight became the oldest.
    front_since: Instant,
    seq: u64,
}

fn comm_thread(ready: mpsc::Sender<Result<(usize, usize)>>, rx: mpsc::Receiver<Job>, timeout: Duration) {
    let Some((universe, level)) = mpi::initialize_with_threading(Threading::Funneled) else {
        let _ = ready.send(Err(Error::Training("MPI is already initialized in this process".into())));
        return;
    };
    if level < Threading::Funneled {
        let _ = ready.send(Err(Error::Unsupported(format!(
            "the MPI library grants thread level {level:?}; the mpi backend needs at least Funneled"
        ))));
        return;
    }
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let (Ok(rank), Ok(size)) = (usize::try_from(rank), usize::try_from(size)) else {
        let _ = ready.send(Err(Error::Training(format!("MPI reports rank {rank} of {size}"))));
        return;
    };
    let mut op = std::mem::MaybeUninit::<ffi::MPI_Op>::uninit();
    // SAFETY: `sum_f16` has MPI_User_function's signature and touches only the `len` elements it is given.
    let rc = unsafe { ffi::MPI_Op_create(Some(sum_f16), 1, op.as_mut_ptr()) };
    if rc != 0 {
        let _ =
            ready.send(Err(Error::Training(format!("MPI_Op_create for the f16 sum failed (error {rc})"))));
        return;
    }
    // SAFETY: MPI_Op_create succeeded, so it wrote the handle.
    let sum_f16_op = unsafe { op.assume_init() };
    let _ = ready.send(Ok((rank, size)));
    let mut e = Engine {
        comm: world.as_raw(),
        rank,
        world: size,
        sum_f16: sum_f16_op,
        timeout,
        inflight: VecDeque::new(),
        front_since: Instant::now(),
        seq: 0,
    };
    e.run(&rx);
    // SAFETY: no operation uses the op any more (the queue is drained).
    unsafe { ffi::MPI_Op_free(&mut e.sum_f16) };
    if crate::train::stop::requested().is_some() {
        // A SIGTERM may come from mpirun tearing the job down; its daemon then
        // sleeps until it sends SIGKILL and never answers MPI_Finalize's fence.
        // The ranks have agreed on the step and saved it: they exit without it.
        std::mem::forget(universe);
        return;
    }
    // Dropping the universe calls MPI_Finalize, on the thread that initialized MPI.
    drop(universe);
}

impl Engine {
    fn run(&mut self, rx: &mpsc::Receiver<Job>) {
        let mut open = true;
        loop {
            if open {
                let next = if self.inflight.is_empty() {
                    rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
                } else {
                    rx.recv_timeout(POLL)
                };
                match next {
                    Ok(job) => {
                        self.start(job);
                        // Everything already issued starts now, before any waiting.
                        while let Ok(job) = rx.try_recv() {
                            self.start(job);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
                }
            } else if self.inflight.is_empty() {
                return;
            } else {
                std::thread::sleep(POLL);
            }
            self.progress();
        }
    }

    /// Names the operation and ends the whole job: a collective that cannot
    /// finish on one rank cannot finish on the others either.
    fn abort(&self, desc: &str, why: &str) -> ! {
        // One write: mpirun forwards each write as it comes, tagged, so a line
        // written in pieces could be split by another rank's output.
        let line = format!("rank {}: {desc}: {why}; aborting the job (MPI_Abort)\n", self.rank);
        let _ = std::io::stderr().write_all(line.as_bytes());
        // SAFETY: MPI is initialized and this is the thread that initialized it.
        unsafe { ffi::MPI_Abort(self.comm, ABORT_CODE) };
        std::process::exit(ABORT_CODE)
    }

    fn start(&mut self, job: Job) {
        self.seq += 1;
        let desc = job.describe(self.seq);
        job.done.start();
        let (d, n) = (job.buf.dtype(), job.buf.len());
        let count = |n: usize| {
            c_int::try_from(n).unwrap_or_else(|_| {
                self.abort(&desc, &format!("{n} elements are more than one MPI call can carry"))
            })
        };
        // SAFETY: a predefined handle; every start call below overwrites it.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut send = job.buf;
        let (mut recv, rc);
        // SAFETY: `send` and `recv` hold the counts passed, in the datatype passed, and
        // live in the InFlight until MPI_Test reports the request complete.
        unsafe {
            match job.kind {
                OpKind::AllReduce(_) => {
                    recv = zeros(d, n);
                    let op = match d {
                        DType::F32 => ffi::RSMPI_SUM,
                        DType::F16 => self.sum_f16,
                    };
                    let (s, r) = (ptr(&send), ptr_mut(&mut recv));
                    rc = ffi::MPI_Iallreduce(s, r, count(n), datatype(d), op, self.comm, &mut request);
                }
                OpKind::Broadcast(root) => {
                    recv = std::mem::replace(&mut send, Buffer::F32(Vec::new()));
                    let root = count(root);
                    rc = ffi::MPI_Ibcast(
                        ptr_mut(&mut recv),
                        count(n),
                        datatype(d),
                        root,
                        self.comm,
                        &mut request,
                    );
                }
                OpKind::AllGather => {
                    recv = zeros(d, n.saturating_mul(self.world));
                    let (s, r) = (ptr(&send), ptr_mut(&mut recv));
                    let (c, t) = (count(n), datatype(d));
                    rc = ffi::MPI_Iallgather(s, c, t, r, c, t, self.comm, &mut request);
                }
                OpKind::Barrier => {
                    recv = Buffer::F32(Vec::new());
                    rc = ffi::MPI_Ibarrier(self.comm, &mut request);
                }
            }
        }
        if rc != 0 {
            self.abort(&desc, &format!("MPI could not start it (error {rc})"));
        }
        if self.inflight.is_empty() {
            self.front_since = Instant::now();
        }
        self.inflight.push_back(InFlight { kind: job.kind, desc, request, send, recv, done: job.done });
    }

    /// Completes the finished operations at the head of the queue, in issue order.
    fn progress(&mut self) {
        while let Some(front) = self.inflight.front_mut() {
            let mut flag: c_int = 0;
            // SAFETY: `request` came from a start call and has not completed yet.
            let rc = unsafe { ffi::MPI_Test(&mut front.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                let desc = front.desc.clone();
                self.abort(&desc, &format!("MPI_Test failed (error {rc})"));
            }
            if flag == 0 {
                if self.front_since.elapsed() >= self.timeout {
                    let why = format!("no progress for {}s (parallel.timeout_s)", self.timeout.as_secs_f64());
                    let desc = front.desc.clone();
                    self.abort(&desc, &why);
                }
                return;
            }
            let Some(op) = self.inflight.pop_front() else { return };
            self.front_since = Instant::now();
            let out = self.finish(op.kind, op.recv);
            drop(op.send);
            op.done.complete(Ok(out));
        }
    }

    fn finish(&self, kind: OpKind, recv: Buffer) -> Buffer {
        if kind != OpKind::AllReduce(ReduceOp::Avg) {
            return recv;
        }
        let w = self.world as f32;
        match recv {
            Buffer::F32(mut v) => {
                v.iter_mut().for_each(|x| *x /= w);
                Buffer::F32(v)
            }
            Buffer::F16(v) => Buffer::F16(v.into_iter().map(|x| f16::from_f32(x.to_f32() / w)).collect()),
        }
    }
}
