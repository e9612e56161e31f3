//! The loss scaler: static (a fixed number) or dynamic (apex's
//! `LossScaler("dynamic")` / torch `GradScaler`): multiply the loss by the
//! scale before backward, unscale and check all gradients in one pass, skip
//! the step and back off on inf/NaN, grow after `growth_interval` clean steps.

use crate::config::{AmpConfig, LossScale};
use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, Tensor};
use rayon::prelude::*;

use super::Policy;

/// Dynamic scaler settings; defaults are torch GradScaler's / apex's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalerConfig {
    pub init_scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u64,
    pub min_loss_scale: f32,
    pub max_loss_scale: f32,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        ScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            min_loss_scale: 1.0,
            max_loss_scale: 16_777_216.0,
        }
    }
}

impl ScalerConfig {
    /// The `[amp]` scaler keys over the defaults, checked. Setting one when
    /// the loss scale is static is an error naming the key: it would do nothing.
    pub fn resolve(amp: &AmpConfig) -> Result<ScalerConfig> {
        let bad = |key: &str, msg: String| Err(Error::config(String::new(), format!("amp.{key}"), msg));
        let policy = Policy::resolve(amp)?;
        let given: [(&str, bool); 6] = [
            ("init_scale", amp.init_scale.is_some()),
            ("growth_factor", amp.growth_factor.is_some()),
            ("backoff_factor", amp.backoff_factor.is_some()),
            ("growth_interval", amp.growth_interval.is_some()),
            ("min_loss_scale", amp.min_loss_scale.is_some()),
            ("max_loss_scale", amp.max_loss_scale.is_some()),
        ];
        if let LossScale::Static(v) = policy.loss_scale {
            if let Some((key, _)) = given.iter().find(|(_, set)| *set) {
                return bad(
                    key,
                    format!(
                        "only applies to the dynamic loss scaler, but the loss scale is static ({v}) with {}; \
                         remove it or set amp.loss_scale = \"dynamic\"",
                        amp.opt_level
                    ),
                );
            }
        }
        let d = ScalerConfig::default();
        let c = ScalerConfig {
            init_scale: amp.init_scale.map_or(d.init_scale, |v| v as f32),
            growth_factor: amp.growth_factor.map_or(d.growth_factor, |v| v as f32),
            backoff_factor: amp.backoff_factor.map_or(d.backoff_factor, |v| v as f32),
            growth_interval: amp.growth_interval.unwrap_or(d.growth_interval),
            min_loss_scale: amp.min_loss_scale.map_or(d.min_loss_scale, |v| v as f32),
            max_loss_scale: amp.max_loss_scale.map_or(d.max_loss_scale, |v| v as f32),
        };
        let positive = |v: f32| v.is_finite() && v > 0.0;
        if !positive(c.min_loss_scale) {
            return bad("min_loss_scale", format!("must be a positive number, got {}", c.min_loss_scale));
        }
        if !positive(c.max_loss_scale) || c.max_loss_scale < c.min_loss_scale {
            return bad(
                "max_loss_scale",
                format!(
                    "must be a finite number >= min_loss_scale ({}), got {}",
                    c.min_loss_scale, c.max_loss_scale
                ),
            );
        }
        if !(positive(c.init_scale) && (c.min_loss_scale..=c.max_loss_scale).contains(&c.init_scale)) {
            return bad(
                "init_scale",
                format!(
                    "must lie in [min_loss_scale, max_loss_scale] = [{}, {}], got {}",
                    c.min_loss_scale, c.max_loss_scale, c.init_scale
                ),
            );
        }
        if !(c.growth_factor.is_finite() && c.growth_factor > 1.0) {
            return bad("growth_factor", format!("must be a number > 1, got {}", c.growth_factor));
        }
        if !(c.backoff_factor > 0.0 && c.backoff_factor < 1.0) {
            return bad("backoff_factor", format!("must be in (0, 1), got {}", c.backoff_factor));
        }
        if c.growth_interval == 0 {
            return bad("growth_interval", "must be at least 1".into());
        }
        Ok(c)
    }
}

/// What a checkpoint stores to resume the scaler exactly.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScalerState {
    pub scale: f32,
    /// Consecutive clean steps since the last growth or overflow.
    pub growth_tracker: u64,
    /// Steps skipped for overflow so far.
    pub overflow_steps: u64,
}

/// The result of one fused unscale + check pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Overflow {
    /// state_dict names of the parameters whose gradients held inf or NaN,
    /// in the order backward produced them (last layer first): the first
    /// name is where the overflow showed up first.
    pub params: Vec<String>,
}

impl Overflow {
    pub fn found(&self) -> bool {
        !self.params.is_empty()
    }

