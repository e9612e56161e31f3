//! NCCL collectives on device buffers. Rank 0 creates the NCCL unique id and
//! the job's existing TCP [`Communicator`] (set up by the rendezvous) hands its
//! 128 bytes to the other ranks; every rank then joins the NCCL communicator.
//!
//! The raw `ncclComm_t` is driven through `cudarc::nccl::result` rather than
//! cudarc's `Comm`, because `Comm` fixes one stream at creation (collectives
//! here run on whatever stream the caller picks, e.g. a communication stream
//! ordered after backward by an event) and panics in `Drop` on an error.
//! Buffers go through cudarc's `DevicePtr`, so the caller's stream waits for
//! the buffer's last write on another stream, as for a kernel launch.
//!
//! Every collective is watched by a [`watchdog`] thread, which aborts the
//! communicator and ends the process when one does not complete within
//! `parallel.timeout_s` or NCCL reports an asynchronous error (a dead peer).

mod redop;
mod watchdog;

use super::Gpu;
use crate::dist::{Buffer, Communicator};
use crate::error::{Error, Result};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use cudarc::nccl::{result, sys, NcclType};
use redop::RawOps;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;
use std::time::Duration;
use watchdog::{Op, Watchdog};

/// An element type NCCL reduces here: f32 or f16.
pub trait NcclElem: NcclType + DeviceRepr + Copy {
    const NAME: &'static str;
    /// The scalar `1/world` of the averaging op, in this element type.
    fn inverse(world: usize) -> Self;
}

impl NcclElem for f32 {
    const NAME: &'static str = "f32";
    fn inverse(world: usize) -> f32 {
        1.0 / world as f32
    }
}

impl NcclElem for half::f16 {
    const NAME: &'static str = "f16";
    fn inverse(world: usize) -> half::f16 {
        half::f16::from_f32(1.0 / world as f32)
    }
}

/// Whether libnccl can be loaded (cudarc panics on first use otherwise).
pub fn is_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// Ok when libnccl can be loaded, else an error saying what to install.
pub fn require_nccl() -> Result<()> {
    if is_available() {
        return Ok(());
    }
    Err(Error::Unsupported(
        "parallel.backend = \"nccl\" but libnccl could not be loaded: install NCCL (the \
         `nvidia-nccl-cu13` wheel or the libnccl2 package) and put a folder holding `libnccl.so` on \
         LD_LIBRARY_PATH (cudarc looks for libnccl.so, not libnccl.so.2: symlink it), or set \
         parallel.backend = \"tcp\""
            .to_string(),
    ))
}

/// `op` failed with NCCL status `e`; NCCL's own message, and the
/// communicator's last error when there is one.
fn nccl_err(op: &str, e: result::NcclError, comm: Option<sys::ncclComm_t>) -> Error {
    // SAFETY: NCCL returns static, NUL-terminated strings (or null).
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let mut msg = format!("{:?} ({})", e.0, text(unsafe { sys::ncclGetErrorString(e.0) }));
    if let Some(c) = comm {
        let last = text(unsafe { sys::ncclGetLastError(c) });
        if !last.is_empty() {
            msg = format!("{msg}: {last}");
        }
    }
    Error::Cuda { op: format!("NCCL {op}"), msg }
}

/// The id travels as 1 + 128 f32 values (a flag, then one byte each: small
/// integers are exact in f32 and survive any transport). Flag 0 says rank 0
/// could not create an id, so the others fail instead of waiting.
const ID_LEN: usize = 128;

fn encode_id(id: Option<&[c_char; ID_LEN]>) -> Vec<f32> {
    match id {
        Some(bytes) => std::iter::once(1.0).chain(bytes.iter().map(|&b| b as u8 as f32)).collect(),
        None => vec![0.0; ID_LEN + 1],
    }
}

