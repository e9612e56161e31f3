//! Linear on the device: cuBLAS GEMMs over `n * rows` rows
//! (`ops/linear/cuda.rs`). Backward: `+=` into dW and db, `=` into dx.

use super::Linear;
use crate::error::Result;
use crate::nn::cuda::layer::{
    read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs,
};
use crate::ops::linear::cuda as lin;

/// `rows` is how many rows of `in_features` a sample holds: 1 for `[in]`,
/// T for a transformer's `[T, C]` (the same GEMM over `n * T` rows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearPlan {
    pub in_features: usize,
    pub out_features: usize,
    pub rows: usize,
}

impl DeviceLayer for Linear {
    type Plan = LinearPlan;
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(LinearPlan, Needs)> {
        let (in_features, out_features) = (self.in_features, self.out_features);
        let rows = a.in_numel() / in_features.max(1);
        if rows * in_features != a.in_numel() || rows * out_features != a.out_numel() {
            return Err(a.bad(format!("is not what {self} makes")));
        }
        Ok((LinearPlan { in_features, out_features, rows }, Needs::new().reads_input()))
    }

    fn state(_: &LinearPlan, _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(p: &LinearPlan, _: &mut (), f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, blas, n, params, x, mut y, .. } = f;
        let w = params.value::<A>(0)?;
        let b = (params.len() > 1).then(|| params.value::<A>(1)).transpose()?;
        lin::forward(gpu, blas, n * p.rows, p.in_features, p.out_features, &x, &w, b.as_ref(), &mut y)
    }

    fn backward<A: Elem>(p: &LinearPlan, _: &(), b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, blas, n, mut params, x, dy, mut dx, .. } = b;
        let x = read(x, "input")?;
        params.with_weight_and_grads::<A, A, ()>(|w, (dw, db)| {
            let (rows, i, o) = (n * p.rows, p.in_features, p.out_features);
            lin::backward(gpu, blas, rows, i, o, &x, w, &dy, dw, db, dx.as_mut())
        })
    }
}
