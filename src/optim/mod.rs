//! Optimizers (SGD, Adam, AdamW) and learning-rate schedules, on flat f32
//! slices: one slice per parameter tensor, in the model's registration order.
//!
//! The update rules are PyTorch's single-tensor (`foreach=False`) formulas,
//! op for op, so a run here stays within an ulp or so of the same run under
//! `torch.optim` in f32:
//! - every scalar PyTorch computes in Python (`1 - dampening`, `lr / (1 -
//!   beta1**t)`, ...) is computed here in f64 and rounded to f32 once, where
//!   PyTorch hands it to a kernel;
//! - where PyTorch's vectorized CPU kernels fuse a multiply-add
//!   (`add(.., alpha=)` and `lerp`), so do we (`mul_add`); elsewhere
//!   (`mul`, `addcmul`, `addcdiv`, `div`, `sqrt`) the ops round one by one, in
//!   PyTorch's order.
//!
//! State is explicit ([`ParamState`]) and named as in PyTorch's
//! `optimizer.state_dict()` (`momentum_buffer`, `exp_avg`, `exp_avg_sq`), so a
//! checkpoint can store and restore it ([`Optimizer::state_tensors`],
//! [`Optimizer::load_state_tensors`]).

mod adam;
pub mod cuda;
mod master;
pub mod schedule;
mod sgd;
#[cfg(test)]
mod tests;

pub use master::{step_in_place, MasterWeights};
pub use schedule::{LrSchedule, ScheduleKind};

use std::path::Path;

use crate::error::{Error, Result};
use rayon::prelude::*;

/// The `file` of the config errors raised here: the optimizer sees values, not
/// the file they came from, so the config loader may re-label these.
const CONFIG_SOURCE: &str = "optimizer config";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    Sgd,
    Adam,
    AdamW,
}

impl OptimizerKind {
    fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "SGD",
            OptimizerKind::Adam => "Adam",
            OptimizerKind::AdamW => "AdamW",
        }
    }
}

/// Hyperparameters, as the arguments of the PyTorch constructors. Fields a
/// kind does not use are ignored (`momentum`, `dampening`, `nesterov` for
/// Adam/AdamW; `betas`, `eps` for SGD).
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerConfig {
    pub kind: OptimizerKind,
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    pub betas: (f32, f32),
    pub eps: f32,
}

impl OptimizerConfig {
    /// `torch.optim.SGD(params, lr)` defaults: no momentum, no weight decay.
    pub fn sgd(lr: f32) -> Self {
        OptimizerConfig {
            kind: OptimizerKind::Sgd,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            betas: (0.9, 0.999),
            eps: 1e-8,
        }
    }

    /// `torch.optim.Adam(params, lr)` defaults: betas (0.9, 0.999), eps 1e-8,
    /// weight_decay 0.
    pub fn adam(lr: f32) -> Self {
        OptimizerConfig { kind: OptimizerKind::Adam, ..Self::sgd(lr) }
    }

    /// `torch.optim.AdamW(params, lr)` defaults: as Adam but weight_decay 0.01.
    pub fn adamw(lr: f32) -> Self {
        OptimizerConfig { kind: OptimizerKind::AdamW, weight_decay: 0.01, ..Self::sgd(lr) }
    }

