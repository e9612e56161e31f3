//! LayerNorm on the device (`ops/layer_norm/cuda.rs`): the forward keeps
//! each row's mean and 1/sqrt(var + eps) for the backward. With f16
//! parameters (O2) it runs on f32 copies and rounds its gradients back once,
//! as `ops::layer_norm` widens them on the CPU. Backward: `+=` into dW and
//! db, `=` into dx.

use super::LayerNorm;
use crate::cuda::cast;
use crate::error::Result;
use crate::nn::cuda::layer::{
    f32_param, read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, Scratch,
    StateArgs,
};
use crate::nn::cuda::model::alloc;
use crate::ops::layer_norm::cuda::{self as lnk, Affine, Rows, SavedStats};
use crate::tensor::DType;
use cudarc::driver::CudaSlice;
use half::f16;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormPlan {
    /// Over the last `c` values of each of a sample's `rows` rows.
    pub c: usize,
    pub rows: usize,
    pub eps: f32,
    /// That of weight and bias (f16 under O2).
    pub param_dtype: DType,
}

impl LayerNormPlan {
    fn shape(&self, n: usize) -> Rows {
        Rows { rows: n * self.rows, c: self.c }
    }
}

/// A LayerNorm's per-row statistics of the last training forward.
pub struct LnState {
    mean: CudaSlice<f32>,
    rstd: CudaSlice<f32>,
}

impl DeviceLayer for LayerNorm {
    type Plan = LayerNormPlan;
    type State = LnState;

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(LayerNormPlan, Needs)> {
        let c = self.normalized_shape;
        let rows = a.in_numel() / c.max(1);
        if rows * c != a.in_numel() || a.out_numel() != a.in_numel() {
            return Err(a.bad(format!("is not a layer norm over {c}")));
        }
        let p = LayerNormPlan { c, rows, eps: self.eps, param_dtype: a.param_dtype(0)? };
        // The f32 weight, bias and their gradients, then the backward's partial sums.
        let mut s = Scratch::default();
        for _ in 0..4 {
            s.push(DType::F32, c);
        }
        s.push(DType::F32, lnk::backward_workspace_len(p.shape(a.max_batch)));
        Ok((p, Needs::new().reads_input().scratch(s)))
    }

    fn state(p: &LayerNormPlan, a: &StateArgs<'_>) -> Result<LnState> {
        let rows = p.rows * a.max_batch;
        Ok(LnState { mean: alloc(a.gpu, rows)?, rstd: alloc(a.gpu, rows)? })
    }

    fn forward<A: Elem>(p: &LayerNormPlan, s: &mut LnState, f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, n, params, x, mut y, mut ws, .. } = f;
        let shape = p.shape(n);
        let [mut w32, mut b32] = ws.take::<f32, 2>([p.c; 2])?;
        let w = f32_param(gpu, &params, &mut w32, 0, p.param_dtype)?;
        let b =
            (params.len() > 1).then(|| f32_param(gpu, &params, &mut b32, 1, p.param_dtype)).transpose()?;
        // The statistics are allocated for the largest batch.
        let saved = SavedStats { mean: &mut s.mean.slice_mut(0..shape.rows), rstd: &mut s.rstd.slice_mut(0..shape.rows) };
        lnk::forward(gpu, &x, shape, Affine { weight: &w, bias: b.as_ref() }, p.eps, &mut y, saved)
    }

    fn backward<A: Elem>(p: &LayerNormPlan, s: &LnState, b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, n, mut params, x, dy, dx, mut ws, .. } = b;
        let (x, mut dx) = (read(x, "input")?, dx);
        let (shape, c) = (p.shape(n), p.c);
        let (mean, rstd) = (s.mean.slice(0..shape.rows), s.rstd.slice(0..shape.rows));
        let saved = SavedStats { mean: &mean, rstd: &rstd };
        let [mut w32, _b32, mut dw32, mut db32, mut sums] =
            ws.take::<f32, 5>([c, c, c, c, lnk::backward_workspace_len(shape)])?;
        match p.param_dtype {
            DType::F32 => params.with_weight_and_grads::<f32, f32, ()>(|w, (dw, db)| {
                let grads = Affine { weight: dw, bias: db };
                lnk::backward(gpu, &x, shape, w, saved, &dy, dx.as_mut(), grads, &mut sums)
            }),
            // f16 .grad (O2): accumulated in f32, rounded once.
            DType::F16 => {
                cast::f16_to_f32(gpu, &params.value::<f16>(0)?, &mut w32)?;
                let w = w32.as_view();
                params.with_grads::<f16, ()>(|(dw, db)| {
                    cast::f16_to_f32(gpu, &*dw, &mut dw32)?;
                    if let Some(db) = &db {
                        cast::f16_to_f32(gpu, &**db, &mut db32)?;
                    }
                    let grads = Affine { weight: &mut dw32, bias: db.is_some().then_some(&mut db32) };
                    lnk::backward(gpu, &x, shape, &w, saved, &dy, dx.as_mut(), grads, &mut sums)?;
                    cast::f32_to_f16(gpu, &dw32, dw)?;
                    match db {
                        Some(db) => cast::f32_to_f16(gpu, &db32, db),
                        None => Ok(()),
                    }
                })
            }
        }
    }
}
