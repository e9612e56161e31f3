//! Backward over the graph: the layers in reverse, a value read by several
//! nodes getting the sum of their gradients (`+=`, in the order backward
//! reaches them), each parameter's gradient accumulated into its `.grad`.
//!
//! A layer may hand its parameter gradients over for later ([`Defer`]), as
//! linear does with `dW += dy^T x`, half of a transformer's backward
//! products. The input gradients are the critical path (each layer waits for
//! the one after it); the parameter gradients are tasks on the pool, spawned
//! before the layer computes its dx, that a core takes up whenever the
//! critical path leaves it idle (the tail of a split product, a short serial
//! op). A baby GPT's CPU step left one of its two cores idle about 9% of the
//! time, mostly beside its backward products; spawned after the dx instead,
//! the tasks often ran out while the other core finished a product alone.
//! On one thread, the layers compute them in place as before.
//!
//! A task runs the operations the layer would have run, into the same
//! tensor, so the bits never depend on when it ran. Its gradients leave
//! their parameters while it runs and are back before anything else reads
//! or adds to them: before a layer that adds to one (a tied weight's owner)
//! runs, and before the hooks (DDP's buckets) see them, in the same order
//! as without deferral.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use super::layers::{Defer, GradJob, Weights};
use super::{Model, Saved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[cfg(test)]
thread_local! {
    /// Tasks spawned by walks on this thread (the tests check that deferral happens).
    pub(super) static SPAWNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What a finished task hands back: the gradients it held, and its result.
type Outcome = (Vec<Tensor>, Result<()>);

/// One layer's parameter gradients, computing on the pool.
struct Task {
    /// The (node, parameter) each held gradient belongs to, in job order
    /// (a tied slot's is its owner's).
    homes: Vec<(usize, usize)>,
    out: Arc<Mutex<Option<Outcome>>>,
}

impl Task {
    fn done(&self) -> bool {
        self.out.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// Waits for the task, running other pool work meanwhile (the task
    /// itself, when no other thread has taken it).
    fn wait(self) -> (Vec<(usize, usize)>, Outcome) {
        loop {
            if let Some(outcome) = self.out.lock().unwrap_or_else(PoisonError::into_inner).take() {
                return (self.homes, outcome);
            }
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::hint::spin_loop();
            }
        }
    }
}

/// The state of one backward walk.
struct Walk<'m, 'h> {
    model: &'m mut Model,
    /// Per node: its parameter gradients' task, while one runs.
    tasks: Vec<Option<Task>>,
    /// Nodes walked whose parameters the hooks have not seen yet, in order.
    unreported: VecDeque<usize>,
    /// Per node: the index of its first own parameter in registration order.
    first_param: Vec<usize>,
    on_ready: &'h mut dyn FnMut(usize, &Tensor) -> Result<()>,
}

/// A layer backward's [`Defer`]: spawns its job on the walk's scope.
struct Spawner<'a, 'scope> {
    scope: &'a rayon::Scope<'scope>,
    /// Where the spawned job's outcome will be.
    out: Cell<Option<Arc<Mutex<Option<Outcome>>>>>,
}

impl Defer for Spawner<'_, '_> {
    fn spawn(&self, w: &mut Weights, job: GradJob) {
        #[cfg(test)]
        SPAWNED.with(|n| n.set(n.get() + 1));
        let mut held: Vec<Tensor> =
            w.params.iter_mut().map(|p| std::mem::replace(&mut p.grad, Tensor::zeros(&[0]))).collect();
        let out = Arc::new(Mutex::new(None));
        let back = out.clone();
        self.scope.spawn(move |_| {
            // A panic becomes the task's error: a waiter must never wait on
            // a task that will not finish.
            let result = catch_unwind(AssertUnwindSafe(|| job(&mut held))).unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Error::internal(format!("a deferred parameter gradient panicked: {what}")))
            });
            *back.lock().unwrap_or_else(PoisonError::into_inner) = Some((held, result));
        });
        self.out.set(Some(out));
    }
}

impl Model {
    /// Backward from dlogits, accumulating into every parameter's grad.
    /// The input gradient of the first layer is never computed.
    pub fn backward(&mut self, saved: Vec<Saved>, dlogits: Tensor) -> Result<()> {
        self.backward_hooked(saved, dlogits, &mut |_, _| Ok(()))
    }

