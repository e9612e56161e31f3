//! A run is never lost to a signal. SIGTERM (SLURM preemption, Kubernetes,
//! `ddptrain launch`) or SIGINT (a terminal's Ctrl-C) only sets a flag; the
//! loop finishes the step it is in, and the ranks agree on the step to stop
//! after through that step's own gradient all-reduce, which carries each
//! rank's request as [`VOTE_LEN`] extra elements of its last bucket (the CPU
//! reducer, src/dist/reducer.rs, and the device one, src/dist/cuda/reducer.rs).
//! The CPU knows the sum when the step's backward returns; the GPU's host
//! reads it from the loss scaler's per-step snapshot, one step late but at
//! the same step on every rank. At world size 1 the flag is read directly.
//! Then rank 0 writes a checkpoint and a summary marked interrupted, every
//! rank passes the final barrier, and the process exits with
//! [`StopSignal::exit_code`]. A second SIGINT exits at once; a second
//! SIGTERM changes nothing (a scheduler and `launch` may each send one).
//! The handlers are installed when the loop starts: a signal before then
//! ends the process as it always did (nothing is trained yet), and one
//! after the last step lets the run complete (exit 0).
//!
//! The same vote carries rank 0's call for a timed checkpoint
//! (`checkpoint.every_minutes`, src/checkpoint/timed.rs), acted on where the
//! stop is, so every rank saves after the same step.

use super::engine::{Engine, HostSync};
use super::{Ddp, RunOptions};
use crate::checkpoint::{Checkpointer, TrainProgress};
use crate::error::{Error, Result};
use crate::metrics::MetricsWriter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Extra elements of a step's last gradient bucket: how many ranks were asked
/// to stop by SIGINT, by SIGTERM, and voted for a timed checkpoint (0 or 1
/// each per rank, so the sum is exact even in an f16 bucket). [`Vote`] and
/// [`Agreed`] are what they mean.
pub const VOTE_LEN: usize = 3;
/// Where each count sits in the vote.
const INT: usize = 0;
const TERM: usize = 1;
const SAVE: usize = 2;

/// This rank's share of a step's vote: the stop it was asked for, and
/// whether its clock says a timed checkpoint is due (rank 0's only, see
/// src/checkpoint/timed.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Vote {
    pub stop: Option<StopSignal>,
    pub save: bool,
}

impl Vote {
    /// The vote as the elements the all-reduce sums.
    pub fn elements(self) -> [f32; VOTE_LEN] {
        let mut v = [0.0; VOTE_LEN];
        match self.stop {
            None => {}
            Some(StopSignal::Int) => v[INT] = 1.0,
            Some(StopSignal::Term) => v[TERM] = 1.0,
        }
        if self.save {
            v[SAVE] = 1.0;
        }
        v
    }
}

/// What the ranks agreed on from their summed votes: SIGTERM (a
/// scheduler's notice) wins over SIGINT, so every rank exits with the same
/// code; one rank's vote for a save is a save on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Agreed {
    pub stop: Option<StopSignal>,
    pub save: bool,
}

impl Agreed {
    pub fn from_sum(sum: [f32; VOTE_LEN]) -> Agreed {
        let stop = if sum[TERM] > 0.0 {
            Some(StopSignal::Term)
        } else if sum[INT] > 0.0 {
            Some(StopSignal::Int)
        } else {
            None
        };
        Agreed { stop, save: sum[SAVE] > 0.0 }
    }
}

/// The signal a run stopped for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum StopSignal {
    #[serde(rename = "SIGINT")]
    Int,
    #[serde(rename = "SIGTERM")]
    Term,
}

impl StopSignal {
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Int => "SIGINT",
            StopSignal::Term => "SIGTERM",
        }
    }

    /// 128 + the signal's number (130, 143): what a shell reports for a
    /// process the signal ended, so every wrapper (a shell's `$?`, SLURM,
    /// Kubernetes, `ddptrain launch`) sees what it would have seen without
    /// the handler, never a success; `summary.json`'s `interrupted` tells a
    /// saved stop from a kill.
    pub fn exit_code(self) -> u8 {
        match self {
            StopSignal::Int => 130,
            StopSignal::Term => 143,
        }
    }
}

/// The flags the handlers set.
struct Flags {
    /// Any stop asked for: arms the immediate exit of a second SIGINT.
    any: Arc<AtomicBool>,
    int: Arc<AtomicBool>,
    term: Arc<AtomicBool>,
}

static FLAGS: OnceLock<Flags> = OnceLock::new();

/// Installs the handlers, once per process (the binary's training run asks
/// for them through `RunOptions::stop_on_signals`; a library caller keeps
/// the default dispositions).
pub fn install() -> Result<()> {
    if FLAGS.get().is_some() {
        return Ok(());
    }
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flags = Flags {
        any: Arc::new(AtomicBool::new(false)),
        int: Arc::new(AtomicBool::new(false)),
        term: Arc::new(AtomicBool::new(false)),
    };
    let err = |e| Error::io("cannot install the SIGINT/SIGTERM handlers", e);
    // Registered first, so it sees `any` as it was before this SIGINT: only a
    // second one exits (signal-hook runs a signal's actions in registration order).
    signal_hook::flag::register_conditional_shutdown(
        SIGINT,
        i32::from(StopSignal::Int.exit_code()),
        flags.any.clone(),
    )
    .map_err(err)?;
    for (sig, own) in [(SIGINT, &flags.int), (SIGTERM, &flags.term)] {
        signal_hook::flag::register(sig, own.clone()).map_err(err)?;
        signal_hook::flag::register(sig, flags.any.clone()).map_err(err)?;
    }
    // A concurrent install lost the race: its handlers set flags nobody reads,
    // and this process's read the same signals, so nothing is missed.
    let _ = FLAGS.set(flags);
    Ok(())
}

