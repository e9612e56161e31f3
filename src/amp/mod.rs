//! Mixed precision with apex semantics: the opt-level [`Policy`], the
//! [`LossScaler`], the model cast, and [`Amp::step`], which turns the
//! (scaled) gradients backward left in the model into one optimizer step:
//! unscale + inf/NaN check in one pass, skip on overflow, clip the unscaled
//! gradients, step (on fp32 masters under O2), move the scale.

pub mod cuda;
mod policy;
mod scaler;
#[cfg(test)]
mod tests_policy;
#[cfg(test)]
mod tests_scaler;
#[cfg(test)]
mod tests_step;

pub use policy::Policy;
pub use scaler::{LossScaler, Overflow, ScalerConfig, ScalerState};

use crate::error::Result;
use crate::nn::layers::{AmpClass, BufferValue};
use crate::nn::{Model, Param, Precision, StateEntry, StateValue};
use crate::optim::{step_in_place, MasterWeights, Optimizer};
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

fn cast_param(p: &mut Param, dtype: DType) {
    if p.value.dtype() != dtype {
        p.value = p.value.to_dtype(dtype);
    }
    // A grad has its parameter's dtype (as `.grad` in PyTorch).
    if p.grad.dtype() != dtype {
        p.grad = p.grad.to_dtype(dtype);
    }
}

fn cast_tensor(t: &mut Tensor, dtype: DType) {
    if t.dtype() != dtype {
        *t = t.to_dtype(dtype);
    }
}

/// `model.half()` / `.float()` as the policy says: weights of conv and
/// linear layers to cast_model_type; BatchNorm's parameters and running
/// statistics to f32 when keep_batchnorm_fp32, else with the rest. O1 (no
/// cast_model_type) leaves the model fp32.
pub fn cast_model(model: &mut Model, policy: &Policy) {
    model.precision = Precision {
        input: policy.input_dtype(),
        patch_conv_linear: policy.patch_torch_functions.then_some(DType::F16),
    };
    for layer in &mut model.layers {
        let dt = match layer.kind.amp_class() {
            AmpClass::Fp16 | AmpClass::Fp32 => policy.param_dtype(false),
            AmpClass::BatchNorm => policy.param_dtype(true),
            // No parameters; nothing to cast.
            AmpClass::Passthrough | AmpClass::Promote => continue,
        };
        for p in &mut layer.weights.params {
            cast_param(p, dt);
        }
        for b in &mut layer.weights.buffers {
            if let BufferValue::Tensor(t) = &mut b.value {
                cast_tensor(t, dt);
            }
        }
    }
}

/// Gradient values per partial sum of [`total_grad_norm`]: fixed, so the
/// norm does not depend on the thread count.
const NORM_CHUNK: usize = 1 << 14;

/// The total L2 norm of all gradients together, accumulated in f64: what
/// `torch.nn.utils.clip_grad_norm_` returns. The one definition of the
/// gradient norm that traces, metrics and clipping share.
///
/// Each tensor is summed in chunks of [`NORM_CHUNK`] values on the pool,
/// each chunk in 8 f64 lanes (value `i` into lane `i % 8`, the lanes then
/// added in order), and the chunks' sums are added in order. One f64 sum
/// element after element was a chain of dependent adds, 5% of a baby GPT's
/// step with the other core idle. The squares are exact in f64, so only the
/// order of the adds differs from that sum, by an ulp or so of f64.
pub fn total_grad_norm<G: AsRef<[f32]> + Sync>(grads: &[G]) -> f32 {
    let parts: Vec<f64> = grads
        .par_iter()
        .flat_map_iter(|g| g.as_ref().chunks(NORM_CHUNK))
        .map(|chunk| {
            let mut lanes = [0f64; 8];
            let mut blocks = chunk.chunks_exact(8);
            for b in &mut blocks {
                for (l, &g) in lanes.iter_mut().zip(b) {
                    *l += f64::from(g) * f64::from(g);
                }
            }
            for (l, &g) in lanes.iter_mut().zip(blocks.remainder()) {
                *l += f64::from(g) * f64::from(g);
            }
            lanes.iter().sum::<f64>()
        })
        .collect();
    parts.iter().sum::<f64>().sqrt() as f32
}

