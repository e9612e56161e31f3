//! Active waiting for the CPU step's thread pool, as OpenMP's default
//! (libgomp spins a while before it sleeps; `OMP_WAIT_POLICY=passive`
//! turns that off, and does here too).
//!
//! A step is a dozen parallel ops with short serial stretches between them
//! (allocations, the filter transforms, the classifier, the optimizer). A
//! rayon worker that finds no work spins for a few dozen microseconds, then
//! sleeps, and waking it costs more than that: in a VM, a sleeping worker
//! missed 29% of a step (`perf sched`), while the thread that forked each
//! op ran its tasks alone. So while a step runs, every other worker polls
//! the pool for work instead of sleeping, for up to [`MAX_IDLE`] at a time.

use rayon::Yield;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a polling worker goes without finding work before it gives up
/// and lets rayon put it to sleep: longer than a step's serial stretches
/// (at most a few hundred microseconds on MNIST's ConvNet), short enough
/// that a wait on data or on a peer does not burn a core for long.
pub const MAX_IDLE: Duration = Duration::from_millis(1);

/// Keeps the current pool's other workers polling. Cheap to call per step:
/// it starts pollers only where none runs.
#[derive(Debug, Default)]
pub struct ActiveWait {
    passive: bool,
    /// Whether pollers run (the last one out clears it).
    polling: Arc<AtomicBool>,
}

impl ActiveWait {
    /// An `ActiveWait` that never polls when `OMP_WAIT_POLICY` says
    /// `passive`.
    pub fn from_env() -> Self {
        Self::with_policy(std::env::var("OMP_WAIT_POLICY").ok().as_deref())
    }

    /// `OMP_WAIT_POLICY`'s value as OpenMP reads it: `passive` (any case)
    /// turns polling off; `active`, anything else or nothing leaves it on.
    fn with_policy(policy: Option<&str>) -> Self {
        let passive = policy.is_some_and(|v| v.trim().eq_ignore_ascii_case("passive"));
        ActiveWait { passive, polling: Arc::default() }
    }

    /// Starts a poller on every other worker of the current pool, unless
    /// they still run (or the policy is passive). Call it on a pool worker
    /// with no parallel op in flight: each poller then starts at the bottom
    /// of its worker's stack, so nothing it runs waits below it.
    pub fn arm(&self) {
        let Some(me) = rayon::current_thread_index() else { return };
        if self.passive || rayon::current_num_threads() < 2 || self.polling.swap(true, Ordering::AcqRel) {
            return;
        }
        let polling = self.polling.clone();
        let left = Arc::new(AtomicUsize::new(rayon::current_num_threads() - 1));
        rayon::spawn_broadcast(move |ctx| {
            if ctx.index() == me {
                return;
            }
            poll(MAX_IDLE);
            // The last poller out lets the next `arm` start new ones.
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                polling.store(false, Ordering::Release);
            }
        });
    }
}

/// Runs the pool's pending jobs until none has come for `max_idle`.
fn poll(max_idle: Duration) {
    let mut idle_since: Option<Instant> = None;
    let mut spins = 0u32;
    loop {
        match rayon::yield_now() {
            Some(Yield::Executed) => idle_since = None,
            Some(Yield::Idle) => {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                // The clock, every 64 empty polls: a few microseconds apart.
                if spins.is_multiple_of(64)
                    && idle_since.get_or_insert_with(Instant::now).elapsed() >= max_idle
                {
                    return;
                }
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn pool(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("a test pool")
    }

    #[test]
    fn pollers_stop_after_max_idle_and_can_be_armed_again() {
        pool(2).install(|| {
            let w = ActiveWait::default();
            for _ in 0..3 {
                w.arm();
                assert!(w.polling.load(Ordering::Acquire), "arm started no poller");
                let sum: u64 = (0..10_000u64).into_par_iter().sum();
                assert_eq!(sum, 49_995_000);
                let deadline = Instant::now() + Duration::from_secs(5);
                while w.polling.load(Ordering::Acquire) {
                    assert!(Instant::now() < deadline, "the poller did not stop after {MAX_IDLE:?} idle");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
    }

    #[test]
    fn one_thread_and_the_passive_policy_start_nothing() {
        pool(1).install(|| {
            let w = ActiveWait::default();
            w.arm();
            assert!(!w.polling.load(Ordering::Acquire));
        });
        // Outside any pool: nothing to keep awake.
        let w = ActiveWait::default();
        w.arm();
        assert!(!w.polling.load(Ordering::Acquire));
        for (policy, passive) in
            [(Some("PASSIVE"), true), (Some(" passive "), true), (Some("active"), false), (None, false)]
        {
            assert_eq!(ActiveWait::with_policy(policy).passive, passive, "OMP_WAIT_POLICY={policy:?}");
        }
        pool(2).install(|| {
            let w = ActiveWait::with_policy(Some("passive"));
            w.arm();
            assert!(!w.polling.load(Ordering::Acquire));
        });
    }

    #[test]
    fn nested_parallel_work_finishes_while_pollers_run() {
        pool(2).install(|| {
            let w = ActiveWait::default();
            for i in 0..200u64 {
                w.arm();
                let v: Vec<u64> =
                    (0..64u64).into_par_iter().map(|j| (0..j).into_par_iter().sum::<u64>() + i).collect();
                assert_eq!(v[63], 1953 + i);
            }
        });
    }
}
