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
                gemm_ld(t, t, hd, (q, 3 * c, false), (k, 3 * c, true), (a, t), false, Par::Seq);
                for (i, row) in a.chunks_exact_mut(t).enumerate() {
                    super::softmax::row(row, i, scale);
                }
                let offset = ((n * h + head) * t * t) as u64;
                let ad = dropped(a, mask, offset);
                gemm_ld(
                    t,
                    hd,
                    t,
                    (&ad, t, false),
                    (v, 3 * c, false),
                    (&mut y[head * hd..], c),
                    false,
                    Par::Seq,
                );
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
                // d(dropped softmax) = dy v^T, then through the mask.
                gemm_ld(t, t, hd, (dyh, c, false), (v, 3 * c, true), (&mut da, t), false, Par::Seq);
                if let Some(m) = mask {
                    apply(m, &mut da, offset);
                }
                // dv = (dropped softmax)^T dy.
                let dv = &mut dx[2 * c + head * hd..];
                gemm_ld(t, hd, t, (&ad, t, true), (dyh, c, false), (dv, 3 * c), false, Par::Seq);
                // Softmax backward: ds = a * (da - sum_j a da) * scale on and below the diagonal.
                for i in 0..t {
                    let (ar, dar) = (&a[i * t..i * t + i + 1], &da[i * t..i * t + i + 1]);
                    let dot = butterfly(lane_sums_of2(-T::zero(), ar, dar, |p, g| p * g));
                    for j in 0..=i {
                        ds[i * t + j] = ar[j] * (dar[j] - dot) * scale;
                    }
                }
                // dq = ds k, dk = ds^T q.
                gemm_ld(
                    t,
                    hd,
                    t,
                    (&ds, t, false),
                    (k, 3 * c, false),
                    (&mut dx[head * hd..], 3 * c),
                    false,
                    Par::Seq,
                );
                let dk = &mut dx[c + head * hd..];
                gemm_ld(t, hd, t, (&ds, t, true), (q, 3 * c, false), (dk, 3 * c), false, Par::Seq);
            }
        },
    );
}