    /// [`Model::backward`] that calls `on_ready(param_index, grad)` for each
    /// parameter (registration order) once its layer's backward is done,
    /// layer by layer in reverse, so DDP can start reducing a bucket while
    /// backward goes on.
    pub fn backward_hooked(
        &mut self,
        saved: Vec<Saved>,
        dlogits: Tensor,
        on_ready: &mut dyn FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<()> {
        let n = self.layers.len();
        if saved.len() != n {
            return Err(Error::internal(format!(
                "backward of {n} layers given {} saved states",
                saved.len()
            )));
        }
        let mut first_param = Vec::with_capacity(n);
        let mut count = 0;
        for layer in &self.layers {
            first_param.push(count);
            count += layer.own_params().count();
        }
        let tasks = (0..n).map(|_| None).collect();
        let mut walk = Walk { model: self, tasks, unreported: VecDeque::new(), first_param, on_ready };
        rayon::in_place_scope(|scope| {
            let walked = walk.run(scope, saved, dlogits);
            // Every gradient goes home, whatever happened, before the scope ends.
            let landed = (0..n).try_for_each(|i| walk.land(i));
            walked.and(landed)
        })
    }
}

impl<'scope> Walk<'_, '_> {
    fn run(&mut self, scope: &rayon::Scope<'scope>, saved: Vec<Saved>, dlogits: Tensor) -> Result<()> {
        let n = self.model.layers.len();
        let inputs: Vec<Vec<usize>> =
            (0..n).map(|i| self.model.inputs(i).map(<[usize]>::to_vec)).collect::<Result<_>>()?;
        let prec = self.model.precision;
        let mut grads: Vec<Option<Tensor>> = (0..=n).map(|_| None).collect();
        grads[n] = Some(dlogits);
        // A value's gradients from its other readers, added by its producer.
        let mut more: Vec<Vec<Tensor>> = (0..=n).map(|_| Vec::new()).collect();
        // Tasks need a pool worker to spawn them where the pool's other
        // workers look first, and another worker to take them: one thread
        // (or a thread outside any pool, whose tasks would queue behind
        // every other caller's) runs each layer's parameter gradients in
        // place, as the layer would.
        let deferring = rayon::current_thread_index().is_some() && rayon::current_num_threads() > 1;
        for (i, s) in saved.into_iter().enumerate().rev() {
            self.land_touched_by(i)?;
            // A value nothing downstream needed a gradient for (a fused
            // layer's, or one the graph never reads back to) has none.
            if let Some(dy) = grads[i + 1].take() {
                // The model input needs no gradient.
                let need: Vec<bool> = inputs[i].iter().map(|&v| v > 0).collect();
                let spawner = Spawner { scope, out: Cell::new(None) };
                let defer = deferring.then_some(&spawner as &dyn Defer);
                self.model.swap_tied(i)?;
                let dy_more = std::mem::take(&mut more[i + 1]);
                let dxs = self.model.layers[i].backward(s, dy, dy_more, &need, prec, defer);
                self.model.swap_tied(i)?;
                if let Some(out) = spawner.out.take() {
                    self.tasks[i] = Some(Task { homes: self.homes(i), out });
                }
                for (&v, dx) in inputs[i].iter().zip(dxs?) {
                    let (Some(dx), true) = (dx, v > 0) else { continue };
                    match &mut grads[v] {
                        Some(_) => more[v].push(dx),
                        slot => *slot = Some(dx),
                    }
                }
            }
            // Even a layer no gradient reached reports its (zero) gradients:
            // DDP's buckets wait for every parameter.
            self.unreported.push_back(i);
            self.report(false)?;
        }
        self.report(true)
    }

    /// Where node `i`'s gradients live, in parameter order: a tied slot's
    /// is its owner's.
    fn homes(&self, i: usize) -> Vec<(usize, usize)> {
        let node = &self.model.layers[i];
        (0..node.weights.params.len())
            .map(|k| match &node.tie {
                Some(t) if t.slot == k => (t.node, t.param),
                _ => (i, k),
            })
            .collect()
    }

    /// Waits for node `i`'s task, if it has one, and puts its gradients back.
    fn land(&mut self, i: usize) -> Result<()> {
        let Some(task) = self.tasks[i].take() else { return Ok(()) };
        let (homes, (held, result)) = task.wait();
        for ((node, k), grad) in homes.into_iter().zip(held) {
            let home = self.model.layers.get_mut(node).and_then(|l| l.weights.params.get_mut(k));
            let home = home.ok_or_else(|| Error::internal(format!("no parameter {k} on layer {node}")))?;
            home.grad = grad;
        }
        result
    }

    /// Lands every task holding a gradient that node `i`'s backward adds to:
    /// its own parameters', and its tied weight's owner's.
    fn land_touched_by(&mut self, i: usize) -> Result<()> {
        let owner = self.model.layers[i].tie.as_ref().map(|t| t.node);
        for j in 0..self.tasks.len() {
            let touches = self.tasks[j]
                .as_ref()
                .is_some_and(|t| t.homes.iter().any(|&(node, _)| node == i || Some(node) == owner));
            if touches {
                self.land(j)?;
            }
        }
        Ok(())
    }

    /// Shows the hooks the parameters of walked nodes, in walk order, as far
    /// as their tasks are done (all of them, waiting, when `all`).
    fn report(&mut self, all: bool) -> Result<()> {
        while let Some(&i) = self.unreported.front() {
            if !all && self.tasks[i].as_ref().is_some_and(|t| !t.done()) {
                return Ok(());
            }
            self.land(i)?;
            for (k, p) in self.model.layers[i].own_params().enumerate() {
                (self.on_ready)(self.first_param[i] + k, &p.grad)?;
            }
            self.unreported.pop_front();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests_tie::tied_layers;

    /// A task that panics ends as an error, its gradients back home: the
    /// walk waiting for it never hangs.
    #[test]
    fn a_panicking_task_is_an_error_not_a_hang() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut model = Model::new(&tied_layers(), 3).unwrap();
        let before: Vec<Vec<f32>> = model.params().iter().map(|p| p.grad.to_f32_vec()).collect();
        let last = model.layers.len() - 1;
        let e = pool.install(|| {
            let mut on_ready = |_: usize, _: &Tensor| Ok(());
            let tasks = (0..model.layers.len()).map(|_| None).collect();
            let mut walk = Walk {
                model: &mut model,
                tasks,
                unreported: VecDeque::new(),
                first_param: vec![],
                on_ready: &mut on_ready,
            };
            rayon::in_place_scope(|scope| {
                let spawner = Spawner { scope, out: Cell::new(None) };
                spawner.spawn(&mut walk.model.layers[last].weights, Box::new(|_| panic!("kernel bug")));
                let out = spawner.out.take().expect("spawned");
                walk.tasks[last] = Some(Task { homes: walk.homes(last), out });
                walk.land(last)
            })
        });
        let e = e.unwrap_err().to_string();
        assert!(e.contains("a deferred parameter gradient panicked: kernel bug"), "{e}");
        let after: Vec<Vec<f32>> = model.params().iter().map(|p| p.grad.to_f32_vec()).collect();
        assert_eq!(after, before);
    }
}
