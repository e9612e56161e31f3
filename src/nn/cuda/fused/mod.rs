//! The device's fusion pass, as `nn/fuse.rs` is the CPU's: runs of nodes
//! that one fused kernel computes become one node of the device plan, with
//! its own [`DeviceLayer`] implementation. A fused group is a file here (its
//! rule, [`Fusion::matches`], and its launches) and its name in the
//! registry's `fused` list (`nn/layers/mod.rs`), which tries the rules in
//! that order at each node; nothing else in the plan or the step changes.
//!
//! A group's value between its members has no buffer and no gradient: a
//! rule takes a run only when each member's output is read by the next
//! member alone. Its device state is its head's (the only member with state
//! so far), uploaded from and downloaded into the head's host node.

/// The [`DeviceLayer`] items of a group headed by a BatchNorm2d (the
/// tuple struct of that layer) and ending in ReLU: its plan is BatchNorm's
/// after a first scratch region for ReLU's dx, reading the group's output
/// (ReLU's mask); its state is BatchNorm's, allocated, uploaded,
/// downloaded and broadcast as that layer's.
macro_rules! head_batchnorm {
    () => {
        type Plan = crate::nn::cuda::fused::bn_relu::BnReluPlan;
        type State = BnState;

        fn plan(&self, a: &PlanArgs<'_>) -> Result<(Self::Plan, Needs)> {
            let (bn, needs) = self.0.plan(a)?;
            let needs = crate::nn::cuda::fused::bn_relu::scratch_first(needs, a);
            Ok((
                crate::nn::cuda::fused::bn_relu::BnReluPlan { bn, numel: a.out_numel() },
                needs.reads_output(),
            ))
        }

        fn state(p: &Self::Plan, a: &crate::nn::cuda::layer::StateArgs<'_>) -> Result<BnState> {
            BatchNorm2d::state(&p.bn, a)
        }

        fn upload(s: &mut BnState, gpu: &crate::cuda::Gpu, node: &crate::nn::Node) -> Result<()> {
            BatchNorm2d::upload(s, gpu, node)
        }

        fn download(s: &BnState, gpu: &crate::cuda::Gpu, node: &mut crate::nn::Node) -> Result<()> {
            BatchNorm2d::download(s, gpu, node)
        }

        fn buffers_mut(s: &mut BnState) -> Vec<&mut crate::nn::cuda::params::DevBuf> {
            BatchNorm2d::buffers_mut(s)
        }
    };
}

pub mod bn_add_relu;
pub mod bn_relu;

pub use bn_add_relu::BnAddRelu;
pub use bn_relu::BnRelu;

use super::layer::{DeviceLayer, PlanArgs};
use super::plan::LayerPlan;
use crate::nn::layers::LayerKind;
use crate::nn::Model;

/// A run of nodes one kernel (or one sequence of launches) computes.
pub trait Fusion: DeviceLayer + Sized {
    /// Its node type in plans and errors: the members' types joined by `+`.
    const TYPE: &'static str;

    /// The group heading `run`, and how many nodes it spans, when its rule
    /// takes them.
    fn matches(run: &Run<'_>) -> Option<(Self, usize)>;
}

/// The unfused plan from a candidate head on, as a rule sees it.
pub struct Run<'a> {
    pub model: &'a Model,
    /// From the head on, up to the first node O1 wraps (which runs alone).
    pub layers: &'a [LayerPlan],
    /// How many readers each value has (the loss reads the logits).
    readers: &'a [usize],
    max_batch: usize,
}

