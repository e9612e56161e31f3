//! CPU conv2d as im2col + GEMM, parallel over the batch: each rayon task owns
//! a run of images, its own im2col scratch and (backward) its own weight
//! gradient, which are summed at the end. GEMMs inside a task run sequentially.

use crate::ops::gemm::{gemm, Par};
use crate::ops::Elem;
use rayon::prelude::*;

/// Every size a conv2d kernel needs, already validated by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeom {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub k: usize,
    pub stride: usize,
    pub padding: usize,
    pub ho: usize,
    pub wo: usize,
}

impl ConvGeom {
    /// Rows of the im2col matrix (= columns of the flattened weight).
    pub fn ckk(&self) -> usize {
        self.c * self.k * self.k
    }
    pub fn out_hw(&self) -> usize {
        self.ho * self.wo
    }
    pub fn x_len(&self) -> usize {
        self.c * self.h * self.w
    }
    pub fn y_len(&self) -> usize {
        self.o * self.out_hw()
    }

    /// Images per rayon task, and how GEMMs inside a task may be split: with
    /// fewer images than threads the batch cannot feed the pool, so the
    /// products themselves go parallel.
    fn schedule(&self) -> (usize, Par) {
        let threads = rayon::current_num_threads().max(1);
        let per_task = self.n.div_ceil(threads).max(1);
        let par = if self.n < threads {
            Par::Rayon(0)
        } else {
            Par::Seq
        };
        (per_task, par)
    }

    /// Output positions `o` along one axis whose input index
    /// `o*stride + kk - padding` falls inside `0..len`, as a half-open range.
    fn valid(&self, out: usize, len: usize, kk: usize) -> (usize, usize) {
        let s = self.stride;
        let lo = self.padding.saturating_sub(kk).div_ceil(s);
        let hi = if len + self.padding > kk {
            (len + self.padding - kk).div_ceil(s)
        } else {
            0
        };
        let hi = hi.min(out);
        (lo.min(hi), hi)
    }
}