    /// The checks of the PyTorch constructors, plus: NaN and infinity are
    /// refused everywhere (PyTorch lets some through, e.g. SGD's `lr=nan`).
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, msg: String| Err(Error::config(CONFIG_SOURCE, key, msg));
        let non_negative = |x: f32| x.is_finite() && x >= 0.0;
        if !non_negative(self.lr) {
            return bad("lr", format!("Invalid learning rate: {} (must be a finite number >= 0)", self.lr));
        }
        if !non_negative(self.weight_decay) {
            return bad(
                "weight_decay",
                format!("Invalid weight_decay value: {} (must be a finite number >= 0)", self.weight_decay),
            );
        }
        match self.kind {
            OptimizerKind::Sgd => {
                if !non_negative(self.momentum) {
                    return bad(
                        "momentum",
                        format!("Invalid momentum value: {} (must be a finite number >= 0)", self.momentum),
                    );
                }
                if !self.dampening.is_finite() {
                    return bad("dampening", format!("Invalid dampening value: {}", self.dampening));
                }
                if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
                    return bad(
                        "nesterov",
                        format!(
                            "Nesterov momentum requires a momentum and zero dampening \
                             (momentum = {}, dampening = {})",
                            self.momentum, self.dampening
                        ),
                    );
                }
            }
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                if !non_negative(self.eps) {
                    return bad(
                        "eps",
                        format!("Invalid epsilon value: {} (must be a finite number >= 0)", self.eps),
                    );
                }
                for (index, beta) in [self.betas.0, self.betas.1].into_iter().enumerate() {
                    if !(beta.is_finite() && (0.0..1.0).contains(&beta)) {
                        return bad(
                            "betas",
                            format!("Invalid beta parameter at index {index}: {beta} (must be in [0, 1))"),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// The f64 a Python user would have written for an f32 config value.
///
/// PyTorch keeps hyperparameters as Python floats, so `betas=(0.9, 0.999)`
/// means the f64 nearest 0.9, while the config holds the f32 nearest 0.9.
/// Formatting the f32 gives the shortest decimal that reads back as it
/// ("0.9"), and parsing that as f64 recovers PyTorch's value for any number
/// written with up to 7 significant digits; for other numbers it is the f32's
/// value to within its own rounding, which is as good as widening.
pub(crate) fn widen(x: f32) -> f64 {
    x.to_string().parse::<f64>().unwrap_or(f64::from(x))
}

/// One parameter tensor's optimizer state, named as in PyTorch's state_dict.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamState {
    /// SGD: PyTorch creates the momentum buffer on the first step (as a copy
    /// of the gradient), and never when `momentum == 0`.
    Sgd { momentum_buffer: Option<Vec<f32>> },
    /// Adam and AdamW: first and second moment running averages. PyTorch
    /// allocates them as zeros on the first step; allocating them up front is
    /// the same computation.
    Adam { exp_avg: Vec<f32>, exp_avg_sq: Vec<f32> },
}

/// An optimizer over a fixed list of parameter tensors.
#[derive(Debug, Clone)]
pub struct Optimizer {
    cfg: OptimizerConfig,
    param_sizes: Vec<usize>,
    state: Vec<ParamState>,
    step_count: u64,
    /// Per parameter: whether `weight_decay` applies (nanoGPT's two param
    /// groups, the second with `weight_decay=0.0`); all by default.
    decay: Vec<bool>,
}

impl Optimizer {
    /// Validates `cfg` as the PyTorch constructor would; `param_sizes[i]` is
    /// the element count of parameter tensor `i`.
    pub fn new(cfg: OptimizerConfig, param_sizes: &[usize]) -> Result<Self> {
        cfg.validate()?;
        if param_sizes.is_empty() {
            return Err(Error::shape("optimizer got an empty parameter list"));
        }
        let state = param_sizes.iter().map(|&n| Self::initial_state(cfg.kind, n)).collect();
        let decay = vec![true; param_sizes.len()];
        Ok(Optimizer { cfg, param_sizes: param_sizes.to_vec(), state, step_count: 0, decay })
    }

    /// Weight decay on parameter `i` only where `decay[i]`: PyTorch's param
    /// groups `[{params: decayed, weight_decay}, {params: rest, weight_decay: 0.0}]`,
    /// as nanoGPT's `configure_optimizers` builds them.
    pub fn with_decay_mask(mut self, decay: &[bool]) -> Result<Self> {
        if decay.len() != self.param_sizes.len() {
            return Err(Error::shape(format!(
                "weight decay mask has {} entries for {} parameters",
                decay.len(),
                self.param_sizes.len()
            )));
        }
        self.decay = decay.to_vec();
        Ok(self)
    }

    /// Per parameter: whether weight decay applies to it.
    pub fn decay(&self) -> &[bool] {
        &self.decay
    }

    /// Whether every parameter is decayed (the one group PyTorch builds from `model.parameters()`).
    pub fn decays_every_param(&self) -> bool {
        self.cfg.weight_decay == 0.0 || self.decay.iter().all(|&d| d)
    }

    fn initial_state(kind: OptimizerKind, n: usize) -> ParamState {
        match kind {
            OptimizerKind::Sgd => ParamState::Sgd { momentum_buffer: None },
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                ParamState::Adam { exp_avg: vec![0.0; n], exp_avg_sq: vec![0.0; n] }
            }
        }
    }

    pub fn config(&self) -> &OptimizerConfig {
        &self.cfg
    }

    pub fn param_sizes(&self) -> &[usize] {
        &self.param_sizes
    }

    /// Per-parameter state, in parameter order.
    pub fn state(&self) -> &[ParamState] {
        &self.state
    }

    /// Updates taken so far (Adam's `state['step']`, shared by all tensors
    /// because they always step together).
    pub fn step_count(&self) -> u64 {
        self.step_count
    }

    /// One update of every parameter. `params[i]` and `grads[i]` have
    /// `param_sizes[i]` elements; `lr` comes from the schedule and replaces
    /// `cfg.lr` for this step. Everything is checked before anything is
    /// written, so an error leaves parameters and state untouched. Tensors
    /// update side by side on the pool: each update is elementwise, so the
    /// bits do not depend on it.
    pub fn step(&mut self, params: &mut [&mut [f32]], grads: &[&[f32]], lr: f32) -> Result<()> {
        self.check_step_args(params, grads, lr)?;
        let cfg = &self.cfg;
        let lr = widen(lr);
        let weight_decay = widen(cfg.weight_decay);
        match cfg.kind {
            OptimizerKind::Sgd => {
                let hp = |wd| {
                    sgd::SgdScalars::new(lr, widen(cfg.momentum), widen(cfg.dampening), cfg.nesterov, wd)
                };
                let groups = [hp(0.0), hp(weight_decay)];
                let params = params.par_iter_mut().zip(grads).zip(&self.decay);
                params.zip(&mut self.state).for_each(|(((param, grad), &decay), state)| {
                    if let ParamState::Sgd { momentum_buffer } = state {
                        sgd::update(param, grad, momentum_buffer, &groups[usize::from(decay)]);
                    }
                });
            }
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                let hp = |wd| {
                    adam::AdamScalars::new(
                        lr,
                        (widen(cfg.betas.0), widen(cfg.betas.1)),
                        widen(cfg.eps),
                        wd,
                        cfg.kind == OptimizerKind::AdamW,
                        self.step_count + 1,
                    )
                };
                let groups = [hp(0.0), hp(weight_decay)];
                let params = params.par_iter_mut().zip(grads).zip(&self.decay);
                params.zip(&mut self.state).for_each(|(((param, grad), &decay), state)| {
                    if let ParamState::Adam { exp_avg, exp_avg_sq } = state {
                        adam::update(param, grad, exp_avg, exp_avg_sq, &groups[usize::from(decay)]);
                    }
                });
            }
        }
        self.step_count += 1;
        Ok(())
    }

    fn check_step_args(&self, params: &[&mut [f32]], grads: &[&[f32]], lr: f32) -> Result<()> {
        let n = self.param_sizes.len();
        if params.len() != n || grads.len() != n {
            return Err(Error::shape(format!(
                "optimizer step: got {} parameter tensors and {} gradients, expected {n} of each",
                params.len(),
                grads.len()
            )));
        }
        for (i, &size) in self.param_sizes.iter().enumerate() {
            for (what, len) in [("parameter", params[i].len()), ("gradient", grads[i].len())] {
                if len != size {
                    return Err(Error::shape(format!(
                        "optimizer step: {what} {i} has {len} elements, expected {size}"
                    )));
                }
            }
        }
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::Training(format!(
                "learning rate {lr} for step {} is not a finite number >= 0",
                self.step_count + 1
            )));
        }
        Ok(())
    }

    /// The state a checkpoint must hold, as (PyTorch state name, parameter
    /// index, values), in parameter order. SGD without momentum has none, and
    /// SGD with momentum has none before its first step (as in PyTorch).
    pub fn state_tensors(&self) -> Vec<(&'static str, usize, &[f32])> {
        let mut out = Vec::new();
        for (i, state) in self.state.iter().enumerate() {
            match state {
                ParamState::Sgd { momentum_buffer: Some(buf) } => {
                    out.push(("momentum_buffer", i, buf.as_slice()))
                }
                ParamState::Sgd { momentum_buffer: None } => {}
                ParamState::Adam { exp_avg, exp_avg_sq } => {
                    out.push(("exp_avg", i, exp_avg.as_slice()));
                    out.push(("exp_avg_sq", i, exp_avg_sq.as_slice()));
                }
            }
        }
        out
    }

    /// The names of the state tensors each parameter has after `step_count`
    /// steps (what `state_tensors` returns then).
    fn expected_names(&self, step_count: u64) -> &'static [&'static str] {
        match self.cfg.kind {
            OptimizerKind::Sgd if self.cfg.momentum != 0.0 && step_count > 0 => &["momentum_buffer"],
            OptimizerKind::Sgd => &[],
            OptimizerKind::Adam | OptimizerKind::AdamW => &["exp_avg", "exp_avg_sq"],
        }
    }

    /// Inverse of [`Optimizer::state_tensors`]: restores the state and step
    /// count of a checkpoint read from `source` (named in errors). The set of
    /// tensors must be exactly the one `state_tensors` gives after
    /// `step_count` steps; on any error nothing is changed.
    pub fn load_state_tensors(
        &mut self,
        source: &Path,
        step_count: u64,
        tensors: &[(&str, usize, &[f32])],
    ) -> Result<()> {
        let fail = |msg: String| Err(Error::Checkpoint { path: source.to_path_buf(), msg });
        let kind = self.cfg.kind.name();
        let names = self.expected_names(step_count);
        let n = self.param_sizes.len();
        // found[i][k]: the values given for parameter i, state names[k].
        let mut found: Vec<Vec<Option<&[f32]>>> = vec![vec![None; names.len()]; n];
        for &(name, index, values) in tensors {
            let Some(k) = names.iter().position(|&known| known == name) else {
                let expected = if names.is_empty() { "none".to_string() } else { names.join(", ") };
                return fail(format!(
                    "unexpected optimizer state `{name}` for parameter {index}: this {kind} optimizer \
                     (momentum {}) after {step_count} steps has state: {expected}",
                    self.cfg.momentum
                ));
            };
            if index >= n {
                return fail(format!(
                    "optimizer state `{name}` for parameter {index}, but the model has {n}"
                ));
            }
            if values.len() != self.param_sizes[index] {
                return fail(format!(
                    "optimizer state `{name}` for parameter {index} has {} elements, expected {}",
                    values.len(),
                    self.param_sizes[index]
                ));
            }
            if found[index][k].replace(values).is_some() {
                return fail(format!("optimizer state `{name}` for parameter {index} is given twice"));
            }
        }
        let mut state = Vec::with_capacity(n);
        for (i, slots) in found.iter().enumerate() {
            if let Some(k) = slots.iter().position(Option::is_none) {
                return fail(format!(
                    "missing optimizer state `{}` for parameter {i} ({kind} after {step_count} steps)",
                    names[k]
                ));
            }
            let owned = |k: usize| slots[k].map(<[f32]>::to_vec).unwrap_or_default();
            state.push(match self.cfg.kind {
                OptimizerKind::Sgd => {
                    ParamState::Sgd { momentum_buffer: (!slots.is_empty()).then(|| owned(0)) }
                }
                OptimizerKind::Adam | OptimizerKind::AdamW => {
                    ParamState::Adam { exp_avg: owned(0), exp_avg_sq: owned(1) }
                }
            });
        }
        self.state = state;
        self.step_count = step_count;
        Ok(())
    }
}
