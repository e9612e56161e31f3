//! Attention's CPU kernels, generic over f32/f64, parallel over the batch
//! (each sample's heads write only that sample's rows).

use crate::ops::dropout::{cpu::apply, Mask};
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
fn dropped<T: Elem>(att: &[T], mask: Option<&Mask>, offset: u64) -> Vec<T> {
    let mut a = att.to_vec();
    if let Some(m) = mask {
        apply(m, &mut a, offset);
    }
    a
}

/// `y[N, T, C]` and the softmax `att[N, H, T, T]` (0 above the diagonal).
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
                let q = |i: usize, k: usize| x[i * 3 * c + head * hd + k];
                let kk = |j: usize, k: usize| x[j * 3 * c + c + head * hd + k];
                let v = |j: usize, k: usize| x[j * 3 * c + 2 * c + head * hd + k];
                let a = &mut att[head * t * t..(head + 1) * t * t];
                for i in 0..t {
                    let row = &mut a[i * t..(i + 1) * t];
                    let mut max = T::neg_infinity();
                    for (j, s) in row.iter_mut().enumerate().take(i + 1) {
                        *s = (0..hd).map(|k| q(i, k) * kk(j, k)).sum::<T>() * scale;
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
                for i in 0..t {
                    for k in 0..hd {
                        y[i * c + head * hd + k] = (0..=i).map(|j| ad[i * t + j] * v(j, k)).sum::<T>();
                    }
                }
            }
        });
}

/// `dx[N, T, 3C]` (`=`) for the q, k and v parts.
pub fn backward<T: Elem>(d: Dims, x: &[T], att: &[T], dy: &[T], mask: Option<&Mask>, dx: &mut [T]) {
    let Dims { t, c, h, .. } = d;
    let hd = d.hd();
    let scale = T::one() / T::from_usize(hd).unwrap_or_else(T::one).sqrt();
    dx.par_chunks_mut(t * 3 * c).zip(x.par_chunks(t * 3 * c)).zip(dy.par_chunks(t * c)).enumerate().for_each(
        |(n, ((dx, x), dy))| {
            dx.fill(T::zero());
            for head in 0..h {
                let (qo, ko, vo) = (head * hd, c + head * hd, 2 * c + head * hd);
                let a = &att[(n * h + head) * t * t..(n * h + head + 1) * t * t];
                let offset = ((n * h + head) * t * t) as u64;
                let ad = dropped(a, mask, offset);
                // d(dropped softmax) = dy v^T, then through the mask.
                let mut da = vec![T::zero(); t * t];
                for i in 0..t {
                    for j in 0..=i {
                        da[i * t + j] =
                            (0..hd).map(|k| dy[i * c + head * hd + k] * x[j * 3 * c + vo + k]).sum();
                    }
                }
                if let Some(m) = mask {
                    apply(m, &mut da, offset);
                }
                // dv[j] = sum_i ad[i, j] dy[i].
                for j in 0..t {
                    for k in 0..hd {
                        dx[j * 3 * c + vo + k] =
                            (j..t).map(|i| ad[i * t + j] * dy[i * c + head * hd + k]).sum();
                    }
                }
                // Softmax backward: ds = a * (da - sum_j a da), then the scaled q k^T.
                for i in 0..t {
                    let dot = (0..=i).map(|j| a[i * t + j] * da[i * t + j]).sum::<T>();
                    for j in 0..=i {
                        let ds = a[i * t + j] * (da[i * t + j] - dot) * scale;
                        for k in 0..hd {
                            dx[i * 3 * c + qo + k] = dx[i * 3 * c + qo + k] + ds * x[j * 3 * c + ko + k];
                            dx[j * 3 * c + ko + k] = dx[j * 3 * c + ko + k] + ds * x[i * 3 * c + qo + k];
                        }
                    }
                }
            }
        },
    );
}