/// This process's own request: the first signal's kind (SIGTERM when both came).
pub fn requested() -> Option<StopSignal> {
    let f = FLAGS.get()?;
    if f.term.load(Ordering::SeqCst) {
        Some(StopSignal::Term)
    } else if f.int.load(Ordering::SeqCst) {
        Some(StopSignal::Int)
    } else {
        None
    }
}

/// After each step but the last: the stop and the timed save every rank
/// agrees on, if any; and this rank's vote on a timed save for the next step.
pub(crate) fn after_step(
    opts: &RunOptions,
    engine: &mut dyn Engine,
    ddp: &mut Ddp,
    ckpt: &mut Checkpointer,
) -> Result<Agreed> {
    if let Some(d) = opts.step_pause {
        std::thread::sleep(d);
    }
    if ddp.world_size() == 1 {
        return Ok(Agreed { stop: requested(), save: ckpt.timed_save_due() });
    }
    let agreed = engine.agreed(ddp, false)?;
    // Cast before this step's save resets the clock: the clock then holds
    // back a second vote while the first one's save is still to come.
    ddp.set_save_vote(ckpt.timed_save_vote());
    Ok(agreed)
}

/// The stop every rank agrees on after the step just taken, at an epoch's
/// end before its evaluation (the device is waited for), if any. A timed
/// save it might also tell of is left to the next step's [`after_step`],
/// which learns it again then on the GPU (on the CPU it was this step's).
pub(crate) fn settled(engine: &mut dyn Engine, ddp: &Ddp) -> Result<Option<StopSignal>> {
    if ddp.world_size() == 1 {
        return Ok(requested());
    }
    Ok(engine.agreed(ddp, true)?.stop)
}

/// Rank 0 checkpoints step `c.step`, `batches_in_epoch` into its epoch,
/// unless it is saved already (every rank takes part): at a stop, and at
/// the timed save the ranks agreed on.
pub(crate) fn save_now(
    engine: &mut dyn Engine,
    ckpt: &mut Checkpointer,
    c: &mut TrainProgress,
    batches_in_epoch: usize,
    metrics: &mut MetricsWriter,
    ddp: &Ddp,
) -> Result<()> {
    // What the device summed since the last look belongs to the checkpoint's loss window.
    engine.fold_loss(&mut c.window_loss)?;
    let host = engine.host(HostSync::WeightsAndGrads)?;
    let p = TrainProgress { batches_in_epoch, ..c.clone() };
    ckpt.on_stop(host.model, host.optimizer, host.amp, &p, metrics, ddp.communicator())
}

/// The run stops after step `c.step`, `batches_in_epoch` into its epoch:
/// rank 0 checkpoints it (every rank takes part). Returns the line to log.
pub(crate) fn checkpoint(
    sig: StopSignal,
    engine: &mut dyn Engine,
    ckpt: &mut Checkpointer,
    c: &mut TrainProgress,
    batches_in_epoch: usize,
    metrics: &mut MetricsWriter,
    ddp: &Ddp,
) -> Result<String> {
    save_now(engine, ckpt, c, batches_in_epoch, metrics, ddp)?;
    Ok(format!(
        "{}: stopping after step {} (epoch {}); checkpoint written, no evaluation; exit code {}",
        sig.name(),
        c.step,
        c.epoch,
        sig.exit_code()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(votes: &[Vote]) -> [f32; VOTE_LEN] {
        let mut s = [0.0; VOTE_LEN];
        for v in votes {
            s.iter_mut().zip(v.elements()).for_each(|(s, e)| *s += e);
        }
        s
    }

    #[test]
    fn votes_sum_to_one_agreed_signal_and_its_exit_code() {
        let vote = |stop| Vote { stop, save: false };
        let (none, int, term) = (vote(None), vote(Some(StopSignal::Int)), vote(Some(StopSignal::Term)));
        let stop = |votes: &[Vote]| Agreed::from_sum(sum(votes)).stop;
        assert_eq!(stop(&[none, none]), None);
        assert_eq!(stop(&[none, int]), Some(StopSignal::Int));
        assert_eq!(stop(&[int, term]), Some(StopSignal::Term));
        assert_eq!(Agreed::from_sum([f32::NAN, 0.0, f32::NAN]), Agreed::default());
        assert_eq!((StopSignal::Int.exit_code(), StopSignal::Term.exit_code()), (130, 143));
        assert_eq!(serde_json::to_value(StopSignal::Term).unwrap(), "SIGTERM");
    }

    #[test]
    fn one_ranks_save_vote_is_every_ranks_save_and_leaves_the_stop_alone() {
        let save = Vote { stop: None, save: true };
        assert_eq!(Agreed::from_sum(sum(&[Vote::default(), Vote::default()])), Agreed::default());
        assert_eq!(Agreed::from_sum(sum(&[save, Vote::default()])), Agreed { stop: None, save: true });
        let term = Vote { stop: Some(StopSignal::Term), save: false };
        assert_eq!(
            Agreed::from_sum(sum(&[save, term])),
            Agreed { stop: Some(StopSignal::Term), save: true },
            "a stop and a save in one step: both are known (the stop's checkpoint serves both)"
        );
        // Every element is 0 or 1 per rank: exact in f16 as in f32.
        assert!(save.elements().iter().chain(&term.elements()).all(|&e| e == 0.0 || e == 1.0));
    }
}