fn decode_id(v: &[f32]) -> Result<[c_char; ID_LEN]> {
    if v.len() != ID_LEN + 1 {
        return Err(Error::Training(format!(
            "NCCL id: expected {} values from rank 0, got {}",
            ID_LEN + 1,
            v.len()
        )));
    }
    if v[0] != 1.0 {
        return Err(Error::Training(
            "NCCL id: rank 0 could not create the NCCL unique id (see its log)".into(),
        ));
    }
    let mut id = [0 as c_char; ID_LEN];
    for (o, &x) in id.iter_mut().zip(&v[1..]) {
        if !(0.0..=255.0).contains(&x) || x.fract() != 0.0 {
            return Err(Error::Training(format!("NCCL id: {x} is not a byte")));
        }
        *o = x as u8 as c_char;
    }
    Ok(id)
}

/// `rank`/`world` must be the TCP communicator's, which carries the id.
fn check_membership(rank: usize, world: usize, tcp: &dyn Communicator) -> Result<()> {
    if world == 0 || rank >= world || i32::try_from(world).is_err() {
        return Err(Error::shape(format!("NCCL: rank {rank} is not a rank of a world of {world}")));
    }
    if (tcp.rank(), tcp.world_size()) != (rank, world) {
        return Err(Error::shape(format!(
            "NCCL: rank {rank} of {world} but the TCP communicator is rank {} of {}",
            tcp.rank(),
            tcp.world_size()
        )));
    }
    Ok(())
}

/// One rank's NCCL communicator on one GPU.
pub struct NcclComm {
    comm: sys::ncclComm_t,
    gpu: Arc<Gpu>,
    rank: usize,
    world: usize,
    /// Sum of inputs premultiplied by `1/world` (f32, f16): averaging without
    /// a separate scaling kernel, and before the sum, so f16 does not overflow
    /// where the mean would fit. Raw values: see [`redop`].
    avg_f32: u32,
    avg_f16: u32,
    ops: RawOps,
    watchdog: Watchdog,
    /// Inside [`NcclComm::group`]: the collectives enqueued at its end, which
    /// the watchdog starts watching then.
    grouped: RefCell<Option<Vec<(Op, sys::cudaStream_t)>>>,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a
// time; `NcclComm` is not `Sync`, so callers sharing it wrap it in a Mutex.
unsafe impl Send for NcclComm {}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(rank {} of {} on {:?})", self.rank, self.world, self.gpu)
    }
}

