//! AvgPool2d on the device (`ops/avg_pool2d/cuda.rs`), which global average
//! pooling (`adaptive_avgpool2d`) shares. `=` into dx.

use super::AvgPool2d;
use crate::error::Result;
use crate::nn::cuda::layer::{read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use crate::ops::avg_pool2d::cuda as avgk;
use crate::ops::avg_pool2d::AvgPool2dArgs;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AvgPoolPlan {
    /// The input's `[C, H, W]`.
    pub shape: [usize; 3],
    pub args: AvgPool2dArgs,
}

/// The plan of a pooling by `args`, its output checked against the resolved shape.
pub(crate) fn plan(a: &PlanArgs<'_>, args: AvgPool2dArgs) -> Result<(AvgPoolPlan, Needs)> {
    let shape = a.chw()?;
    let [c, h, w] = shape;
    let (oh, ow) = args.out_hw(h, w)?;
    if a.out_shape != [c, oh, ow] {
        return Err(a.bad(format!("makes {:?}", [c, oh, ow])));
    }
    Ok((AvgPoolPlan { shape, args }, Needs::new()))
}

pub(crate) fn forward<A: Elem>(p: &AvgPoolPlan, f: Forward<'_, A>) -> Result<()> {
    let Forward { gpu, n, x, mut y, .. } = f;
    let [c, h, w] = p.shape;
    avgk::forward(gpu, &x, [n, c, h, w], p.args, &mut y)
}

pub(crate) fn backward<A: Elem>(p: &AvgPoolPlan, b: Backward<'_, A>) -> Result<()> {
    let Backward { gpu, n, dy, dx, .. } = b;
    let [c, h, w] = p.shape;
    avgk::backward(gpu, &dy, [n, c, h, w], p.args, &mut read(dx, "dx")?)
}

impl DeviceLayer for AvgPool2d {
    type Plan = AvgPoolPlan;
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(AvgPoolPlan, Needs)> {
        plan(a, self.args())
    }

    fn state(_: &AvgPoolPlan, _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(p: &AvgPoolPlan, _: &mut (), f: Forward<'_, A>) -> Result<()> {
        forward(p, f)
    }

    fn backward<A: Elem>(p: &AvgPoolPlan, _: &(), b: Backward<'_, A>) -> Result<()> {
        backward(p, b)
    }
}
