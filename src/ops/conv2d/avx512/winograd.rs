//! Winograd F(4x4, 5x5) convolution on AVX-512, for 5x5 stride-1 kernels
//! with enough channels on both sides (MNIST's conv2). Each 4 x 4 block of
//! output pixels (a tile) costs 64 products per channel pair instead of 400:
//! the 8 x 8 input patch and the filter are transformed, multiplied point by
//! point (64 small GEMMs over the channels), and transformed back
//! (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks").
//!
//! - forward: F(4, 5) over the input padded by `p`;
//! - input gradient: the same F(4, 5) over `dy` padded by `K - 1 - p` with
//!   the flipped, transposed filter (a full correlation);
//! - weight gradient: F(5, 4), the 4 x 4 `dy` tile as the filter over the
//!   forward's own 8 x 8 patches, summed over tiles and images in the
//!   transformed domain and transformed back once per call.
//!
//! Activations are pixel-major with channels along the lanes. The data
//! transforms' coefficients are short dyadic fractions (21/4, 5/2, 1/8, ...)
//! and the filter transform's fractions are rounded once from f64, so the
//! results differ from the direct kernels' by a few roundings more than a
//! different order of sums: measured at about twice F(2x2, 5x5)'s error
//! (`winograd_error_stays_within_a_few_ulps_on_mnist_conv2`), for 64 products
//! per 16 outputs instead of 36 per 4.

mod kernels;

use super::dw::pixels_sum;
use super::{add_partials, backward_tasks, per_forward_task};
use crate::ops::conv2d::avx512_direct::to_planes;
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::lines::Lines;
use crate::ops::half_emu::{Act, Pixels};
use kernels::{point_len, TileGrid, AT5, G5, INV_F, LANES, M, T, TT};
use rayon::prelude::*;
use std::cell::RefCell;

const K: usize = 5;

/// Whether [`forward`] and [`backward`] take this geometry: a 5x5 stride-1
/// kernel with at least 8 channels in and out (MNIST's conv1, with one
/// input channel, would spend its time in the transforms).
pub(super) fn fits(g: &ConvGeom) -> bool {
    g.k == K && g.stride == 1 && g.padding < K && g.c >= 8 && g.o >= 8
}

/// An image pixel-major, `[rows][cols][ld]`: its `ch` planes of `h x w`
/// pixels at `(pad, pad)`, zeros around them and in lanes `ch..ld`.
struct PixelMajor {
    rows: usize,
    cols: usize,
    ld: usize,
    pad: usize,
    h: usize,
    w: usize,
    ch: usize,
}

impl PixelMajor {
    fn len(&self) -> usize {
        self.rows * self.cols * self.ld
    }

    /// Writes the pixels of `src[ch][h][w]` into `buf` (whose border stays
    /// as it is: zero), f16 widened as it is read.
    fn fill(&self, src: Pixels<'_>, buf: &mut [f32]) {
        assert!(
            src.len() >= self.ch * self.h * self.w && self.ch <= self.ld && self.ld.is_multiple_of(LANES)
        );
        assert!(self.pad + self.h <= self.rows && self.pad + self.w <= self.cols && buf.len() >= self.len());
        let (dims, at) = ((self.ch, self.h, self.w), (self.pad, self.cols, self.ld));
        // SAFETY: the asserts are `to_pixel_major`'s contract. AVX-512F/BW/VL: see `fits`.
        unsafe {
            match src {
                Pixels::F32(s) => kernels::to_pixel_major(s.as_ptr(), dims, buf.as_mut_ptr(), at),
                Pixels::F16(s) => kernels::to_pixel_major(s.as_ptr(), dims, buf.as_mut_ptr(), at),
            }
        }
    }

    /// The tiles of an output grid of `ho x wo` pixels over this image.
    fn tiles(&self, (ho, wo): (usize, usize)) -> TileGrid {
        TileGrid { ty: ho.div_ceil(M), tx: wo.div_ceil(M), cols: self.cols, ld: self.ld }
    }
}

/// Sizes shared by the forward and backward passes.
struct Plan {
    /// `x`, padded by `p`: read by the forward and weight-gradient tiles.
    x: PixelMajor,
    /// `dy`, padded by `q = K - 1 - p`: read by the input gradient's tiles
    /// and (at `(q, q)`) by the weight gradient's 4 x 4 tiles.
    dy: PixelMajor,
    /// Tiles over the output, read from `x`.
    out: TileGrid,
    /// Tiles over the input gradient, read from `dy`.
    dx: TileGrid,
    /// The weight gradient's `dy` tiles: `out`'s grid over `dy`.
    dwt: TileGrid,
}

