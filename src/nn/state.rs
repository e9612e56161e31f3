//! `state_dict()` / `load_state_dict(strict=True)` with PyTorch's names, order
//! and dtypes (f32 tensors; `num_batches_tracked` an i64 scalar).

use super::layers::BufferValue;
use super::Model;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum StateValue {
    F32(Vec<f32>),
    I64(i64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct StateEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub value: StateValue,
}

fn f32_entry(name: &str, t: &Tensor) -> Result<StateEntry> {
    Ok(StateEntry {
        name: name.to_string(),
        shape: t.shape().to_vec(),
        value: StateValue::F32(t.to_f32_vec()),
    })
}

impl Model {
    /// Parameters and buffers, module by module, parameters before buffers (PyTorch's order).
    pub fn state_dict(&self) -> Result<Vec<StateEntry>> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (k, p) in layer.weights.params.iter().enumerate() {
                out.push(f32_entry(&p.name, self.param_value(i, k)?)?);
            }
            for b in &layer.weights.buffers {
                out.push(match &b.value {
                    BufferValue::Tensor(t) => f32_entry(&b.name, t)?,
                    BufferValue::Count(c) => {
                        StateEntry { name: b.name.clone(), shape: Vec::new(), value: StateValue::I64(*c) }
                    }
                });
            }
        }
        Ok(out)
    }

    /// Strict load: every name of `state_dict()` must be present with its exact
    /// shape, and nothing else may be. `source` names the file in errors.
    pub fn load_state_dict(&mut self, entries: Vec<StateEntry>, source: &Path) -> Result<()> {
        let err = |msg: String| Error::Checkpoint { path: source.to_path_buf(), msg };
        let mut by_name: HashMap<String, StateEntry> = HashMap::new();
        for e in entries {
            by_name.insert(e.name.clone(), e);
        }
        let expected = self.state_dict()?;
        let mut missing = Vec::new();
        for e in &expected {
            match by_name.get(&e.name) {
                None => missing.push(e.name.clone()),
                Some(got) if got.shape != e.shape => {
                    return Err(err(format!(
                        "tensor `{}` has shape {:?} but the model expects {:?}",
                        e.name, got.shape, e.shape
                    )))
                }
                Some(_) => {}
            }
        }
        if !missing.is_empty() {
            return Err(err(format!("missing tensors: {}", missing.join(", "))));
        }
        let known: std::collections::HashSet<&str> = expected.iter().map(|e| e.name.as_str()).collect();
        let mut unexpected: Vec<&str> =
            by_name.keys().map(String::as_str).filter(|n| !known.contains(n)).collect();
        if !unexpected.is_empty() {
            unexpected.sort_unstable();
            return Err(err(format!("unexpected tensors (not in this model): {}", unexpected.join(", "))));
        }

        let take_f32 =
            |name: &str, dst: &mut Tensor, by_name: &mut HashMap<String, StateEntry>| -> Result<()> {
                match by_name.remove(name).map(|e| e.value) {
                    Some(StateValue::F32(v)) => {
                        dst.copy_from_f32(&v)?;
                        Ok(())
                    }
                    _ => Err(Error::Checkpoint {
                        path: source.to_path_buf(),
                        msg: format!("tensor `{name}` must be a floating-point tensor"),
                    }),
                }
            };
        for i in 0..self.layers.len() {
            // A tied weight's key is loaded into its owner, after the
            // owner's own key: the later key wins, as loading one tensor
            // twice in PyTorch does.
            self.swap_tied(i)?;
            let layer = &mut self.layers[i];
            let loaded: Result<()> = layer
                .weights
                .params
                .iter_mut()
                .try_for_each(|p| take_f32(&p.name, &mut p.value, &mut by_name));
            self.swap_tied(i)?;
            loaded?;
            let layer = &mut self.layers[i];
            for b in &mut layer.weights.buffers {
                match &mut b.value {
                    BufferValue::Tensor(t) => take_f32(&b.name, t, &mut by_name)?,
                    BufferValue::Count(c) => {
                        *c = match by_name.remove(&b.name).map(|e| e.value) {
                            Some(StateValue::I64(v)) => v,
                            // Files converted from other frameworks sometimes store it as a float.
                            Some(StateValue::F32(v)) if v.len() == 1 => v[0] as i64,
                            _ => return Err(err(format!("tensor `{}` must be an integer scalar", b.name))),
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
