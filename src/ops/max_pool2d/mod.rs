//! MaxPool2d like `nn.MaxPool2d(kernel_size, stride)`: no padding, floor mode,
//! returning PyTorch-style indices (flat argmax within each (n, c) plane).

pub mod cpu;
pub mod cuda;

use super::half_emu::{any_f16, f32_of};
use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, Storage, Tensor};
use cpu::Geometry;

fn unsupported(op: &str, t: &Tensor) -> Error {
    Error::Unsupported(format!("max_pool2d {op} on {:?} tensors (only CPU f32 is implemented)", t.dtype()))
}

fn nchw(op: &str, what: &str, shape: &[usize]) -> Result<[usize; 4]> {
    match *shape {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(Error::shape(format!(
            "max_pool2d {op}: expected a 4-D [N, C, H, W] {what}, got shape {shape:?}"
        ))),
    }
}

/// Checks everything `cpu::forward` relies on and returns the geometry.
fn geometry(op: &str, h: usize, w: usize, kernel_size: usize, stride: usize) -> Result<Geometry> {
    if kernel_size == 0 || stride == 0 {
        return Err(Error::shape(format!(
            "max_pool2d {op}: kernel_size and stride must be positive, \
             got kernel_size {kernel_size}, stride {stride}"
        )));
    }
    if kernel_size > h || kernel_size > w {
        return Err(Error::shape(format!(
            "max_pool2d {op}: kernel_size {kernel_size} is larger than the {h}x{w} input (H x W)"
        )));
    }
    if u32::try_from(h * w).is_err() {
        return Err(Error::shape(format!("max_pool2d {op}: a {h}x{w} plane is too large for u32 indices")));
    }
    Ok(Geometry { h, w, kernel: kernel_size, stride })
}

/// Returns the pooled tensor `[N, C, OH, OW]` and, per output element, the
/// flat index of the chosen input within its `H * W` plane.
pub fn forward(x: &Tensor, kernel_size: usize, stride: usize) -> Result<(Tensor, Vec<u32>)> {
    if any_f16([Some(x)]) {
        let (y, idx) = forward(&f32_of(x), kernel_size, stride)?;
        return Ok((y.into_dtype(x.dtype()), idx));
    }
    let [n, c, h, w] = nchw("forward", "input", x.shape())?;
    let g = geometry("forward", h, w, kernel_size, stride)?;
    let (oh, ow) = g.out_hw();
    match x.storage() {
        Storage::Cpu(CpuStorage::F32(xs)) => {
            let len = n * c * oh * ow;
            let mut y = vec![0.0f32; len];
            let mut idx = vec![0u32; len];
            cpu::forward(xs, g, &mut y, &mut idx);
            Ok((Tensor::from_vec(&[n, c, oh, ow], y)?, idx))
        }
        _ => Err(unsupported("forward", x)),
    }
}

/// Routes each output gradient to the input position its window selected.
pub fn backward(dy: &Tensor, indices: &[u32], x_shape: &[usize]) -> Result<Tensor> {
    if any_f16([Some(dy)]) {
        return Ok(backward(&f32_of(dy), indices, x_shape)?.into_dtype(dy.dtype()));
    }
    let [n, c, h, w] = nchw("backward", "x_shape", x_shape)?;
    let [dn, dc, oh, ow] = nchw("backward", "dy", dy.shape())?;
    if (dn, dc) != (n, c) || oh > h || ow > w {
        return Err(Error::shape(format!(
            "max_pool2d backward: dy of shape {:?} cannot come from an input of shape {x_shape:?}",
            dy.shape()
        )));
    }
    if indices.len() != dy.numel() {
        return Err(Error::shape(format!(
            "max_pool2d backward: {} indices for a dy of {} elements (shape {:?})",
            indices.len(),
            dy.numel(),
            dy.shape()
        )));
    }
    match dy.storage() {
        Storage::Cpu(CpuStorage::F32(dys)) => {
            let mut dx = vec![0.0f32; n * c * h * w];
            cpu::backward(dys, indices, h * w, oh * ow, &mut dx).map_err(|i| {
                Error::shape(format!(
                    "max_pool2d backward: index {i} is outside the {h}x{w} input plane \
                     (indices do not belong to this input)"
                ))
            })?;
            Tensor::from_vec(x_shape, dx)
        }
        _ => Err(unsupported("backward", dy)),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;
