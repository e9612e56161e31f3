//! One micro-batch on the device, as llm.c's step reads: the forward over
//! the plan, the loss and its gradient, then the backward in reverse with
//! each dx routed as the plan decided (written, or added to what another
//! reader wrote), DDP hearing of each layer's ready gradients as soon as
//! their kernels are launched. Launches only, on the compute stream: no
//! host synchronization.

use super::acts::{reads_and_writes, Acts};
use super::layer::{Backward, Elem, Forward, Grad, Params, RestDx};
use super::model::{view, view_mut, GpuModel, LocalHooks, TrainHooks};
use super::plan::Route;
use crate::error::{Error, Result};
use crate::ops::add::cuda as addk;
use crate::ops::cross_entropy::cuda::{self as xent, CrossEntropyTotals};
use cudarc::driver::CudaView;

impl GpuModel {
    pub(super) fn train<A: Elem>(
        &mut self,
        x: &CudaView<'_, f32>,
        labels: &CudaView<'_, u32>,
        n: usize,
        grad_scale: &CudaView<'_, f32>,
        totals: &mut CrossEntropyTotals,
        hooks: &mut dyn TrainHooks,
    ) -> Result<()> {
        self.load_input(x)?;
        for i in 0..self.plan.layers.len() {
            self.forward_node::<A>(i, n, true, hooks)?;
        }
        let (plan, gpu) = (&self.plan, &*self.gpu);
        let rows = n * plan.positions;
        let acts = Acts { bufs: &mut self.acts, storage: &plan.storage };
        let logits = view::<A>(acts.get(plan.logits()), rows * plan.classes)?;
        let dlogits = &mut self.grads[grad_slot(plan, plan.logits())];
        let mut dlogits = view_mut::<A>(dlogits, rows * plan.classes)?;
        xent::forward_backward(gpu, &logits, labels, [rows, plan.classes], grad_scale, &mut dlogits, totals)?;
        for i in (0..self.plan.layers.len()).rev() {
            let lp = &self.plan.layers[i];
            match lp.needs.grad {
                // dx is dy, in the same buffer.
                Grad::Alias => {}
                Grad::Identity => self.route_dy::<A>(i, n)?,
                Grad::Backward if lp.runs_backward() => self.backward_node::<A>(i, n, hooks)?,
                Grad::Backward => {}
            }
            let lp = &self.plan.layers[i];
            if !lp.ready.is_empty() {
                hooks.grads_ready(&mut self.params, &lp.ready)?;
            }
        }
        Ok(())
    }

    pub(super) fn eval<A: Elem>(
        &mut self,
        x: &CudaView<'_, f32>,
        labels: &CudaView<'_, u32>,
        n: usize,
        totals: &mut CrossEntropyTotals,
    ) -> Result<()> {
        self.load_input(x)?;
        for i in 0..self.plan.layers.len() {
            self.forward_node::<A>(i, n, false, &mut LocalHooks)?;
        }
        let (plan, rows) = (&self.plan, n * self.plan.positions);
        let acts = Acts { bufs: &mut self.acts, storage: &plan.storage };
        let logits = view::<A>(acts.get(plan.logits()), rows * plan.classes)?;
        xent::forward(&self.gpu, &logits, labels, [rows, plan.classes], totals)
    }

    /// The model input: `x` converted to the activation dtype into buffer 0,
    /// and as it is into the token ids a token embedding reads.
    fn load_input(&mut self, x: &CudaView<'_, f32>) -> Result<()> {
        let (gpu, len) = (&*self.gpu, x.len());
        if self.plan.tokens {
            // Sized for the largest batch, which check_batch holds `x` to.
            let mut ids = self.ids.slice_mut(0..len);
            gpu.stream().memcpy_dtod(x, &mut ids).map_err(|e| Error::cuda("copying the token ids", e))?;
        }
        let mut acts = Acts { bufs: &mut self.acts, storage: &self.plan.storage };
        match acts.get_mut(0) {
            super::params::DevBuf::F32(b) => gpu
                .stream()
                .memcpy_dtod(x, &mut b.slice_mut(0..len))
                .map_err(|e| Error::cuda("copying the input batch", e)),
            super::params::DevBuf::F16(b) => crate::cuda::cast::f32_to_f16(gpu, x, &mut b.slice_mut(0..len)),
        }
    }

    /// Node `i`'s forward over `n` samples (nothing for an alias).
    fn forward_node<A: Elem>(
        &mut self,
        i: usize,
        n: usize,
        train: bool,
        hooks: &mut dyn TrainHooks,
    ) -> Result<()> {
        let GpuModel { params, draws, gpu, blas, plan, nodes, o1_inputs, acts, scratch, ids, .. } = self;
        let lp = &plan.layers[i];
        if lp.needs.grad == Grad::Alias {
            return Ok(());
        }
        let mut acts = Acts { bufs: acts, storage: &plan.storage };
        let (xs, y) = acts.reads_write(&lp.srcs, lp.dst)?;
        let mut xs = xs.into_iter().map(|b| view::<A>(b, n * lp.in_numel)).collect::<Result<Vec<_>>>()?;
        // The plan's srcs start with src: every layer reads a value.
        let rest = xs.split_off(1);
        let f = Forward {
            gpu,
            blas,
            n,
            train,
            draws: draws.node(lp.nodes.start),
            params: Params::Model { all: params, ids: &lp.params },
            x: xs.remove(0),
            rest,
            y: view_mut::<A>(y, n * lp.out_numel)?,
            ws: scratch.all(),
            ids: ids.as_view(),
            hooks,
        };
        match &mut o1_inputs[i] {
            Some(x16) => super::o1::forward(&mut nodes[i], x16, f),
            None => nodes[i].forward(f),
        }
    }

