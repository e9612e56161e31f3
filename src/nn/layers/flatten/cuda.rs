//! Flatten on the device: its output is its input's buffer under another
//! shape, so it launches nothing and its dx is its dy, in place.

use super::Flatten;
use crate::error::Result;
use crate::nn::cuda::layer::{Backward, DeviceLayer, Elem, Forward, Grad, Needs, PlanArgs, StateArgs};

impl DeviceLayer for Flatten {
    type Plan = ();
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<((), Needs)> {
        if a.in_numel() != a.out_numel() {
            return Err(a.bad("is not a reshape"));
        }
        Ok(((), Needs::new().grad(Grad::Alias)))
    }

    fn state(_: &(), _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(_: &(), _: &mut (), _: Forward<'_, A>) -> Result<()> {
        Ok(())
    }

    fn backward<A: Elem>(_: &(), _: &(), _: Backward<'_, A>) -> Result<()> {
        Ok(())
    }
}
