//! The residual add on the device (`ops/add/cuda.rs`). Its dx is its dy for
//! every input, which the step copies or adds into each input's gradient.

use super::Add;
use crate::error::Result;
use crate::nn::cuda::layer::{
    others, Backward, DeviceLayer, Elem, Forward, Grad, Needs, PlanArgs, StateArgs,
};
use crate::nn::layers::Join;
use crate::ops::add::cuda as addk;

impl DeviceLayer for Add {
    type Plan = ();
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<((), Needs)> {
        if self.arity() < 2 || a.in_numel() != a.out_numel() {
            return Err(a.bad(format!("adds {} inputs", self.arity())));
        }
        Ok(((), Needs::new().grad(Grad::Identity)))
    }

    fn state(_: &(), _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    /// ((x0 + x1) + x2) + ...: each partial sum rounded to the storage
    /// dtype, as the CPU's chain of adds rounds it.
    fn forward<A: Elem>(_: &(), _: &mut (), f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, x, rest, mut y, .. } = f;
        let ([x1], more) = others::<_, 1>(rest)?;
        addk::forward(gpu, &x, &x1, &mut y)?;
        for c in &more {
            addk::accumulate(gpu, &mut y, c)?;
        }
        Ok(())
    }

    fn backward<A: Elem>(_: &(), _: &(), _: Backward<'_, A>) -> Result<()> {
        Ok(())
    }
}