impl Plan {
    fn new(g: &ConvGeom) -> Self {
        let (p, q) = (g.padding, K - 1 - g.padding);
        let (ldc, ldo) = (g.c.next_multiple_of(LANES), g.o.next_multiple_of(LANES));
        // A tile's 8 x 8 patch reaches 4 * tiles + 4 rows and columns.
        let reach = |n: usize| M * n.div_ceil(M) + T - M;
        let x = PixelMajor {
            rows: reach(g.ho).max(p + g.h),
            cols: reach(g.wo).max(p + g.w),
            ld: ldc,
            pad: p,
            h: g.h,
            w: g.w,
            ch: g.c,
        };
        let dy = PixelMajor {
            rows: reach(g.h).max(q + M * g.ho.div_ceil(M)),
            cols: reach(g.w).max(q + M * g.wo.div_ceil(M)),
            ld: ldo,
            pad: q,
            h: g.ho,
            w: g.wo,
            ch: g.o,
        };
        let out = x.tiles((g.ho, g.wo));
        let dx = dy.tiles((g.h, g.w));
        let dwt = dy.tiles((g.ho, g.wo));
        // What makes the kernels' raw reads sound: every 8 x 8 patch inside
        // its image, every 4 x 4 `dy` tile (from (q, q)) inside `dy`.
        let inside = |pm: &PixelMajor, tg: TileGrid, from: usize, side: usize| {
            from + M * (tg.ty - 1) + side <= pm.rows && from + M * (tg.tx - 1) + side <= pm.cols
        };
        assert!(inside(&x, out, 0, T) && inside(&dy, dx, 0, T) && inside(&dy, dwt, q, M));
        Plan { x, dy, out, dx, dwt }
    }
}

/// The transformed filters `u[p][i][ld]` (`ld` = `nout` rounded up to
/// lanes) of `at(o, i, ki, kj)`, `G w G^T` in f64 and rounded once. The
/// output channel runs innermost so the f64 loops vectorize, one input
/// channel per rayon job. Each sum starts from its first term, as
/// `Iterator::sum` (from -0.0) does, bit for bit.
fn filters(nin: usize, nout: usize, at: impl Fn(usize, usize, usize, usize) -> f32 + Sync) -> Lines {
    let ld = nout.next_multiple_of(LANES);
    // Input channels in parallel, each its `[p][o]` block (the rest of the
    // pool would otherwise wait): w[ki][kj][o], (G w)[a][kj][o], then u.
    let blocks: Vec<Vec<f32>> = (0..nin)
        .into_par_iter()
        .map(|i| {
            let (mut w, mut gw) = (vec![0f64; K * K * nout], vec![0f64; T * K * nout]);
            for (t, wt) in w.chunks_exact_mut(nout).enumerate() {
                for (o, v) in wt.iter_mut().enumerate() {
                    *v = at(o, i, t / K, t % K) as f64;
                }
            }
            for (t, dst) in gw.chunks_exact_mut(nout).enumerate() {
                let (a, kj) = (t / K, t % K);
                mul_add_rows(dst, (0..K).map(|ki| (G5[a][ki], &w[(ki * K + kj) * nout..][..nout])));
            }
            let gw = &gw;
            rows_f32(TT, nout, |p| {
                (0..K).map(move |kj| (G5[p % T][kj], &gw[(p / T * K + kj) * nout..][..nout]))
            })
        })
        .collect();
    let mut u = Lines::zeroed(TT * nin * ld);
    for (i, block) in blocks.iter().enumerate() {
        for (p, src) in block.chunks_exact(nout).enumerate() {
            u[(p * nin + i) * ld..][..nout].copy_from_slice(src);
        }
    }
    u
}

/// `rows` rows of `n`: row `t` is [`mul_add_rows`] of `terms(t)`, rounded
/// to f32 once.
fn rows_f32<'a, I: Iterator<Item = (f64, &'a [f64])>>(
    rows: usize,
    n: usize,
    terms: impl Fn(usize) -> I,
) -> Vec<f32> {
    let (mut out, mut row) = (vec![0f32; rows * n], vec![0f64; n]);
    for (t, dst) in out.chunks_exact_mut(n.max(1)).enumerate() {
        mul_add_rows(&mut row, terms(t));
        for (d, v) in dst.iter_mut().zip(&row) {
            *d = *v as f32;
        }
    }
    out
}

/// `dst = sum_k c_k * src_k`, the terms added in order from the first.
fn mul_add_rows<'a>(dst: &mut [f64], mut terms: impl Iterator<Item = (f64, &'a [f64])>) {
    let Some((c, src)) = terms.next() else {
        dst.fill(-0.0);
        return;
    };
    for (d, s) in dst.iter_mut().zip(src) {
        *d = c * s;
    }
    for (c, src) in terms {
        for (d, s) in dst.iter_mut().zip(src) {
            *d += c * s;
        }
    }
}

