//! Distributed data parallel, process layer: who this rank is ([`env`]), how
//! the ranks find each other ([`rendezvous`]) and the collectives between them
//! ([`Communicator`], over TCP in [`tcp`], MPI with the `mpi` feature, and
//! NCCL for device buffers in [`cuda`]).
//!
//! The [`Communicator`] trait is what the trainer programs against: buffers are
//! handed over by value and come back from [`Work::wait`], so an implementation
//! may run the operation on a thread (TCP, MPI) while the caller computes. Operations complete in the order they are issued, and their
//! results are bitwise equal on every rank.

mod agree;
pub mod cuda;
pub mod env;
mod junk;
#[cfg(feature = "mpi")]
pub mod mpi;
mod queue;
pub mod reducer;
pub mod rendezvous;
pub mod selftest;
pub mod tcp;
mod wire;

#[cfg(test)]
mod tests_agree;
#[cfg(test)]
mod tests_env;
#[cfg(test)]
mod tests_reducer;
#[cfg(test)]
mod tests_rendezvous;
#[cfg(test)]
mod tests_tcp;

pub use agree::check_same_config;
pub use env::{DistEnv, Launcher, JOB_TOKEN_VAR};
pub use queue::Queued;
pub use rendezvous::{rendezvous, Membership, RendezvousOpts};
pub use tcp::TcpCommunicator;

