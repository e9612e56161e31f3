//! Learning-rate schedules: a pure function of the number of optimizer steps
//! taken, so a resumed run gets the same learning rate as an unbroken one
//! (PyTorch's closed forms, not its recursive `step()` updates).

use super::widen;
use crate::error::{Error, Result};

const CONFIG_SOURCE: &str = "lr schedule config";

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScheduleKind {
    /// `base_lr` throughout.
    Constant,
    /// `torch.optim.lr_scheduler.StepLR`: `base_lr * gamma^floor(s / step_size)`.
    Step { step_size: u64, gamma: f32 },
    /// `torch.optim.lr_scheduler.CosineAnnealingLR` with `T_max` the steps
    /// after warmup, held at `eta_min` once it is reached (PyTorch's would
    /// climb back up).
    Cosine { eta_min: f32 },
}

/// A schedule of `total_steps` optimizer steps, the first `warmup_steps` of
/// them a linear warmup to `base_lr`.
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    pub base_lr: f32,
    pub kind: ScheduleKind,
    pub warmup_steps: u64,
    pub total_steps: u64,
}

impl LrSchedule {
    /// Refuses schedules whose `lr_at` would be meaningless: a negative or
    /// non-finite rate, `step_size == 0`, a cosine with no steps after warmup.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, msg: String| Err(Error::config(CONFIG_SOURCE, key, msg));
        let non_negative = |x: f32| x.is_finite() && x >= 0.0;
        if !non_negative(self.base_lr) {
            return bad(
                "lr",
                format!("Invalid learning rate: {} (must be a finite number >= 0)", self.base_lr),
            );
        }
        match self.kind {
            ScheduleKind::Constant => {}
            ScheduleKind::Step { step_size, gamma } => {
                if step_size == 0 {
                    return bad("step_size", "step_size must be at least 1".to_string());
                }
                if !non_negative(gamma) {
                    return bad("gamma", format!("Invalid gamma: {gamma} (must be a finite number >= 0)"));
                }
            }
            ScheduleKind::Cosine { eta_min } => {
                if !non_negative(eta_min) {
                    return bad(
                        "eta_min",
                        format!("Invalid eta_min: {eta_min} (must be a finite number >= 0)"),
                    );
                }
            }
        }
        Ok(())
    }

    /// The learning rate for the update after `step` updates (0-based).
    ///
    /// Warmup: for `step < warmup_steps` the rate is
    /// `base_lr * (step + 1) / warmup_steps`, so the first update already
    /// moves the weights (a 0-based ramp `step / warmup_steps` would waste it
    /// at rate 0) and the last warmup step reaches `base_lr` exactly.
    ///
    /// After warmup, with `s = step - warmup_steps` and
    /// `T = total_steps - warmup_steps`: Constant gives `base_lr`; Step gives
    /// `base_lr * gamma^floor(s / step_size)`; Cosine gives
    /// `eta_min + (base_lr - eta_min) * (1 + cos(pi * s / T)) / 2` for `s < T`
    /// and `eta_min` from then on.
    ///
    /// Computed in f64 from the values as written in the config (as PyTorch's
    /// Python-side schedulers do), then rounded once. On a schedule that
    /// [`LrSchedule::validate`] refuses, it still returns a number without
    /// panicking (no decay for `step_size == 0`, `eta_min` for an empty cosine).
    pub fn lr_at(&self, step: u64) -> f32 {
        self.lr_at_f64(step) as f32
    }

    fn lr_at_f64(&self, step: u64) -> f64 {
        let base = widen(self.base_lr);
        if step < self.warmup_steps {
            return base * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let s = step - self.warmup_steps;
        match self.kind {
            ScheduleKind::Constant => base,
            ScheduleKind::Step { step_size, gamma } => match s.checked_div(step_size) {
                Some(k) => base * widen(gamma).powf(k as f64),
                None => base,
            },
            ScheduleKind::Cosine { eta_min } => {
                let eta_min = widen(eta_min);
                let t_max = self.total_steps.saturating_sub(self.warmup_steps);
                if s >= t_max {
                    eta_min
                } else {
                    let cos = (std::f64::consts::PI * s as f64 / t_max as f64).cos();
                    eta_min + (base - eta_min) * (1.0 + cos) / 2.0
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_shorter_than_the_warmup_ends_inside_it() {
        // A shortened run (--set train.max_steps=4) keeps the configured warmup ramp.
        let s = schedule(ScheduleKind::Cosine { eta_min: 0.0 }, 100, 4);
        assert!(s.validate().is_ok());
        assert!((s.lr_at(3) - 0.004).abs() < 1e-9, "{}", s.lr_at(3));
    }

    fn schedule(kind: ScheduleKind, warmup_steps: u64, total_steps: u64) -> LrSchedule {
        LrSchedule { base_lr: 0.1, kind, warmup_steps, total_steps }
    }

    fn close(a: f32, b: f64) -> bool {
        (f64::from(a) - b).abs() <= 1e-7 * b.abs().max(1e-3)
    }

    #[test]
    fn warmup_is_linear_from_one_step_and_reaches_base() {
        let s = schedule(ScheduleKind::Constant, 4, 100);
        let got: Vec<f32> = (0..6).map(|k| s.lr_at(k)).collect();
        let want = [0.025, 0.05, 0.075, 0.1, 0.1, 0.1];
        for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(close(g, w), "step {k}: {g} vs {w}");
        }
        assert!(s.lr_at(0) > 0.0);
    }

    #[test]
    fn no_warmup_starts_at_base() {
        let s = schedule(ScheduleKind::Constant, 0, 10);
        assert_eq!(s.lr_at(0), 0.1);
        assert_eq!(s.lr_at(1_000_000), 0.1);
    }

    #[test]
    fn step_decay_changes_exactly_at_boundaries() {
        let s = schedule(ScheduleKind::Step { step_size: 3, gamma: 0.5 }, 2, 100);
        // Steps 0,1 warm up; decay counts from step 2.
        let want = [(0, 0.05), (1, 0.1), (2, 0.1), (4, 0.1), (5, 0.05), (7, 0.05), (8, 0.025), (11, 0.0125)];
        for (k, w) in want {
            assert!(close(s.lr_at(k), w), "step {k}: {} vs {w}", s.lr_at(k));
        }
    }

    /// nanoGPT's `get_lr(it)` (train.py), transcribed.
    fn nanogpt_get_lr(
        it: u64,
        learning_rate: f64,
        warmup_iters: u64,
        lr_decay_iters: u64,
        min_lr: f64,
    ) -> f64 {
        if it < warmup_iters {
            return learning_rate * (it + 1) as f64 / (warmup_iters + 1) as f64;
        }
        if it > lr_decay_iters {
            return min_lr;
        }
        let decay_ratio = (it - warmup_iters) as f64 / (lr_decay_iters - warmup_iters) as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * decay_ratio).cos());
        min_lr + coeff * (learning_rate - min_lr)
    }

    #[test]
    fn warmup_and_cosine_compose_as_nanogpts_get_lr() {
        // configs/gpt_sotu_o2.toml's: lr 1e-3, warmup 100, cosine to 1e-4
        // over max_steps (nanoGPT's lr_decay_iters = max_iters) = 2000.
        let s = LrSchedule {
            base_lr: 1e-3,
            kind: ScheduleKind::Cosine { eta_min: 1e-4 },
            warmup_steps: 100,
            total_steps: 2000,
        };
        for it in 0..2100 {
            let want = nanogpt_get_lr(it, 1e-3, 100, 2000, 1e-4);
            // The warmup ramp reaches lr at step warmup - 1 where nanoGPT's
            // reaches lr * warmup / (warmup + 1): a ratio of (warmup + 1) / warmup.
            let want = if it < 100 { want * 101.0 / 100.0 } else { want };
            let got = s.lr_at_f64(it);
            assert!((got - want).abs() <= 1e-15, "it {it}: {got} vs nanoGPT's {want}");
        }
    }

    #[test]
    fn cosine_endpoints_midpoint_and_clamp() {
        let s = schedule(ScheduleKind::Cosine { eta_min: 0.001 }, 10, 110);
        assert!(close(s.lr_at(10), 0.1), "start {}", s.lr_at(10));
        assert!(close(s.lr_at(60), 0.001 + 0.099 / 2.0), "midpoint {}", s.lr_at(60));
        let quarter = 0.001 + 0.099 * (1.0 + (std::f64::consts::PI / 4.0).cos()) / 2.0;
        assert!(close(s.lr_at(35), quarter), "quarter {}", s.lr_at(35));
        assert!(close(
            s.lr_at(109),
            0.001 + 0.099 * (1.0 + (std::f64::consts::PI * 99.0 / 100.0).cos()) / 2.0
        ));
        assert_eq!(s.lr_at(110), 0.001);
        assert_eq!(s.lr_at(10_000), 0.001);
        // Strictly decreasing over the annealing.
        for k in 10..110 {
            assert!(s.lr_at(k + 1) < s.lr_at(k), "step {k}");
        }
    }

    #[test]
    fn lr_is_a_pure_function_of_the_step() {
        let s = schedule(ScheduleKind::Cosine { eta_min: 0.0 }, 5, 50);
        let forward: Vec<f32> = (0..60).map(|k| s.lr_at(k)).collect();
        let backward: Vec<f32> = (0..60).rev().map(|k| s.lr_at(k)).collect();
        assert!(forward.iter().eq(backward.iter().rev()));
        // A "resumed" copy agrees bit for bit.
        let resumed = s.clone();
        assert!((30..60).all(|k| resumed.lr_at(k).to_bits() == forward[k as usize].to_bits()));
    }

    #[test]
    fn validate_refuses_meaningless_schedules() {
        let cases = [
            (
                LrSchedule { base_lr: -0.1, ..schedule(ScheduleKind::Constant, 0, 10) },
                "Invalid learning rate: -0.1",
            ),
            (
                schedule(ScheduleKind::Step { step_size: 0, gamma: 0.1 }, 0, 10),
                "step_size must be at least 1",
            ),
            (schedule(ScheduleKind::Step { step_size: 1, gamma: f32::NAN }, 0, 10), "Invalid gamma: NaN"),
            (schedule(ScheduleKind::Cosine { eta_min: -1.0 }, 0, 10), "Invalid eta_min: -1"),
        ];
        for (s, want) in cases {
            let err = s.validate().expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
        assert!(schedule(ScheduleKind::Cosine { eta_min: 0.0 }, 10, 11).validate().is_ok());
        // Refused schedules still give a number rather than panicking.
        assert_eq!(schedule(ScheduleKind::Step { step_size: 0, gamma: 0.1 }, 0, 10).lr_at(5), 0.1);
        assert_eq!(schedule(ScheduleKind::Cosine { eta_min: 0.0 }, 10, 10).lr_at(10), 0.0);
    }
}
