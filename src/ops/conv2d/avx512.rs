//! f32 stride-1 conv2d on AVX-512 as an implicit GEMM: no im2col, no col2im.
//!
//! The padded image uses the "wide" layout of [`super::cpu`] (row pitch
//! `P = W + p`, output pixel (oh, ow) at column `oh * P + ow`), in which row
//! `(c, ki, kj)` of the im2col matrix is the padded image read from offset
//! `c * plane + ki * P + kj`. So the micro-kernels read 16-wide vectors
//! straight from the padded image at a per-row offset, with the weights
//! broadcast, and never materialize the (K*K times larger) column matrix.
//!
//! - forward: `out[O, cols] = W[O, CKK] * col[CKK, cols]`, columns padded to
//!   whole vectors (the extra columns read finite slack and are dropped).
//! - input gradient: a full correlation of `dy` with the flipped kernel, the
//!   same kernel over `dy` in the wide layout with `K - 1` rows of zeros
//!   around it (see [`DyLayout`]): it writes `dx` directly, no scatter-add.
//! - weight gradient: `dW^T[CKK, O] += col[CKK, cols] * dy^T[cols, O]`, with
//!   `O` along the vector lanes and the column sum in the inner loop, so the
//!   accumulators never need a horizontal sum.
//!
//! Sums run in a different order from the GEMM path (same f32 products).

mod dw;
mod pixel_major;
mod strided;
mod winograd;

use super::avx512_direct::{self as direct, Grid, LaneWeights};
use super::cpu::ConvGeom;
use crate::ops::half_emu::{Act, Load16, Pixels, Planes, Store16};
use crate::tensor::as_uninit;
use dw::{dw_blocks, pixel_dw, pixels_sum, transpose_to, PixelDw, PO};
use rayon::prelude::*;
use std::arch::x86_64::*;

const LANES: usize = 16;
/// Output rows per forward/dx tile (the kernel's broadcast side).
const MR: usize = 8;

