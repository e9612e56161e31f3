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

/// A matrix read in place: (slice, leading dimension).
type Rows<'a, T> = (&'a [T], usize);

/// `c = a b^T` on and below the diagonal's blocks (`[t, t]`, terms `k`):
/// `q k^T`, `dy v^T`. Above them `c` is left as it was.
fn lower_abt<T: Elem>(t: usize, k: usize, (a, lda): Rows<T>, (b, ldb): Rows<T>, c: &mut [T]) {
    for (r0, r1) in causal_blocks(t) {
        let (ar, cr) = ((&a[r0 * lda..], lda, false), (&mut c[r0 * t..], t));
        gemm_ld(r1 - r0, r1, k, ar, (b, ldb, true), cr, false, Par::Seq);
    }
}

/// `c[t, n] = l b` for a lower-triangular `l` (`[t, t]`): row i sums the
/// terms `j <= i` (`att v`, `ds k`).
fn lower_times<T: Elem>(t: usize, n: usize, l: &[T], b: Rows<T>, (c, ldc): (&mut [T], usize)) {
    for (r0, r1) in causal_blocks(t) {
        let cr = (&mut c[r0 * ldc..], ldc);
        gemm_ld(r1 - r0, n, r1, (&l[r0 * t..], t, false), (b.0, b.1, false), cr, false, Par::Seq);
    }
}

/// `c[t, n] = l^T b` for a lower-triangular `l`: row j sums the terms
/// `i >= j` (`att^T dy`, `ds^T q`).
fn lower_t_times<T: Elem>(t: usize, n: usize, l: &[T], (b, ldb): Rows<T>, (c, ldc): (&mut [T], usize)) {
    for (r0, r1) in causal_blocks(t) {
        let (lr, br) = ((&l[r0 * t + r0..], t, true), (&b[r0 * ldb..], ldb, false));
        gemm_ld(r1 - r0, n, t - r0, lr, br, (&mut c[r0 * ldc..], ldc), false, Par::Seq);
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
                lower_abt(t, hd, (q, 3 * c), (k, 3 * c), a);
                // Each row's softmax zeroes what the blocks left above the diagonal.
                for (i, row) in a.chunks_exact_mut(t).enumerate() {
                    super::softmax::row(row, i, scale);
                }
                let offset = ((n * h + head) * t * t) as u64;
                let ad = dropped(a, mask, offset);
                lower_times(t, hd, &ad, (v, 3 * c), (&mut y[head * hd..], c));
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
                lower_abt(t, hd, (dyh, c), (v, 3 * c), &mut da);
                if let Some(m) = mask {
                    apply(m, &mut da, offset);
                }
                // dv = (dropped softmax)^T dy: row j sums over i >= j.
                lower_t_times(t, hd, &ad, (dyh, c), (&mut dx[2 * c + head * hd..], 3 * c));
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
                lower_times(t, hd, &ds, (k, 3 * c), (&mut dx[head * hd..], 3 * c));
                lower_t_times(t, hd, &ds, (q, 3 * c), (&mut dx[c + head * hd..], 3 * c));
            }
        },
    );
}