fn zeros(n: usize) -> Vec<f32> {
    vec![0f32; n]
}

std::thread_local! {
    static SCRATCH: RefCell<Lines> = RefCell::new(Lines::default());
}

/// Runs `f` on this thread's scratch cut into pieces of the lengths `lens`,
/// each on a cache line of its own: the first `zeroed` zero-filled, the
/// others holding whatever the last use left (the kernels write them in
/// full before reading). Fresh buffers per rayon task, allocated and
/// zero-filled page by page, took 3% of a step.
fn with_scratch<const N: usize, R>(
    lens: [usize; N],
    zeroed: usize,
    f: impl FnOnce([&mut [f32]; N]) -> R,
) -> R {
    let run = |buf: &mut Lines| {
        buf.grow(Lines::split_len(&lens));
        let mut parts = buf.split(lens);
        for p in parts.iter_mut().take(zeroed) {
            p.fill(0.0);
        }
        f(parts)
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => run(&mut buf),
        // Only a nested use lands here; it gets a buffer of its own.
        Err(_) => run(&mut Lines::default()),
    })
}

/// `y[N, O, Ho, Wo] = conv(x, w) + bias`, as [`super::forward`] (which
/// calls it for [`fits`] geometries on AVX-512 machines).
pub(super) fn forward<X: Act>(g: &ConvGeom, x: &[X], w: &[f32], bias: Option<&[f32]>, y: &mut [X::Out]) {
    let plan = Plan::new(g);
    let (ckk, kk) = (g.ckk(), K * K);
    let u = filters(g.c, g.o, |o, c, ki, kj| w[o * ckk + c * kk + ki * K + kj]);
    let (ldc, ldo, nt, hw) = (plan.x.ld, plan.dy.ld, plan.out.count(), g.out_hw());
    let pt = per_forward_task(g.n);
    y.par_chunks_mut(pt * g.y_len()).zip(x.par_chunks(pt * g.x_len())).for_each(|(yc, xc)| {
        let lens = [plan.x.len(), TT * point_len(nt, ldc), TT * point_len(nt, ldo), hw * ldo];
        with_scratch(lens, 1, |[xt, v, m, out]| {
            for (yi, xi) in yc.chunks_exact_mut(g.y_len()).zip(xc.chunks_exact(g.x_len())) {
                plan.x.fill(X::pixels(xi), xt);
                // SAFETY: the patches of `plan.out` lie inside `xt` (Plan::new
                // sizes it to their reach), and v, u, m, out have the lengths
                // the kernels' contracts ask for (cut from the scratch above). `fits`
                // callers run only where `avx512::usable` found AVX-512F.
                unsafe {
                    kernels::input_transform(xt.as_ptr(), plan.out, v.as_mut_ptr());
                    kernels::point_gemms(nt, g.c, v.as_ptr(), ldc, u.as_ptr(), ldo, m.as_mut_ptr());
                    kernels::output_transform(
                        m.as_ptr(),
                        (plan.out.ty, plan.out.tx, ldo),
                        (g.ho, g.wo),
                        out.as_mut_ptr(),
                    );
                }
                to_planes(out, hw, ldo, bias, X::planes(yi));
            }
        });
    });
}