/// Whether this machine and geometry can take the AVX-512 kernels (BW and
/// VL for the f16 loads and stores that widen and round in place).
pub fn usable(g: &ConvGeom) -> bool {
    (g.stride == 1 || strided::fits(g))
        && g.padding < g.k
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// The padded input image: see the module doc.
struct XLayout {
    pitch: usize,
    plane: usize,
    /// Output columns (`(Ho - 1) * P + Wo`) rounded up to vectors.
    ncolv: usize,
    /// Buffer length: every channel plus slack for the last vector reads.
    len: usize,
    /// Offset of im2col row `(c, ki, kj)` in the buffer.
    offs: Vec<usize>,
}

impl XLayout {
    fn new(g: &ConvGeom) -> Self {
        let (p, k) = (g.padding, g.k);
        let pitch = g.w + p;
        let plane = (g.h + 2 * p) * pitch + p;
        let ncol = (g.ho - 1) * pitch + g.wo;
        let ncolv = ncol.next_multiple_of(LANES);
        let mut offs = Vec::with_capacity(g.ckk());
        for c in 0..g.c {
            for ki in 0..k {
                for kj in 0..k {
                    offs.push(c * plane + ki * pitch + kj);
                }
            }
        }
        let last = (g.c - 1) * plane + (k - 1) * (pitch + 1) + ncolv;
        XLayout { pitch, plane, ncolv, len: last.max(g.c * plane), offs }
    }

    /// Copies `x[C, H, W]` into `buf` (zeros outside the pixels stay).
    fn fill(&self, g: &ConvGeom, x: Pixels<'_>, buf: &mut [f32]) {
        let (p, hw) = (g.padding, g.h * g.w);
        for c in 0..x.len() / hw.max(1) {
            let at = c * self.plane + p * self.pitch + p;
            copy_rows(x.slice(c * hw..(c + 1) * hw), g.w, &mut buf[at..], self.pitch, g.h, g.w);
        }
    }
}

/// `dy` per output channel in the wide layout, shifted by `shift = (K-1)(P+1)`
/// zeros, so the input-gradient kernel's reads before the first or past the
/// last output row, and at junk columns, all find zeros. `dx` column
/// `ih * P + iw` reads row `(o, ki, kj)` at `o * plane + ih * P + iw +
/// (p + K - 1 - ki) * (P) + (p + K - 1 - kj)`.
struct DyLayout {
    plane: usize,
    shift: usize,
    /// dx columns (`(H - 1) * P + W`) rounded up to vectors.
    ncolv: usize,
    offs: Vec<usize>,
}

impl DyLayout {
    fn new(g: &ConvGeom, xl: &XLayout) -> Self {
        let (p, k, pitch) = (g.padding, g.k, xl.pitch);
        let shift = (k - 1) * (pitch + 1);
        let ncolv = ((g.h - 1) * pitch + g.w).next_multiple_of(LANES);
        let reach = (p + k - 1) * (pitch + 1);
        let plane = (shift + xl.ncolv).max(ncolv + reach);
        let mut offs = Vec::with_capacity(g.o * k * k);
        for o in 0..g.o {
            for ki in 0..k {
                for kj in 0..k {
                    offs.push(o * plane + (p + k - 1 - ki) * pitch + (p + k - 1 - kj));
                }
            }
        }
        DyLayout { plane, shift, ncolv, offs }
    }
}

/// Copies `rows` rows of `w` elements from `src` (row pitch `sp`) to `dst`
/// (row pitch `dp`), f16 widened. The rows of MNIST's images are 14 and 28
/// floats: as one `memcpy` call each they cost more than the copying (4% of
/// a step).
fn copy_rows(src: Pixels<'_>, sp: usize, dst: &mut [f32], dp: usize, rows: usize, w: usize) {
    copy_rows_plus(src, sp, Planes::F32(as_uninit(dst)), dp, rows, w, None);
}

/// [`copy_rows`] into a possibly uninitialized or f16 `dst` (rounded as it
/// is stored), adding `bias` to every element when given (a scalar loop here
/// took 2% of a step).
fn copy_rows_plus(
    src: Pixels<'_>,
    sp: usize,
    dst: Planes<'_>,
    dp: usize,
    rows: usize,
    w: usize,
    bias: Option<f32>,
) {
    if rows == 0 || w == 0 {
        return;
    }
    assert!((rows - 1) * sp + w <= src.len() && (rows - 1) * dp + w <= dst.len());
    // SAFETY: row r reads src[r * sp + j] and writes dst[r * dp + j] for
    // j < w (masked lanes are neither read nor written): inside the slices
    // by the assert. AVX-512F/BW/VL: see `usable`.
    unsafe {
        let args = (sp, dp, rows, w, bias);
        match (src, dst) {
            (Pixels::F32(s), Planes::F32(d)) => {
                copy_rows_avx512(s.as_ptr(), d.as_mut_ptr().cast::<f32>(), args)
            }
            (Pixels::F16(s), Planes::F32(d)) => {
                copy_rows_avx512(s.as_ptr(), d.as_mut_ptr().cast::<f32>(), args)
            }
            (Pixels::F32(s), Planes::F16(d)) => {
                copy_rows_avx512(s.as_ptr(), d.as_mut_ptr().cast::<half::f16>(), args)
            }
            (Pixels::F16(s), Planes::F16(d)) => {
                copy_rows_avx512(s.as_ptr(), d.as_mut_ptr().cast::<half::f16>(), args)
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn copy_rows_avx512<S: Load16, D: Store16>(
    src: *const S,
    dst: *mut D,
    (sp, dp, rows, w, bias): (usize, usize, usize, usize, Option<f32>),
) {
    let tail = (1u32 << (w % LANES)) as u16 - 1;
    // `x + 0.0` would turn -0.0 into +0.0: a plain copy adds nothing.
    let plus = |v| bias.map_or(v, |b| _mm512_add_ps(v, _mm512_set1_ps(b)));
    for r in 0..rows {
        let (s, d) = (src.add(r * sp), dst.add(r * dp));
        let mut j = 0;
        while j + LANES <= w {
            D::store16(d.add(j), !0, plus(S::load16(s.add(j), !0)));
            j += LANES;
        }
        if tail != 0 {
            D::store16(d.add(j), tail, plus(S::load16(s.add(j), tail)));
        }
    }
}

/// `c[i, j] = sum_r a[r * lda + i] * b[offs[r] + j]` for `i < m` (a multiple
/// of [`MR`], `<= lda`), `j < 16 * nv`; `c` has row stride `16 * nv`.
fn gemm_offsets(m: usize, nv: usize, a: &[f32], lda: usize, offs: &[usize], b: &[f32], c: &mut [f32]) {
    let kk = offs.len();
    let ldc = nv * LANES;
    // These checks are what make the raw reads and writes below sound.
    assert!(m.is_multiple_of(MR) && m <= lda && a.len() >= kk * lda && c.len() >= m * ldc);
    assert!(offs.iter().all(|&o| o + ldc <= b.len()));
    for i0 in (0..m).step_by(MR) {
        let mut v0 = 0;
        while v0 < nv {
            let left = nv - v0;
            // SAFETY: the asserts bound every read: a[r * lda + i0 + i] with
            // i0 + i < m <= lda, r < kk; b[offs[r] + 16 * (v0 + v) + l] with
            // v0 + v < nv; and every write c[(i0 + i) * ldc + ...] < m * ldc.
            // `usable` checked that the CPU has AVX-512F.
            unsafe {
                let (ap, cp) = (a.as_ptr().add(i0), c.as_mut_ptr().add(i0 * ldc + v0 * LANES));
                let bp = b.as_ptr().add(v0 * LANES);
                match left {
                    1 => tile::<1>(kk, ap, lda, offs.as_ptr(), bp, cp, ldc),
                    2 => tile::<2>(kk, ap, lda, offs.as_ptr(), bp, cp, ldc),
                    _ => tile::<3>(kk, ap, lda, offs.as_ptr(), bp, cp, ldc),
                }
            }
            v0 += left.min(3);
        }
    }
}

/// One `MR x 16*NV` tile of [`gemm_offsets`]: 8 broadcasts and `NV` loads
/// feed `8 * NV` FMAs per reduction step.
#[target_feature(enable = "avx512f")]
unsafe fn tile<const NV: usize>(
    kk: usize,
    a: *const f32,
    lda: usize,
    offs: *const usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    for r in 0..kk {
        let br = b.add(*offs.add(r));
        let ar = a.add(r * lda);
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = _mm512_loadu_ps(br.add(v * LANES));
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*ar.add(i));
            for (x, s) in bv.iter().zip(row.iter_mut()) {
                *s = _mm512_fmadd_ps(av, *x, *s);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, s) in row.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc + v * LANES), *s);
        }
    }
}

/// Images per rayon task: a few tasks per thread so work stealing can even
/// out a core that is busy with something else.
fn per_task(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    n.div_ceil(threads * 4).max(1)
}

/// Images per forward task: the forward's images are independent (no
/// partial sums to add up afterwards), so its tasks are smaller, and the
/// last one, which the other threads wait for, is short.
fn per_forward_task(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    n.div_ceil(threads * FWD_TASKS).max(1)
}
const FWD_TASKS: usize = 8;

/// `w[O, CKK]` as `wt[CKK, ld]` (`ld` = O rounded up to [`MR`], zero-filled).
fn transpose_padded(w: &[f32], rows: usize, cols: usize, ld: usize) -> Vec<f32> {
    let mut t = vec![0f32; cols * ld];
    for (i, wr) in w.chunks_exact(cols).take(rows).enumerate() {
        for (j, v) in wr.iter().enumerate() {
            t[j * ld + i] = *v;
        }
    }
    t
}

/// `y[N, O, Ho, Wo] = conv(x, w) + bias`, as [`super::cpu::forward`]. Every
/// element of `y` is written (it may come uninitialized: zero-filling the
/// 5 MB of MNIST's conv1 output was 3% of a step, on one thread).
/// f16 activations (`X = f16`) are widened image by image as they are
/// loaded and the output rounded image by image as it is stored.
pub fn forward<X: Act>(g: &ConvGeom, x: &[X], w: &[f32], bias: Option<&[f32]>, y: &mut [X::Out]) {
    if g.stride > 1 {
        return strided::forward(g, x, w, bias, y);
    }
    if g.n > 0 && super::winograd_on() && winograd::fits(g) {
        return winograd::forward(g, x, w, bias, y);
    }
    forward_direct(g, x, w, bias, y);
}

/// [`forward`] without the Winograd kernels (so tests can run both).
pub(super) fn forward_direct<X: Act>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [X::Out],
) {
    if g.n == 0 {
        return;
    }
    let xl = XLayout::new(g);
    let hw = g.out_hw();
    if direct::fits(g.k, g.wo, g.ckk()) {
        let ckk = g.ckk();
        let wt = LaneWeights::new(ckk, g.o, |r, o| w[o * ckk + r]);
        let grid = Grid { rows: g.ho, cols: g.wo, pitch: xl.pitch };
        per_image(g, &xl, x, y, hw * wt.ld(), |xp, out, yi| {
            direct::conv_image(xp, &xl.offs, g.k, grid, &wt, out);
            direct::to_planes(out, hw, wt.ld(), bias, yi);
        });
        return;
    }
    let om = g.o.next_multiple_of(MR);
    let wt = transpose_padded(w, g.o, g.ckk(), om);
    per_image(g, &xl, x, y, om * xl.ncolv, |xp, out, mut yi| {
        gemm_offsets(om, xl.ncolv / LANES, &wt, om, &xl.offs, xp, out);
        for o in 0..g.o {
            // Bias or not, every output is `t + b` (as the generic kernel).
            let b = bias.map_or(0.0, |b| b[o]);
            let yo = yi.slice(o * hw..(o + 1) * hw);
            copy_rows_plus(Pixels::F32(&out[o * xl.ncolv..]), xl.pitch, yo, g.wo, g.ho, g.wo, Some(b));
        }
    });
}

