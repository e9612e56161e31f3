//! Attention's CPU kernels, generic over f32/f64, parallel over the batch
//! (each sample's heads write only that sample's rows). Each head's products
//! are GEMMs reading and writing its `[T, hd]` blocks in place (rows 3C or C
//! apart): the scalar dot products they replaced took a third of a baby
//! GPT's training step, and gathering the blocks into copies a twentieth.
//! The softmax's row sums run in the device's warp order (`ops::warp_order`).

use crate::ops::dropout::{cpu::apply, Mask};
use crate::ops::gemm::{gemm_ld, Par};
use crate::ops::warp_order::{butterfly, lane_sums_of2};
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

/// Rows per block of the causal products: row block `[r0, r1)` of `q k^T`
/// needs only its first `r1` columns (the rest are above the diagonal), so
/// the products skip the blocks above the diagonal (a quarter of the work
/// at T = 64, nearly half at T = 256). The sums keep their bits: an element
/// is the same dot product whichever block computes it, and the terms a
/// block leaves out of `att v` and its gradients are the softmax's zeros.
const CAUSAL_BLOCK: usize = 32;

/// The `[r0, r1)` row blocks of a `t`-row causal product.
fn causal_blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t).step_by(CAUSAL_BLOCK).map(move |r0| (r0, (r0 + CAUSAL_BLOCK).min(t)))
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

/// `y[N, T, C]` and the softmax `att[N, H, T, T]` (0 above the diagonal).
/// Per sample and head: `q k^T` and `att v` as GEMMs (the CUDA twin's
/// cuBLAS calls) that read q, k and v in place from the `[T, 3C]` rows and
/// write each head's columns of y, the causal softmax row by row with the
/// row max subtracted.
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
                let (q, k, v) = (&x[head * hd..], &x[c + head * hd..], &x[2 * c + head * hd..]);
                let a = &mut att[head * t * t..(head + 1) * t * t];
                for (r0, r1) in causal_blocks(t) {
                    let (qr, ar) = ((&q[r0 * 3 * c..], 3 * c, false), (&mut a[r0 * t..], t));
                    gemm_ld(r1 - r0, r1, hd, qr, (k, 3 * c, true), ar, false, Par::Seq);
                }
                // Each row's softmax zeroes what the blocks left above the diagonal.
                for (i, row) in a.chunks_exact_mut(t).enumerate() {
                    super::softmax::row(row, i, scale);
                }
                let offset = ((n * h + head) * t * t) as u64;
                let ad = dropped(a, mask, offset);
                for (r0, r1) in causal_blocks(t) {
                    let yr = (&mut y[r0 * c + head * hd..], c);
                    gemm_ld(
                        r1 - r0,
                        hd,
                        r1,
                        (&ad[r0 * t..], t, false),
                        (v, 3 * c, false),
                        yr,
                        false,
                        Par::Seq,
                    );
                }
            }
        });
}

/// `dx[N, T, 3C]` (`=`) for the q, k and v parts, each a GEMM per sample
/// and head writing its columns in place.
pub fn backward<T: Elem>(d: Dims, x: &[T], att: &[T], dy: &[T], mask: Option<&Mask>, dx: &mut [T]) {
    let Dims { t, c, h, .. } = d;
    let hd = d.hd();
    let scale = T::one() / T::from_usize(hd).unwrap_or_else(T::one).sqrt();
    dx.par_chunks_mut(t * 3 * c).zip(x.par_chunks(t * 3 * c)).zip(dy.par_chunks(t * c)).enumerate().for_each(
        |(n, ((dx, x), dy))| {
            let (mut da, mut ds) = (vec![T::zero(); t * t], vec![T::zero(); t * t]);
            for head in 0..h {
                let (q, k, v) = (&x[head * hd..], &x[c + head * hd..], &x[2 * c + head * hd..]);
                let dyh = &dy[head * hd..];
                let a = &att[(n * h + head) * t * t..(n * h + head + 1) * t * t];
                let offset = ((n * h + head) * t * t) as u64;
                let ad = dropped(a, mask, offset);
                // d(dropped softmax) = dy v^T on and below the diagonal's
                // blocks (softmax backward reads no more), then through the mask.
                for (r0, r1) in causal_blocks(t) {
                    let (dyr, dar) = ((&dyh[r0 * c..], c, false), (&mut da[r0 * t..], t));
                    gemm_ld(r1 - r0, r1, hd, dyr, (v, 3 * c, true), dar, false, Par::Seq);
                }
                if let Some(m) = mask {
                    apply(m, &mut da, offset);
                }
                // dv = (dropped softmax)^T dy: row j sums over i >= j.
                for (r0, r1) in causal_blocks(t) {
                    let (adr, dyr) = ((&ad[r0 * t + r0..], t, true), (&dyh[r0 * c..], c, false));
                    let dv = (&mut dx[r0 * 3 * c + 2 * c + head * hd..], 3 * c);
                    gemm_ld(r1 - r0, hd, t - r0, adr, dyr, dv, false, Par::Seq);
                }
                // Softmax backward: ds = a * (da - sum_j a da) * scale on and below the diagonal.
                for i in 0..t {
                    let (ar, dar) = (&a[i * t..i * t + i + 1], &da[i * t..i * t + i + 1]);
                    let dot = butterfly(lane_sums_of2(-T::zero(), ar, dar, |p, g| p * g));
                    for j in 0..=i {
                        ds[i * t + j] = ar[j] * (dar[j] - dot) * scale;
                    }
                }
                // dq = ds k (row i sums over j <= i), dk = ds^T q (row j
                // over i >= j).
                for (r0, r1) in causal_blocks(t) {
                    let dq = (&mut dx[r0 * 3 * c + head * hd..], 3 * c);
                    gemm_ld(
                        r1 - r0,
                        hd,
                        r1,
                        (&ds[r0 * t..], t, false),
                        (k, 3 * c, false),
                        dq,
                        false,
                        Par::Seq,
                    );
                    let (dsr, qr) = ((&ds[r0 * t + r0..], t, true), (&q[r0 * 3 * c..], 3 * c, false));
                    let dk = (&mut dx[r0 * 3 * c + c + head * hd..], 3 * c);
                    gemm_ld(r1 - r0, hd, t - r0, dsr, qr, dk, false, Par::Seq);
                }
            }
        },
    );
}
