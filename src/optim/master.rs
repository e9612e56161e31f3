//! fp32 master weights (apex O2): the optimizer updates f32 copies of the
//! weights with f32 gradients and f32 state, and the model gets the copies
//! rounded to its own dtype after every step. Without masters (O0, O1, O3)
//! the optimizer updates the model's tensors in their own dtype: f16 values
//! are widened, stepped in f32, and rounded back, so an update smaller than
//! half an f16 ulp is lost (which is what master weights are for).

use super::Optimizer;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

#[derive(Debug, Clone, PartialEq)]
pub struct MasterWeights {
    masters: Vec<Vec<f32>>,
}

impl MasterWeights {
    /// f32 copies of the model's parameter values (exact for f16).
    pub fn new(values: &[&Tensor]) -> Self {
        MasterWeights { masters: values.iter().map(|t| t.to_f32_vec()).collect() }
    }

    pub fn masters(&self) -> &[Vec<f32>] {
        &self.masters
    }

    /// Replaces the masters (checkpoint resume); sizes must match.
    pub fn load(&mut self, masters: Vec<Vec<f32>>) -> Result<()> {
        let fits = masters.len() == self.masters.len()
            && masters.iter().zip(&self.masters).all(|(a, b)| a.len() == b.len());
        if !fits {
            return Err(Error::shape(
                "master weights: the loaded tensors do not match the model's parameters",
            ));
        }
        self.masters = masters;
        Ok(())
    }

    /// One optimizer step on the masters, then the model's values become the
    /// masters rounded to the model's dtype.
    pub fn step(
        &mut self,
        optimizer: &mut Optimizer,
        grads: &[&[f32]],
        lr: f32,
        model_values: &mut [&mut Tensor],
    ) -> Result<()> {
        if model_values.len() != self.masters.len() {
            return Err(Error::shape(format!(
                "master weights: {} model parameters for {} masters",
                model_values.len(),
                self.masters.len()
            )));
        }
        let mut views: Vec<&mut [f32]> = self.masters.iter_mut().map(Vec::as_mut_slice).collect();
        optimizer.step(&mut views, grads, lr)?;
        // The f16 copies, tensors side by side on the pool.
        model_values
            .par_iter_mut()
            .zip(&self.masters)
            .try_for_each(|(value, master)| value.copy_from_f32(master))
    }
}

/// One optimizer step on the model's own tensors, whatever their dtype.
pub fn step_in_place(
    optimizer: &mut Optimizer,
    values: &mut [&mut Tensor],
    grads: &[&[f32]],
    lr: f32,
) -> Result<()> {
    if values.iter().all(|v| v.dtype() == DType::F32) {
        let mut views = values.iter_mut().map(|v| v.as_f32_mut()).collect::<Result<Vec<_>>>()?;
        return optimizer.step(&mut views, grads, lr);
    }
    let mut wide: Vec<Vec<f32>> = values.iter().map(|v| v.to_f32_vec()).collect();
    let mut views: Vec<&mut [f32]> = wide.iter_mut().map(Vec::as_mut_slice).collect();
    optimizer.step(&mut views, grads, lr)?;
    for (value, w) in values.iter_mut().zip(&wide) {
        value.copy_from_f32(w)?;
    }
    Ok(())
}