/// The forward's driver: runs of images per rayon task, each image padded
/// into the task's scratch `xp` and handed to `image(xp, out, y_i)` with
/// `out_len` floats of scratch `out`.
fn per_image<X: Act>(
    g: &ConvGeom,
    xl: &XLayout,
    x: &[X],
    y: &mut [X::Out],
    out_len: usize,
    image: impl Fn(&[f32], &mut [f32], Planes<'_>) + Sync,
) {
    let pt = per_forward_task(g.n);
    y.par_chunks_mut(pt * g.y_len()).zip(x.par_chunks(pt * g.x_len())).for_each(|(yc, xc)| {
        let mut xp = vec![0f32; xl.len];
        let mut out = vec![0f32; out_len];
        for (yi, xi) in yc.chunks_exact_mut(g.y_len()).zip(xc.chunks_exact(g.x_len())) {
            xl.fill(g, X::pixels(xi), &mut xp);
            image(&xp, &mut out, X::planes(yi));
        }
    });
}

/// The input gradient's weights, for whichever kernel the geometry takes.
enum DxKernel {
    /// [`direct::conv_image`]: reduction rows `(o, ki, kj')` with the taps
    /// reversed (`kj' = K - 1 - kj`) so they read `dy` in increasing order.
    Direct { wt: LaneWeights, offs: Vec<usize> },
    /// [`gemm_offsets`] over [`DyLayout::offs`]: `w2[(o, ki, kj), c]`, `C`
    /// padded to `cm`.
    Gemm { w2: Vec<f32>, cm: usize },
}

impl DxKernel {
    fn new(g: &ConvGeom, w: &[f32], dl: &DyLayout) -> Self {
        let (k, kk, ckk) = (g.k, g.k * g.k, g.ckk());
        if direct::fits(k, g.w, g.o * kk) {
            let wt = LaneWeights::new(g.o * kk, g.c, |r, c| {
                let (o, ki, kj) = (r / kk, r % kk / k, k - 1 - r % k);
                w[o * ckk + c * kk + ki * k + kj]
            });
            let offs = dl.offs.chunks_exact(k).flat_map(|t| t.iter().rev().copied()).collect();
            return DxKernel::Direct { wt, offs };
        }
        let cm = g.c.next_multiple_of(MR);
        let mut w2 = vec![0f32; g.o * kk * cm];
        for (o, wo) in w.chunks_exact(ckk).enumerate() {
            for (c, wc) in wo.chunks_exact(kk).enumerate() {
                for (r, v) in wc.iter().enumerate() {
                    w2[(o * kk + r) * cm + c] = *v;
                }
            }
        }
        DxKernel::Gemm { w2, cm }
    }

    /// Scratch floats [`DxKernel::image`] needs.
    fn out_len(&self, g: &ConvGeom, dl: &DyLayout) -> usize {
        match self {
            DxKernel::Direct { wt, .. } => g.h * g.w * wt.ld(),
            DxKernel::Gemm { cm, .. } => cm * dl.ncolv,
        }
    }

    /// `dx[C, H, W]` of one image from its `dyz` (see [`DyLayout`]).
    fn image(
        &self,
        g: &ConvGeom,
        dl: &DyLayout,
        pitch: usize,
        dyz: &[f32],
        out: &mut [f32],
        mut dx: Planes<'_>,
    ) {
        match self {
            DxKernel::Direct { wt, offs } => {
                let grid = Grid { rows: g.h, cols: g.w, pitch };
                direct::conv_image(dyz, offs, g.k, grid, wt, out);
                direct::to_planes(out, g.h * g.w, wt.ld(), None, dx);
            }
            DxKernel::Gemm { w2, cm } => {
                gemm_offsets(*cm, dl.ncolv / LANES, w2, *cm, &dl.offs, dyz, out);
                let hw = g.h * g.w;
                for c in 0..g.c {
                    let dxc = dx.slice(c * hw..(c + 1) * hw);
                    copy_rows_plus(Pixels::F32(&out[c * dl.ncolv..]), pitch, dxc, g.w, g.h, g.w, None);
                }
            }
        }
    }
}

/// Gradients of [`forward`], as [`super::cpu::backward`]: `dw`, `db` are
/// accumulated into, every element of `dx` (when asked for) is written (it
/// may come uninitialized: zero-filling conv2's was 2% of a step, serial).
/// f16 `x` and `dy` are widened image by image, and `dx` rounded image by image.
pub fn backward<X: Act>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    dy: &[X],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    dx: Option<&mut [X::Out]>,
) {
    if g.stride > 1 {
        return strided::backward(g, x, w, dy, dw, db, dx);
    }
    if g.n > 0 && super::winograd_on() && winograd::fits_backward(g) {
        return winograd::backward(g, x, w, dy, dw, db, dx);
    }
    backward_with(g, x, w, dy, dw, db, dx, pixel_dw(g));
}

