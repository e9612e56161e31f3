//! The residual add, `f(x) + shortcut(x)` (a sum of branches in general):
//! not a module in PyTorch but a line of `forward()`, so it has no
//! parameters and no config table of its own; `residual` entries make it.
//! apex lists `add` among its promote functions: operands of different
//! dtypes meet in f32.
//!
//! Gradients: every operand's dx `=` dy (the identity); where a value has
//! several readers, the model sums their gradients (`+=`).

pub mod cuda;

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
        // The last operand that needs a gradient takes dy itself, the others
        // dy in their dtype (shared when it is dy's).
        let last = need_dx.iter().rposition(|&need| need);
        let mut dy = Some(dy);
        let mut dxs = Vec::with_capacity(need_dx.len());
        for (i, (&need, dt)) in need_dx.iter().zip(dtypes).enumerate() {
            let dx = match (need, &dy) {
                (true, Some(g)) if Some(i) != last => Some(g.to_dtype(dt)),
                (true, Some(_)) => dy.take().map(|g| g.into_dtype(dt)),
                _ => None,
            };
            dxs.push(dx);
        }
        Ok(dxs)
    }
}

impl fmt::Display for Add {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "add")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operand that needs one gets dy in its own dtype (the last one
    /// dy itself), the others nothing.
    #[test]
    fn backward_gives_each_operand_dy_in_its_dtype() {
        let add = Add { inputs: 4 };
        let dy = Tensor::from_vec(&[3], vec![1.0, -2.5, 1e-8]).unwrap();
        let dtypes = vec![DType::F16, DType::F32, DType::F32, DType::F16];
        for need in
            [[true, false, true, false], [false, true, false, true], [true, true, true, true], [false; 4]]
        {
            let dxs = add.backward(dtypes.clone(), dy.clone(), &need).unwrap();
            assert_eq!(dxs.len(), 4);
            for ((dx, &n), &dt) in dxs.iter().zip(&need).zip(&dtypes) {
                match dx {
                    Some(dx) => {
                        assert!(n, "{need:?}: a gradient nobody asked for");
                        assert_eq!(dx.dtype(), dt);
                        assert_eq!(dx.to_f32_vec(), dy.to_dtype(dt).to_f32_vec());
                    }
                    None => assert!(!n, "{need:?}: a missing gradient"),
                }
            }
        }
    }
}
