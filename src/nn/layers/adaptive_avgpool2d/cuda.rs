//! AdaptiveAvgPool2d(1) on the device: AvgPool2d's kernels over the whole plane.

use super::AdaptiveAvgPool2d;
use crate::error::Result;
use crate::nn::cuda::layer::{Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use crate::nn::layers::avgpool2d::cuda::{self as avg, AvgPoolPlan};

impl DeviceLayer for AdaptiveAvgPool2d {
    type Plan = AvgPoolPlan;
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(AvgPoolPlan, Needs)> {
        avg::plan(a, self.args())
    }

    fn state(_: &AvgPoolPlan, _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(p: &AvgPoolPlan, _: &mut (), f: Forward<'_, A>) -> Result<()> {
        avg::forward(p, f)
    }

    fn backward<A: Elem>(p: &AvgPoolPlan, _: &(), b: Backward<'_, A>) -> Result<()> {
        avg::backward(p, b)
    }
}
