//! Embedding on the device (`ops/embedding/cuda.rs`): rows of the table
//! picked by the model input's token ids, or by position. Backward: `+=`
//! into the table's gradient; no dx (its input is the ids).

use super::Embedding;
use crate::error::Result;
use crate::nn::cuda::layer::{Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use crate::ops::embedding::cuda::{self as embk, Lookup, Table};
use cudarc::driver::CudaView;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbeddingPlan {
    pub table: Table,
    /// Outputs per sample.
    pub rows: usize,
    pub positions: bool,
}

/// The first `n` samples' lookups.
fn lookup<'a, 'b>(p: &EmbeddingPlan, ids: &'a CudaView<'b, f32>, n: usize) -> Lookup<'a, 'b> {
    if p.positions {
        Lookup::Positions { rows: n * p.rows, t: p.rows }
    } else {
        Lookup::Tokens(ids)
    }
}

/// The batch's token ids: the model's id buffer holds the largest batch's.
fn batch_ids<'b>(ids: &CudaView<'b, f32>, p: &EmbeddingPlan, n: usize) -> CudaView<'b, f32> {
    ids.slice(0..if p.positions { 0 } else { n * p.rows })
}

impl DeviceLayer for Embedding {
    type Plan = EmbeddingPlan;
    type State = ();

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(EmbeddingPlan, Needs)> {
        let table = Table { num_embeddings: self.num_embeddings, dim: self.embedding_dim };
        if a.out_numel() != a.in_numel() * self.embedding_dim {
            return Err(a.bad(format!("is not an embedding of width {}", self.embedding_dim)));
        }
        let mut needs = Needs::new();
        needs.tokens = !self.positions;
        Ok((EmbeddingPlan { table, rows: a.in_numel(), positions: self.positions }, needs))
    }

    fn state(_: &EmbeddingPlan, _: &StateArgs<'_>) -> Result<()> {
        Ok(())
    }

    fn forward<A: Elem>(p: &EmbeddingPlan, _: &mut (), f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, n, params, mut y, ids, .. } = f;
        let w = params.value::<A>(0)?;
        let ids = batch_ids(&ids, p, n);
        embk::forward(gpu, lookup(p, &ids, n), &w, p.table, &mut y)
    }

    fn backward<A: Elem>(p: &EmbeddingPlan, _: &(), b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, n, mut params, dy, ids, .. } = b;
        let ids = batch_ids(&ids, p, n);
        params.with_grads::<A, ()>(|(dw, _)| embk::backward(gpu, lookup(p, &ids, n), &dy, p.table, dw))
    }
}
