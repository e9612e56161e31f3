//! Pending gradients: with `train.grad_accum_steps` > 1 an epoch can end
//! between optimizer steps, and the gradients of its last micro-batches carry
//! into the next epoch's first step. A checkpoint taken there keeps them in
//! `optim.safetensors`, widened to f32 (exact for f16 gradients, which are
//! rounded back on restore): rank 0's as `<param>.grad`, and with several
//! ranks every other rank's as `rank{r}.<param>.grad`, since under DDP's
//! `no_sync()` each rank accumulates its own until the step's all-reduce.
//! Checkpoints of older builds hold rank 0's only; they still load, with a
//! warning that the step they complete is not exactly the uninterrupted one.

use super::io::ckpt_err;
use crate::dist::{Buffer, Communicator};
use crate::error::{Error, Result};
use crate::nn::{Model, StateEntry};
use std::collections::HashMap;
use std::path::Path;

/// The name of rank `rank`'s pending gradient of parameter `param`.
pub(super) fn grad_name(rank: usize, param: &str) -> String {
    if rank == 0 {
        format!("{param}.grad")
    } else {
        format!("rank{rank}.{param}.grad")
    }
}

/// (rank, parameter index) of a pending-gradient tensor's name, `None` when
/// `name` is not one. A parameter's own name wins over a `rank{r}.` reading.
pub(super) fn parse_grad_name(name: &str, index: &HashMap<String, usize>) -> Option<(usize, usize)> {
    let param = name.strip_suffix(".grad")?;
    if let Some(&i) = index.get(param) {
        return Some((0, i));
    }
    let (rank, param) = param.strip_prefix("rank")?.split_once('.')?;
    if rank.is_empty() || !rank.bytes().all(|b| b.is_ascii_digit()) || rank.starts_with('0') {
        return None;
    }
    Some((rank.parse().ok()?, *index.get(param)?))
}

/// This rank's gradients, flattened in parameter order and widened to f32.
pub(super) fn local_flat(model: &Model) -> Vec<f32> {
    model.params().iter().flat_map(|p| p.grad.to_f32_vec()).collect()
}

/// Every rank's flattened gradients, in rank order (every rank calls this).
pub(super) fn gather(comm: &dyn Communicator, local: Vec<f32>) -> Result<Vec<Vec<f32>>> {
    let n = local.len();
    let all = comm.all_gather(Buffer::F32(local), "checkpoint: pending gradients")?.into_f32()?;
    if n == 0 || all.len() != n * comm.world_size() {
        return Err(Error::Training(format!(
            "checkpoint: the pending-gradient gather returned {} values for {} ranks of {n}",
            all.len(),
            comm.world_size()
        )));
    }
    Ok(all.chunks_exact(n).map(<[f32]>::to_vec).collect())
}

/// The `optim.safetensors` entries of every rank's flattened gradients
/// (`ranks[r]` is rank r's), or none when all are zero: nothing is pending.
pub(super) fn entries(model: &Model, ranks: &[Vec<f32>]) -> Result<Vec<StateEntry>> {
    if !ranks.iter().any(|g| g.iter().any(|&v| v != 0.0)) {
        return Ok(Vec::new());
    }
    let params = model.params();
    let mut out = Vec::with_capacity(params.len() * ranks.len());
    for (rank, flat) in ranks.iter().enumerate() {
        let mut rest = flat.as_slice();
        for p in &params {
            let n = p.grad.numel();
            if rest.len() < n {
                return Err(Error::Training(format!(
                    "internal error: rank {rank}'s pending gradients end before `{}`",
                    p.name
                )));
            }
            let (values, tail) = rest.split_at(n);
            rest = tail;
            out.push(StateEntry {
                name: grad_name(rank, &p.name),
                shape: p.grad.shape().to_vec(),
                value: crate::nn::StateValue::F32(values.to_vec()),
            });
        }
    }
    Ok(out)
}

/// The pending gradients found in a checkpoint: `by_rank[r][i]` is rank r's
/// gradient of parameter i.
pub(super) struct Found<'a> {
    pub by_rank: Vec<Vec<Option<&'a [f32]>>>,
}

impl<'a> Found<'a> {
    pub fn new(world_size: usize, num_params: usize) -> Self {
        Found { by_rank: vec![vec![None; num_params]; world_size.max(1)] }
    }

    /// Records `name` (rank `rank`'s gradient of parameter `i`, `numel` values);
    /// refused when that rank did not write the checkpoint or the size is wrong.
    pub fn insert(
        &mut self,
        path: &Path,
        name: &str,
        (rank, i): (usize, usize),
        numel: usize,
        values: &'a [f32],
    ) -> Result<()> {
        let world = self.by_rank.len();
        let Some(slot) = self.by_rank.get_mut(rank).and_then(|r| r.get_mut(i)) else {
            return Err(ckpt_err(
                path,
                format!(
                    "`{name}` holds pending gradients of rank {rank}, but state.json records a world size \
                     of {world} (ranks 0 to {})",
                    world - 1
                ),
            ));
        };
        if values.len() != numel {
            return Err(ckpt_err(
                path,
                format!("`{name}` has {} values, its parameter {numel}", values.len()),
            ));
        }
        *slot = Some(values);
        Ok(())
    }

    /// Checks the set against state.json's `pending_grads`; returns whether
    /// it is an older build's (rank 0's gradients only, with several ranks).
    pub fn check(&self, path: &Path, pending: bool) -> Result<bool> {
        let count = |r: &Vec<Option<&[f32]>>| r.iter().filter(|g| g.is_some()).count();
        let n = self.by_rank[0].len();
        let fail = |msg: String| Err(ckpt_err(path, msg));
        let have: Vec<(usize, usize)> =
            self.by_rank.iter().map(count).enumerate().filter(|&(_, k)| k > 0).collect();
        if !pending {
            return match have.first() {
                Some(&(r, _)) => fail(format!(
                    "it holds pending gradients (`{}`), but state.json records none (pending_grads = false)",
                    grad_name(r, "<param>")
                )),
                None => Ok(false),
            };
        }
        if count(&self.by_rank[0]) != n {
            return fail(format!(
                "the pending gradients are incomplete: rank 0 has {} of {n} (`<param>.grad`)",
                count(&self.by_rank[0])
            ));
        }
        let legacy = have.len() == 1;
        if legacy {
            return Ok(self.by_rank.len() > 1);
        }
        for (r, grads) in self.by_rank.iter().enumerate().skip(1) {
            if count(grads) != n {
                return fail(format!(
                    "the pending gradients are incomplete: rank {r} has {} of {n} (`rank{r}.<param>.grad`) \
                     of the {} ranks that wrote the checkpoint",
                    count(grads),
                    self.by_rank.len()
                ));
            }
        }
        Ok(false)
    }

    /// Rank `rank`'s gradients, rank 0's for an older build's checkpoint.
    pub fn of_rank(&self, rank: usize, legacy: bool) -> &[Option<&'a [f32]>] {
        let r = if legacy { 0 } else { rank };
        self.by_rank.get(r).map_or(&[], Vec::as_slice)
    }
}
