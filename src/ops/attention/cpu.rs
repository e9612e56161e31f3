//! Attention's CPU kernels, generic over f32/f64, parallel over the batch
//! (each sample's heads write only that sample's rows). Each head's products
//! are GEMMs on its gathered `[T, hd]` blocks: the scalar dot products they
//! replace took a third of a baby GPT's training step.

use crate::ops::dropout::{cpu::apply, Mask};
use crate::ops::gemm::{gemm, Par};
use crate::ops::Elem;
use rayon::prelude::*;

#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub n: usize,
    pub t: usize,
    /// Model width (all heads).
    pub c: usize,
    pub h: usize,
}

impl Dims {
    fn hd(&self) -> usize {
        self.c / self.h
    }
}

/// The dropped-out copy of one head's softmax `[T, T]`, element `e` of the
/// whole `[N, H, T, T]` at `offset + e`.
fn dropped<'a, T: Elem>(att: &'a [T], mask: Option<&Mask>, offset: u64) -> std::borrow::Cow<'a, [T]> {
    match mask {
        Some(m) => {
            let mut a = att.to_vec();
            apply(m, &mut a, offset);
            std::borrow::Cow::Owned(a)
        }
        None => std::borrow::Cow::Borrowed(att),
    }
}

/// One head's `[T, hd]` block of columns `col..col + hd` of the `[T, stride]` rows of `x`.
fn gather<T: Elem>(x: &[T], t: usize, stride: usize, col: usize, hd: usize) -> Vec<T> {
    (0..t).flat_map(|i| x[i * stride + col..i * stride + col + hd].iter().copied()).collect()
}

/// Writes one head's `[T, hd]` block into columns `col..col + hd` of `out`'s `[T, stride]` rows.
fn scatter<T: Elem>(block: &[T], out: &mut [T], stride: usize, col: usize, hd: usize) {
    for (i, row) in block.chunks_exact(hd).enumerate() {
        out[i * stride + col..i * stride + col + hd].copy_from_slice(row);
    }
}

/// `y[N, T, C]` and the softmax `att[N, H, T, T]` (0 above the diagonal).
/// Per sample and head: `q k^T` and `att v` as GEMMs (the CUDA twin's
/// cuBLAS calls), the causal softmax row by row with the row max subtracted.
pub fn forward<T: Elem>(d: Dims, x: &[T], mask: Option<&Mask>, y: &mut [T], att: &mut [T]) {
    let Dims { t, c, h, .. } = d;
    let hd = d.hd();
    let scale = T::one() / T::from_usize(hd).unwrap_or_else(T::one).sqrt();
    y.par_chunks_mut(t * c)
        .zip(att.par_chunks_mut(h * t * t))
        .zip(x.par_chunks(t * 3 * c))
        .enumerate()
        .for_each(|(n, ((y, att), x))| {
            for head in 0..h {
                let q = gather(x, t, 3 * c, head * hd, hd);
                let k = gather(x, t, 3 * c, c + head * hd, hd);
                let v = gather(x, t, 3 * c, 2 * c + head * hd, hd);
                let a = &mut att[head * t * t..(head + 1) * t * t];
                gemm(t, t, hd, &q, false, &k, true, a, false, Par::Seq);
                for (i, row) in a.chunks_exact_mut(t).enumerate() {
                    let mut max = T::neg_infinity();
                    for s in row.iter_mut().take(i + 1) {
                        *s = *s * scale;
                        max = max.max(*s);
                    }
                    let mut sum = T::zero();
                    for s in row.iter_mut().take(i + 1) {
                        *s = (*s - max).exp();
                        sum = sum + *s;
                    }
                    for (j, s) in row.iter_mut().enumerate() {
                        *s = if j <= i { *s / sum } else { T::zero() };
                    }
                }
                let offset = ((n * h + head) * t * t) as u64;
                let ad = dropped(a, mask, offset);
                let mut yh = vec![T::zero(); t * hd];
                gemm(t, hd, t, &ad, false, &v, false, &mut yh, false, Par::Seq);
                scatter(&yh, y, c, head * hd, hd);
            }
        });
}

/// `dx[N, T, 3C]` (`=`) for the q, k and v parts, each a GEMM per sample and head.
pub fn backward<T: Elem>(d: Dims, x: &[T], att: &[T], dy: &[T], mask: Option<&Mask>, dx: &mut [T]) {
    let Dims { t, c, h, .. } = d;
    let hd = d.hd();
    let scale = T::one() / T::from_usize(hd).unwrap_or_else(T::one).sqrt();
    dx.par_chunks_mut(t * 3 * c).zip(x.par_chunks(t * 3 * c)).zip(dy.par_chunks(t * c)).enumerate().for_each(
        |(n, ((dx, x), dy))| {
            for head in 0..h {
                let q = gather(x, t, 3 * c, head * hd, hd);
                let k = gather(x, t, 3 * c, c + head * hd, hd);
                let v = gather(x, t, 3 * c, 2 * c + head * hd, hd);
                let dyh = gather(dy, t, c, head * hd, hd);
                let a = &att[(n * h + head) * t * t..(n * h + head + 1) * t * t];
                let offset = ((n * h + head) * t * t) as u64;
                let ad = dropped(a, mask, offset);
                // d(dropped softmax) = dy v^T, then through the mask.
                let mut da = vec![T::zero(); t * t];
                gemm(t, t, hd, &dyh, false, &v, true, &mut da, false, Par::Seq);
                if let Some(m) = mask {
                    apply(m, &mut da, offset);
                }
                // dv = (dropped softmax)^T dy.
                let mut dv = vec![T::zero(); t * hd];
                gemm(t, hd, t, &ad, true, &dyh, false, &mut dv, false, Par::Seq);
                // Softmax backward: ds = a * (da - sum_j a da) * scale on and below the diagonal.
                let mut ds = vec![T::zero(); t * t];
                for i in 0..t {
                    let (ar, dar) = (&a[i * t..i * t + i + 1], &da[i * t..i * t + i + 1]);
                    let dot = ar.iter().zip(dar).map(|(&p, &g)| p * g).sum::<T>();
                    for j in 0..=i {
                        ds[i * t + j] = ar[j] * (dar[j] - dot) * scale;
                    }
                }
                // dq = ds k, dk = ds^T q.
                let (mut dq, mut dk) = (vec![T::zero(); t * hd], vec![T::zero(); t * hd]);
                gemm(t, hd, t, &ds, false, &k, false, &mut dq, false, Par::Seq);
                gemm(t, hd, t, &ds, true, &q, false, &mut dk, false, Par::Seq);
                scatter(&dq, dx, 3 * c, head * hd, hd);
                scatter(&dk, dx, 3 * c, c + head * hd, hd);
                scatter(&dv, dx, 3 * c, 2 * c + head * hd, hd);
            }
        },
    );
}
