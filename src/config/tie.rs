//! Weight tying: a layer's `weight` that is the parameter of an earlier
//! module (nanoGPT's `self.transformer.wte.weight = self.lm_head.weight`,
//! ALBERT's layers sharing one set of weights). PyTorch keeps one tensor
//! under both names: both keys are in `state_dict()`, `parameters()` yields
//! it once (at the first module's place), and backward sums the gradients
//! of both uses into it.

use serde::Serialize;

use super::model::{err, ResolvedLayer};
use crate::error::Result;
use crate::nn::layers::{AmpClass, LayerKind};

/// Node parameter `slot` is node `node`'s parameter `param`, whose
/// `state_dict` key is `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tie {
    pub slot: usize,
    pub node: usize,
    pub param: usize,
    pub key: String,
}

/// How many parameter names of earlier modules an error lists.
const LISTED: usize = 12;

/// The tie of the layer `kind` at `key` to `target`, a parameter key of a
/// module in `before` (a tie to a tied parameter is one to its owner).
pub(super) fn resolve(before: &[ResolvedLayer], kind: &LayerKind, key: &str, target: &str) -> Result<Tie> {
    let at = format!("{key}.tie");
    let params = kind.params();
    let Some(slot) = params.iter().position(|(suffix, _)| *suffix == "weight") else {
        return Err(err(at, format!("a {} has no `weight` to tie", kind.type_name())));
    };
    let mut names = Vec::new();
    for (node, r) in before.iter().enumerate() {
        for (param, (suffix, shape)) in r.kind.params().into_iter().enumerate() {
            let name = format!("{}.{suffix}", r.name);
            if name != target {
                names.push(name);
                continue;
            }
            if shape != params[slot].1 {
                return Err(err(
                    at,
                    format!(
                        "this {}'s weight is {:?} but `{target}` is {shape:?}; tied parameters must have one shape",
                        kind.type_name(),
                        params[slot].1
                    ),
                ));
            }
            if (r.kind.amp_class() == AmpClass::BatchNorm) != (kind.amp_class() == AmpClass::BatchNorm) {
                return Err(err(
                    at,
                    format!(
                        "`{target}` belongs to a {} and this is a {}: apex keeps batchnorm parameters in f32 and casts the others, so they cannot be one tensor",
                        r.kind.type_name(),
                        kind.type_name()
                    ),
                ));
            }
            return Ok(match r.tie.as_ref().filter(|t| t.slot == param) {
                Some(owner) => Tie { slot, ..owner.clone() },
                None => Tie { slot, node, param, key: name },
            });
        }
        if r.kind.buffers().iter().any(|(suffix, _)| format!("{}.{suffix}", r.name) == target) {
            return Err(err(
                at,
                format!("`{target}` is a buffer, not a parameter; only parameters are tied"),
            ));
        }
    }
    let listed = if names.is_empty() {
        "no module before it has parameters".to_owned()
    } else {
        let more = names.len().saturating_sub(LISTED);
        let shown = names.into_iter().rev().take(LISTED).collect::<Vec<_>>().join(", ");
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        format!("the parameters of the modules before it, nearest first: {shown}{more}")
    };
    Err(err(
        at,
        format!(
            "no module before this one has a parameter {:?} (a tie names the full state_dict key of an earlier module's parameter); {listed}",
            crate::error::cut(target, crate::error::VALUE_CHARS)
        ),
    ))
}
