//! Fully connected layer, PyTorch `F.linear` semantics: `y = x W^T + b` with
//! `W[out_features, in_features]`.

pub mod cpu;
pub mod cuda;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;

use super::half_emu::{any_f16, f32_of, grads_in_f32};
use super::{cpu_f32, cpu_f32_mut};
use crate::error::{Error, Result};
use crate::tensor::{written_by, DType, Tensor};
use std::sync::Arc;

const OP: &str = "linear";

/// `(batch, in_features, out_features)` once `x` and `weight` fit together.
fn dims(x: &Tensor, weight: &Tensor) -> Result<(usize, usize, usize)> {
    let &[n, in_f] = x.shape() else {
        return Err(Error::shape(format!(
            "linear: input must be 2-D [N, in_features], got shape {:?}",
            x.shape()
        )));
    };
    let &[out_f, w_in] = weight.shape() else {
        return Err(Error::shape(format!(
            "linear: weight must be 2-D [out_features, in_features], got shape {:?}",
            weight.shape()
        )));
    };
    if w_in != in_f {
        return Err(Error::shape(format!(
            "linear: weight {:?} expects {w_in} input features but input {:?} has {in_f}",
            weight.shape(),
            x.shape()
        )));
    }
    Ok((n, in_f, out_f))
}

/// `x[N, in]`, `weight[out, in]`, `bias[out]` -> `[N, out]`.
///
/// f16 operands: f16 inputs with f32 accumulation; the output takes `x`'s dtype.
pub fn forward(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if any_f16([Some(x), Some(weight), bias]) {
        let b = bias.map(f32_of);
        let y = forward(&f32_of(x), &f32_of(weight), b.as_deref())?;
        return Ok(y.into_dtype(x.dtype()));
    }
    let (n, in_f, out_f) = dims(x, weight)?;
    if let Some(b) = bias {
        b.check_shape("linear bias", &[out_f])?;
    }
    let xs = cpu_f32(OP, "input", x)?;
    let ws = cpu_f32(OP, "weight", weight)?;
    let bs = bias.map(|b| cpu_f32(OP, "bias", b)).transpose()?;
    // SAFETY: cpu::forward writes all n * out_f elements.
    let y = unsafe { written_by(n * out_f, |y| cpu::forward(n, in_f, out_f, xs, ws, bs, y)) };
    Tensor::from_vec(&[n, out_f], y)
}

/// Backward of [`forward`] for upstream gradient `dy[N, out]`. Adds into
/// `dweight` (`[out, in]`) and `dbias` (`[out]`), like PyTorch's `.grad`;
/// returns `dx` (`[N, in]`) when `need_dx`.
pub fn backward(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
    need_dx: bool,
) -> Result<Option<Tensor>> {
    if any_f16([Some(x), Some(weight), Some(dy), Some(&*dweight), dbias.as_deref()]) {
        let (x32, w32, dy32) = (f32_of(x), f32_of(weight), f32_of(dy));
        let dx = grads_in_f32(dweight, dbias, |dw, db| backward(&x32, &w32, &dy32, dw, db, need_dx))?;
        return Ok(dx.map(|d| d.into_dtype(x.dtype())));
    }
    let (n, in_f, out_f) = dims(x, weight)?;
    dy.check_shape("linear dy", &[n, out_f])?;
    dweight.check_shape("linear dweight", weight.shape())?;
    if let Some(db) = dbias.as_deref() {
        db.check_shape("linear dbias", &[out_f])?;
    }
    let xs = cpu_f32(OP, "input", x)?;
    let ws = cpu_f32(OP, "weight", weight)?;
    let dys = cpu_f32(OP, "dy", dy)?;
    let dws = cpu_f32_mut(OP, "dweight", dweight)?;
    let dbs = match dbias {
        Some(db) => Some(cpu_f32_mut(OP, "dbias", db)?),
        None => None,
    };
    if !need_dx {
        cpu::backward(n, in_f, out_f, xs, ws, dys, dws, dbs, None);
        return Ok(None);
    }
    // SAFETY: backward writes all n * in_f elements of dx.
    let dx =
        unsafe { written_by(n * in_f, |dx| cpu::backward(n, in_f, out_f, xs, ws, dys, dws, dbs, Some(dx))) };
    Tensor::from_vec(x.shape(), dx).map(Some)
}

