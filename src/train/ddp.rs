//! DistributedDataParallel around the trainer: join the job, make every rank
//! start from rank 0's model, reduce gradients in buckets while backward runs,
//! keep BatchNorm buffers in step, and combine evaluation results. At world
//! size 1 every call is a cheap no-op, so the loop has one code path.
//!
//! The gradient reducer is built at the first synchronizing backward, from the
//! parameters' dtypes then: `amp` casts the model (O2: f16 conv/linear, f32
//! BatchNorm) after the replicas are made equal, and the buckets follow the
//! gradients' dtypes.

use super::stop::{self, Agreed, Vote};
use super::EvalResult;
use crate::config::Config;
use crate::dist::reducer::{Reducer, ReducerOptions};
use crate::dist::{self, Buffer, Communicator, DistEnv, ReduceOp};
use crate::error::{Error, Result};
use crate::nn::layers::BufferValue;
use crate::nn::{Model, Saved, StateEntry, StateValue};
use crate::tensor::Tensor;
use std::sync::Arc;

/// Testing hook: `DDPTRAIN_INJECT_GRAD_INF=RANK:STEP` makes rank RANK put an
/// inf into its local gradient (the first one backward produces) at optimizer
/// step STEP (1-based, counted by this process), before the all-reduce, to
/// test that an overflow on one rank makes every rank skip the step.
pub const INJECT_GRAD_INF_VAR: &str = "DDPTRAIN_INJECT_GRAD_INF";

/// Parses [`INJECT_GRAD_INF_VAR`]: `(rank, step)`.
pub fn parse_inject_grad_inf(v: &str) -> Result<(usize, u64)> {
    let bad = || {
        Error::Unsupported(format!(
            "{INJECT_GRAD_INF_VAR}={v:?}: expected RANK:STEP with a step >= 1, e.g. \"1:3\" (a testing hook)"
        ))
    };
    let (r, s) = v.split_once(':').ok_or_else(bad)?;
    let rank = r.trim().parse().map_err(|_| bad())?;
    let step: u64 = s.trim().parse().map_err(|_| bad())?;
    if step == 0 {
        return Err(bad());
    }
    Ok((rank, step))
}

pub struct Ddp {
    pub env: DistEnv,
    comm: Arc<dyn Communicator>,
    reducer: Option<Reducer>,
    reducer_opts: ReducerOptions,
    broadcast_buffers: bool,
    /// Sum and count of the per-step share of all-reduce time hidden behind backward.
    hidden: (f64, u64),
    /// Synchronizing backwards so far (= optimizer steps this process ran).
    synced_steps: u64,
    /// The step at which this rank injects an inf ([`INJECT_GRAD_INF_VAR`]).
    inject_inf_at: Option<u64>,
    /// What the ranks agreed on in the last synchronizing backward.
    agreed: Agreed,
    /// This rank's vote for a timed checkpoint, sent with the next synchronizing backward.
    save_vote: bool,
}