use crate::config::{Backend, Config};
use crate::error::{Error, Result};
use half::f16;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Element type of a [`Buffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
        }
    }
}

/// A flat buffer handed to a collective. f16 sums are accumulated in f32 and
/// rounded once.
#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Buffer {
    pub fn len(&self) -> usize {
        match self {
            Buffer::F32(v) => v.len(),
            Buffer::F16(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::F16(_) => DType::F16,
        }
    }
    /// The values widened to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Buffer::F32(v) => v.clone(),
            Buffer::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }
    pub fn into_f32(self) -> Result<Vec<f32>> {
        match self {
            Buffer::F32(v) => Ok(v),
            Buffer::F16(_) => Err(Error::shape("expected an f32 buffer, got f16")),
        }
    }
    pub fn into_f16(self) -> Result<Vec<f16>> {
        match self {
            Buffer::F16(v) => Ok(v),
            Buffer::F32(_) => Err(Error::shape("expected an f16 buffer, got f32")),
        }
    }
}

/// The reduction of an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Sum divided by the world size.
    Avg,
}

/// When an operation was submitted (on the caller's thread), and its start
/// and end on the communication thread, for overlap accounting.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkTiming {
    pub submitted: Option<Instant>,
    pub started: Option<Instant>,
    pub finished: Option<Instant>,
}

/// A pending collective. Dropping it does not cancel the operation.
pub struct Work {
    rx: mpsc::Receiver<Result<Buffer>>,
    timing: Arc<Mutex<WorkTiming>>,
    what: String,
}

/// The communication side of a [`Work`]: reports start, then the result.
pub struct WorkCompleter {
    tx: mpsc::Sender<Result<Buffer>>,
    timing: Arc<Mutex<WorkTiming>>,
}

impl Work {
    /// A pending operation and the completer its executor fulfils.
    pub fn pending(what: impl Into<String>) -> (Work, WorkCompleter) {
        let (tx, rx) = mpsc::channel();
        let timing =
            Arc::new(Mutex::new(WorkTiming { submitted: Some(Instant::now()), ..Default::default() }));
        (Work { rx, timing: timing.clone(), what: what.into() }, WorkCompleter { tx, timing })
    }

    /// An operation that finished on the spot (world size 1, or refused at submission).
    pub fn ready(result: Result<Buffer>) -> Work {
        let (w, c) = Work::pending("operation");
        c.start();
        c.complete(result);
        w
    }

    /// Blocks until the operation is done; its buffer, or why it failed.
    pub fn wait(self) -> Result<Buffer> {
        self.rx.recv().unwrap_or_else(|_| {
            Err(Error::Training(format!("{}: the communication thread is gone", self.what)))
        })
    }

    /// [`Work::wait`], also returning when the operation started and finished.
    pub fn wait_timed(self) -> (Result<Buffer>, WorkTiming) {
        let timing = self.timing.clone();
        let result = self.wait();
        let t = timing.lock().map(|t| *t).unwrap_or_default();
        (result, t)
    }

    /// Whether the result is there (so [`Work::wait`] would not block).
    pub fn is_completed(&self) -> bool {
        self.timing.lock().map(|t| t.finished.is_some()).unwrap_or(true)
    }

    pub fn timing(&self) -> WorkTiming {
        self.timing.lock().map(|t| *t).unwrap_or_default()
    }
}

impl WorkCompleter {
    pub fn start(&self) {
        if let Ok(mut t) = self.timing.lock() {
            t.started = Some(Instant::now());
        }
    }
    pub fn complete(self, result: Result<Buffer>) {
        // Send first: whoever sees `finished` must find the result in the channel.
        let _ = self.tx.send(result);
        if let Ok(mut t) = self.timing.lock() {
            t.finished = Some(Instant::now());
        }
    }
}

/// Collectives between the ranks of a job. All ranks must issue the same
/// operations, with buffers of the same length and dtype, in the same order;
/// a mismatch is reported as an error, not a wrong result.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Every rank gets the element-wise sum (or mean) of all ranks' buffers.
    /// `label` names the operation in errors, e.g. "bucket 3".
    fn all_reduce_async(&self, buf: Buffer, op: ReduceOp, label: &str) -> Work;
    /// Every rank gets `root`'s buffer (others' contents are ignored, their length is checked).
    fn broadcast_async(&self, buf: Buffer, root: usize, label: &str) -> Work;
    /// Every rank gets all ranks' buffers (equal lengths) concatenated in rank order.
    fn all_gather_async(&self, buf: Buffer, label: &str) -> Work;
    /// Completes when every rank has reached it; the result is an empty buffer.
    fn barrier_async(&self, label: &str) -> Work;

    fn all_reduce(&self, buf: Buffer, op: ReduceOp, label: &str) -> Result<Buffer> {
        self.all_reduce_async(buf, op, label).wait()
    }
    fn broadcast(&self, buf: Buffer, root: usize, label: &str) -> Result<Buffer> {
        self.broadcast_async(buf, root, label).wait()
    }
    fn all_gather(&self, buf: Buffer, label: &str) -> Result<Buffer> {
        self.all_gather_async(buf, label).wait()
    }
    fn barrier(&self, label: &str) -> Result<()> {
        self.barrier_async(label).wait().map(|_| ())
    }
}

/// World size 1: every collective is the identity.
pub struct LocalCommunicator;

impl Communicator for LocalCommunicator {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_async(&self, buf: Buffer, _op: ReduceOp, _label: &str) -> Work {
        Work::ready(Ok(buf))
    }
    fn broadcast_async(&self, buf: Buffer, root: usize, _label: &str) -> Work {
        if let Err(e) = queue::check_root(root, 1) {
            return Work::ready(Err(e));
        }
        Work::ready(Ok(buf))
    }
    fn all_gather_async(&self, buf: Buffer, _label: &str) -> Work {
        Work::ready(Ok(buf))
    }
    fn barrier_async(&self, _label: &str) -> Work {
        Work::ready(Ok(Buffer::F32(Vec::new())))
    }
}

/// Joins the job this process was launched into: reads the environment, then
/// runs the rendezvous and connects the TCP mesh, or (`parallel.backend =
/// "mpi"`) initializes MPI. A single process (no launcher variables, or a
/// world size of 1) gets a [`LocalCommunicator`] and touches no port.
pub fn init(cfg: &Config) -> Result<(DistEnv, Box<dyn Communicator>)> {
    let env = DistEnv::from_process(&cfg.parallel)?;
    let backend = cfg.parallel.backend;
    check_backend(backend, &env)?;
    if env.world_size == 1 {
        return Ok((env, Box::new(LocalCommunicator)));
    }
    let timeout = Duration::from_secs(cfg.parallel.timeout_s.max(1));
    let opts = RendezvousOpts::for_config(cfg, env.job_token.clone(), timeout);
    let comm = connect(&env, &opts, backend)?;
    Ok((env, comm))
}

/// Refuses `backend` where it cannot work: "mpi" in a build without the
/// feature, or in a process that no MPI launcher started.
pub fn check_backend(backend: Backend, env: &DistEnv) -> Result<()> {
    check_backend_in(backend, env, cfg!(feature = "mpi"))
}

/// [`check_backend`] for a build with (`mpi_built`) or without the feature:
/// both refusals are tested whichever way the tests were built.
fn check_backend_in(backend: Backend, env: &DistEnv, mpi_built: bool) -> Result<()> {
    if backend != Backend::Mpi {
        return Ok(());
    }
    let bad = |msg: String| Err(Error::config("[parallel]", "parallel.backend", msg));
    if !mpi_built {
        return bad(
            "\"mpi\" needs a ddptrain built with the `mpi` feature (`cargo build --release --features mpi`, \
             with the MPI development headers and libclang installed; see the README), or use \"tcp\""
                .into(),
        );
    }
    match env.launcher {
        Launcher::OpenMpi | Launcher::Pmi => Ok(()),
        Launcher::None => {
            bad("\"mpi\" takes the ranks from MPI, and this process was not started by an MPI launcher: \
             run it under `mpirun -np N ddptrain ...` (or srun with PMI), or use \"tcp\""
                .into())
        }
        other => bad(format!(
            "\"mpi\" takes the ranks from MPI, but this process was started by {other:?}'s variables \
             (no OMPI_COMM_WORLD_RANK or PMI_RANK): start the job with `mpirun -np N ddptrain ...`, \
             or use \"tcp\" with this launcher"
        )),
    }
}

/// The communicator of `backend` for a job of several ranks: the TCP
/// rendezvous and mesh, or MPI, whose ranks then compare config fingerprints.
pub fn connect(env: &DistEnv, opts: &RendezvousOpts, backend: Backend) -> Result<Box<dyn Communicator>> {
    if backend != Backend::Mpi {
        return Ok(Box::new(TcpCommunicator::connect(rendezvous(env, opts)?, opts.timeout)?));
    }
    connect_mpi(env, opts)
}

#[cfg(feature = "mpi")]
fn connect_mpi(env: &DistEnv, opts: &RendezvousOpts) -> Result<Box<dyn Communicator>> {
    let comm = mpi::MpiCommunicator::init(opts.timeout)?;
    if (comm.rank(), comm.world_size()) != (env.rank, env.world_size) {
        return Err(Error::config(
            "the environment",
            "parallel.backend",
            format!(
                "MPI says this is rank {} of {}, but the launcher's variables say rank {} of {} ({:?}): \
                 start the job with the mpirun of the MPI library ddptrain was built against",
                comm.rank(),
                comm.world_size(),
                env.rank,
                env.world_size,
                env.launcher
            ),
        ));
    }
    check_same_config(&comm, opts)?;
    Ok(Box::new(comm))
}

#[cfg(not(feature = "mpi"))]
fn connect_mpi(env: &DistEnv, _opts: &RendezvousOpts) -> Result<Box<dyn Communicator>> {
    check_backend(Backend::Mpi, env)?;
    Err(Error::Unsupported("this ddptrain was built without the `mpi` feature".into()))
}