/// `torch.nn.utils.clip_grad_norm_` (L2, with its 1e-6) over f32 gradients;
/// returns the total norm before clipping.
pub fn clip_grad_norm_(grads: &mut [Vec<f32>], max_norm: f32) -> f32 {
    let norm = total_grad_norm(grads);
    clip_to(grads, max_norm, norm);
    norm
}

/// Scales `grads` so their total norm `norm` is at most `max_norm`.
fn clip_to(grads: &mut [Vec<f32>], max_norm: f32, norm: f32) {
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        grads.par_iter_mut().flat_map_iter(|g| g.chunks_mut(NORM_CHUNK)).for_each(|c| {
            c.iter_mut().for_each(|g| *g *= coef);
        });
    }
}

/// What one [`Amp::step`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// Skipped for overflow: weights, optimizer state and schedule untouched.
    pub skipped: bool,
    /// The parameters with non-finite gradients (empty when clean).
    pub overflow: Overflow,
    /// The loss scale this step's gradients were computed with.
    pub loss_scale: f32,
    /// Total L2 norm of the unscaled gradients before clipping (what
    /// `clip_grad_norm_` returns), whether or not clipping is on; inf or NaN
    /// on a skipped step.
    pub grad_norm: f32,
}

/// The mixed-precision state of a run: policy, scaler, fp32 masters (O2),
/// and the f32 buffer the unscaled gradients land in.
pub struct Amp {
    pub policy: Policy,
    pub scaler: LossScaler,
    masters: Option<MasterWeights>,
    grads: Vec<Vec<f32>>,
}

impl Amp {
    /// Casts `model` per the policy and sets up masters and the scaler.
    pub fn new(policy: Policy, scaler: LossScaler, model: &mut Model) -> Self {
        cast_model(model, &policy);
        let masters = policy
            .uses_master_weights()
            .then(|| MasterWeights::new(&model.params().iter().map(|p| &p.value).collect::<Vec<_>>()));
        Amp { policy, scaler, masters, grads: Vec::new() }
    }

    pub fn loss_scale(&self) -> f32 {
        self.scaler.scale()
    }

    pub fn masters(&self) -> Option<&MasterWeights> {
        self.masters.as_ref()
    }

    pub fn masters_mut(&mut self) -> Option<&mut MasterWeights> {
        self.masters.as_mut()
    }

    /// The model's state_dict in fp32, with the fp32 masters (O2) in place
    /// of the f16-rounded weights: what apex users save, and what loads back
    /// into an fp32 model exactly.
    pub fn state_dict(&self, model: &Model) -> Result<Vec<StateEntry>> {
        let mut entries = model.state_dict()?;
        if let Some(m) = &self.masters {
            for (p, master) in model.params().iter().zip(m.masters()) {
                if let Some(e) = entries.iter_mut().find(|e| e.name == p.name) {
                    e.value = StateValue::F32(master.clone());
                }
            }
        }
        Ok(entries)
    }

    /// Optimizer step `step` (1-based, for messages) from the gradients in
    /// `model` (scaled by [`Amp::loss_scale`]). The caller zeroes the grads.
    pub fn step(
        &mut self,
        model: &mut Model,
        optimizer: &mut Optimizer,
        lr: f32,
        grad_clip_norm: Option<f32>,
        step: u64,
    ) -> Result<StepOutcome> {
        let loss_scale = self.scaler.scale();
        let overflow = {
            let params = model.params();
            let named: Vec<(&str, &Tensor)> = params.iter().map(|p| (p.name.as_str(), &p.grad)).collect();
            self.scaler.unscale(&named, &mut self.grads)
        };
        let grad_norm = total_grad_norm(&self.grads);
        if self.scaler.update(&overflow, step)? {
            return Ok(StepOutcome { skipped: true, overflow, loss_scale, grad_norm });
        }
        if let Some(max_norm) = grad_clip_norm {
            clip_to(&mut self.grads, max_norm, grad_norm);
        }
        let grads: Vec<&[f32]> = self.grads.iter().map(Vec::as_slice).collect();
        let mut params = model.params_mut();
        let mut values: Vec<&mut Tensor> = params.iter_mut().map(|p| &mut p.value).collect();
        match &mut self.masters {
            Some(m) => m.step(optimizer, &grads, lr, &mut values)?,
            None => step_in_place(optimizer, &mut values, &grads, lr)?,
        }
        Ok(StepOutcome { skipped: false, overflow, loss_scale, grad_norm })
    }
}
