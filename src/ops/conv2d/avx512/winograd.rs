//! Winograd convolution on AVX-512 over 8 x 8 patches: F(4x4, 5x5) for 5x5
//! stride-1 kernels (MNIST's conv2) and F(6x6, 3x3) for 3x3 stride-1
//! kernels (the ResNets' convs), with enough channels on both sides. Each
//! `M x M` block of output pixels (a tile) costs 64 products per channel
//! pair instead of 400 (5x5) or 324 (3x3): the 8 x 8 input patch and the
//! filter are transformed, multiplied point by point (64 small GEMMs over
//! the channels), and transformed back (Lavin & Gray, "Fast Algorithms for
//! Convolutional Neural Networks"). Both use the same eight points, hence
//! the same data transform; the output tile side `M` picks what differs.
//!
//! - forward: F(M, K) over the input padded by `p`;
//! - input gradient: the same F(M, K) over `dy` padded by `K - 1 - p` with
//!   the flipped, transposed filter (a full correlation);
//! - weight gradient: F(K, M), the M x M `dy` tile as the filter over the
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

mod filters;
pub(super) mod kernels;

use super::dw::pixels_sum;
use super::pixel_major::fill_pixel_major;
use super::{add_partials, backward_tasks, per_forward_task};
use crate::ops::conv2d::avx512_direct::to_planes;
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::lines::Lines;
use crate::ops::half_emu::{Act, Pixels};
use filters::{filters, finish_dw, Taps};
use kernels::{point_len, TileGrid, LANES, T, TT};
use rayon::prelude::*;
use std::cell::RefCell;

/// Whether [`forward`] and [`backward`] take this geometry: a 5x5 or 3x3
/// stride-1 kernel with at least 8 channels in and out (MNIST's conv1 and
/// the ResNets' first conv, with one input channel, would spend their time
/// in the transforms).
pub(super) fn fits(g: &ConvGeom) -> bool {
    (g.k == 5 || g.k == 3) && g.stride == 1 && g.padding < g.k && g.c >= 8 && g.o >= 8
}

/// Whether [`backward`] takes this geometry: as [`fits`], but 3x3 kernels
/// under 8 x 8 output pixels only in a mosaic of several images. A lone
/// 7x7 image spends 4 tiles of 6 x 6 (two thirds of them padding), and the
/// weight gradient's transformed accumulators (1 MB a task at 64 channels)
/// then cost more than the products saved: 2.78 ms per batch of 128
/// against 2.72 ms for the direct kernels, where 3 x 3 images in a mosaic
/// (1.8 tiles each) take 1.67-1.80 ms (`conv_timing_resnet20`). Up to 64
/// channels each way, as measured: ResNet-18's 4x4 stage (512 channels)
/// would hold 64 MB of accumulators a task.
pub(super) fn fits_backward(g: &ConvGeom) -> bool {
    let small_ok = || g.c.max(g.o) <= 64 && Mosaic::new(g, 6).slots() > 1;
    fits(g) && (g.k != 3 || g.ho.min(g.wo) >= 8 || small_ok())
}

/// [`Mosaic::new`] for `g`'s tile side, as `(gy, gx, pitch)`.
#[cfg(test)]
pub(super) fn mosaic_of(g: &ConvGeom) -> (usize, usize, (usize, usize)) {
    let mo = Mosaic::new(g, if g.k == 3 { 6 } else { 4 });
    (mo.gy, mo.gx, mo.pitch)
}

/// Tiles per point GEMM that F(6x6, 3x3) batches mosaics up to.
const GEMM_TILES: usize = 32;

/// Mosaics whose tiles go through the point GEMMs together, for `nt` tiles
/// per mosaic of output tiles of `m x m` pixels. F(6x6, 3x3): about
/// [`GEMM_TILES`] tiles, as the point GEMMs otherwise reload the
/// transformed filter (64 KB a point at 64 x 64 channels) and the weight
/// gradient's accumulators every few tiles. F(4x4, 5x5): one, as MNIST's
/// conv2 has 16 tiles an image (the sums are the same either way).
fn batch(m: usize, nt: usize) -> usize {
    if m == 6 {
        (GEMM_TILES / nt).max(1)
    } else {
        1
    }
}

