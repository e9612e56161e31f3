//! apex O1 on the device, as one wrapper over the layers whose apex class is
//! fp16 (conv and linear): they run in f16 on f32 activations. The CPU twin
//! is `patched_backward` and the `patch_conv_linear` arms in src/nn/mod.rs.
//! The input and the f32 weights are cast to f16 per call and the f16
//! output back to f32; backward casts dy to f16, has the layer compute f16
//! gradients from zero (one rounding each) and adds them into the f32
//! `.grad`, and casts dx back to f32. The wrapper keeps the f16 input for
//! the backward, so the layer's own f32 input may die.

use super::layer::{Backward, Elem, Forward, Needs, Params, PlanArgs};
use crate::cuda::cast;
use crate::error::{Error, Result};
use crate::nn::layers::DeviceNode;
use crate::tensor::DType;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::f16;

/// The wrapped layer's needs, with the wrapper's f16 scratch ahead of its
/// own: weight, bias, their gradients, and one batch of output, dy and dx.
pub fn needs(inner: Needs, a: &PlanArgs<'_>, params: usize) -> Result<Needs> {
    let numel = |i: usize| -> Result<usize> {
        Ok(if i < params { a.model.param_value(a.node, i)?.numel() } else { 0 })
    };
    let (w, b) = (numel(0)?, numel(1)?);
    let (x, y) = (a.in_numel() * a.max_batch, a.out_numel() * a.max_batch);
    let mut scratch = super::layer::Scratch::default();
    for len in [w, b, w, b, y, y, x] {
        scratch.push(DType::F16, len);
    }
    scratch.f16.extend(&inner.scratch.f16);
    scratch.f32 = inner.scratch.f32.clone();
    Ok(Needs { reads_input: false, scratch, ..inner })
}

/// The lengths of the f32 weight and bias (0 without one).
fn lens(params: &Params<'_>) -> Result<(usize, usize)> {
    let numel =
        |k: usize| -> Result<usize> { Ok(if k < params.len() { params.value::<f32>(k)?.len() } else { 0 }) };
    Ok((numel(0)?, numel(1)?))
}

/// Forward; the f16 input stays in `x16` for the backward.
pub fn forward<A: Elem>(node: &mut DeviceNode, x16: &mut CudaSlice<f16>, f: Forward<'_, A>) -> Result<()> {
    // The layers O1 wraps, conv and linear, read one input.
    let Forward { gpu, blas, n, train, draws, params, x, mut y, mut ws, ids, hooks, .. } = f;
    let (wn, bn) = lens(&params)?;
    let (xn, yn) = (x.len(), y.len());
    let [mut w16, mut b16, dw, db, mut y16, _, _] = ws.take::<f16, 7>([wn, bn, wn, bn, yn, yn, xn])?;
    // Sized for the largest batch, as every activation.
    let mut x16 = x16.slice_mut(0..xn);
    A::cast_to_f16(gpu, &x, &mut x16)?;
    let values = cast_params(gpu, &params, &mut w16, &mut b16, true)?;
    let half = Forward {
        gpu,
        blas,
        n,
        train,
        draws,
        params: Params::Half { values, dw, db: (bn > 0).then_some(db) },
        x: x16.as_view(),
        rest: Vec::new(),
        y: y16.slice_mut(..),
        ws,
        ids,
        hooks,
    };
    node.forward::<f16>(half)?;
    A::cast_from_f16(gpu, &y16.as_view(), &mut y)
}

/// The f32 weight (and with `bias` the bias) cast to f16 into `w16` / `b16`.
fn cast_params<'b>(
    gpu: &crate::cuda::Gpu,
    params: &Params<'_>,
    w16: &'b mut CudaViewMut<'_, f16>,
    b16: &'b mut CudaViewMut<'_, f16>,
    bias: bool,
) -> Result<Vec<CudaView<'b, f16>>> {
    cast::f32_to_f16(gpu, &params.value::<f32>(0)?, w16)?;
    if bias && params.len() > 1 {
        cast::f32_to_f16(gpu, &params.value::<f32>(1)?, b16)?;
        return Ok(vec![w16.as_view(), b16.as_view()]);
    }
    Ok(vec![w16.as_view()])
}

/// Backward from dy: f16 gradients added into the f32 `.grad`, and dx where
/// asked.
pub fn backward<A: Elem>(
    node: &DeviceNode,
    x16: &CudaSlice<f16>,
    in_numel: usize,
    b: Backward<'_, A>,
) -> Result<()> {
    let Backward { gpu, blas, n, draws, mut params, dy, mut dx, mut ws, ids, hooks, .. } = b;
    let (wn, bn) = lens(&params)?;
    let (yn, xn) = (dy.len(), n * in_numel);
    let [mut w16, mut b16, mut dw16, mut db16, _, mut dy16, mut dx16] =
        ws.take::<f16, 7>([wn, bn, wn, bn, yn, yn, xn])?;
    let x16 = x16.slice(0..xn);
    // The weight again: its f16 copy's scratch served the layers after this one.
    let values = cast_params(gpu, &params, &mut w16, &mut b16, false)?;
    A::cast_to_f16(gpu, &dy, &mut dy16)?;
    let zero = |e| Error::cuda("zeroing O1's f16 gradient scratch", e);
    gpu.stream().memset_zeros(&mut dw16).map_err(zero)?;
    let has_bias = bn > 0;
    if has_bias {
        gpu.stream().memset_zeros(&mut db16).map_err(zero)?;
    }
    let half = Backward {
        gpu,
        blas,
        n,
        draws,
        params: Params::Half { values, dw: dw16.slice_mut(..), db: has_bias.then(|| db16.slice_mut(..)) },
        x: Some(x16),
        y: None,
        dy: dy16.as_view(),
        dx: dx.is_some().then(|| dx16.slice_mut(..)),
        rest: Vec::new(),
        ws,
        ids,
        hooks,
    };
    node.backward::<f16>(half)?;
    params.with_grads::<f32, ()>(|(dw, db)| {
        cast::f16_add_to_f32(gpu, &dw16, dw)?;
        if let Some(db) = db {
            cast::f16_add_to_f32(gpu, &db16, db)?;
        }
        Ok(())
    })?;
    match dx.as_mut() {
        Some(dx) => A::cast_from_f16(gpu, &dx16.as_view(), dx),
        None => Ok(()),
    }
}