    /// At most `n` names, then how many more.
    pub fn describe(&self, n: usize) -> String {
        let shown = self.params.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
        match self.params.len().saturating_sub(n) {
            0 => shown,
            more => format!("{shown} and {more} more"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    dynamic: bool,
    cfg: ScalerConfig,
    state: ScalerState,
}

impl LossScaler {
    pub fn dynamic(cfg: ScalerConfig) -> Self {
        let state = ScalerState { scale: cfg.init_scale, growth_tracker: 0, overflow_steps: 0 };
        LossScaler { dynamic: true, cfg, state }
    }

    pub fn fixed(scale: f32) -> Self {
        let state = ScalerState { scale, growth_tracker: 0, overflow_steps: 0 };
        LossScaler { dynamic: false, cfg: ScalerConfig::default(), state }
    }

    /// The scaler a validated `[amp]` asks for.
    pub fn from_config(amp: &AmpConfig) -> Result<Self> {
        Ok(match Policy::resolve(amp)?.loss_scale {
            LossScale::Dynamic => Self::dynamic(ScalerConfig::resolve(amp)?),
            LossScale::Static(v) => Self::fixed(v as f32),
        })
    }

    pub fn is_dynamic(&self) -> bool {
        self.dynamic
    }

    pub fn config(&self) -> ScalerConfig {
        self.cfg
    }

    pub fn scale(&self) -> f32 {
        self.state.scale
    }

    pub fn state(&self) -> ScalerState {
        self.state
    }

    pub fn load_state(&mut self, state: ScalerState) {
        self.state = state;
    }

    /// [`LossScaler::load_state`] for a state read from a checkpoint: refused
    /// (with the reason) unless this dynamic scaler could have reached it.
    pub fn restore(&mut self, state: ScalerState) -> std::result::Result<(), String> {
        if !self.dynamic {
            return Err(format!(
                "it holds a dynamic loss-scaler state, but this run's loss scale is static ({})",
                self.state.scale
            ));
        }
        let c = &self.cfg;
        if !(state.scale.is_finite() && (c.min_loss_scale..=c.max_loss_scale).contains(&state.scale)) {
            return Err(format!(
                "its loss scale {} lies outside [amp.min_loss_scale, amp.max_loss_scale] = [{}, {}]",
                state.scale, c.min_loss_scale, c.max_loss_scale
            ));
        }
        if state.growth_tracker >= c.growth_interval {
            return Err(format!(
                "its loss scaler counted {} clean steps, but amp.growth_interval is {}",
                state.growth_tracker, c.growth_interval
            ));
        }
        self.state = state;
        Ok(())
    }

    /// One fused pass over every gradient: `out[i] = grads[i] / scale` in f32
    /// (widening f16 grads) and inf/NaN detection. `grads` are (state_dict
    /// name, gradient) in registration order; `out` is resized to fit.
    pub fn unscale(&self, grads: &[(&str, &Tensor)], out: &mut Vec<Vec<f32>>) -> Overflow {
        // torch's _amp_foreach_non_finite_check_and_unscale_: multiply by the
        // f32 reciprocal (exact for the power-of-two scales the dynamic scaler uses).
        let inv = 1.0f32 / self.state.scale;
        out.resize_with(grads.len(), Vec::new);
        // Tensors side by side on the pool (elementwise: the same bits).
        let non_finite: Vec<bool> = grads
            .par_iter()
            .zip(out.par_iter_mut())
            .map(|((_, g), dst)| {
                dst.resize(g.numel(), 0.0);
                // Non-finite values survive the multiply, so one check on the
                // unscaled value covers both; the `|` keeps the loop branch-free.
                let mut non_finite = false;
                match g.storage() {
                    CpuStorage::F32(src) => {
                        for (d, &s) in dst.iter_mut().zip(src) {
                            let v = s * inv;
                            non_finite |= !v.is_finite();
                            *d = v;
                        }
                    }
                    CpuStorage::F16(src) => {
                        for (d, &s) in dst.iter_mut().zip(src) {
                            let v = f32::from(s) * inv;
                            non_finite |= !v.is_finite();
                            *d = v;
                        }
                    }
                }
                non_finite
            })
            .collect();
        let mut bad: Vec<String> = grads
            .iter()
            .zip(non_finite)
            .filter(|(_, bad)| *bad)
            .map(|((name, _), _)| name.to_string())
            .collect();
        bad.reverse();
        Overflow { params: bad }
    }

    /// After the unscale pass of optimizer step `step` (1-based): returns
    /// whether to skip the step, and moves the scale. Overflow with a static
    /// scale, or a dynamic scale that would fall below `min_loss_scale`, is
    /// an error naming the step and the parameters: training on would only
    /// produce NaN weights.
    pub fn update(&mut self, overflow: &Overflow, step: u64) -> Result<bool> {
        let s = &mut self.state;
        if !overflow.found() {
            if self.dynamic {
                s.growth_tracker += 1;
                if s.growth_tracker >= self.cfg.growth_interval {
                    s.scale = (s.scale * self.cfg.growth_factor).min(self.cfg.max_loss_scale);
                    s.growth_tracker = 0;
                }
            }
            return Ok(false);
        }
        let who = overflow.describe(8);
        if !self.dynamic {
            return Err(Error::Training(format!(
                "step {step}: gradients of {who} are inf or NaN with the static loss scale {}; \
                 lower optimizer.lr, set train.grad_clip_norm, or use amp.loss_scale = \"dynamic\"",
                s.scale
            )));
        }
        let next = s.scale * self.cfg.backoff_factor;
        if next < self.cfg.min_loss_scale {
            return Err(Error::Training(format!(
                "step {step}: gradients of {who} are inf or NaN even at the minimum loss scale {} \
                 (amp.min_loss_scale); the model diverges rather than overflows: lower optimizer.lr \
                 or set train.grad_clip_norm",
                s.scale
            )));
        }
        s.scale = next;
        s.growth_tracker = 0;
        s.overflow_steps += 1;
        Ok(true)
    }
}
