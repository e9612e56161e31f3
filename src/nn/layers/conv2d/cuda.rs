//! Conv2d on the device: im2col and one cuBLAS GEMM per image
//! (`ops/conv2d/cuda.rs`, `kernels/conv2d.cu`). Backward: `+=` into dW and
//! db, `=` into dx.

use super::Conv2d;
use crate::error::Result;
use crate::nn::cuda::layer::{
    read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, Scratch, StateArgs,
};
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::cuda as convk;
use crate::ops::conv2d::out_size;

impl DeviceLayer for Conv2d {
    /// `n` is 0 here; each batch fills in its own.
    type Plan = ConvGeom;
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(ConvGeom, Needs)> {
        let [c, h, w] = a.chw()?;
        let (o, k, s, p) = (self.out_channels, self.kernel_size, self.stride, self.padding);
        let (ho, wo) = (out_size(h, k, s, p), out_size(w, k, s, p));
        if self.in_channels != c || ho * wo == 0 || a.out_shape != [o, ho, wo] {
            return Err(a.bad(format!("is not what {self} makes")));
        }
        let geom = ConvGeom { n: 0, c, h, w, o, k, stride: s, padding: p, ho, wo };
        let batch = ConvGeom { n: a.max_batch, ..geom };
        // im2col's columns, then backward's dy with its batch and channel axes swapped.
        let mut scratch = Scratch::default();
        scratch.push(a.compute, convk::col_len(&batch)).push(a.compute, convk::dy_t_len(&batch));
        Ok((geom, Needs::new().reads_input().scratch(scratch)))
    }

    fn state(_: &ConvGeom, _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(geom: &ConvGeom, _: &mut (), f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, blas, n, params, x, mut y, mut ws, .. } = f;
        let w = params.value::<A>(0)?;
        let b = (params.len() > 1).then(|| params.value::<A>(1)).transpose()?;
        let [mut col, _] = ws.whole::<A, 2>()?;
        convk::forward(gpu, blas, &ConvGeom { n, ..*geom }, &x, &w, b.as_ref(), &mut col, &mut y)
    }

    fn backward<A: Elem>(geom: &ConvGeom, _: &(), b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, blas, n, mut params, x, dy, mut dx, mut ws, .. } = b;
        let x = read(x, "input")?;
        let g = ConvGeom { n, ..*geom };
        let [mut col, mut dy_t] = ws.whole::<A, 2>()?;
        params.with_weight_and_grads::<A, A, ()>(|w, (dw, db)| {
            convk::backward(gpu, blas, &g, &x, w, &dy, &mut col, &mut dy_t, dw, db, dx.as_mut())
        })
    }
}
