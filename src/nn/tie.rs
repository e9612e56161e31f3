//! Tied parameters (`config::Tie`): one tensor under two `state_dict`
//! keys. The owner (the earlier module) holds it; the tying node keeps an
//! empty placeholder in its slot and borrows the owner's value and gradient
//! for its own forward and backward, so its weight gradient is accumulated
//! (`+=`) into the owner's before the owner's own backward adds its share,
//! as autograd sums the two uses into one `.grad`. `parameters()` yields
//! the tensor once, at the owner's place.

use super::{Model, Node, Param};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

impl Node {
    /// Whether parameter `k` is tied to an earlier node's.
    pub fn ties(&self, k: usize) -> bool {
        self.tie.as_ref().is_some_and(|t| t.slot == k)
    }

    /// The parameters this node owns (all but a tied one).
    pub fn own_params(&self) -> impl Iterator<Item = &Param> {
        self.weights.params.iter().enumerate().filter(|(k, _)| !self.ties(*k)).map(|(_, p)| p)
    }

    pub fn own_params_mut(&mut self) -> impl Iterator<Item = &mut Param> {
        let tied = self.tie.as_ref().map(|t| t.slot);
        self.weights.params.iter_mut().enumerate().filter(move |(k, _)| Some(*k) != tied).map(|(_, p)| p)
    }
}

fn internal(i: usize) -> Error {
    Error::internal(format!("layer {i}'s tied weight names no earlier parameter"))
}

impl Model {
    /// Moves each tied node's initial weight into its owner, leaving the
    /// placeholder: PyTorch initializes module by module, so the later
    /// module's draw is the one the shared tensor keeps.
    pub(super) fn tie_weights(&mut self) -> Result<()> {
        for i in 0..self.layers.len() {
            self.swap_tied(i)?;
            if let Some(t) = self.layers[i].tie.clone() {
                let p = &mut self.layers[i].weights.params[t.slot];
                p.value = Tensor::zeros(&[0]);
                p.grad = Tensor::zeros(&[0]);
            }
        }
        Ok(())
    }

    /// Swaps node `i`'s tied weight (the placeholder) with its owner's value
    /// and gradient; called again, swaps them back. A no-op for a node
    /// without a tie.
    pub(crate) fn swap_tied(&mut self, i: usize) -> Result<()> {
        let Some(t) = self.layers.get(i).and_then(|n| n.tie.clone()) else { return Ok(()) };
        if t.node >= i {
            return Err(internal(i));
        }
        let (before, rest) = self.layers.split_at_mut(i);
        let owner = before[t.node].weights.params.get_mut(t.param).ok_or_else(|| internal(i))?;
        let mine = rest[0].weights.params.get_mut(t.slot).ok_or_else(|| internal(i))?;
        std::mem::swap(&mut owner.value, &mut mine.value);
        std::mem::swap(&mut owner.grad, &mut mine.grad);
        Ok(())
    }

    /// The value node `i`'s parameter `k` has: its owner's when tied.
    pub(crate) fn param_value(&self, i: usize, k: usize) -> Result<&Tensor> {
        let node = self.layers.get(i).ok_or_else(|| internal(i))?;
        let (i, k) = match &node.tie {
            Some(t) if t.slot == k => (t.node, t.param),
            _ => (i, k),
        };
        let p = self.layers.get(i).and_then(|n| n.weights.params.get(k));
        p.map(|p| &p.value).ok_or_else(|| internal(i))
    }

    /// Node `i` with its tied weight filled in from the owner (a copy, for
    /// evaluation, which cannot swap).
    pub(super) fn lent(&self, i: usize) -> Result<std::borrow::Cow<'_, Node>> {
        let node = self.layers.get(i).ok_or_else(|| internal(i))?;
        let Some(t) = &node.tie else { return Ok(std::borrow::Cow::Borrowed(node)) };
        let mut copy = node.clone();
        let value = self.param_value(i, t.slot)?.clone();
        copy.weights.params.get_mut(t.slot).ok_or_else(|| internal(i))?.value = value;
        Ok(std::borrow::Cow::Owned(copy))
    }
}
