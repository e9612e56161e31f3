//! The residual add, `f(x) + shortcut(x)` (a sum of branches in general):
//! not a module in PyTorch but a line of `forward()`, so it has no
//! parameters and no config table of its own; `residual` entries make it.
//! apex lists `add` among its promote functions: operands of different
//! dtypes meet in f32.
//!
//! Gradients: every operand's dx `=` dy (the identity); where a value has
//! several readers, the model sums their gradients (`+=`).

use std::fmt;

use serde::Serialize;

use super::{mul, AmpClass, Join, MemoryArgs};
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::{DType, Tensor};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Add {
    /// Operands summed (2 for a residual block).
    pub inputs: usize,
}

impl Join for Add {
    /// The operands' dtypes, each gradient's.
    type Saved = Vec<DType>;
    const TYPE: &'static str = "add";

    fn arity(&self) -> usize {
        self.inputs
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Promote
    }

    fn saved_bytes(&self, _m: &MemoryArgs<'_>) -> Option<u128> {
        mul(&[0])
    }

    fn forward_train(&self, xs: Vec<Tensor>) -> Result<(Tensor, Vec<DType>)> {
        let dtypes = xs.iter().map(Tensor::dtype).collect();
        Ok((self.forward_eval(xs)?, dtypes))
    }

    fn forward_eval(&self, xs: Vec<Tensor>) -> Result<Tensor> {
        let mut xs = xs.into_iter();
        let first = xs.next().ok_or_else(|| Error::internal("add of no operands"))?;
        let mut sum = match xs.next() {
            Some(second) => ops::add::forward(&first, &second)?,
            None => return Err(Error::internal("add of one operand")),
        };
        for x in xs {
            sum = ops::add::forward(&sum, &x)?;
        }
        Ok(sum)
    }

    fn backward(&self, dtypes: Vec<DType>, dy: Tensor, need_dx: &[bool]) -> Result<Vec<Option<Tensor>>> {
        Ok(need_dx.iter().zip(dtypes).map(|(&need, dt)| need.then(|| dy.to_dtype(dt))).collect())
    }
}

impl fmt::Display for Add {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "add")
    }
}
