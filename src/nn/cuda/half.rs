//! apex O1 on the device: conv and linear on f32 activations run in f16.
//! The CPU twin is `patched_backward` and the `patch_conv_linear` arms of
//! `Layer::forward_train` / `forward_eval` in src/nn/mod.rs: the input and
//! the f32 weights are cast to f16 per call, the f16 output is cast back to
//! f32; backward casts dy to f16, computes f16 gradients from zero (one
//! rounding each) and adds them into the f32 `.grad`, and dx goes back to f32.

use super::acts::Acts;
use super::layers::{ids, internal, io, slice, slice_mut, view, view_mut, whole_mut, Ctx};
use super::model::HalfScratch;
use super::params::{DevBuf, DeviceParams};
use super::plan::{LayerPlan, Step};
use crate::cuda::{cast, Gpu};
use crate::error::{Error, Result};
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::cuda as convk;
use crate::ops::linear::cuda as lin;
use cudarc::driver::{CudaSlice, CudaView};
use half::f16;

fn weight_bias(lp: &LayerPlan) -> Result<(usize, Option<usize>)> {
    match lp.step {
        Step::Conv { weight, bias, .. } | Step::Linear { weight, bias, .. } => Ok((weight, bias)),
        ref other => Err(internal(format!("{other:?} run as an O1 conv/linear"))),
    }
}

fn scratch<'h>(half: &'h mut Option<&mut HalfScratch>) -> Result<&'h mut HalfScratch> {
    half.as_deref_mut().ok_or_else(|| internal("O1 layer without its f16 scratch"))
}

/// The f32 weight (and bias) cast to f16 into `w16` / `b16`.
fn cast_params<'b>(
    gpu: &Gpu,
    params: &DeviceParams,
    w16: &'b mut CudaSlice<f16>,
    b16: &'b mut CudaSlice<f16>,
    weight: usize,
    bias: Option<usize>,
) -> Result<(CudaView<'b, f16>, Option<CudaView<'b, f16>>)> {
    let w = params.value::<f32>(weight)?;
    cast::f32_to_f16(gpu, &w, &mut slice_mut(w16, w.len())?)?;
    let w16: &'b CudaSlice<f16> = w16;
    let b = match bias {
        Some(i) => {
            let b = params.value::<f32>(i)?;
            cast::f32_to_f16(gpu, &b, &mut slice_mut(b16, b.len())?)?;
            let b16: &'b CudaSlice<f16> = b16;
            Some(slice(b16, b.len())?)
        }
        None => None,
    };
    Ok((slice(w16, w.len())?, b))
}

/// Forward; the f16 input stays in `x16` for backward.
pub(super) fn forward(
    ctx: &mut Ctx<'_>,
    lp: &LayerPlan,
    x16: &mut CudaSlice<f16>,
    acts: &mut Acts<'_>,
    n: usize,
) -> Result<()> {
    let (gpu, blas) = (ctx.gpu, ctx.blas);
    let (x, mut y) = io::<f32>(acts, lp, n)?;
    let mut x16 = slice_mut(x16, n * lp.in_numel)?;
    cast::f32_to_f16(gpu, &x, &mut x16)?;
    let (weight, bias) = weight_bias(lp)?;
    let HalfScratch { weight: w16, bias: b16, y: y16, .. } = scratch(&mut ctx.half)?;
    let (w, b) = cast_params(gpu, ctx.params, w16, b16, weight, bias)?;
    let mut y16 = slice_mut(y16, n * lp.out_numel)?;
    let x16 = x16.as_view();
    match lp.step {
        Step::Conv { geom, .. } => {
            let g = ConvGeom { n, ..geom };
            convk::forward(gpu, blas, &g, &x16, &w, b.as_ref(), &mut whole_mut::<f16>(ctx.col)?, &mut y16)?
        }
        Step::Linear { in_features, out_features, rows, .. } => {
            lin::forward(gpu, blas, n * rows, in_features, out_features, &x16, &w, b.as_ref(), &mut y16)?
        }
        ref other => return Err(internal(format!("{other:?} run as an O1 conv/linear"))),
    }
    cast::f16_to_f32(gpu, &y16, &mut y)
}

/// Backward from the f32 dy in `gy`: f16 gradients added into the f32
/// `.grad`, and the f32 dx into `gx` when `need_dx`.
pub(super) fn backward(
    ctx: &mut Ctx<'_>,
    lp: &LayerPlan,
    x16: &CudaSlice<f16>,
    (gy, gx): (&DevBuf, &mut DevBuf),
    n: usize,
    need_dx: bool,
) -> Result<()> {
    let (gpu, blas) = (ctx.gpu, ctx.blas);
    let (in_len, out_len) = (n * lp.in_numel, n * lp.out_numel);
    let x16 = slice(x16, in_len)?;
    let (weight, bias) = weight_bias(lp)?;
    let HalfScratch { weight: w16, bias: b16, dweight, dbias, dy: dy16, dx: dx16, .. } =
        scratch(&mut ctx.half)?;
    // The weight again: its f16 copy's scratch served the layers after this one.
    let (w, _) = cast_params(gpu, ctx.params, w16, b16, weight, None)?;
    let mut dy16 = slice_mut(dy16, out_len)?;
    cast::f32_to_f16(gpu, &view::<f32>(gy, out_len)?, &mut dy16)?;
    let zero = |e| Error::cuda("zeroing O1's f16 gradient scratch", e);
    let mut dw16 = slice_mut(dweight, w.len())?;
    gpu.stream().memset_zeros(&mut dw16).map_err(zero)?;
    let mut db16 = match bias {
        Some(i) => {
            let mut db = slice_mut(dbias, ctx.params.slots[i].numel)?;
            gpu.stream().memset_zeros(&mut db).map_err(zero)?;
            Some(db)
        }
        None => None,
    };
    let mut dx16 = if need_dx { Some(slice_mut(dx16, in_len)?) } else { None };
    let dy16 = dy16.as_view();
    match lp.step {
        Step::Conv { geom, .. } => {
            let g = ConvGeom { n, ..geom };
            let (mut col, mut dy_t) = (whole_mut::<f16>(ctx.col)?, whole_mut::<f16>(ctx.dy_t)?);
            convk::backward(
                gpu,
                blas,
                &g,
                &x16,
                &w,
                &dy16,
                &mut col,
                &mut dy_t,
                &mut dw16,
                db16.as_mut(),
                dx16.as_mut(),
            )?
        }
        Step::Linear { in_features, out_features, rows, .. } => lin::backward(
            gpu,
            blas,
            n * rows,
            in_features,
            out_features,
            &x16,
            &w,
            &dy16,
            &mut dw16,
            db16.as_mut(),
            dx16.as_mut(),
        )?,
        ref other => return Err(internal(format!("{other:?} run as an O1 conv/linear"))),
    }
    ctx.params.with_grads::<f32, ()>(&ids(weight, bias), |g| {
        cast::f16_add_to_f32(gpu, &dw16, &mut g[0])?;
        if let (Some(db16), Some(db)) = (&db16, g.get_mut(1)) {
            cast::f16_add_to_f32(gpu, db16, db)?;
        }
        Ok(())
    })?;
    match dx16 {
        Some(dx16) => cast::f16_to_f32(gpu, &dx16, &mut view_mut::<f32>(gx, in_len)?),
        None => Ok(()),
    }
}
