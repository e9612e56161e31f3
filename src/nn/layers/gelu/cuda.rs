//! GELU on the device, exact or tanh (`ops/gelu/cuda.rs`). `=` into dx.

use super::Gelu;
use crate::error::Result;
use crate::nn::cuda::layer::{read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use crate::ops::gelu::cuda as gelk;

impl DeviceLayer for Gelu {
    /// Whether it is the tanh approximation.
    type Plan = bool;
    type State = ();

    fn plan(&self, _: &PlanArgs<'_>) -> Result<(bool, Needs)> {
        Ok((self.approximate == "tanh", Needs::new().reads_input()))
    }

    fn state(_: &bool, _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(&tanh: &bool, _: &mut (), f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, x, mut y, .. } = f;
        gelk::forward(gpu, &x, &mut y, tanh)
    }

    fn backward<A: Elem>(&tanh: &bool, _: &(), b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, x, dy, dx, .. } = b;
        gelk::backward(gpu, &read(x, "input")?, &dy, &mut read(dx, "dx")?, tanh)
    }
}