/// Whether [`forward`] and [`backward`] take Winograd for `g` (for tests
/// that compare it with the direct kernels).
#[cfg(test)]
pub(super) fn takes_winograd(g: &ConvGeom) -> (bool, bool) {
    (winograd::fits(g), winograd::fits_backward(g))
}

/// The mosaic Winograd lays `g`'s images out in: `(images down, images
/// across, pitch)`.
#[cfg(test)]
pub(super) fn winograd_mosaic(g: &ConvGeom) -> (usize, usize, (usize, usize)) {
    winograd::mosaic_of(g)
}

/// Winograd's backward wherever [`winograd::fits`], even where
/// [`backward`] picks the direct kernels (for tests timing both).
#[cfg(test)]
pub(super) fn backward_winograd(
    g: &ConvGeom,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    dx: &mut [f32],
) {
    assert!(winograd::fits(g));
    winograd::backward(g, x, w, dy, dw, None, Some(as_uninit(dx)));
}

/// Whether [`backward`] picks [`PixelDw`] for the weight gradient where it
/// does not take Winograd (for tests timing both).
#[cfg(test)]
pub(super) fn dw_pixel(g: &ConvGeom) -> bool {
    pixel_dw(g)
}

/// [`backward`] with the weight-gradient kernel chosen by the caller
/// (`pixel`: [`PixelDw`], else [`dw_blocks`]), so tests can run both.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward_with<X: Act>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    dy: &[X],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    dx: Option<&mut [X::Out]>,
    pixel: bool,
) {
    if g.n == 0 {
        return;
    }
    let xl = XLayout::new(g);
    let dl = DyLayout::new(g, &xl);
    let (ckk, hw) = (g.ckk(), g.out_hw());
    let px = (g.ho, g.wo, xl.pitch);
    // Weight-gradient accumulators dW^T[CKKp, ldo]: O padded to vectors,
    // CKK to the row block (extra rows read offset 0 and are dropped).
    let ldo = g.o.next_multiple_of(LANES);
    // Row blocks of 24 (one vector of O) or 12 (two): 24 accumulators.
    let kr = if ldo == LANES { 24 } else { 12 };
    let mut dw_offs = xl.offs.clone();
    dw_offs.resize(ckk.next_multiple_of(kr), 0);
    let dxk = DxKernel::new(g, w, &dl);
    let need_db = db.is_some();
    // Per task: dW[O, CKK] and db, summed in task order below.
    let partials = backward_tasks(g, per_task(g.n), dx, |first, imgs, mut dxt| {
        let mut pdw = if pixel { Some(PixelDw::new(g, &xl)) } else { None };
        let mut dwt = vec![0f32; if pixel { 0 } else { dw_offs.len() * ldo }];
        let mut db_t = vec![0f32; if need_db { g.o } else { 0 }];
        let mut xp = vec![0f32; xl.len];
        // dy^T[pixels, ldo]: padded channels stay zero.
        let mut dyt = vec![0f32; if pixel { 0 } else { hw * ldo }];
        let need_dx = dxt.is_some();
        // dy in the wide layout, `dl.shift` into each of its planes (see
        // DyLayout), with zero rows up to the PixelDw's channel padding.
        let dyz_rows = if pixel { g.o.next_multiple_of(PO) } else { g.o };
        let mut dyz = vec![0f32; if need_dx || pixel { dyz_rows * dl.plane } else { 0 }];
        let mut out = vec![0f32; if need_dx { dxk.out_len(g, &dl) } else { 0 }];
        let mut dyb = Vec::new();
        for i in 0..imgs {
            let img = first + i;
            xl.fill(g, X::pixels(&x[img * g.x_len()..(img + 1) * g.x_len()]), &mut xp);
            let dyx = &dy[img * g.y_len()..(img + 1) * g.y_len()];
            let dyi = X::pixels(dyx);
            if !pixel {
                transpose_to(X::widened(dyx, &mut dyb), g.o, hw, &mut dyt, ldo);
            }
            if need_dx || pixel {
                for o in 0..g.o {
                    let dyo = dyi.slice(o * hw..(o + 1) * hw);
                    copy_rows(dyo, g.wo, &mut dyz[o * dl.plane + dl.shift..], xl.pitch, g.ho, g.wo);
                }
            }
            if let Some(p) = pdw.as_mut() {
                p.add(xl.ncolv / LANES, &xp, &dyz, dl.shift, dl.plane);
            } else if ldo == LANES {
                dw_blocks::<24, 1>(px, &dw_offs, &xp, &dyt, ldo, 0, &mut dwt);
            } else {
                let mut v0 = 0;
                while v0 + 2 <= ldo / LANES {
                    dw_blocks::<12, 2>(px, &dw_offs, &xp, &dyt, ldo, v0, &mut dwt);
                    v0 += 2;
                }
                if v0 < ldo / LANES {
                    dw_blocks::<12, 1>(px, &dw_offs, &xp, &dyt, ldo, v0, &mut dwt);
                }
            }
            for (o, acc) in db_t.iter_mut().enumerate() {
                *acc += pixels_sum(dyi.slice(o * hw..(o + 1) * hw));
            }
            if let Some(dxt) = dxt.as_deref_mut() {
                let dxi = &mut dxt[i * g.x_len()..(i + 1) * g.x_len()];
                dxk.image(g, &dl, xl.pitch, &dyz, &mut out, X::planes(dxi));
            }
        }
        let part = match pdw {
            Some(p) => p.finish(g),
            None => {
                let mut part = vec![0f32; g.o * ckk];
                for (o, row) in part.chunks_exact_mut(ckk).enumerate() {
                    for (a, b) in row.iter_mut().zip(dwt[o..].iter().step_by(ldo)) {
                        *a = *b;
                    }
                }
                part
            }
        };
        (part, db_t)
    });
    add_partials(&partials, dw, db);
}