impl<'a> Run<'a> {
    /// The layer type of the run's node `k`.
    pub fn kind(&self, k: usize) -> Option<&'a LayerKind> {
        let lp = self.layers.get(k)?;
        self.model.layers.get(lp.nodes.start).map(|n| &n.kind)
    }

    /// Whether node `k`'s output is read by node `k + 1` alone, as its first input.
    pub fn feeds_only_next(&self, k: usize) -> bool {
        self.read_only_by_next(k)
            && self.layers.get(k + 1).map(|b| b.src) == self.layers.get(k).map(|a| a.dst)
    }

    /// Whether node `k`'s output is read by node `k + 1` alone, as any of its inputs.
    pub fn read_only_by_next(&self, k: usize) -> bool {
        let (Some(a), Some(b)) = (self.layers.get(k), self.layers.get(k + 1)) else { return false };
        a.dst != a.src && b.srcs.contains(&a.dst) && self.readers.get(a.dst) == Some(&1)
    }

    /// The members' names joined by `+`.
    pub fn name(&self, len: usize) -> String {
        self.layers[..len.min(self.layers.len())]
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// What the group of the first `len` nodes plans from: the head's
    /// input, the last member's output, the head's host node.
    pub fn args<'b>(&'b self, len: usize, name: &'b str) -> Option<PlanArgs<'b>> {
        let (head, tail) = (self.layers.first()?, self.layers.get(len.checked_sub(1)?)?);
        let (first, last) =
            (self.model.resolved.get(head.nodes.start)?, self.model.resolved.get(tail.nodes.start)?);
        Some(PlanArgs {
            name,
            node: head.nodes.start,
            in_shape: &first.in_shape,
            out_shape: &last.out_shape,
            max_batch: self.max_batch,
            compute: self.model.precision.input,
            model: self.model,
        })
    }
}

#[cfg(test)]
std::thread_local! {
    /// Tests turn the pass off to run each node alone (the fused groups' reference).
    pub(crate) static FUSE: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// `f` with the pass off on this thread.
#[cfg(test)]
pub(crate) fn unfused<R>(f: impl FnOnce() -> R) -> R {
    let was = FUSE.with(|c| c.replace(false));
    let r = f();
    FUSE.with(|c| c.set(was));
    r
}

fn enabled() -> bool {
    #[cfg(test)]
    if !FUSE.with(|f| f.get()) {
        return false;
    }
    true
}

/// `layers` (one per host node, in execution order, over `values`
/// activations) with each run a rule takes replaced by its group.
pub fn fuse(
    model: &Model,
    layers: Vec<LayerPlan>,
    values: usize,
    max_batch: usize,
) -> crate::error::Result<Vec<LayerPlan>> {
    if !enabled() {
        return Ok(layers);
    }
    let mut readers = vec![0usize; values];
    for &s in layers.iter().flat_map(|l| &l.srcs) {
        if let Some(r) = readers.get_mut(s) {
            *r += 1;
        }
    }
    if let Some(r) = layers.last().and_then(|l| readers.get_mut(l.dst)) {
        *r += 1;
    }
    let mut out = Vec::with_capacity(layers.len());
    let mut i = 0;
    while i < layers.len() {
        let alone = layers[i..].iter().position(|l| l.o1).unwrap_or(layers.len() - i);
        let run = Run { model, layers: &layers[i..i + alone], readers: &readers, max_batch };
        match crate::nn::layers::fuse_at(&run)? {
            Some((op, needs, len)) if len >= 2 && len <= alone => {
                out.push(merge(&layers[i..i + len], run.name(len), op, needs));
                i += len;
            }
            _ => {
                out.push(layers[i].clone());
                i += 1;
            }
        }
    }
    Ok(out)
}

/// One plan node for `members`: the inputs none of them makes, the last
/// one's output, every member's parameters in order.
fn merge(
    members: &[LayerPlan],
    name: String,
    op: crate::nn::layers::DeviceOp,
    needs: super::layer::Needs,
) -> LayerPlan {
    let (head, tail) = (&members[0], &members[members.len() - 1]);
    let inner: Vec<usize> = members[..members.len() - 1].iter().map(|l| l.dst).collect();
    let srcs: Vec<usize> =
        members.iter().flat_map(|l| l.srcs.iter().copied()).filter(|s| !inner.contains(s)).collect();
    LayerPlan {
        name,
        op,
        needs,
        o1: false,
        src: head.src,
        srcs,
        dst: tail.dst,
        routes: Vec::new(),
        in_numel: head.in_numel,
        out_numel: tail.out_numel,
        params: members.iter().flat_map(|l| l.params.iter().copied()).collect(),
        ready: members.iter().flat_map(|l| l.ready.iter().copied()).collect(),
        nodes: head.nodes.start..tail.nodes.end,
    }
}

#[cfg(test)]
mod tests;
