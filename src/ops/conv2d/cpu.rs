//! CPU conv2d as im2col + GEMM, parallel over the batch: each rayon task owns
//! a run of images, its own scratch and (backward) its own weight gradient,
//! which are summed at the end. GEMMs inside a task run sequentially.
//!
//! The image is zero-padded once into a buffer with row pitch `P`; pixel
//! (ih, iw) of channel c sits at `c * plane + (ih + p) * P + iw + p`. For
//! stride 1 the right padding of a row doubles as the left padding of the
//! next (`P = W + p`, when `p < K`), and im2col is "wide": output pixel
//! (oh, ow) is column `oh * P + ow`, so every im2col row is one contiguous
//! slice of the padded image and col2im one contiguous add. The `P - Wo`
//! junk columns per output row (`K - 1 - p`, 2 of 16 for MNIST's conv2) ride
//! along through the GEMMs and are dropped; this beats the short per-row
//! copies of a compact im2col, which took a third of the time.

#[cfg(target_arch = "x86_64")]
use crate::ops::elem::{f32s, f32s_mut};
use crate::ops::gemm::{gemm, Par};
use crate::ops::half_emu::{round_into, widen_into};
use crate::ops::Elem;
use half::f16;
use rayon::prelude::*;

/// An activation (`x`, `y`, `dy`, `dx`) the GEMM path computes on as `T`:
/// `T` itself, read and written in place, or f16 as `T = f32`, widened
/// (exactly) into scratch an image at a time and rounded to nearest-even as
/// an image is stored. The bits are those of widening the whole tensor,
/// running the f32 path and rounding its result once, without the two
/// whole-tensor copies.
pub trait Operand<T>: Copy + Send + Sync {
    /// `v` itself, when it is already `T`.
    fn as_t(v: &[Self]) -> Option<&[T]>;
    /// `v` itself, when it is already `T`.
    fn as_t_mut(v: &mut [Self]) -> Option<&mut [T]>;
    /// `src` as `T` into `dst` (same length).
    fn load(src: &[Self], dst: &mut [T]);
    /// `src` into `dst` (same length), rounded when narrower.
    fn store(src: &[T], dst: &mut [Self]);
}

impl<T: Elem> Operand<T> for T {
    fn as_t(v: &[T]) -> Option<&[T]> {
        Some(v)
    }
    fn as_t_mut(v: &mut [T]) -> Option<&mut [T]> {
        Some(v)
    }
    fn load(src: &[T], dst: &mut [T]) {
        dst.copy_from_slice(src);
    }
    fn store(src: &[T], dst: &mut [T]) {
        dst.copy_from_slice(src);
    }
}

impl Operand<f32> for f16 {
    fn as_t(_: &[f16]) -> Option<&[f32]> {
        None
    }
    fn as_t_mut(_: &mut [f16]) -> Option<&mut [f32]> {
        None
    }
    fn load(src: &[f16], dst: &mut [f32]) {
        widen_into(src, dst);
    }
    fn store(src: &[f32], dst: &mut [f16]) {
        round_into(src, dst);
    }
}

/// `v` as `T`: itself, or loaded into `buf` (grown as needed).
fn as_t<'a, T: Elem, X: Operand<T>>(v: &'a [X], buf: &'a mut Vec<T>) -> &'a [T] {
    match X::as_t(v) {
        Some(t) => t,
        None => {
            buf.resize(v.len(), T::zero());
            X::load(v, buf);
            buf
        }
    }
}