impl NcclComm {
    /// Joins the job's NCCL communicator. Every rank calls this at the same
    /// point (it runs a broadcast on `tcp`). A collective not done within
    /// `timeout` ends the process (see [`watchdog`]).
    pub fn new(
        gpu: &Arc<Gpu>,
        rank: usize,
        world: usize,
        tcp: &dyn Communicator,
        timeout: Duration,
    ) -> Result<NcclComm> {
        check_membership(rank, world, tcp)?;
        require_nccl()?;
        let mut created = None;
        let mut id_err = None;
        if rank == 0 {
            match result::get_uniqueid() {
                Ok(id) => created = Some(id.internal),
                Err(e) => id_err = Some(nccl_err("ncclGetUniqueId", e, None)),
            }
        }
        // Rank 0 broadcasts even after a failure, so nobody waits for an id that never comes.
        let got = tcp.broadcast(Buffer::F32(encode_id(created.as_ref())), 0, "NCCL unique id")?;
        if let Some(e) = id_err {
            return Err(e);
        }
        let id = sys::ncclUniqueId { internal: decode_id(&got.into_f32()?)? };
        gpu.ctx().bind_to_thread().map_err(|e| Error::cuda("binding the CUDA context for NCCL", e))?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: an out-pointer to a live handle; rank < world checked above.
        unsafe { result::comm_init_rank(&mut comm, world as i32, id, rank as i32) }
            .map_err(|e| nccl_err(&format!("ncclCommInitRank (rank {rank} of {world})"), e, None))?;
        let ops = match RawOps::load() {
            Ok(o) => o,
            Err(e) => {
                // SAFETY: the communicator just created, never used again.
                let _ = unsafe { result::comm_abort(comm) };
                return Err(Error::Cuda { op: "loading libnccl's entry points".into(), msg: e });
            }
        };
        let watchdog = match Watchdog::start(gpu.ctx(), comm, rank, world, timeout) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the communicator just created, never used again.
                let _ = unsafe { result::comm_abort(comm) };
                return Err(Error::io("cannot start the NCCL watchdog thread", e));
            }
        };
        let mut me = NcclComm {
            comm,
            gpu: gpu.clone(),
            rank,
            world,
            avg_f32: redop::SUM,
            avg_f16: redop::SUM,
            ops,
            watchdog,
            grouped: RefCell::new(None),
        };
        me.avg_f32 = me.premul_op::<f32>()?;
        me.avg_f16 = me.premul_op::<half::f16>()?;
        Ok(me)
    }

    fn premul_op<T: NcclElem>(&self) -> Result<u32> {
        let mut scalar = T::inverse(self.world);
        // SAFETY: the scalar is read at creation (host-immediate residence).
        unsafe {
            RawOps::create_pre_mul_sum((&mut scalar) as *mut T as *mut c_void, T::as_nccl_type(), self.comm)
        }
        .map_err(|e| nccl_err(&format!("ncclRedOpCreatePreMulSum {}", T::NAME), e, Some(self.comm)))
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    fn bind(&self) -> Result<()> {
        self.gpu.ctx().bind_to_thread().map_err(|e| Error::cuda("binding the CUDA context for NCCL", e))
    }

    /// Hands `op`, just enqueued on `stream`, to the watchdog (at the group's
    /// end inside [`NcclComm::group`], when NCCL actually enqueues it).
    fn watch(&self, op: Op, stream: &CudaStream) -> Result<()> {
        let s = stream.cu_stream() as sys::cudaStream_t;
        if let Some(g) = self.grouped.borrow_mut().as_mut() {
            g.push((op, s));
            return Ok(());
        }
        self.watchdog.watch(op, s as _).map_err(|e| Error::cuda(format!("watching {op}"), e))
    }

    fn all_reduce<T: NcclElem>(
        &self,
        buf: &mut CudaViewMut<T>,
        op: u32,
        stream: &CudaStream,
        what: &'static str,
    ) -> Result<()> {
        self.bind()?;
        let n = buf.len();
        let (p, _record) = buf.device_ptr_mut(stream);
        // SAFETY: in place over the view's n elements; every rank passes the
        // same n; `op` is ncclSum or one of this communicator's.
        unsafe {
            self.ops.all_reduce(
                p as *mut c_void,
                n,
                T::as_nccl_type(),
                op,
                self.comm,
                stream.cu_stream() as _,
            )
        }
        .map_err(|e| nccl_err(&format!("ncclAllReduce {what} {} x{n}", T::NAME), e, Some(self.comm)))?;
        let name = if what == "sum" { "ncclAllReduce sum" } else { "ncclAllReduce avg" };
        self.watch(Op { name, dtype: T::NAME, n, root: None }, stream)
    }

    /// In-place sum over the ranks, enqueued on `stream`.
    pub fn all_reduce_sum<T: NcclElem>(&self, buf: &mut CudaViewMut<T>, stream: &CudaStream) -> Result<()> {
        self.all_reduce(buf, redop::SUM, stream, "sum")
    }

    /// In-place mean over the ranks (each input premultiplied by `1/world`,
    /// then summed), enqueued on `stream`.
    pub fn all_reduce_avg<T: NcclElem>(&self, buf: &mut CudaViewMut<T>, stream: &CudaStream) -> Result<()> {
        let op =
            if T::as_nccl_type() == sys::ncclDataType_t::ncclFloat16 { self.avg_f16 } else { self.avg_f32 };
        self.all_reduce(buf, op, stream, "avg")
    }

    /// In place: every rank's `buf` becomes `root`'s.
    pub fn broadcast<T: NcclElem>(
        &self,
        buf: &mut CudaViewMut<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        if root >= self.world {
            return Err(Error::shape(format!(
                "NCCL broadcast: root {root} is not a rank of a world of {}",
                self.world
            )));
        }
        self.bind()?;
        let n = buf.len();
        let (p, _record) = buf.device_ptr_mut(stream);
        // SAFETY: in place over the view's n elements.
        unsafe {
            result::broadcast(
                p as *const c_void,
                p as *mut c_void,
                n,
                T::as_nccl_type(),
                root as i32,
                self.comm,
                stream.cu_stream() as _,
            )
        }
        .map_err(|e| {
            nccl_err(&format!("ncclBroadcast {} x{n} from rank {root}", T::NAME), e, Some(self.comm))
        })?;
        self.watch(Op { name: "ncclBroadcast", dtype: T::NAME, n, root: Some(root) }, stream)
    }

    /// `recv` (world x `send.len()`) gets every rank's `send` in rank order.
    pub fn all_gather<T: NcclElem>(
        &self,
        send: &CudaView<T>,
        recv: &mut CudaViewMut<T>,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = send.len();
        if recv.len() != n * self.world {
            return Err(Error::shape(format!(
                "NCCL all_gather: receive buffer has {} elements, expected {} ranks x {n}",
                recv.len(),
                self.world
            )));
        }
        self.bind()?;
        let (ps, _rs) = send.device_ptr(stream);
        let (pr, _rr) = recv.device_ptr_mut(stream);
        // SAFETY: send holds n elements and recv world * n (checked above).
        unsafe {
            result::all_gather(
                ps as *const c_void,
                pr as *mut c_void,
                n,
                T::as_nccl_type(),
                self.comm,
                stream.cu_stream() as _,
            )
        }
        .map_err(|e| nccl_err(&format!("ncclAllGather {} x{n}", T::NAME), e, Some(self.comm)))?;
        self.watch(Op { name: "ncclAllGather", dtype: T::NAME, n, root: None }, stream)
    }

    /// Runs `f`'s collectives as one NCCL group (fused launch, e.g. all the
    /// ready buckets at once). The group is closed even when `f` fails.
    pub fn group<R>(&self, f: impl FnOnce(&Self) -> Result<R>) -> Result<R> {
        if self.grouped.borrow().is_some() {
            return Err(Error::internal("NCCL groups of one communicator do not nest here"));
        }
        result::group_start().map_err(|e| nccl_err("ncclGroupStart", e, Some(self.comm)))?;
        *self.grouped.borrow_mut() = Some(Vec::new());
        let out = f(self);
        let ops = self.grouped.borrow_mut().take().unwrap_or_default();
        let end = result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e, Some(self.comm)));
        let out = out?;
        end?;
        for (op, s) in ops {
            self.watchdog.watch(op, s as _).map_err(|e| Error::cuda(format!("watching {op}"), e))?;
        }
        Ok(out)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // The watchdog first: its thread must not look at an aborted communicator.
        self.watchdog.stop();
        if self.watchdog.aborted() {
            return;
        }
        // Abort rather than destroy: destroy waits for pending operations,
        // which never finish when a peer is gone. Errors here have no one to go to.
        // SAFETY: the ops and the communicator are live and dropped once.
        unsafe {
            for op in [self.avg_f32, self.avg_f16] {
                if op != redop::SUM {
                    let _ = self.ops.destroy(op, self.comm);
                }
            }
            let _ = result::comm_abort(self.comm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::LocalCommunicator;
    use half::f16;

    #[test]
    fn the_id_round_trips_through_f32_values() {
        let mut id = [0 as c_char; ID_LEN];
        for (i, b) in id.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37) as c_char; // every byte value class, negatives included
        }
        let v = encode_id(Some(&id));
        assert_eq!(v.len(), ID_LEN + 1);
        assert_eq!(decode_id(&v).unwrap(), id);
    }

    #[test]
    fn a_failed_or_garbled_id_is_an_error_not_a_hang() {
        let e = decode_id(&encode_id(None)).unwrap_err().to_string();
        assert!(e.contains("rank 0 could not create the NCCL unique id"), "{e}");
        let e = decode_id(&[1.0; 5]).unwrap_err().to_string();
        assert!(e.contains("expected 129 values from rank 0, got 5"), "{e}");
        let mut v = encode_id(Some(&[0; ID_LEN]));
        v[3] = 256.0;
        assert!(decode_id(&v).unwrap_err().to_string().contains("256 is not a byte"));
    }

    #[test]
    fn membership_must_match_the_tcp_communicator() {
        assert!(check_membership(0, 1, &LocalCommunicator).is_ok());
        let e = check_membership(1, 2, &LocalCommunicator).unwrap_err().to_string();
        assert!(e.contains("rank 1 of 2 but the TCP communicator is rank 0 of 1"), "{e}");
        let e = check_membership(2, 2, &LocalCommunicator).unwrap_err().to_string();
        assert!(e.contains("rank 2 is not a rank of a world of 2"), "{e}");
    }

    #[test]
    fn missing_libnccl_says_what_to_install() {
        match require_nccl() {
            Ok(()) => assert!(is_available()),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("libnccl could not be loaded: install NCCL"), "{e}");
                assert!(e.contains("parallel.backend = \"tcp\""), "{e}");
            }
        }
    }

    #[test]
    fn nccl_at_world_size_one_reduces_broadcasts_and_gathers() {
        let Some(gpu) = crate::cuda::test_gpu("nccl_at_world_size_one_reduces_broadcasts_and_gathers") else {
            return;
        };
        let comm = NcclComm::new(&gpu, 0, 1, &LocalCommunicator, Duration::from_secs(30)).unwrap();
        assert_eq!((comm.rank(), comm.world_size()), (0, 1));
        let s = gpu.stream();
        let host: Vec<f32> = (0..1001).map(|i| i as f32 * 0.25 - 7.0).collect();
        let mut x = s.clone_htod(&host).unwrap();
        comm.all_reduce_sum(&mut x.as_view_mut(), s).unwrap();
        comm.all_reduce_avg(&mut x.as_view_mut(), s).unwrap();
        comm.broadcast(&mut x.as_view_mut(), 0, s).unwrap();
        assert_eq!(s.clone_dtoh(&x).unwrap(), host);
        let h16: Vec<f16> = host.iter().map(|&v| f16::from_f32(v)).collect();
        let mut y = s.clone_htod(&h16).unwrap();
        comm.group(|c| {
            c.all_reduce_sum(&mut y.as_view_mut(), s)?;
            c.all_reduce_avg(&mut y.as_view_mut(), s)
        })
        .unwrap();
        assert_eq!(s.clone_dtoh(&y).unwrap(), h16);
        let mut out = s.clone_htod(&vec![f32::NAN; host.len()]).unwrap();
        comm.all_gather(&x.as_view(), &mut out.as_view_mut(), s).unwrap();
        assert_eq!(s.clone_dtoh(&out).unwrap(), host);
        let mut short = s.alloc_zeros::<f32>(3).unwrap();
        let e = comm.all_gather(&x.as_view(), &mut short.as_view_mut(), s).unwrap_err().to_string();
        assert!(e.contains("receive buffer has 3 elements, expected 1 ranks x 1001"), "{e}");
        let e = comm.broadcast(&mut x.as_view_mut(), 1, s).unwrap_err().to_string();
        assert!(e.contains("root 1 is not a rank of a world of 1"), "{e}");
    }
}