/// Images per backward task: whole mosaics, spread evenly over a few tasks
/// a thread. Each task sums the weight gradient into accumulators of its
/// own (`acc_len` floats), added up in task order afterwards. F(6x6, 3x3)
/// with accumulators of 256 KB or more (32 x 32 channels and up) takes two
/// tasks a thread: at four, writing and adding up 1 MB of accumulators a
/// task made ResNet-20's 7x7 convs' backward (64 channels, batch 128, two
/// threads) 8-10% slower, its 14x14 ones' (32) 6%. Four otherwise, as each
/// task then sums half
/// the tiles in f32 in the transformed domain: the seed ConvNet's 5x5 F(4x4,
/// 5x5) at two drifted from the device by 1.7e-4 of a weight in 20 O0 steps,
/// against 5.4e-6 at four (`twenty_o0_steps_on_the_gpu_match_the_cpu`).
fn per_backward_task(n: usize, slots: usize, m: usize, acc_len: usize) -> usize {
    let per_thread = if m == 6 && acc_len >= TT * 32 * 32 { 2 } else { 4 };
    let tasks = per_thread * rayon::current_num_threads().max(1);
    n.div_ceil(slots).div_ceil(tasks).max(1) * slots
}

/// `gy x gx` images side by side in one pixel-major buffer, `pitch` pixels
/// apart, so that tiles run across them. A 7x7 image alone takes 2 x 2
/// tiles of 6 x 6 (144 output pixels for 49); 3 x 3 of them, 8 pixels
/// apart, take 4 x 4 tiles (1.8 a image), and 2 x 2 images of 14x14 take
/// 25 tiles instead of 36. Only where the output keeps the input's size
/// (`2 p = K - 1`): the `p` zero rows and columns between two images are
/// then the padding of both, for the forward, and the input gradient's
/// `dy` padded by `q = p` reads the same gaps. Grid pixels in a gap are
/// computed and dropped (see [`kernels::Slots`]); the weight gradient sums
/// them as products with the gaps' zero `dy`. Images go to mosaics by
/// their index in the batch (mosaic `j` holds images `j * slots ..`), so
/// the output's bits do not depend on how tasks cut the batch. A tile
/// across two images rounds both with the larger one's values (as a tile
/// inside one image does with its largest pixels): beside an image 100x
/// its size, an image's outputs were off by 3.8e-4 of its own peak (4.2e-6
/// beside one of its size), within Winograd's bounds of the larger one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mosaic {
    gy: usize,
    gx: usize,
    pitch: (usize, usize),
}

impl Mosaic {
    /// The mosaic with the fewest tiles per image for `g` and tile side
    /// `m`, at most [`GEMM_TILES`] tiles; one image where none has fewer.
    fn new(g: &ConvGeom, m: usize) -> Self {
        let gap = g.padding.max(g.k - 1 - g.padding);
        let pitch = (g.h.max(g.ho) + gap, g.w.max(g.wo) + gap);
        let one = Mosaic { gy: 1, gx: 1, pitch };
        if m != 6 || g.ho != g.h || g.wo != g.w {
            return one;
        }
        let tiles =
            |mo: &Mosaic| mo.extent((g.ho, g.wo)).0.div_ceil(m) * mo.extent((g.ho, g.wo)).1.div_ceil(m);
        let mut best = (one, tiles(&one));
        for gy in 1..=6 {
            for gx in 1..=6 {
                let mo = Mosaic { gy, gx, pitch };
                let nt = tiles(&mo);
                // Fewer tiles per image (nt / slots), compared as fractions.
                if nt <= GEMM_TILES && nt * best.0.slots() < best.1 * mo.slots() {
                    best = (mo, nt);
                }
            }
        }
        best.0
    }