/// Runs `f` on `out` as `T`: in place, or on `buf` (grown as needed) stored
/// into `out` after.
fn with_t<T: Elem, X: Operand<T>>(out: &mut [X], buf: &mut Vec<T>, f: impl FnOnce(&mut [T])) {
    if let Some(t) = X::as_t_mut(out) {
        return f(t);
    }
    buf.resize(out.len(), T::zero());
    f(buf);
    X::store(buf, out);
}

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

    /// Whether rows share their padding (see the module doc).
    fn shared_pad(&self) -> bool {
        self.stride == 1 && self.padding < self.k
    }
    /// Row pitch `P` of the padded image.
    fn pitch(&self) -> usize {
        if self.shared_pad() {
            self.w + self.padding
        } else {
            self.w + 2 * self.padding
        }
    }
    /// Length of one padded channel.
    fn plane(&self) -> usize {
        let tail = if self.shared_pad() { self.padding } else { 0 };
        (self.h + 2 * self.padding) * self.pitch() + tail
    }
    fn padded_len(&self) -> usize {
        self.c * self.plane()
    }

    /// Columns of the im2col matrix, and the column distance between two
    /// output rows (see the module doc for the stride-1 layout).
    fn cols(&self) -> (usize, usize) {
        if self.stride == 1 {
            let pitch = self.pitch();
            (self.ho.saturating_sub(1) * pitch + self.wo, pitch)
        } else {
            (self.out_hw(), self.wo)
        }
    }

    /// Images per rayon task, and how GEMMs inside a task may be split: with
    /// fewer images than threads the batch cannot feed the pool, so the
    /// products themselves go parallel. A few tasks per thread let work
    /// stealing even out a core that is busy with something else.
    fn schedule(&self) -> (usize, Par) {
        const TASKS_PER_THREAD: usize = 4;
        let threads = rayon::current_num_threads().max(1);
        let per_task = self.n.div_ceil(threads * TASKS_PER_THREAD).max(1);
        let par = if self.n < threads { Par::Rayon(0) } else { Par::Seq };
        (per_task, par)
    }
}

/// Per-task scratch for the zero-padded image. Padding once per image lets
/// im2col/col2im run without any bounds logic (they dominate otherwise);
/// without padding the image itself is used (or its f32 copy, for f16).
struct Padded<T> {
    buf: Vec<T>,
}

impl<T: Elem> Padded<T> {
    fn new(g: &ConvGeom) -> Self {
        let len = if g.padding > 0 { g.padded_len() } else { 0 };
        Padded { buf: vec![T::zero(); len] }
    }

    /// `x[C, H, W]` in the padded layout. Only the pixels are ever
    /// written, so the zeros set up in `new` stay.
    fn image<'a, X: Operand<T>>(&'a mut self, g: &ConvGeom, x: &'a [X]) -> &'a [T] {
        if g.padding == 0 {
            return as_t(x, &mut self.buf);
        }
        let (p, pitch, plane) = (g.padding, g.pitch(), g.plane());
        for (c, xc) in x.chunks_exact(g.h * g.w).enumerate() {
            for (ih, xrow) in xc.chunks_exact(g.w).enumerate() {
                let at = c * plane + (ih + p) * pitch + p;
                X::load(xrow, &mut self.buf[at..at + g.w]);
            }
        }
        &self.buf
    }
}

