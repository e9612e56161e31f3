//! Timed checkpoints (`checkpoint.every_minutes`), what PyTorch Lightning's
//! `ModelCheckpoint(train_time_interval=...)` gives: a save whenever that
//! much wall time has passed since the run's start or its last save, so a
//! killed run loses at most that much. A save is collective (rank 0 gathers
//! every rank's pending gradients), yet clocks differ per rank: only rank 0's
//! counts, and it reaches the others as one element of the step's vote
//! (src/train/stop.rs), so every rank saves at the step the vote says.

use super::Checkpointer;
use std::time::{Duration, Instant};

/// Rank 0's clock for timed saves.
#[derive(Debug, Clone)]
pub(super) struct SaveClock {
    /// Timed saves are on: on every rank alike, as `finish` must decide its
    /// final save the same everywhere.
    on: bool,
    /// The period on rank 0's clock; None when off and on the other ranks.
    every: Option<Duration>,
    since: Instant,
    /// A vote for a save went out and its save has not happened yet: the
    /// GPU learns a vote one step late, so voting again in that step would
    /// ask for a second save right after the first.
    voted: bool,
}

impl SaveClock {
    pub(super) fn new(every_minutes: f64, rank: usize) -> SaveClock {
        // validate.rs refuses a negative or non-finite value; try_from also
        // keeps an absurd one from panicking here.
        let every = (rank == 0 && every_minutes > 0.0)
            .then(|| Duration::try_from_secs_f64(every_minutes * 60.0).ok())
            .flatten();
        SaveClock { on: every_minutes > 0.0, every, since: Instant::now(), voted: false }
    }

    pub(super) fn on(&self) -> bool {
        self.on
    }

    fn due(&self) -> bool {
        self.every.is_some_and(|e| self.since.elapsed() >= e)
    }

    /// Whether to vote for a save in the next step: once per due period.
    fn vote(&mut self) -> bool {
        let v = !self.voted && self.due();
        self.voted |= v;
        v
    }

    /// Any save restarts the period.
    pub(super) fn reset(&mut self) {
        self.since = Instant::now();
        self.voted = false;
    }
}

impl Checkpointer {
    /// At world size 1: whether a timed save is due now.
    pub fn timed_save_due(&self) -> bool {
        self.clock.due()
    }

    /// With several ranks: this rank's vote for a timed save in the next
    /// step (only rank 0's clock ever votes).
    pub fn timed_save_vote(&mut self) -> bool {
        self.clock.vote()
    }

    /// The timed save the ranks agreed on restarts the period, whether it
    /// writes a checkpoint or finds the step saved already (by
    /// `every_steps`); the save itself is [`Checkpointer::on_stop`]'s.
    pub fn restart_clock(&mut self) {
        self.clock.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rank_0_votes_once_per_period_until_a_save_resets_it() {
        let mut off = SaveClock::new(0.0, 0);
        assert!(!off.on() && !off.vote());
        let mut other = SaveClock::new(1e-9, 1);
        std::thread::sleep(Duration::from_millis(1));
        assert!(other.on() && !other.vote(), "on everywhere, but only rank 0's clock counts");
        let mut c = SaveClock::new(1e-9, 0);
        std::thread::sleep(Duration::from_millis(1));
        assert!(c.due() && c.vote());
        assert!(c.due() && !c.vote(), "one vote until its save");
        c.reset();
        std::thread::sleep(Duration::from_millis(1));
        assert!(c.vote(), "a save starts the next period");
        let hour = SaveClock::new(60.0, 0);
        assert!(hour.on() && !hour.due());
        assert!(!SaveClock::new(f64::MAX, 0).due(), "too long to count never comes, and is no panic");
    }
}
