//! MaxPool2d on the device (`ops/max_pool2d/cuda.rs`): the forward keeps
//! the flat index of each output's maximum within its plane, which the
//! backward scatters dy to. `=` into dx.

use super::MaxPool2d;
use crate::error::Result;
use crate::nn::cuda::layer::{read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use crate::nn::cuda::model::alloc;
use crate::ops::max_pool2d::cuda as pool;
use cudarc::driver::CudaSlice;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaxPoolPlan {
    /// The input's `[C, H, W]`.
    pub shape: [usize; 3],
    pub kernel: usize,
    pub stride: usize,
    pub out_numel: usize,
}

impl DeviceLayer for MaxPool2d {
    type Plan = MaxPoolPlan;
    type State = CudaSlice<u32>;

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(MaxPoolPlan, Needs)> {
        let shape = a.chw()?;
        let [c, h, w] = shape;
        let (kernel, stride) = (self.kernel_size, self.stride);
        let out = pool::out_shape([a.max_batch, c, h, w], kernel, stride)?;
        if out[1..] != a.out_shape[..] {
            return Err(a.bad(format!("makes {out:?}")));
        }
        Ok((MaxPoolPlan { shape, kernel, stride, out_numel: a.out_numel() }, Needs::new()))
    }

    fn state(p: &MaxPoolPlan, a: &StateArgs<'_>) -> Result<CudaSlice<u32>> {
        alloc(a.gpu, p.out_numel * a.max_batch)
    }

    fn forward<A: Elem>(p: &MaxPoolPlan, indices: &mut CudaSlice<u32>, f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, n, x, mut y, .. } = f;
        let [c, h, w] = p.shape;
        // Allocated for the largest batch.
        let mut indices = indices.slice_mut(0..n * p.out_numel);
        pool::forward(gpu, &x, [n, c, h, w], p.kernel, p.stride, &mut y, &mut indices).map(|_| ())
    }

    fn backward<A: Elem>(p: &MaxPoolPlan, indices: &CudaSlice<u32>, b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, n, dy, dx, .. } = b;
        let [c, h, w] = p.shape;
        let indices = indices.slice(0..n * p.out_numel);
        pool::backward(gpu, &dy, &indices, [n, c, h, w], p.kernel, p.stride, &mut read(dx, "dx")?)
    }
}