/// Unfolds one image `[C, H, W]` into `col[C*K*K, Ho*Wo]` (zero where the
/// window hangs over the padding).
fn im2col<T: Elem>(g: &ConvGeom, x: &[T], col: &mut [T]) {
    let (k, s, p, hw) = (g.k, g.stride, g.padding, g.out_hw());
    let plane = g.h * g.w;
    for c in 0..g.c {
        let xc = &x[c * plane..(c + 1) * plane];
        for ki in 0..k {
            let (oh_lo, oh_hi) = g.valid(g.ho, g.h, ki);
            for kj in 0..k {
                let (ow_lo, ow_hi) = g.valid(g.wo, g.w, kj);
                let r = (c * k + ki) * k + kj;
                let row = &mut col[r * hw..(r + 1) * hw];
                row[..oh_lo * g.wo].fill(T::zero());
                row[oh_hi * g.wo..].fill(T::zero());
                for oh in oh_lo..oh_hi {
                    let out = &mut row[oh * g.wo..(oh + 1) * g.wo];
                    let ih = oh * s + ki - p;
                    let xrow = &xc[ih * g.w..(ih + 1) * g.w];
                    out[..ow_lo].fill(T::zero());
                    out[ow_hi..].fill(T::zero());
                    if ow_lo == ow_hi {
                        continue;
                    }
                    let start = ow_lo * s + kj - p;
                    if s == 1 {
                        out[ow_lo..ow_hi].copy_from_slice(&xrow[start..start + (ow_hi - ow_lo)]);
                    } else {
                        for (o, v) in out[ow_lo..ow_hi]
                            .iter_mut()
                            .zip(xrow[start..].iter().step_by(s))
                        {
                            *o = *v;
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: scatters `col` back onto one image, adding
/// where windows overlap. `dx` is overwritten.
fn col2im<T: Elem>(g: &ConvGeom, col: &[T], dx: &mut [T]) {
    let (k, s, p, hw) = (g.k, g.stride, g.padding, g.out_hw());
    let plane = g.h * g.w;
    dx.fill(T::zero());
    for c in 0..g.c {
        let dxc = &mut dx[c * plane..(c + 1) * plane];
        for ki in 0..k {
            let (oh_lo, oh_hi) = g.valid(g.ho, g.h, ki);
            for kj in 0..k {
                let (ow_lo, ow_hi) = g.valid(g.wo, g.w, kj);
                if ow_lo == ow_hi {
                    continue;
                }
                let r = (c * k + ki) * k + kj;
                let row = &col[r * hw..(r + 1) * hw];
                for oh in oh_lo..oh_hi {
                    let src = &row[oh * g.wo + ow_lo..oh * g.wo + ow_hi];
                    let ih = oh * s + ki - p;
                    let dxrow = &mut dxc[ih * g.w..(ih + 1) * g.w];
                    let start = ow_lo * s + kj - p;
                    if s == 1 {
                        for (d, v) in dxrow[start..start + src.len()].iter_mut().zip(src) {
                            *d = *d + *v;
                        }
                    } else {
                        for (d, v) in dxrow[start..].iter_mut().step_by(s).zip(src) {
                            *d = *d + *v;
                        }
                    }
                }
            }
        }
    }
}

/// `y[N, O, Ho, Wo] = conv(x[N, C, H, W], w[O, C, K, K]) + bias[O]`.
pub fn forward<T: Elem>(g: &ConvGeom, x: &[T], w: &[T], bias: Option<&[T]>, y: &mut [T]) {
    let (per_task, par) = g.schedule();
    let (ckk, hw) = (g.ckk(), g.out_hw());
    y.par_chunks_mut(per_task * g.y_len())
        .zip(x.par_chunks(per_task * g.x_len()))
        .for_each(|(yt, xt)| {
            let mut col = vec![T::zero(); ckk * hw];
            for (yi, xi) in yt.chunks_mut(g.y_len()).zip(xt.chunks(g.x_len())) {
                im2col(g, xi, &mut col);
                if let Some(b) = bias {
                    for (yo, &bo) in yi.chunks_mut(hw).zip(b) {
                        yo.fill(bo);
                    }
                }
                // y_i[O, HoWo] (+)= W[O, CKK] * col[CKK, HoWo]
                gemm(g.o, hw, ckk, w, false, &col, false, yi, bias.is_some(), par);
            }
        });
}

/// Gradients of [`forward`] for upstream `dy[N, O, Ho, Wo]`. `dw` and `db`
/// are accumulated into (`+=`, like PyTorch's `.grad`); `dx`, when asked for,
/// is overwritten.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem>(
    g: &ConvGeom,
    x: &[T],
    w: &[T],
    dy: &[T],
    dw: &mut [T],
    db: Option<&mut [T]>,
    dx: Option<&mut [T]>,
) {
    let (per_task, par) = g.schedule();
    let (ckk, hw) = (g.ckk(), g.out_hw());
    let tasks = g.n.div_ceil(per_task);
    let need_db = db.is_some();
    let dx_parts: Vec<Option<&mut [T]>> = match dx {
        Some(d) => d.chunks_mut(per_task * g.x_len()).map(Some).collect(),
        None => (0..tasks).map(|_| None).collect(),
    };
    let partials: Vec<(Vec<T>, Vec<T>)> = dx_parts
        .into_par_iter()
        .enumerate()
        .map(|(t, mut dxt)| {
            let first = t * per_task;
            let imgs = per_task.min(g.n - first);
            let mut dw_t = vec![T::zero(); g.o * ckk];
            let mut db_t = vec![T::zero(); if need_db { g.o } else { 0 }];
            let mut col = vec![T::zero(); ckk * hw];
            let mut dcol = vec![T::zero(); if dxt.is_some() { ckk * hw } else { 0 }];
            for i in 0..imgs {
                let img = first + i;
                let xi = &x[img * g.x_len()..(img + 1) * g.x_len()];
                let dyi = &dy[img * g.y_len()..(img + 1) * g.y_len()];
                im2col(g, xi, &mut col);
                // dW[O, CKK] += dy_i[O, HoWo] * col^T[HoWo, CKK]
                gemm(g.o, ckk, hw, dyi, false, &col, true, &mut dw_t, true, par);
                for (acc, dyo) in db_t.iter_mut().zip(dyi.chunks(hw)) {
                    *acc = *acc + dyo.iter().copied().sum::<T>();
                }
                if let Some(dxt) = dxt.as_deref_mut() {
                    // dcol[CKK, HoWo] = W^T[CKK, O] * dy_i[O, HoWo]
                    gemm(ckk, hw, g.o, w, true, dyi, false, &mut dcol, false, par);
                    col2im(g, &dcol, &mut dxt[i * g.x_len()..(i + 1) * g.x_len()]);
                }
            }
            (dw_t, db_t)
        })
        .collect();
    for (dw_t, _) in &partials {
        for (a, b) in dw.iter_mut().zip(dw_t) {
            *a = *a + *b;
        }
    }
    if let Some(db) = db {
        for (_, db_t) in &partials {
            for (a, b) in db.iter_mut().zip(db_t) {
                *a = *a + *b;
            }
        }
    }
}