/// Runs `task(first image, images, their dx)` for each run of `pt` images
/// (the last maybe fewer) in parallel (`dx` `None` without an input
/// gradient), and returns the tasks' `(weight-gradient part, db part)` in
/// task order.
fn backward_tasks<X: Send>(
    g: &ConvGeom,
    pt: usize,
    dx: Option<&mut [X]>,
    task: impl Fn(usize, usize, Option<&mut [X]>) -> (Vec<f32>, Vec<f32>) + Sync + Send,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let pt = pt.max(1);
    let runs: Vec<Option<&mut [X]>> = match dx {
        Some(d) => d.chunks_mut(pt * g.x_len()).map(Some).collect(),
        None => (0..g.n.div_ceil(pt)).map(|_| None).collect(),
    };
    runs.into_par_iter()
        .enumerate()
        .map(|(t, dxt)| {
            let first = t * pt;
            task(first, pt.min(g.n - first), dxt)
        })
        .collect()
}

/// Adds the tasks' `(weight-gradient part, db part)` into `dw` and `db`, in
/// task order (so the sums do not depend on which thread ran what).
fn add_partials(partials: &[(Vec<f32>, Vec<f32>)], dw: &mut [f32], db: Option<&mut [f32]>) {
    // A piece of `dw` at a time, so it stays in L1 across the tasks' parts
    // (Winograd's are 128 KB each), the pieces in parallel (on one thread,
    // the other waited 1% of a step); each element's sum keeps task order.
    const PIECE: usize = 1024;
    dw.par_chunks_mut(PIECE).enumerate().for_each(|(i, piece)| {
        for (part, _) in partials {
            for (a, b) in piece.iter_mut().zip(part.get(i * PIECE..).unwrap_or_default()) {
                *a += *b;
            }
        }
    });
    if let Some(db) = db {
        for (_, db_t) in partials {
            for (a, b) in db.iter_mut().zip(db_t) {
                *a += *b;
            }
        }
    }
}
