//! AvgPool2d like `nn.AvgPool2d(kernel_size, stride, padding)` with PyTorch's
//! defaults `ceil_mode=False`, `count_include_pad=True`: every window divides
//! by `kh * kw`, padded zeros included. `nn.AdaptiveAvgPool2d(1)` (global
//! average pooling) is [`AvgPool2dArgs::global`].

pub mod cpu;
pub mod cuda;

use super::half_emu::{round_into, scratch, widen_into};
use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, Tensor};
use cpu::Geometry;
use half::f16;
use rayon::prelude::*;

/// Window size, step and zero padding, as (height, width) pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2dArgs {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl AvgPool2dArgs {
    /// `nn.AdaptiveAvgPool2d(1)` on an `h x w` input: one window over the
    /// whole plane, so the divisor is `h * w`.
    pub fn global(h: usize, w: usize) -> AvgPool2dArgs {
        AvgPool2dArgs { kernel: [h, w], stride: [h, w], padding: [0, 0] }
    }

    /// The floor-mode output size for an `h x w` input, after PyTorch's
    /// checks: positive kernel and stride, padding at most half the kernel,
    /// the window no larger than the padded input. Sizes beyond i32 (PyTorch
    /// takes them as `int`) are refused, which also keeps `kh * kw` exact.
    pub fn out_hw(&self, h: usize, w: usize) -> Result<(usize, usize)> {
        let AvgPool2dArgs { kernel: k, stride: s, padding: p } = *self;
        if k.contains(&0) || s.contains(&0) {
            return Err(Error::shape(format!(
                "avg_pool2d: kernel and stride must be positive, got kernel {k:?}, stride {s:?}"
            )));
        }
        if k.iter().chain(&s).chain(&p).any(|&v| i32::try_from(v).is_err()) {
            return Err(Error::shape(format!(
                "avg_pool2d: kernel {k:?}, stride {s:?}, padding {p:?} do not fit in i32"
            )));
        }
        if p[0] > k[0] / 2 || p[1] > k[1] / 2 {
            return Err(Error::shape(format!(
                "avg_pool2d: padding {p:?} must be at most half the kernel {k:?} (PyTorch's rule)"
            )));
        }
        let (ph, pw) = (h.checked_add(2 * p[0]), w.checked_add(2 * p[1]));
        match (ph, pw) {
            (Some(ph), Some(pw)) if k[0] <= ph && k[1] <= pw => {
                Ok(((ph - k[0]) / s[0] + 1, (pw - k[1]) / s[1] + 1))
            }
            _ => Err(Error::shape(format!(
                "avg_pool2d: the {}x{} window is larger than the {h}x{w} input padded by {p:?}",
                k[0], k[1]
            ))),
        }
    }
}

fn nchw(op: &str, what: &str, shape: &[usize]) -> Result<[usize; 4]> {
    match *shape {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(Error::shape(format!(
            "avg_pool2d {op}: expected a 4-D [N, C, H, W] {what}, got shape {shape:?}"
        ))),
    }
}

fn geometry(h: usize, w: usize, args: AvgPool2dArgs) -> Result<Geometry> {
    let (oh, ow) = args.out_hw(h, w)?;
    Ok(Geometry { h, w, oh, ow, args })
}

/// `[N, C, H, W]` -> `[N, C, OH, OW]`, in `x`'s dtype.
pub fn forward(x: &Tensor, args: AvgPool2dArgs) -> Result<Tensor> {
    let [n, c, h, w] = nchw("forward", "input", x.shape())?;
    let g = geometry(h, w, args)?;
    let out = [n, c, g.oh, g.ow];
    let len = n * c * g.oh * g.ow;
    match x.storage() {
        CpuStorage::F32(xs) => {
            let mut y = vec![0.0f32; len];
            cpu::forward(xs, g, &mut y);
            Tensor::from_vec(&out, y)
        }
        CpuStorage::F16(xs) => {
            let mut y = vec![f16::ZERO; len];
            per_plane_f16(xs, g.h * g.w, &mut y, g.oh * g.ow, |xs, ys| cpu::forward(xs, g, ys));
            Tensor::from_f16_vec(&out, y)
        }
    }
}