impl Ddp {
    /// Joins the job (rendezvous) and prepares `model` as PyTorch's DDP
    /// constructor does: rank 0's parameters and buffers go to every rank,
    /// BatchNorm becomes SyncBatchNorm when `parallel.sync_batchnorm`.
    pub fn init(cfg: &Config, model: &mut Model) -> Result<Ddp> {
        let inject = match std::env::var(INJECT_GRAD_INF_VAR) {
            Ok(v) if !v.is_empty() => Some(parse_inject_grad_inf(&v)?),
            _ => None,
        };
        let (env, comm) = dist::init(cfg)?;
        let comm: Arc<dyn Communicator> = Arc::from(comm);
        let world = comm.world_size();
        let inject_inf_at = inject.filter(|(r, _)| *r == comm.rank()).map(|(_, s)| s);
        let mut ddp = Ddp {
            env,
            comm: comm.clone(),
            reducer: None,
            reducer_opts: ReducerOptions::from_config(&cfg.parallel),
            broadcast_buffers: false,
            hidden: (0.0, 0),
            synced_steps: 0,
            inject_inf_at,
            agreed: Agreed::default(),
            save_vote: false,
        };
        if world > 1 {
            ddp.broadcast_state(model, true)?;
            if cfg.parallel.sync_batchnorm {
                model.convert_sync_batchnorm(comm.clone());
            }
            // With SyncBatchNorm the running statistics are already equal everywhere.
            ddp.broadcast_buffers = cfg.parallel.broadcast_buffers && !cfg.parallel.sync_batchnorm;
        }
        Ok(ddp)
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// The job's communicator (checkpoint resume broadcasts through it).
    pub fn communicator(&self) -> &dyn Communicator {
        &*self.comm
    }

    /// The communicator, shared (the GPU's tcp backend stages through it).
    pub fn communicator_arc(&self) -> Arc<dyn Communicator> {
        self.comm.clone()
    }

    /// The optimizer step at which this rank injects an inf ([`INJECT_GRAD_INF_VAR`]).
    pub fn inject_inf_at(&self) -> Option<u64> {
        self.inject_inf_at
    }

    /// Rank 0 writes the run's files; the others only train.
    pub fn is_primary(&self) -> bool {
        self.rank() == 0
    }

    /// Rank 0's parameters (when `params`) and buffers (BatchNorm's), to every rank.
    fn broadcast_state(&self, model: &mut Model, params: bool) -> Result<()> {
        let mut tensors: Vec<&mut Tensor> = Vec::new();
        let mut counters: Vec<&mut i64> = Vec::new();
        for layer in &mut model.layers {
            if params {
                // A tied weight is its owner's tensor, broadcast once.
                let tied = layer.tie.as_ref().map(|t| t.slot);
                let own = layer.weights.params.iter_mut().enumerate().filter(|&(k, _)| Some(k) != tied);
                tensors.extend(own.map(|(_, p)| &mut p.value));
            }
            for b in &mut layer.weights.buffers {
                match &mut b.value {
                    BufferValue::Tensor(t) => tensors.push(t),
                    BufferValue::Count(c) => counters.push(c),
                }
            }
        }
        if tensors.is_empty() {
            return Ok(());
        }
        let mut flat = Vec::new();
        for t in &tensors {
            // f16 buffers (O3's BatchNorm) travel widened: exact both ways.
            flat.extend(t.to_f32_vec());
        }
        // Counters ride along as f32: exact below 2^24 steps.
        flat.extend(counters.iter().map(|c| **c as f32));
        let what = if params { "initial parameter broadcast" } else { "BatchNorm buffer broadcast" };
        let flat = self.comm.broadcast(Buffer::F32(flat), 0, what)?.into_f32()?;
        let mut off = 0;
        for t in tensors {
            let n = t.numel();
            t.copy_from_f32(&flat[off..off + n])?;
            off += n;
        }
        for c in counters {
            *c = flat[off] as i64;
            off += 1;
        }
        Ok(())
    }

    /// Before each training forward (and before evaluation), like DDP's
    /// `broadcast_buffers=True`: rank 0's BatchNorm running statistics win.
    pub fn sync_buffers(&self, model: &mut Model) -> Result<()> {
        if self.broadcast_buffers {
            self.broadcast_state(model, false)?;
        }
        Ok(())
    }

    /// Backward; when `sync` (the last micro-step of an accumulation), every
    /// bucket's all-reduce starts as soon as its gradients are ready and the
    /// averaged gradients are in place on return. Without `sync` the gradients
    /// only accumulate locally (PyTorch's `no_sync()`).
    pub fn backward(
        &mut self,
        model: &mut Model,
        saved: Vec<Saved>,
        dlogits: Tensor,
        sync: bool,
    ) -> Result<()> {
        if !sync {
            return model.backward(saved, dlogits);
        }
        self.synced_steps += 1;
        let inject = self.inject_inf_at == Some(self.synced_steps);
        if self.comm.world_size() == 1 {
            model.backward(saved, dlogits)?;
            if inject {
                if let Some(p) = model.params_mut().pop() {
                    p.grad.fill_(f32::INFINITY);
                }
            }
            return Ok(());
        }
        let vote = self.vote();
        let reducer = self.reducer_for(model);
        if inject {
            reducer.inject_inf_next();
        }
        reducer.set_vote(vote.elements());
        model.backward_hooked(saved, dlogits, &mut |i, grad| reducer.mark_ready(i, grad))?;
        let mut params = model.params_mut();
        let mut grads: Vec<&mut Tensor> = params.iter_mut().map(|p| &mut p.grad).collect();
        reducer.finish(&mut grads)?;
        let agreed = Agreed::from_sum(reducer.agreed_vote());
        let hidden = reducer.last_overlap().hidden_fraction();
        self.agreed = agreed;
        self.hidden.0 += hidden;
        self.hidden.1 += 1;
        Ok(())
    }

    /// What every rank agreed on through the last step's gradient
    /// all-reduce; at world size 1, this process's own stop request (its
    /// timed saves need no vote: see `stop::after_step`).
    pub fn agreed(&self) -> Agreed {
        if self.world_size() == 1 {
            return Agreed { stop: stop::requested(), save: false };
        }
        self.agreed
    }

    /// This rank's vote for the next synchronizing backward (either device's).
    pub fn vote(&self) -> Vote {
        Vote { stop: stop::requested(), save: self.save_vote }
    }

    /// Sets this rank's vote for a timed checkpoint in the next steps.
    pub fn set_save_vote(&mut self, save: bool) {
        self.save_vote = save;
    }

    /// The reducer for `model`'s parameters as they are now, built on first
    /// use and rebuilt if their sizes or dtypes changed since.
    fn reducer_for(&mut self, model: &Model) -> &mut Reducer {
        let params: Vec<(usize, crate::tensor::DType)> =
            model.params().iter().map(|p| (p.grad.numel(), p.grad.dtype())).collect();
        let fits = self.reducer.as_ref().is_some_and(|r| r.params() == params.as_slice());
        if !fits {
            self.reducer = None;
        }
        self.reducer.get_or_insert_with(|| Reducer::new(self.comm.clone(), &params, &self.reducer_opts))
    }

    /// The mean share of gradient all-reduce time that ran while backward was
    /// still going (None at world size 1).
    pub fn allreduce_hidden_fraction(&self) -> Option<f64> {
        (self.hidden.1 > 0).then(|| self.hidden.0 / self.hidden.1 as f64)
    }

    /// Sums the per-rank evaluation counts (each rank scored its shard).
    pub fn reduce_eval(&self, local: EvalResult) -> Result<EvalResult> {
        if self.world_size() == 1 {
            return Ok(local);
        }
        let buf = [local.loss * local.total as f64, local.correct as f64, local.total as f64];
        let g = self.comm.all_reduce(
            Buffer::F32(buf.iter().map(|&v| v as f32).collect()),
            ReduceOp::Sum,
            "evaluation",
        )?;
        let g = g.into_f32()?;
        let (loss_sum, correct, total) = (f64::from(g[0]), g[1].round() as usize, g[2].round() as usize);
        let denom = total.max(1) as f64;
        Ok(EvalResult { accuracy: correct as f64 / denom, loss: loss_sum / denom, correct, total })
    }

    /// The mean over ranks of a per-rank value (the logged training loss).
    pub fn mean(&self, v: f64) -> Result<f64> {
        if self.world_size() == 1 {
            return Ok(v);
        }
        let g =
            self.comm.all_reduce(Buffer::F32(vec![v as f32]), ReduceOp::Avg, "loss logging")?.into_f32()?;
        Ok(f64::from(g[0]))
    }

    /// At world size > 1, prints this rank's final state (parameters, masters
    /// under O2, buffers) as a digest with its loss scale and skipped steps:
    /// DDP replicas must agree bitwise, and a reader (or a test) can compare
    /// the ranks' lines.
    pub fn report_replica_state(&self, state: &[StateEntry], loss_scale: f32, overflow_steps: u64) {
        if self.world_size() > 1 {
            crate::errln!(
                "rank {}: final state sha256 {} | loss scale {loss_scale} | overflow steps {overflow_steps}",
                self.rank(),
                state_digest(state)
            );
        }
    }

    /// Waits until every rank is here (end of run, around checkpoints).
    pub fn barrier(&self, what: &str) -> Result<()> {
        if self.world_size() > 1 {
            self.comm.barrier(what)?;
        }
        Ok(())
    }
}

/// sha256 over names, shapes and values of a state dict, as hex.
pub fn state_digest(state: &[StateEntry]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for e in state {
        h.update(e.name.as_bytes());
        e.shape.iter().for_each(|d| h.update((*d as u64).to_le_bytes()));
        match &e.value {
            StateValue::F32(v) => v.iter().for_each(|x| h.update(x.to_bits().to_le_bytes())),
            StateValue::I64(v) => h.update(v.to_le_bytes()),
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inject_grad_inf_parses_rank_and_step_and_names_bad_values() {
        assert_eq!(parse_inject_grad_inf("1:3").unwrap(), (1, 3));
        assert_eq!(parse_inject_grad_inf(" 0 : 12 ").unwrap(), (0, 12));
        for bad in ["1", "a:2", "1:x", "1:0", "-1:2", ""] {
            let m = parse_inject_grad_inf(bad).unwrap_err().to_string();
            assert!(m.contains(INJECT_GRAD_INF_VAR) && m.contains("expected RANK:STEP"), "{bad}: {m}");
        }
    }

    #[test]
    fn state_digest_changes_with_any_value() {
        let e = |v: f32| StateEntry { name: "w".into(), shape: vec![1], value: StateValue::F32(vec![v]) };
        assert_eq!(state_digest(&[e(1.0)]), state_digest(&[e(1.0)]));
        assert_ne!(state_digest(&[e(1.0)]), state_digest(&[e(f32::from_bits(1.0f32.to_bits() + 1))]));
        assert_eq!(state_digest(&[e(1.0)]).len(), 64);
    }
}
