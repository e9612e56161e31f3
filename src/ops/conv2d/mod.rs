//! 2-D convolution, NCHW, square kernels, PyTorch `F.conv2d` semantics
//! (cross-correlation, zero padding, no dilation or groups).

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_direct;
pub mod cpu;
pub mod cuda;
#[cfg(target_arch = "x86_64")]
mod lines;
#[cfg(target_arch = "x86_64")]
mod stride2;
#[cfg(test)]
mod tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_avx512;
#[cfg(test)]
mod tests_f16;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_strided;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_winograd;

#[cfg(target_arch = "x86_64")]
use super::half_emu::Act;
use super::half_emu::{any_f16, f32_acc, f32_of, grads_in_f32, store};
use super::{cpu_f32, cpu_f32_mut};
use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
use crate::tensor::written_by;
use crate::tensor::{CpuStorage, Tensor};
use cpu::ConvGeom;
use half::f16;
#[cfg(target_arch = "x86_64")]
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the CPU's AVX-512 path may take Winograd where it fits.
static WINOGRAD: AtomicBool = AtomicBool::new(true);

/// Test hook behind `ddptrain --direct-convs`: `false` keeps every CPU
/// convolution of this process on the direct kernels. Winograd rounds
/// several times more than they do (rms ~2-3e-6 of the exact output against
/// ~4e-7), and a ReLU whose input lies within that of zero passes or blocks
/// its whole gradient: in ResNet-20 (batch 4, one SGD step at lr 0.1) the
/// one BatchNorm output of layer2.2.bn1 within 1e-5 of zero (-3.9e-6)
/// flipped so and moved weights by up to 1.5e-4, while every conv matched
/// the direct kernels to 9e-6 of its scale (2e-7 without ReLUs). So the
/// device-parity tests and the PyTorch oracle (`scripts/torch_parity.py`)
/// train on the direct kernels, and Winograd is held to those conv by conv
/// (`tests_winograd.rs`) and through a ReLU-free ResNet-20.
pub fn set_winograd(on: bool) {
    WINOGRAD.store(on, Ordering::Relaxed);
}

