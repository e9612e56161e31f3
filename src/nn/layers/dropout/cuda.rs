//! Dropout on the device (`ops/dropout/cuda.rs`): its mask is drawn from
//! the node's Philox counters in forward and drawn again in backward, so
//! nothing is kept between them. `=` into dx.

use super::Dropout;
use crate::error::{Error, Result};
use crate::nn::cuda::layer::{read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use crate::ops::dropout::{cuda as dropk, Mask};

impl DeviceLayer for Dropout {
    /// `p`.
    type Plan = f64;
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(f64, Needs)> {
        if a.in_numel() != a.out_numel() {
            return Err(a.bad("changes the shape"));
        }
        Ok((self.p, Needs::new()))
    }

    fn state(_: &f64, _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(&p: &f64, _: &mut (), f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, train, draws, x, mut y, .. } = f;
        if train {
            dropk::apply(gpu, &Mask::new(p, draws), &x, &mut y)
        } else {
            gpu.stream().memcpy_dtod(&x, &mut y).map_err(|e| Error::cuda("dropout (eval)", e))
        }
    }

    fn backward<A: Elem>(&p: &f64, _: &(), b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, draws, dy, dx, .. } = b;
        dropk::apply(gpu, &Mask::new(p, draws), &dy, &mut read(dx, "dx")?)
    }
}
