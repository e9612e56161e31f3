//! `F.embedding(ids, weight)`: row `ids[i]` of `weight[num_embeddings, dim]`
//! for each id. Backward adds each output row's gradient into its id's row
//! of `weight.grad`, in id order per row of the output (a scatter-add done
//! serially in index order: no atomics, the same sum on every run).
//!
//! Token ids travel as f32 (exact below 2^24); f16 weights are widened and
//! the output rounded once.

pub mod cpu;
pub mod cuda;
#[cfg(test)]
mod tests;

use super::cpu_f32;
use super::half_emu::{any_f16, f32_acc, f32_of, store};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

const OP: &str = "embedding";

/// The ids in `x` as indices, each checked to be a whole number in `0..num_embeddings`.
pub fn ids(x: &Tensor, num_embeddings: usize) -> Result<Vec<usize>> {
    let v = x.to_f32_vec();
    v.iter()
        .enumerate()
        .map(|(i, &id)| {
            if id >= 0.0 && id.fract() == 0.0 && (id as usize) < num_embeddings {
                Ok(id as usize)
            } else {
                Err(Error::shape(format!(
                    "embedding: id {id} at position {i} is not in 0..{num_embeddings} (num_embeddings)"
                )))
            }
        })
        .collect()
}

fn dim(weight: &Tensor) -> Result<(usize, usize)> {
    match *weight.shape() {
        [v, c] => Ok((v, c)),
        _ => Err(Error::shape(format!(
            "embedding: weight must be [num_embeddings, dim], got {:?}",
            weight.shape()
        ))),
    }
}

/// `[ids.len(), dim]` rows of `weight` (ids already checked by [`ids`]).
pub fn forward(ids: &[usize], weight: &Tensor) -> Result<Tensor> {
    if any_f16([Some(weight)]) {
        return Ok(forward(ids, &f32_of(weight))?.into_dtype(weight.dtype()));
    }
    let (v, c) = dim(weight)?;
    if let Some(&bad) = ids.iter().find(|&&i| i >= v) {
        return Err(Error::shape(format!("embedding: id {bad} is not in 0..{v}")));
    }
    let w = cpu_f32(OP, "weight", weight)?;
    let mut y = vec![0f32; ids.len() * c];
    cpu::forward(c, ids, w, &mut y);
    Tensor::from_vec(&[ids.len(), c], y)
}

/// `weight.grad[ids[i]] += dy[i]` for every i, in order.
pub fn backward(ids: &[usize], dy: &Tensor, dweight: &mut Tensor) -> Result<()> {
    if any_f16([Some(dy), Some(&*dweight)]) {
        let mut dw = f32_acc(dweight);
        backward(ids, &f32_of(dy), &mut dw)?;
        return store(dweight, &dw);
    }
    let (v, c) = dim(dweight)?;
    dy.check_shape("embedding backward: dy", &[ids.len(), c])?;
    if let Some(&bad) = ids.iter().find(|&&i| i >= v) {
        return Err(Error::shape(format!("embedding backward: id {bad} is not in 0..{v}")));
    }
    let dys = cpu_f32(OP, "dy", dy)?;
    cpu::backward(c, ids, dys, dweight.as_f32_mut()?);
    Ok(())
}