    fn slots(&self) -> usize {
        self.gy * self.gx
    }

    /// Rows and columns of the mosaic of images of `h x w` pixels.
    fn extent(&self, (h, w): (usize, usize)) -> (usize, usize) {
        ((self.gy - 1) * self.pitch.0 + h, (self.gx - 1) * self.pitch.1 + w)
    }

    /// The first pixel of slot `s`, relative to slot 0's.
    fn origin(&self, s: usize) -> (usize, usize) {
        (s / self.gx * self.pitch.0, s % self.gx * self.pitch.1)
    }

    /// Where the output transform puts the pixels of images of `h x w`
    /// from the tiles of `grid`, `m` pixels a side.
    fn slots_of(&self, (h, w): (usize, usize), grid: TileGrid, m: usize) -> kernels::Slots {
        kernels::Slots::new((h, w), self.pitch, (self.gy, self.gx), (m * grid.ty, m * grid.tx))
    }
}

/// A mosaic of images pixel-major, `[rows][cols][ld]`: each image's `ch`
/// planes of `h x w` pixels at `(pad, pad)` plus its slot's origin, zeros
/// around them and in lanes `ch..ld`.
struct PixelMajor {
    rows: usize,
    cols: usize,
    ld: usize,
    pad: usize,
    h: usize,
    w: usize,
    ch: usize,
    mosaic: Mosaic,
}

impl PixelMajor {
    fn len(&self) -> usize {
        self.rows * self.cols * self.ld
    }

    /// Writes the images of `images` into the mosaic's slots in order and
    /// zeros the slots past them (which hold the last mosaic's images
    /// otherwise: the tiles across a slot's edge would round with them).
    /// The gaps and the border stay as they are: zero.
    fn fill<'a>(&self, images: impl Iterator<Item = Pixels<'a>>, buf: &mut [f32]) {
        let mut filled = 0;
        for (s, src) in images.enumerate() {
            self.fill_slot(s, src, buf);
            filled = s + 1;
        }
        for s in filled..self.mosaic.slots() {
            let (oy, ox) = self.mosaic.origin(s);
            for y in 0..self.h {
                let at = ((self.pad + oy + y) * self.cols + self.pad + ox) * self.ld;
                buf[at..at + self.w * self.ld].fill(0.0);
            }
        }
    }

    /// Writes the pixels of `src[ch][h][w]` into slot `s` of `buf`, f16
    /// widened as it is read.
    fn fill_slot(&self, s: usize, src: Pixels<'_>, buf: &mut [f32]) {
        let (oy, ox) = self.mosaic.origin(s);
        assert!(
            s < self.mosaic.slots()
                && self.pad + oy + self.h <= self.rows
                && self.pad + ox + self.w <= self.cols
        );
        let start = (oy * self.cols + ox) * self.ld;
        fill_pixel_major(src, (self.ch, self.h, self.w), buf, start, (self.pad, self.cols, self.ld));
    }

    /// The tiles of `m x m` pixels of an output grid of `ho x wo` pixels
    /// over this image.
    fn tiles(&self, m: usize, (ho, wo): (usize, usize)) -> TileGrid {
        let (ty, tx) = (ho.div_ceil(m), wo.div_ceil(m));
        TileGrid { ty, tx, cols: self.cols, ld: self.ld, ps: point_len(ty * tx, self.ld) }
    }
}