/// Unfolds one padded image into `col[C*K*K, cols]`.
fn im2col<T: Elem>(g: &ConvGeom, xp: &[T], col: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if g.stride == 2 && super::stride2::usable() {
        if let (Some(xf), Some(cf)) = (f32s(xp), f32s_mut(col)) {
            return super::stride2::im2col(g, xf, g.plane(), g.pitch(), cf);
        }
    }
    let (k, s, wp) = (g.k, g.stride, g.pitch());
    let (ncol, pitch) = g.cols();
    for (c, xc) in xp.chunks_exact(g.plane()).enumerate() {
        for ki in 0..k {
            for kj in 0..k {
                let r = (c * k + ki) * k + kj;
                let row = &mut col[r * ncol..(r + 1) * ncol];
                if s == 1 {
                    let at = ki * wp + kj;
                    row.copy_from_slice(&xc[at..at + ncol]);
                } else {
                    for (oh, out) in row.chunks_exact_mut(pitch).enumerate() {
                        let src = &xc[(oh * s + ki) * wp + kj..];
                        for (o, v) in out.iter_mut().zip(src.iter().step_by(s)) {
                            *o = *v;
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of padding + [`im2col`]: scatters `col` back onto one image
/// `dx[C, H, W]` (overwritten), adding where windows overlap. The junk
/// columns of a wide `col` must be zero. `dxp` is scratch for the padded
/// image (unused without padding).
fn col2im<T: Elem>(g: &ConvGeom, col: &[T], dxp: &mut [T], dx: &mut [T]) {
    let (p, wp) = (g.padding, g.pitch());
    let acc: &mut [T] = if p == 0 { &mut *dx } else { &mut *dxp };
    acc.fill(T::zero());
    match () {
        #[cfg(target_arch = "x86_64")]
        () if g.stride == 2 && super::stride2::usable() && f32s(col).is_some() => {
            if let (Some(cf), Some(af)) = (f32s(col), f32s_mut(acc)) {
                super::stride2::col2im_add(g, cf, g.plane(), wp, af);
            }
        }
        () => col2im_rows(g, col, acc),
    }
    if p > 0 {
        for (c, dxc) in dx.chunks_exact_mut(g.h * g.w).enumerate() {
            for (ih, dxrow) in dxc.chunks_exact_mut(g.w).enumerate() {
                let at = c * g.plane() + (ih + p) * wp + p;
                dxrow.copy_from_slice(&dxp[at..at + g.w]);
            }
        }
    }
}

/// [`col2im`]'s scatter-add of `col` onto the zeroed (padded) image `acc`.
fn col2im_rows<T: Elem>(g: &ConvGeom, col: &[T], acc: &mut [T]) {
    let (k, s, wp) = (g.k, g.stride, g.pitch());
    let (ncol, pitch) = g.cols();
    for (c, ac) in acc.chunks_exact_mut(g.plane()).enumerate() {
        for ki in 0..k {
            for kj in 0..k {
                let r = (c * k + ki) * k + kj;
                let row = &col[r * ncol..(r + 1) * ncol];
                if s == 1 {
                    let at = ki * wp + kj;
                    for (d, v) in ac[at..at + ncol].iter_mut().zip(row) {
                        *d = *d + *v;
                    }
                } else {
                    for (oh, src) in row.chunks_exact(pitch).enumerate() {
                        let dst = &mut ac[(oh * s + ki) * wp + kj..];
                        for (d, v) in dst.iter_mut().step_by(s).zip(src) {
                            *d = *d + *v;
                        }
                    }
                }
            }
        }
    }
}

/// `y[N, O, Ho, Wo] = conv(x[N, C, H, W], w[O, C, K, K]) + bias[O]`.
pub fn forward<T: Elem, X: Operand<T>>(g: &ConvGeom, x: &[X], w: &[T], bias: Option<&[T]>, y: &mut [X]) {
    let (per_task, par) = g.schedule();
    let (ckk, hw) = (g.ckk(), g.out_hw());
    let (ncol, pitch) = g.cols();
    // Both orientations give the same sums. The transposed one puts O on
    // the GEMM crate's register-blocked side, which pays when O fills its
    // 32-row tiles and the reduction is not tiny (measured: 1.3x faster for
    // conv 16->32, 14x14; 1.3x slower for conv 1->16, 28x28, and for O=128).
    let transposed = g.o.is_multiple_of(32) && g.o <= 64 && ckk >= 64;
    y.par_chunks_mut(per_task * g.y_len()).zip(x.par_chunks(per_task * g.x_len())).for_each(|(yc, xc)| {
        let mut col = vec![T::zero(); ckk * ncol];
        let mut padded = Padded::new(g);
        let mut out = vec![T::zero(); g.o * ncol];
        let mut ybuf = Vec::new();
        for (yi, xi) in yc.chunks_mut(g.y_len()).zip(xc.chunks(g.x_len())) {
            im2col(g, padded.image(g, xi), &mut col);
            if transposed {
                // out[cols, O] = col^T[cols, CKK] * W^T[CKK, O]
                gemm(ncol, g.o, ckk, &col, true, w, true, &mut out, false, par);
            } else {
                // out[O, cols] = W[O, CKK] * col[CKK, cols]
                gemm(g.o, ncol, ckk, w, false, &col, false, &mut out, false, par);
            }
            // Into [O, Ho, Wo] without the junk columns, plus the bias.
            with_t(yi, &mut ybuf, |yi| {
                for (o, yo) in yi.chunks_exact_mut(hw).enumerate() {
                    let b = bias.map_or(T::zero(), |b| b[o]);
                    for (oh, yrow) in yo.chunks_exact_mut(g.wo).enumerate() {
                        if transposed {
                            let src = out[oh * pitch * g.o + o..].iter().step_by(g.o);
                            for (v, t) in yrow.iter_mut().zip(src) {
                                *v = *t + b;
                            }
                        } else {
                            let at = o * ncol + oh * pitch;
                            for (v, t) in yrow.iter_mut().zip(&out[at..at + g.wo]) {
                                *v = *t + b;
                            }
                        }
                    }
                }
            });
        }
    });
}

/// `v.iter().sum()` over 8 interleaved partial sums, so the compiler can
/// vectorize it (a strict left-to-right float sum cannot be, and made the
/// bias gradient a sixth of conv1's backward).
fn lane_sum<T: Elem>(v: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = *a + *x;
        }
    }
    let tail: T = rest.iter().copied().sum();
    acc.iter().copied().sum::<T>() + tail
}

/// Gradients of [`forward`] for upstream `dy[N, O, Ho, Wo]`. `dw` and `db`
/// are accumulated into (`+=`, like PyTorch's `.grad`); `dx`, when asked for,
/// is overwritten.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem, X: Operand<T>>(
    g: &ConvGeom,
    x: &[X],
    w: &[T],
    dy: &[X],
    dw: &mut [T],
    db: Option<&mut [T]>,
    dx: Option<&mut [X]>,
) {
    let (per_task, par) = g.schedule();
    let (ckk, hw) = (g.ckk(), g.out_hw());
    let (ncol, pitch) = g.cols();
    let wide = ncol != hw;
    let tasks = g.n.div_ceil(per_task);
    let need_db = db.is_some();
    let dx_parts: Vec<Option<&mut [X]>> = match dx {
        Some(d) => d.chunks_mut(per_task * g.x_len()).map(Some).collect(),
        None => (0..tasks).map(|_| None).collect(),
    };
    let partials: Vec<(Vec<T>, Vec<T>)> = dx_parts
        .into_par_iter()
        .enumerate()
        .map(|(t, mut dxt)| {
            let first = t * per_task;
            let imgs = per_task.min(g.n - first);
            // Accumulates dW^T[CKK, O]: the GEMM crate runs this orientation
            // 1.5x faster than dW[O, CKK] for the MNIST layers (measured).
            let mut dwt = vec![T::zero(); ckk * g.o];
            let mut db_t = vec![T::zero(); if need_db { g.o } else { 0 }];
            let mut col = vec![T::zero(); ckk * ncol];
            let mut padded = Padded::new(g);
            // dy in the wide column layout; its junk columns stay zero, so
            // they add nothing to dW and give zero dcol columns.
            let mut dyw = vec![T::zero(); if wide { g.o * ncol } else { 0 }];
            let need_dx = dxt.is_some();
            let mut dcol = vec![T::zero(); if need_dx { ckk * ncol } else { 0 }];
            let dxp_len = if need_dx && g.padding > 0 { g.padded_len() } else { 0 };
            let mut dxp = vec![T::zero(); dxp_len];
            let (mut dybuf, mut dxbuf) = (Vec::new(), Vec::new());
            for i in 0..imgs {
                let img = first + i;
                let xi = &x[img * g.x_len()..(img + 1) * g.x_len()];
                let dyi = as_t(&dy[img * g.y_len()..(img + 1) * g.y_len()], &mut dybuf);
                im2col(g, padded.image(g, xi), &mut col);
                let dyc: &[T] = if wide {
                    for (o, dyo) in dyi.chunks_exact(hw).enumerate() {
                        for (oh, src) in dyo.chunks_exact(g.wo).enumerate() {
                            let at = o * ncol + oh * pitch;
                            dyw[at..at + g.wo].copy_from_slice(src);
                        }
                    }
                    &dyw
                } else {
                    dyi
                };
                // dW^T[CKK, O] += col[CKK, cols] * dy_i^T[cols, O]
                gemm(ckk, g.o, ncol, &col, false, dyc, true, &mut dwt, true, par);
                for (acc, dyo) in db_t.iter_mut().zip(dyi.chunks(hw)) {
                    *acc = *acc + lane_sum(dyo);
                }
                if let Some(dxt) = dxt.as_deref_mut() {
                    // dcol[CKK, cols] = W^T[CKK, O] * dy_i[O, cols]
                    gemm(ckk, ncol, g.o, w, true, dyc, false, &mut dcol, false, par);
                    let dxi = &mut dxt[i * g.x_len()..(i + 1) * g.x_len()];
                    with_t(dxi, &mut dxbuf, |dxi| col2im(g, &dcol, &mut dxp, dxi));
                }
            }
            (dwt, db_t)
        })
        .collect();
    for (dwt, _) in &partials {
        for (o, dwo) in dw.chunks_mut(ckk).enumerate() {
            for (a, b) in dwo.iter_mut().zip(dwt[o..].iter().step_by(g.o)) {
                *a = *a + *b;
            }
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