    /// Node `i`'s backward: its parameters' gradients, and its dx routed.
    fn backward_node<A: Elem>(&mut self, i: usize, n: usize, hooks: &mut dyn TrainHooks) -> Result<()> {
        let GpuModel {
            params,
            draws,
            gpu,
            blas,
            plan,
            nodes,
            o1_inputs,
            acts,
            grads,
            dx_scratch,
            scratch,
            ids,
            ..
        } = self;
        let lp = &plan.layers[i];
        let acts = Acts { bufs: acts, storage: &plan.storage };
        let (in_len, out_len) = (n * lp.in_numel, n * lp.out_numel);
        let read = |wanted: bool, value: usize, len: usize| -> Result<Option<CudaView<'_, A>>> {
            wanted.then(|| view::<A>(acts.get(value), len)).transpose()
        };
        let (x, y) =
            (read(lp.needs.reads_input, lp.src, in_len)?, read(lp.needs.reads_output, lp.dst, out_len)?);
        let dst = grad_slot(plan, lp.dst);
        let route = lp.routes.first().copied().unwrap_or(Route::None);
        // The gradients written here: dx's when it is the first into its
        // value's, and each later input's (a fused group's) that has one.
        let later: Vec<(Route, usize)> = lp
            .srcs
            .iter()
            .skip(1)
            .zip(lp.routes.iter().skip(1))
            .filter(|(_, &r)| r != Route::None)
            .map(|(&s, &r)| (r, grad_slot(plan, s)))
            .collect();
        let first = (route == Route::Write).then(|| grad_slot(plan, lp.src));
        let slots: Vec<usize> = first.iter().copied().chain(later.iter().map(|&(_, s)| s)).collect();
        let (dy, mut writes) = reads_and_writes(grads, &[dst], &slots)?;
        let rest = writes.split_off(first.iter().count());
        let dx = match route {
            Route::None => None,
            Route::Add => Some(&mut *dx_scratch),
            Route::Write => writes.pop(),
        };
        let rest = later
            .iter()
            .zip(rest)
            .map(|(&(r, _), g)| {
                let g = view_mut::<A>(g, in_len)?;
                Ok(if r == Route::Add { RestDx::Add(g) } else { RestDx::Write(g) })
            })
            .collect::<Result<Vec<_>>>()?;
        let b = Backward {
            gpu,
            blas,
            n,
            draws: draws.node(lp.nodes.start),
            params: Params::Model { all: params, ids: &lp.params },
            x,
            y,
            dy: view::<A>(dy[0], out_len)?,
            dx: dx.map(|d| view_mut::<A>(d, in_len)).transpose()?,
            rest,
            ws: scratch.all(),
            ids: ids.as_view(),
            hooks,
        };
        match &o1_inputs[i] {
            Some(x16) => super::o1::backward(&nodes[i], x16, lp.in_numel, b)?,
            None => nodes[i].backward(b)?,
        }
        if route == Route::Add {
            let from = view::<A>(dx_scratch, in_len)?;
            addk::accumulate(gpu, &mut view_mut::<A>(&mut grads[grad_slot(plan, lp.src)], in_len)?, &from)?;
        }
        Ok(())
    }

    /// A join's dy into each input's gradient: copied into the first, added to a later one.
    fn route_dy<A: Elem>(&mut self, i: usize, n: usize) -> Result<()> {
        let (plan, gpu) = (&self.plan, &*self.gpu);
        let lp = &plan.layers[i];
        let len = n * lp.in_numel;
        for (&s, &route) in lp.srcs.iter().zip(&lp.routes) {
            if route == Route::None {
                continue;
            }
            let (dy, mut dx) =
                reads_and_writes(&mut self.grads, &[grad_slot(plan, lp.dst)], &[grad_slot(plan, s)])?;
            let (dy, mut dx) = (view::<A>(dy[0], len)?, view_mut::<A>(&mut *dx[0], len)?);
            match route {
                Route::Add => addk::accumulate(gpu, &mut dx, &dy)?,
                _ => gpu
                    .stream()
                    .memcpy_dtod(&dy, &mut dx)
                    .map_err(|e| Error::cuda(format!("{} backward", lp.name), e))?,
            }
        }
        Ok(())
    }
}

/// The gradient buffer of activation `value` (the input's is `usize::MAX`:
/// never computed, and refused by `reads_and_writes`).
fn grad_slot(plan: &super::plan::Plan, value: usize) -> usize {
    plan.grad_buffer[value]
}