/// Gradients of [`forward`], as [`super::backward`]: `dw`, `db` are
/// accumulated into, every element of `dx` (when asked for) is written.
pub(super) fn backward<X: Act>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    dy: &[X],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    dx: Option<&mut [X::Out]>,
) {
    let plan = Plan::new(g);
    let (ckk, kk) = (g.ckk(), K * K);
    let (ldc, ldo, hw) = (plan.x.ld, plan.dy.ld, g.out_hw());
    let (nt, ntx) = (plan.out.count(), plan.dx.count());
    // The input gradient's filter: `w` flipped, input and output swapped.
    let udx = dx
        .is_some()
        .then(|| filters(g.o, g.c, |c, o, ki, kj| w[o * ckk + c * kk + (K - 1 - ki) * K + (K - 1 - kj)]));
    let need_db = db.is_some();
    // Per task: the weight gradient in the transformed domain and db.
    let partials = backward_tasks(g, dx, |first, imgs, mut dxt| {
        let mut acc = zeros(TT * ldc * ldo);
        let mut db_t = zeros(if need_db { g.o } else { 0 });
        let dx_len = |n| if dxt.is_some() { n } else { 0 };
        let lens = [
            plan.x.len(),
            plan.dy.len(),
            TT * point_len(nt, ldc),
            TT * point_len(nt, ldo),
            dx_len(TT * point_len(ntx, ldo)),
            dx_len(TT * point_len(ntx, ldc)),
            dx_len(g.h * g.w * ldc),
        ];
        with_scratch(lens, 2, |[xt, dyt, v, d, vdy, mdx, outdx]| {
            for i in 0..imgs {
                let img = first + i;
                plan.x.fill(X::pixels(&x[img * g.x_len()..(img + 1) * g.x_len()]), xt);
                let dyi = X::pixels(&dy[img * g.y_len()..(img + 1) * g.y_len()]);
                plan.dy.fill(dyi, dyt);
                let q = plan.dy.pad;
                // SAFETY: the patches of `plan.out` lie inside `xt` and the
                // 4 x 4 tiles of `plan.dwt` from (q, q) inside `dyt` (Plan::new
                // sizes both to their reach); v, d, acc have the lengths the
                // contracts ask for (cut from the scratch above). AVX-512F: see `fits`.
                unsafe {
                    kernels::input_transform(xt.as_ptr(), plan.out, v.as_mut_ptr());
                    kernels::dy_transform(
                        dyt.as_ptr().add((q * plan.dy.cols + q) * ldo),
                        plan.dwt,
                        d.as_mut_ptr(),
                    );
                    kernels::point_dw(nt, v.as_ptr(), ldc, d.as_ptr(), ldo, acc.as_mut_ptr());
                }
                for (o, s) in db_t.iter_mut().enumerate() {
                    *s += pixels_sum(dyi.slice(o * hw..(o + 1) * hw));
                }
                if let (Some(dxt), Some(udx)) = (dxt.as_deref_mut(), udx.as_deref()) {
                    // SAFETY: the patches of `plan.dx` lie inside `dyt`; vdy,
                    // udx, mdx, outdx have the contracts' lengths.
                    unsafe {
                        kernels::input_transform(dyt.as_ptr(), plan.dx, vdy.as_mut_ptr());
                        kernels::point_gemms(
                            ntx,
                            g.o,
                            vdy.as_ptr(),
                            ldo,
                            udx.as_ptr(),
                            ldc,
                            mdx.as_mut_ptr(),
                        );
                        kernels::output_transform(
                            mdx.as_ptr(),
                            (plan.dx.ty, plan.dx.tx, ldc),
                            (g.h, g.w),
                            outdx.as_mut_ptr(),
                        );
                    }
                    let dxi = &mut dxt[i * g.x_len()..(i + 1) * g.x_len()];
                    to_planes(outdx, g.h * g.w, ldc, None, X::planes(dxi));
                }
            }
        });
        (acc, db_t)
    });
    let mut acc = zeros(TT * ldc * ldo);
    add_partials(&partials, &mut acc, db);
    finish_dw(g, &acc, ldc, ldo, dw);
}

/// `dw[o][c] += A^T (diag(f) acc[.][c][o] diag(f)) A`: the weight gradient
/// out of the transformed domain (`f` = [`INV_F`], the filter transform's
/// fractions), in f64, the output channel innermost (see [`filters`]).
fn finish_dw(g: &ConvGeom, acc: &[f32], ldc: usize, ldo: usize, dw: &mut [f32]) {
    let (kk, no) = (K * K, g.o);
    // Input channels in parallel, each its `[ki][kj][o]` block: s[a][b][o],
    // r[ki][b][o] = (A^T s)[ki][b], then r A.
    let blocks: Vec<Vec<f32>> = (0..g.c)
        .into_par_iter()
        .map(|c| {
            let (mut sv, mut r) = (vec![0f64; TT * no], vec![0f64; K * T * no]);
            for (p, dst) in sv.chunks_exact_mut(no).enumerate() {
                let (fa, fb) = (INV_F[p / T], INV_F[p % T]);
                for (d, a) in dst.iter_mut().zip(&acc[(p * ldc + c) * ldo..]) {
                    *d = *a as f64 * fa * fb;
                }
            }
            for (t, dst) in r.chunks_exact_mut(no).enumerate() {
                let (ki, b) = (t / T, t % T);
                mul_add_rows(dst, (0..T).map(|a| (AT5[ki][a], &sv[(a * T + b) * no..][..no])));
            }
            let r = &r;
            rows_f32(kk, no, |t| (0..T).map(move |b| (AT5[t % K][b], &r[(t / K * T + b) * no..][..no])))
        })
        .collect();
    for (c, block) in blocks.iter().enumerate() {
        for (t, src) in block.chunks_exact(no).enumerate() {
            for (o, x) in src.iter().enumerate() {
                dw[o * g.c * kk + c * kk + t] += *x;
            }
        }
    }
}
