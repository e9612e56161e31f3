//! ReLU on the device (`ops/relu/cuda.rs`): backward reads the output, so
//! the input may die once the forward has run. `=` into dx.

use super::Relu;
use crate::error::Result;
use crate::nn::cuda::layer::{read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use crate::ops::relu::cuda as relu;

impl DeviceLayer for Relu {
    type Plan = ();
    type State = ();

    fn plan(&self, _: &PlanArgs<'_>) -> Result<((), Needs)> {
        Ok(((), Needs::new().reads_output()))
    }

    fn state(_: &(), _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(_: &(), _: &mut (), f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, x, mut y, .. } = f;
        relu::forward(gpu, &x, &mut y)
    }

    fn backward<A: Elem>(_: &(), _: &(), b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, y, dy, dx, .. } = b;
        relu::backward(gpu, &read(y, "output")?, &dy, &mut read(dx, "dx")?)
    }
}