/// See [`set_winograd`].
#[cfg(target_arch = "x86_64")]
fn winograd_on() -> bool {
    WINOGRAD.load(Ordering::Relaxed)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dArgs {
    pub stride: usize,
    pub padding: usize,
}

/// Output length along one axis: `floor((input + 2*padding - kernel) / stride) + 1`,
/// or 0 where no window fits (or `stride` is 0).
pub fn out_size(input: usize, kernel: usize, stride: usize, padding: usize) -> usize {
    let padded = input + 2 * padding;
    if stride == 0 || padded < kernel {
        return 0;
    }
    (padded - kernel) / stride + 1
}

const OP: &str = "conv2d";

/// Checks that `x` and `weight` fit together and works out every size.
fn geometry(x: &Tensor, weight: &Tensor, args: Conv2dArgs) -> Result<ConvGeom> {
    let &[n, c, h, w] = x.shape() else {
        return Err(Error::shape(format!(
            "conv2d: input must be 4-D [N, C, H, W], got shape {:?}",
            x.shape()
        )));
    };
    let &[o, wc, k, k2] = weight.shape() else {
        return Err(Error::shape(format!(
            "conv2d: weight must be 4-D [O, C, K, K], got shape {:?}",
            weight.shape()
        )));
    };
    if k != k2 {
        return Err(Error::shape(format!(
            "conv2d: only square kernels are supported, weight {:?} has a {k}x{k2} kernel",
            weight.shape()
        )));
    }
    if wc != c {
        return Err(Error::shape(format!(
            "conv2d: weight {:?} expects {wc} input channels but input {:?} has {c}",
            weight.shape(),
            x.shape()
        )));
    }
    if c == 0 || h == 0 || w == 0 || o == 0 || k == 0 {
        return Err(Error::shape(format!(
            "conv2d: zero-sized dimension in input {:?} or weight {:?} (only the batch may be empty)",
            x.shape(),
            weight.shape()
        )));
    }
    if args.stride == 0 {
        return Err(Error::shape("conv2d: stride must be at least 1, got 0"));
    }
    let (ho, wo) = (out_size(h, k, args.stride, args.padding), out_size(w, k, args.stride, args.padding));
    if ho == 0 || wo == 0 {
        return Err(Error::shape(format!(
            "conv2d: kernel {k}x{k} does not fit input {h}x{w} with padding {}",
            args.padding
        )));
    }
    Ok(ConvGeom { n, c, h, w, o, k, stride: args.stride, padding: args.padding, ho, wo })
}

/// `x[N, C, H, W]`, `weight[O, C, K, K]`, `bias[O]` -> `[N, O, Ho, Wo]`.
///
/// f16 operands: f16 inputs with f32 accumulation; the output takes `x`'s dtype.
pub fn forward(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, args: Conv2dArgs) -> Result<Tensor> {
    if let Some(y) = forward_f16(x, weight, bias, args)? {
        return Ok(y);
    }
    if any_f16([Some(x), Some(weight), bias]) {
        let b = bias.map(f32_of);
        let y = forward(&f32_of(x), &f32_of(weight), b.as_deref(), args)?;
        return Ok(y.into_dtype(x.dtype()));
    }
    let g = geometry(x, weight, args)?;
    if let Some(b) = bias {
        b.check_shape("conv2d bias", &[g.o])?;
    }
    let xs = cpu_f32(OP, "input", x)?;
    let ws = cpu_f32(OP, "weight", weight)?;
    let bs = bias.map(|b| cpu_f32(OP, "bias", b)).transpose()?;
    let len = g.n * g.y_len();
    #[cfg(target_arch = "x86_64")]
    if avx512::usable(&g) {
        // SAFETY: avx512::forward writes every element of its output.
        let y = unsafe { written_by(len, |y| avx512::forward(&g, xs, ws, bs, y)) };
        return Tensor::from_vec(&[g.n, g.o, g.ho, g.wo], y);
    }
    let mut y = vec![0f32; len];
    cpu::forward(&g, xs, ws, bs, &mut y);
    Tensor::from_vec(&[g.n, g.o, g.ho, g.wo], y)
}

/// [`forward`] of an f16 input without whole-tensor copies: the AVX-512
/// kernels widen it and round the output in their loads and stores, the
/// GEMM path an image at a time (weights and bias, small, are widened up
/// front). `None` when the input is not f16 on the host.
fn forward_f16(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    args: Conv2dArgs,
) -> Result<Option<Tensor>> {
    let CpuStorage::F16(xs) = x.storage() else {
        return Ok(None);
    };
    let g = geometry(x, weight, args)?;
    if let Some(b) = bias {
        b.check_shape("conv2d bias", &[g.o])?;
    }
    let (w32, b32) = (f32_of(weight), bias.map(f32_of));
    let ws = cpu_f32(OP, "weight", &w32)?;
    let bs = b32.as_deref().map(|b| cpu_f32(OP, "bias", b)).transpose()?;
    let len = g.n * g.y_len();
    #[cfg(target_arch = "x86_64")]
    if avx512::usable(&g) {
        // SAFETY: avx512::forward writes every element of its output.
        let y = unsafe { written_by(len, |y| avx512::forward(&g, xs, ws, bs, y)) };
        return Tensor::from_f16_vec(&[g.n, g.o, g.ho, g.wo], y).map(Some);
    }
    let mut y = vec![f16::ZERO; len];
    cpu::forward(&g, xs, ws, bs, &mut y);
    Tensor::from_f16_vec(&[g.n, g.o, g.ho, g.wo], y).map(Some)
}

/// Backward of [`forward`] for upstream gradient `dy[N, O, Ho, Wo]`.
/// Adds into `dweight` (shape of `weight`) and `dbias` (`[O]`), like
/// PyTorch's `.grad`; returns `dx` (shape of `x`) when `need_dx`.
pub fn backward(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    args: Conv2dArgs,
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
    need_dx: bool,
) -> Result<Option<Tensor>> {
    // f16 activations without whole-tensor copies (as in `forward_f16`).
    if let (CpuStorage::F16(xs), CpuStorage::F16(dys)) = (x.storage(), dy.storage()) {
        let g = geometry(x, weight, args)?;
        check_grads(&g, weight, dy, dweight, dbias.as_deref())?;
        let w32 = f32_of(weight);
        let ws = cpu_f32(OP, "weight", &w32)?;
        let mut dw = f32_acc(dweight);
        let mut db = dbias.as_deref().map(f32_acc);
        let dbs = db.as_mut().map(|d| cpu_f32_mut(OP, "dbias", d)).transpose()?;
        let dws = cpu_f32_mut(OP, "dweight", &mut dw)?;
        let dx: Option<Vec<f16>> = match () {
            #[cfg(target_arch = "x86_64")]
            () if avx512::usable(&g) => backward_avx512(&g, xs, ws, dys, dws, dbs, need_dx),
            () => {
                let mut dx = need_dx.then(|| vec![f16::ZERO; xs.len()]);
                cpu::backward(&g, xs, ws, dys, dws, dbs, dx.as_deref_mut());
                dx
            }
        };
        store(dweight, &dw)?;
        if let (Some(target), Some(acc)) = (dbias, db) {
            store(target, &acc)?;
        }
        return dx.map(|d| Tensor::from_f16_vec(x.shape(), d)).transpose();
    }
    if any_f16([Some(x), Some(weight), Some(dy), Some(&*dweight), dbias.as_deref()]) {
        let (x32, w32, dy32) = (f32_of(x), f32_of(weight), f32_of(dy));
        let dx = grads_in_f32(dweight, dbias, |dw, db| backward(&x32, &w32, &dy32, args, dw, db, need_dx))?;
        return Ok(dx.map(|d| d.into_dtype(x.dtype())));
    }
    let g = geometry(x, weight, args)?;
    check_grads(&g, weight, dy, dweight, dbias.as_deref())?;
    let xs = cpu_f32(OP, "input", x)?;
    let ws = cpu_f32(OP, "weight", weight)?;
    let dys = cpu_f32(OP, "dy", dy)?;
    let dws = cpu_f32_mut(OP, "dweight", dweight)?;
    let dbs = match dbias {
        Some(db) => Some(cpu_f32_mut(OP, "dbias", db)?),
        None => None,
    };
    #[cfg(target_arch = "x86_64")]
    if avx512::usable(&g) {
        let dx = backward_avx512(&g, xs, ws, dys, dws, dbs, need_dx);
        return dx.map(|d| Tensor::from_vec(x.shape(), d)).transpose();
    }
    let mut dx = if need_dx { Some(vec![0f32; xs.len()]) } else { None };
    cpu::backward(&g, xs, ws, dys, dws, dbs, dx.as_deref_mut());
    dx.map(|d| Tensor::from_vec(x.shape(), d)).transpose()
}

/// [`avx512::backward`] with `dx` (when `need_dx`) in a new vector, not
/// zero-filled first.
#[cfg(target_arch = "x86_64")]
fn backward_avx512<X: Act<Out = MaybeUninit<X>>>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    dy: &[X],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    need_dx: bool,
) -> Option<Vec<X>> {
    if !need_dx {
        avx512::backward(g, x, w, dy, dw, db, None);
        return None;
    }
    // SAFETY: avx512::backward writes every element of its `dx`.
    Some(unsafe { written_by(x.len(), |dx| avx512::backward(g, x, w, dy, dw, db, Some(dx))) })
}

/// Checks that `dy`, `dweight` and `dbias` fit the convolution.
fn check_grads(
    g: &ConvGeom,
    weight: &Tensor,
    dy: &Tensor,
    dweight: &Tensor,
    dbias: Option<&Tensor>,
) -> Result<()> {
    dy.check_shape("conv2d dy", &[g.n, g.o, g.ho, g.wo])?;
    dweight.check_shape("conv2d dweight", weight.shape())?;
    if let Some(db) = dbias {
        db.check_shape("conv2d dbias", &[g.o])?;
    }
    Ok(())
}
