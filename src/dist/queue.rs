//! The issue queue both CPU transports share: the caller's thread hands each
//! collective to one communication thread, which owns the transport (the TCP
//! sockets, or MPI, whose calls must all come from the thread that
//! initialized it) and runs the operations in issue order.

use super::{Buffer, Communicator, ReduceOp, Work, WorkCompleter};
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
    Barrier,
}

impl OpKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce(_) => "all_reduce",
            OpKind::Broadcast(_) => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::Barrier => "barrier",
        }
    }
}

/// One issued collective, waiting for the communication thread.
pub(crate) struct Job {
    pub kind: OpKind,
    pub buf: Buffer,
    pub label: String,
    pub done: WorkCompleter,
}

impl Job {
    /// How errors name the operation: kind, sequence number, label.
    pub(crate) fn describe(&self, seq: u64) -> String {
        if self.label.is_empty() {
            format!("{} #{seq}", self.kind.name())
        } else {
            format!("{} #{seq} ({})", self.kind.name(), self.label)
        }
    }
}

/// The caller's end of the communication thread.
pub(crate) struct Queue {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Option<JoinHandle<()>>,
}

impl Queue {
    /// Starts the communication thread `name`, which runs `body` on the jobs.
    pub(crate) fn spawn<F>(name: String, body: F) -> Result<Queue>
    where
        F: FnOnce(mpsc::Receiver<Job>) + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || body(rx))
            .map_err(|e| Error::io("cannot start the communication thread", e))?;
        Ok(Queue { tx: Mutex::new(Some(tx)), thread: Some(thread) })
    }

    pub(crate) fn submit(&self, kind: OpKind, buf: Buffer, label: &str) -> Work {
        let (work, done) = Work::pending(format!("{} ({label})", kind.name()));
        let job = Job { kind, buf, label: label.to_string(), done };
        let sent = match self.tx.lock() {
            Ok(tx) => match tx.as_ref() {
                Some(tx) => tx.send(job).map_err(|e| e.0),
                None => Err(job),
            },
            Err(_) => Err(job),
        };
        if let Err(job) = sent {
            job.done.complete(Err(Error::Training(format!(
                "{}: the communication thread has stopped",
                kind.name()
            ))));
        }
        work
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Closing the queue lets the thread finish what was issued, then exit.
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The checks every communicator makes before issuing a broadcast.
pub(crate) fn check_root(root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(Error::shape(format!("broadcast root {root} is not a rank of a world of {world}")));
    }
    Ok(())
}

/// A communicator whose collectives run on the communication thread of the
/// transport `T`, a marker type (`tcp::Tcp`, `mpi::Mpi`) whose module
/// implements joining the job.
pub struct Queued<T> {
    rank: usize,
    world: usize,
    queue: Queue,
    transport: PhantomData<fn() -> T>,
}

impl<T> Queued<T> {
    pub(crate) fn new(rank: usize, world: usize, queue: Queue) -> Self {
        Queued { rank, world, queue, transport: PhantomData }
    }
}

impl<T> Communicator for Queued<T> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn all_reduce_async(&self, buf: Buffer, op: ReduceOp, label: &str) -> Work {
        self.queue.submit(OpKind::AllReduce(op), buf, label)
    }
    fn broadcast_async(&self, buf: Buffer, root: usize, label: &str) -> Work {
        if let Err(e) = check_root(root, self.world) {
            return Work::ready(Err(e));
        }
        self.queue.submit(OpKind::Broadcast(root), buf, label)
    }
    fn all_gather_async(&self, buf: Buffer, label: &str) -> Work {
        self.queue.submit(OpKind::AllGather, buf, label)
    }
    fn barrier_async(&self, label: &str) -> Work {
        self.queue.submit(OpKind::Barrier, Buffer::F32(Vec::new()), label)
    }
}