/// [`backward`]'s parameter gradients, kept for later: the operands they
/// need, owned. Run on the CPU.
pub struct ParamGrads {
    /// The layer's input, in its own dtype (widened when the gradients run).
    x: Tensor,
    /// The upstream gradient, f32, shared with [`backward_input`].
    dy: Arc<Tensor>,
}

impl ParamGrads {
    /// Checks that `x`, `weight` and `dy` fit together and keeps `x` and
    /// `dy` (widened to f32 once, for both halves of the backward).
    pub fn new(x: Tensor, weight: &Tensor, dy: Tensor) -> Result<Self> {
        let (n, _, out_f) = dims(&x, weight)?;
        dy.check_shape("linear dy", &[n, out_f])?;
        Ok(ParamGrads { x, dy: Arc::new(dy.into_dtype(DType::F32)) })
    }

    /// The f32 upstream gradient, for [`backward_input`].
    pub fn dy(&self) -> Arc<Tensor> {
        self.dy.clone()
    }

    /// `dweight += dy^T x`, `dbias += sum_rows(dy)`: [`backward`]'s
    /// operations and roundings (f16 targets accumulate in f32 and round
    /// once), so the bits are the same whenever this runs.
    pub fn accumulate(self, dweight: &mut Tensor, dbias: Option<&mut Tensor>) -> Result<()> {
        let &[n, out_f] = self.dy.shape() else {
            return Err(Error::internal(format!("linear: dy of shape {:?} kept", self.dy.shape())));
        };
        let in_f = self.x.shape().get(1).copied().unwrap_or(0);
        dweight.check_shape("linear dweight", &[out_f, in_f])?;
        if let Some(db) = dbias.as_deref() {
            db.check_shape("linear dbias", &[out_f])?;
        }
        let x = f32_of(&self.x);
        let xs = cpu_f32(OP, "input", &x)?;
        let dys = cpu_f32(OP, "dy", &self.dy)?;
        grads_in_f32(dweight, dbias, |dw, db| {
            let dbs = db.map(|db| cpu_f32_mut(OP, "dbias", db)).transpose()?;
            cpu::backward_params(n, in_f, out_f, xs, dys, cpu_f32_mut(OP, "dweight", dw)?, dbs);
            Ok(())
        })
    }
}

/// [`backward`]'s input gradient alone, `dx = dy w`, for an input of
/// `shape` and `dtype` (the result's), from an f32 `dy` that
/// [`ParamGrads::new`] checked against them.
pub fn backward_input(dy: &Tensor, weight: &Tensor, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let (&[n, out_f], &[w_out, in_f]) = (dy.shape(), weight.shape()) else {
        return Err(Error::internal(format!("linear: dy {:?} and weight {:?}", dy.shape(), weight.shape())));
    };
    if w_out != out_f || n.checked_mul(in_f) != Some(shape.iter().product()) {
        return Err(Error::internal(format!(
            "linear: dy {:?}, weight {:?}, input {shape:?}",
            dy.shape(),
            weight.shape()
        )));
    }
    let w = f32_of(weight);
    let ws = cpu_f32(OP, "weight", &w)?;
    let dys = cpu_f32(OP, "dy", dy)?;
    // SAFETY: backward_input writes all n * in_f elements of dx.
    let dx = unsafe { written_by(n * in_f, |dx| cpu::backward_input(n, in_f, out_f, ws, dys, dx)) };
    Ok(Tensor::from_vec(shape, dx)?.into_dtype(dtype))
}
