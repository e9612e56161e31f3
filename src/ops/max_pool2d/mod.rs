//! MaxPool2d like `nn.MaxPool2d(kernel_size, stride)`: no padding, floor mode,
//! returning PyTorch-style indices (flat argmax within each (n, c) plane).

pub mod cpu;
pub mod cuda;

use super::half_emu::{round_into, scratch, widen_into};
use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, Tensor};
use cpu::Geometry;
use half::f16;
use rayon::prelude::*;

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
    let [n, c, h, w] = nchw("forward", "input", x.shape())?;
    let g = geometry("forward", h, w, kernel_size, stride)?;
    let (oh, ow) = g.out_hw();
    match x.storage() {
        CpuStorage::F32(xs) => {
            let len = n * c * oh * ow;
            let mut y = vec![0.0f32; len];
            let mut idx = vec![0u32; len];
            cpu::forward(xs, g, &mut y, &mut idx);
            Ok((Tensor::from_vec(&[n, c, oh, ow], y)?, idx))
        }
        CpuStorage::F16(xs) => {
            let len = n * c * oh * ow;
            let mut y = vec![f16::ZERO; len];
            let mut idx = vec![0u32; len];
            forward_f16(xs, g, &mut y, &mut idx);
            Ok((Tensor::from_f16_vec(&[n, c, oh, ow], y)?, idx))
        }
    }
}

/// Routes each output gradient to the input position its window selected.
pub fn backward(dy: &Tensor, indices: &[u32], x_shape: &[usize]) -> Result<Tensor> {
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
    let bad_index = |i: u32| {
        Error::shape(format!(
            "max_pool2d backward: index {i} is outside the {h}x{w} input plane \
             (indices do not belong to this input)"
        ))
    };
    match dy.storage() {
        CpuStorage::F32(dys) => {
            let mut dx = vec![0.0f32; n * c * h * w];
            cpu::backward(dys, indices, h * w, oh * ow, &mut dx).map_err(bad_index)?;
            Tensor::from_vec(x_shape, dx)
        }
        CpuStorage::F16(dys) => {
            let mut dx = vec![f16::ZERO; n * c * h * w];
            backward_f16(dys, indices, h * w, oh * ow, &mut dx).map_err(bad_index)?;
            Tensor::from_f16_vec(x_shape, dx)
        }
    }
}

/// [`cpu::forward`] on f16 planes: each plane is widened into the task's
/// scratch, pooled in f32 and its maxima rounded back (exact: pooling only
/// selects), so values and indices are those of the f32 kernel.
fn forward_f16(x: &[f16], g: Geometry, y: &mut [f16], idx: &mut [u32]) {
    let (oh, ow) = g.out_hw();
    let (ip, op) = (g.h * g.w, oh * ow);
    if ip == 0 || op == 0 {
        return;
    }
    x.par_chunks(ip).zip(y.par_chunks_mut(op)).zip(idx.par_chunks_mut(op)).for_each_init(
        Vec::new,
        |buf, ((xp, yp), ixp)| {
            let s = scratch(buf, ip + op);
            let (xs, ys) = s.split_at_mut(ip);
            widen_into(xp, xs);
            cpu::forward(xs, g, ys, ixp);
            round_into(ys, yp);
        },
    );
}

/// [`cpu::backward`] on f16 planes: each plane's gradient is summed in f32
/// (overlapping windows add there) and rounded once, as the f32 kernel's
/// output would be.
fn backward_f16(
    dy: &[f16],
    idx: &[u32],
    ip: usize,
    op: usize,
    dx: &mut [f16],
) -> std::result::Result<(), u32> {
    if ip == 0 || op == 0 {
        return Ok(());
    }
    dy.par_chunks(op).zip(idx.par_chunks(op)).zip(dx.par_chunks_mut(ip)).try_for_each_init(
        Vec::new,
        |buf, ((gp, ixp), dxp)| {
            let s = scratch(buf, op + ip);
            let (gs, dxs) = s.split_at_mut(op);
            widen_into(gp, gs);
            dxs.fill(0.0);
            cpu::backward(gs, ixp, ip, op, dxs)?;
            round_into(dxs, dxp);
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;