/// dx of shape `x_shape` from `dy` (`[N, C, OH, OW]` for that input), in
/// `dy`'s dtype: each input receives `dy / (kh * kw)` from every window that
/// holds it.
pub fn backward(dy: &Tensor, x_shape: &[usize], args: AvgPool2dArgs) -> Result<Tensor> {
    let [n, c, h, w] = nchw("backward", "x_shape", x_shape)?;
    nchw("backward", "dy", dy.shape())?;
    let g = geometry(h, w, args)?;
    dy.check_shape(
        &format!("avg_pool2d backward: dy (for an input of shape {x_shape:?})"),
        &[n, c, g.oh, g.ow],
    )?;
    let len = n * c * h * w;
    if args.kernel == [h, w] && args.padding == [0, 0] {
        return global_backward(dy, x_shape, g.divisor::<f32>());
    }
    match dy.storage() {
        CpuStorage::F32(dys) => {
            let mut dx = vec![0.0f32; len];
            cpu::backward(dys, g, &mut dx);
            Tensor::from_vec(x_shape, dx)
        }
        CpuStorage::F16(dys) => {
            let mut dx = vec![f16::ZERO; len];
            per_plane_f16(dys, g.oh * g.ow, &mut dx, g.h * g.w, |gs, dxs| cpu::backward(gs, g, dxs));
            Tensor::from_f16_vec(x_shape, dx)
        }
    }
}

/// [`backward`] of global pooling (one window over each whole plane):
/// every input of a plane gets the plane's `0 + dy / (h * w)`, the sum the
/// generic kernel forms for it (f16 `dy` widened, the sum rounded once),
/// computed once a plane instead of once an input. The generic kernel,
/// scalar f16 over 1-element planes, took 1% of a ResNet-20 step.
fn global_backward(dy: &Tensor, x_shape: &[usize], div: f32) -> Result<Tensor> {
    let hw = x_shape[2] * x_shape[3];
    let values: Vec<f32> = dy.to_f32_vec().iter().map(|&v| 0.0 + v / div).collect();
    match dy.storage() {
        CpuStorage::F32(_) => Tensor::from_vec(x_shape, fill_planes(&values, hw)),
        CpuStorage::F16(_) => {
            let mut rounded = vec![f16::ZERO; values.len()];
            round_into(&values, &mut rounded);
            Tensor::from_f16_vec(x_shape, fill_planes(&rounded, hw))
        }
    }
}

/// `hw` copies of each value of `per_plane`, one plane after the other.
fn fill_planes<T: Copy + Default + Send + Sync>(per_plane: &[T], hw: usize) -> Vec<T> {
    let mut out = vec![T::default(); per_plane.len() * hw];
    if hw > 0 {
        // 256 planes a task: ResNet-20's 8,192 planes of 7x7 in 32 tasks.
        out.par_chunks_mut(256 * hw).zip(per_plane.par_chunks(256)).for_each(|(o, v)| {
            for (plane, &v) in o.chunks_exact_mut(hw).zip(v) {
                plane.fill(v);
            }
        });
    }
    out
}

/// Runs the f32 kernel `f` on each f16 plane of `src` (`sp` elements)
/// widened into the task's scratch, rounding its `dp`-element output plane
/// once into `dst`: the numerics of a widened whole tensor, without the copy.
fn per_plane_f16(src: &[f16], sp: usize, dst: &mut [f16], dp: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) {
    if sp == 0 || dp == 0 {
        return;
    }
    src.par_chunks(sp).zip(dst.par_chunks_mut(dp)).for_each_init(Vec::new, |buf, (s, d)| {
        let tmp = scratch(buf, sp + dp);
        let (ss, ds) = tmp.split_at_mut(sp);
        widen_into(s, ss);
        f(ss, ds);
        round_into(ds, d);
    });
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;
