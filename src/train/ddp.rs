//! DistributedDataParallel around the trainer: join the job, make every rank
//! start from rank 0's model, reduce gradients in buckets while backward runs,
//! keep BatchNorm buffers in step, and combine evaluation results. At world
//! size 1 every call is a cheap no-op, so the loop has one code path.

use super::EvalResult;
use crate::config::Config;
use crate::dist::{self, reducer::Reducer, Buffer, Communicator, DistEnv, ReduceOp};
use crate::error::Result;
use crate::nn::{Layer, Model, Saved};
use crate::tensor::Tensor;
use std::sync::Arc;

pub struct Ddp {
    pub env: DistEnv,
    comm: Arc<dyn Communicator>,
    reducer: Option<Reducer>,
    broadcast_buffers: bool,
    /// Sum and count of the per-step share of all-reduce time hidden behind backward.
    hidden: (f64, u64),
}

impl Ddp {
    /// Joins the job (rendezvous) and prepares `model` as PyTorch's DDP
    /// constructor does: rank 0's parameters and buffers go to every rank,
    /// BatchNorm becomes SyncBatchNorm when `parallel.sync_batchnorm`.
    pub fn init(cfg: &Config, model: &mut Model) -> Result<Ddp> {
        let (env, comm) = dist::init(cfg)?;
        let comm: Arc<dyn Communicator> = Arc::from(comm);
        let world = comm.world_size();
        let mut ddp =
            Ddp { env, comm: comm.clone(), reducer: None, broadcast_buffers: false, hidden: (0.0, 0) };
        if world > 1 {
            ddp.broadcast_state(model, true)?;
            if cfg.parallel.sync_batchnorm {
                model.convert_sync_batchnorm(comm.clone());
            }
            // With SyncBatchNorm the running statistics are already equal everywhere.
            ddp.broadcast_buffers = cfg.parallel.broadcast_buffers && !cfg.parallel.sync_batchnorm;
            let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
            ddp.reducer = Some(Reducer::new(
                comm,
                &sizes,
                cfg.parallel.first_bucket_mb,
                cfg.parallel.bucket_cap_mb,
                cfg.parallel.gradient_predivide_factor,
            ));
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

    /// Rank 0 writes the run's files; the others only train.
    pub fn is_primary(&self) -> bool {
        self.rank() == 0
    }

    /// Rank 0's parameters (when `params`) and BatchNorm buffers, to every rank.
    fn broadcast_state(&self, model: &mut Model, params: bool) -> Result<()> {
        let mut tensors: Vec<&mut Tensor> = Vec::new();
        let mut counters: Vec<&mut i64> = Vec::new();
        for layer in &mut model.layers {
            match layer {
                Layer::BatchNorm2d(bn) => {
                    let bn = &mut **bn;
                    if params {
                        tensors.push(&mut bn.weight.value);
                        tensors.push(&mut bn.bias.value);
                    }
                    tensors.push(&mut bn.running_mean);
                    tensors.push(&mut bn.running_var);
                    counters.push(&mut bn.num_batches_tracked);
                }
                Layer::Conv2d { weight, bias, .. } | Layer::Linear { weight, bias } if params => {
                    tensors.push(&mut weight.value);
                    if let Some(b) = bias {
                        tensors.push(&mut b.value);
                    }
                }
                _ => {}
            }
        }
        if tensors.is_empty() {
            return Ok(());
        }
        let mut flat = Vec::new();
        for t in &tensors {
            flat.extend_from_slice(t.as_f32()?);
        }
        // Counters ride along as f32: exact below 2^24 steps.
        flat.extend(counters.iter().map(|c| **c as f32));
        let what = if params { "initial parameter broadcast" } else { "BatchNorm buffer broadcast" };
        let flat = self.comm.broadcast(Buffer::F32(flat), 0, what)?.into_f32()?;
        let mut off = 0;
        for t in tensors {
            let dst = t.as_f32_mut()?;
            dst.copy_from_slice(&flat[off..off + dst.len()]);
            off += dst.len();
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
        match (&mut self.reducer, sync) {
            (Some(reducer), true) => {
                model
                    .backward_hooked(saved, dlogits, &mut |i, grad| reducer.mark_ready(i, grad.as_f32()?))?;
                let mut params = model.params_mut();
                let mut grads: Vec<&mut [f32]> =
                    params.iter_mut().map(|p| p.grad.as_f32_mut()).collect::<Result<_>>()?;
                reducer.finish(&mut grads)?;
                self.hidden.0 += reducer.last_overlap().hidden_fraction();
                self.hidden.1 += 1;
                Ok(())
            }
            _ => model.backward(saved, dlogits),
        }
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

    /// Waits until every rank is here (end of run, around checkpoints).
    pub fn barrier(&self, what: &str) -> Result<()> {
        if self.world_size() > 1 {
            self.comm.barrier(what)?;
        }
        Ok(())
    }
}