/// Sizes shared by the forward and backward passes.
struct Plan {
    /// The images a tile grid runs across (the same for every buffer).
    mosaic: Mosaic,
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
    /// For output tiles of `m x m` pixels (`K = T + 1 - m`, `g.k`).
    fn new(g: &ConvGeom, m: usize) -> Self {
        let (p, q) = (g.padding, g.k - 1 - g.padding);
        let (ldc, ldo) = (g.c.next_multiple_of(LANES), g.o.next_multiple_of(LANES));
        let mosaic = Mosaic::new(g, m);
        // The mosaic's extent in input and output pixels.
        let ((h, w), (ho, wo)) = (mosaic.extent((g.h, g.w)), mosaic.extent((g.ho, g.wo)));
        // A tile's 8 x 8 patch reaches M * tiles + T - M rows and columns.
        let reach = |n: usize| m * n.div_ceil(m) + T - m;
        let x = PixelMajor {
            rows: reach(ho).max(p + h),
            cols: reach(wo).max(p + w),
            ld: ldc,
            pad: p,
            h: g.h,
            w: g.w,
            ch: g.c,
            mosaic,
        };
        let dy = PixelMajor {
            rows: reach(h).max(q + m * ho.div_ceil(m)),
            cols: reach(w).max(q + m * wo.div_ceil(m)),
            ld: ldo,
            pad: q,
            h: g.ho,
            w: g.wo,
            ch: g.o,
            mosaic,
        };
        let out = x.tiles(m, (ho, wo));
        let dx = dy.tiles(m, (h, w));
        let dwt = dy.tiles(m, (ho, wo));
        // What makes the kernels' raw reads sound: every 8 x 8 patch inside
        // its image, every m x m `dy` tile (from (q, q)) inside `dy`.
        let inside = |pm: &PixelMajor, tg: TileGrid, from: usize, side: usize| {
            from + m * (tg.ty - 1) + side <= pm.rows && from + m * (tg.tx - 1) + side <= pm.cols
        };
        assert!(inside(&x, out, 0, T) && inside(&dy, dx, 0, T) && inside(&dy, dwt, q, m));
        Plan { mosaic, x, dy, out, dx, dwt }
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
/// full before reading; test builds fill them with NaN to hold them to
/// that). Fresh buffers per rayon task, allocated and zero-filled page by
/// page, took 3% of a step.
fn with_scratch<const N: usize, R>(
    lens: [usize; N],
    zeroed: usize,
    f: impl FnOnce([&mut [f32]; N]) -> R,
) -> R {
    let run = |buf: &mut Lines| {
        buf.grow(Lines::split_len(&lens));
        let mut parts = buf.split(lens);
        for (i, p) in parts.iter_mut().enumerate() {
            if i < zeroed {
                p.fill(0.0);
            } else if cfg!(test) {
                // Tests poison the rest, so a kernel that reads what it did
                // not write shows as NaN instead of a stale value.
                p.fill(f32::NAN);
            }
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
    if g.k == 3 {
        forward_with::<6, X>(g, x, w, bias, y)
    } else {
        forward_with::<4, X>(g, x, w, bias, y)
    }
}

/// [`forward`] with output tiles of `M x M` pixels (`g.k = T + 1 - M`).
fn forward_with<const M: usize, X: Act>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [X::Out],
) {
    let plan = Plan::new(g, M);
    let k = g.k;
    let u = filters(k, g.c, g.o, Taps::Forward(w));
    let (ldc, ldo, nt, hw) = (plan.x.ld, plan.dy.ld, plan.out.count(), g.out_hw());
    let slots = plan.mosaic.slots();
    // Tasks of whole mosaics (see `Mosaic`), batches of `b` mosaics.
    let (pt, b) = (per_forward_task(g.n).next_multiple_of(slots), batch(M, nt));
    let (xl, yl) = (g.x_len(), g.y_len());
    let out_slots = plan.mosaic.slots_of((g.ho, g.wo), plan.out, M);
    y.par_chunks_mut(pt * yl).zip(x.par_chunks(pt * xl)).for_each(|(yc, xc)| {
        let lens = [plan.x.len(), TT * point_len(b * nt, ldc), TT * point_len(b * nt, ldo), slots * hw * ldo];
        with_scratch(lens, 1, |[xt, v, m, out]| {
            for (yb, xb) in yc.chunks_mut(b * slots * yl).zip(xc.chunks(b * slots * xl)) {
                let nm = (xb.len() / xl).div_ceil(slots);
                let tiles = plan.out.batched(nm);
                for (j, xm) in xb.chunks(slots * xl).enumerate() {
                    plan.x.fill(xm.chunks_exact(xl).map(X::pixels), xt);
                    // SAFETY: the patches of `plan.out` lie inside `xt`
                    // (Plan::new sizes it to their reach); mosaic j's tiles
                    // start at tile j * nt of `v`, which holds nm * nt <= b *
                    // nt tiles a point (cut from the scratch above). `fits`
                    // callers run only where `avx512::usable` found AVX-512F.
                    unsafe {
                        kernels::input_transform::<M>(xt.as_ptr(), tiles, v.as_mut_ptr().add(j * nt * ldc))
                    };
                }
                // SAFETY: v, u, m have the lengths the contracts ask for.
                unsafe {
                    kernels::point_gemms(nm * nt, g.c, v.as_ptr(), ldc, u.as_ptr(), ldo, m.as_mut_ptr())
                };
                let ps = point_len(nm * nt, ldo);
                for (j, ym) in yb.chunks_mut(slots * yl).enumerate() {
                    // SAFETY: mosaic j's tiles in `m` as in `v`; `out` has
                    // slots * hw * ldo floats.
                    unsafe {
                        kernels::output_transform::<M>(
                            m.as_ptr().add(j * nt * ldo),
                            (plan.out.ty, plan.out.tx, ldo, ps),
                            &out_slots,
                            out.as_mut_ptr(),
                        )
                    };
                    for (yi, o) in ym.chunks_exact_mut(yl).zip(out.chunks_exact(hw * ldo)) {
                        to_planes(o, hw, ldo, bias, X::planes(yi));
                    }
                }
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
    if g.k == 3 {
        backward_with::<6, X>(g, x, w, dy, dw, db, dx)
    } else {
        backward_with::<4, X>(g, x, w, dy, dw, db, dx)
    }
}

/// [`backward`] with output tiles of `M x M` pixels (`g.k = T + 1 - M`).
fn backward_with<const M: usize, X: Act>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    dy: &[X],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    dx: Option<&mut [X::Out]>,
) {
    let plan = Plan::new(g, M);
    let k = g.k;
    let (ldc, ldo, hw) = (plan.x.ld, plan.dy.ld, g.out_hw());
    let (nt, ntx, slots) = (plan.out.count(), plan.dx.count(), plan.mosaic.slots());
    // The input gradient's filter: `w` flipped, input and output swapped.
    let udx = dx.is_some().then(|| filters(k, g.o, g.c, Taps::Flipped(w)));
    let need_db = db.is_some();
    let b = batch(M, nt);
    let (xl, yl) = (g.x_len(), g.y_len());
    let dx_slots = plan.mosaic.slots_of((g.h, g.w), plan.dx, M);
    // Per task (of whole mosaics): the weight gradient in the transformed
    // domain and db.
    let acc_len = TT * ldc * ldo;
    let per_task = per_backward_task(g.n, slots, M, acc_len);
    let partials = backward_tasks(g, per_task, dx, |first, imgs, mut dxt| {
        // Written in full by the first `point_dw` (see below).
        let mut acc: Vec<f32> = Vec::with_capacity(acc_len);
        let mut db_t = zeros(if need_db { g.o } else { 0 });
        let dx_len = |n| if dxt.is_some() { n } else { 0 };
        let lens = [
            plan.x.len(),
            plan.dy.len(),
            TT * point_len(b * nt, ldc),
            TT * point_len(b * nt, ldo),
            dx_len(TT * point_len(b * ntx, ldo)),
            dx_len(TT * point_len(b * ntx, ldc)),
            dx_len(slots * g.h * g.w * ldc),
        ];
        with_scratch(lens, 2, |[xt, dyt, v, d, vdy, mdx, outdx]| {
            let q = plan.dy.pad;
            let mut i0 = 0;
            while i0 < imgs {
                // Images i0..i0 + nb in nm mosaics, their tiles one after
                // the other in v, d (and vdy, mdx), mosaic j's from tile j *
                // nt (j * ntx).
                let nb = (b * slots).min(imgs - i0);
                let nm = nb.div_ceil(slots);
                let (vt, dt, dxt_grid) = (plan.out.batched(nm), plan.dwt.batched(nm), plan.dx.batched(nm));
                for j in 0..nm {
                    let imgs_j = first + i0 + j * slots..first + i0 + nb.min((j + 1) * slots);
                    plan.x.fill(imgs_j.clone().map(|i| X::pixels(&x[i * xl..(i + 1) * xl])), xt);
                    plan.dy.fill(imgs_j.clone().map(|i| X::pixels(&dy[i * yl..(i + 1) * yl])), dyt);
                    for i in imgs_j {
                        let dyi = X::pixels(&dy[i * yl..(i + 1) * yl]);
                        for (o, s) in db_t.iter_mut().enumerate() {
                            *s += pixels_sum(dyi.slice(o * hw..(o + 1) * hw));
                        }
                    }
                    // SAFETY: the patches of `plan.out` lie inside `xt` and
                    // the m x m tiles of `plan.dwt` from (q, q) inside `dyt`
                    // (Plan::new sizes both to their reach); v, d (and vdy)
                    // hold nm mosaics' tiles from the offsets (cut from the
                    // scratch above). AVX-512F: see `fits`.
                    unsafe {
                        kernels::input_transform::<M>(xt.as_ptr(), vt, v.as_mut_ptr().add(j * nt * ldc));
                        let dy0 = dyt.as_ptr().add((q * plan.dy.cols + q) * ldo);
                        kernels::dy_transform::<M>(dy0, dt, d.as_mut_ptr().add(j * nt * ldo));
                        if dxt.is_some() {
                            kernels::input_transform::<M>(
                                dyt.as_ptr(),
                                dxt_grid,
                                vdy.as_mut_ptr().add(j * ntx * ldo),
                            );
                        }
                    }
                }
                let fresh = acc.is_empty();
                // SAFETY: v, d have the contracts' lengths, `acc` the
                // capacity; the first call writes all of it, after which it
                // is initialized. The tiles are summed in mosaic order.
                unsafe {
                    kernels::point_dw(nm * nt, v.as_ptr(), ldc, d.as_ptr(), ldo, acc.as_mut_ptr(), fresh);
                    if fresh {
                        acc.set_len(acc_len);
                    }
                }
                if let (Some(dxt), Some(udx)) = (dxt.as_deref_mut(), udx.as_deref()) {
                    // SAFETY: vdy, udx, mdx have the contracts' lengths.
                    unsafe {
                        kernels::point_gemms(
                            nm * ntx,
                            g.o,
                            vdy.as_ptr(),
                            ldo,
                            udx.as_ptr(),
                            ldc,
                            mdx.as_mut_ptr(),
                        )
                    };
                    let ps = point_len(nm * ntx, ldc);
                    let dxb = &mut dxt[i0 * xl..(i0 + nb) * xl];
                    for (j, dxm) in dxb.chunks_mut(slots * xl).enumerate() {
                        // SAFETY: mosaic j's tiles in `mdx`; outdx has slots
                        // * h * w * ldc floats.
                        unsafe {
                            kernels::output_transform::<M>(
                                mdx.as_ptr().add(j * ntx * ldc),
                                (plan.dx.ty, plan.dx.tx, ldc, ps),
                                &dx_slots,
                                outdx.as_mut_ptr(),
                            )
                        };
                        for (dxi, o) in dxm.chunks_exact_mut(xl).zip(outdx.chunks_exact(g.h * g.w * ldc)) {
                            to_planes(o, g.h * g.w, ldc, None, X::planes(dxi));
                        }
                    }
                }
                i0 += nb;
            }
        });
        (acc, db_t)
    });
    let mut acc = zeros(TT * ldc * ldo);
    add_partials(&partials, &mut acc, db);
    finish_dw(g, &acc, ldc, ldo, dw);
}
