//! MaxPool2d CPU kernels (no padding, no dilation, floor mode), one (n, c)
//! plane at a time; planes are independent, so they split across cores.

use crate::ops::Elem;
use rayon::prelude::*;

/// Below this many input elements a single core beats rayon's fork/join.
const PAR_MIN_ELEMS: usize = 1 << 15;

/// Spatial geometry of one pooling call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub h: usize,
    pub w: usize,
    pub kernel: usize,
    pub stride: usize,
}

impl Geometry {
    /// Floor-mode output size; the caller guarantees `kernel <= h, w` and `stride > 0`.
    pub fn out_hw(&self) -> (usize, usize) {
        ((self.h - self.kernel) / self.stride + 1, (self.w - self.kernel) / self.stride + 1)
    }
}

/// PyTorch's CPU scan of one window: strictly greater wins (so the first of
/// equal maxima stays) and any NaN is taken (so the last NaN is chosen).
/// Branchy, so used only where a NaN makes the fast paths inexact.
fn scan_window<T: Elem>(x: &[T], w: usize, h0: usize, w0: usize, kernel: usize) -> (T, usize) {
    let mut best = (T::neg_infinity(), h0 * w + w0);
    for ky in 0..kernel {
        let row = (h0 + ky) * w + w0;
        for (kx, &v) in x[row..row + kernel].iter().enumerate() {
            if v > best.0 || v.is_nan() {
                best = (v, row + kx);
            }
        }
    }
    best
}

/// `a > b ? a : b`, the exact form x86 `maxss`/`maxps` implements, so it
/// compiles without a branch. Only meaningful for NaN-free inputs.
#[inline(always)]
fn max2<T: Elem>(a: T, b: T) -> T {
    if a > b {
        a
    } else {
        b
    }
}

/// One plane, any geometry. The max is found branch-free (on real
/// activations the comparison is a coin flip the branch predictor cannot
/// learn), then the first element equal to it is the PyTorch argmax.
/// `kernel` is passed as a literal by the dispatcher for small sizes, so after
/// inlining the window loops unroll.
#[inline(always)]
fn pool_plane<T: Elem>(x: &[T], g: Geometry, kernel: usize, y: &mut [T], idx: &mut [u32]) {
    let (oh, ow) = g.out_hw();
    let (w, s) = (g.w, g.stride);
    for oy in 0..oh {
        let h0 = oy * s;
        let (yrow, irow) = (&mut y[oy * ow..][..ow], &mut idx[oy * ow..][..ow]);
        for (ox, (yo, io)) in yrow.iter_mut().zip(irow.iter_mut()).enumerate() {
            let w0 = ox * s;
            let mut m = T::neg_infinity();
            let mut nan = false;
            for ky in 0..kernel {
                for &v in &x[(h0 + ky) * w + w0..][..kernel] {
                    nan |= v.is_nan();
                    m = max2(v, m);
                }
            }
            let (best, at) = if nan {
                scan_window(x, w, h0, w0, kernel)
            } else {
                let hit = (0..kernel * kernel)
                    .map(|k| (h0 + k / kernel) * w + w0 + k % kernel)
                    .find(|&i| x[i] == m)
                    .unwrap_or(h0 * w + w0); // all -inf: PyTorch keeps the first
                (x[hit], hit)
            };
            *yo = best;
            // Fits: the caller checks that h * w fits in u32.
            *io = at as u32;
        }
    }
}

/// The 2x2 stride-2 case (every MNIST pooling layer), written so the
/// compiler vectorizes a whole output row: NaN-free max, then the argmax
/// as integer selects taken in reverse scan order so the first maximum
/// wins. A row holding a NaN is redone with the exact scan. (The output
/// value can differ from PyTorch's only in the sign of a zero maximum.)
fn pool_plane_2x2<T: Elem>(x: &[T], w: usize, y: &mut [T], idx: &mut [u32]) {
    let ow = w / 2;
    if ow == 0 {
        return;
    }
    // Fits: the caller checks that h * w fits in u32.
    let w32 = w as u32;
    for (oy, (yrow, irow)) in y.chunks_exact_mut(ow).zip(idx.chunks_exact_mut(ow)).enumerate() {
        let top = 2 * oy * w;
        let (r0, r1) = (&x[top..top + 2 * ow], &x[top + w..top + w + 2 * ow]);
        let mut nan = false;
        let cells = r0.chunks_exact(2).zip(r1.chunks_exact(2));
        for (j, ((yo, io), (a, b))) in yrow.iter_mut().zip(irow.iter_mut()).zip(cells).enumerate() {
            let (a0, a1, b0, b1) = (a[0], a[1], b[0], b[1]);
            nan |= a0.is_nan() | a1.is_nan() | b0.is_nan() | b1.is_nan();
            let m = max2(max2(a0, a1), max2(b0, b1));
            let mut off = w32 + 1;
            off = if b0 == m { w32 } else { off };
            off = if a1 == m { 1 } else { off };
            off = if a0 == m { 0 } else { off };
            *yo = m;
            *io = (top + 2 * j) as u32 + off;
        }
        if nan {
            for (j, (yo, io)) in yrow.iter_mut().zip(irow.iter_mut()).enumerate() {
                let (v, at) = scan_window(x, w, 2 * oy, 2 * j, 2);
                *yo = v;
                *io = at as u32;
            }
        }
    }
}

fn pool_plane_dispatch<T: Elem>(x: &[T], g: Geometry, y: &mut [T], idx: &mut [u32]) {
    match g.kernel {
        2 if g.stride == 2 => pool_plane_2x2(x, g.w, y, idx),
        2 => pool_plane(x, g, 2, y, idx),
        3 => pool_plane(x, g, 3, y, idx),
        k => pool_plane(x, g, k, y, idx),
    }
}

/// `x` holds whole `h * w` planes; `y` and `idx` the matching `oh * ow` planes.
/// `idx` receives the flat argmax within each input plane (PyTorch's indices).
pub fn forward<T: Elem>(x: &[T], g: Geometry, y: &mut [T], idx: &mut [u32]) {
    let (oh, ow) = g.out_hw();
    let (ip, op) = (g.h * g.w, oh * ow);
    if ip == 0 || op == 0 {
        return;
    }
    debug_assert_eq!(x.len() / ip, y.len() / op);
    debug_assert_eq!(y.len(), idx.len());
    let run = |((xp, yp), ixp): ((&[T], &mut [T]), &mut [u32])| pool_plane_dispatch(xp, g, yp, ixp);
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks(ip).zip(y.par_chunks_mut(op)).zip(idx.par_chunks_mut(op)).for_each(run);
    } else {
        x.chunks(ip).zip(y.chunks_mut(op)).zip(idx.chunks_mut(op)).for_each(run);
    }
}

/// Scatters `dy` into `dx` (which must be zeroed) at the saved argmax
/// positions, adding where overlapping windows chose the same input.
/// Returns the first out-of-plane index found, if any (then `dx` is partial).
pub fn backward<T: Elem>(
    dy: &[T],
    idx: &[u32],
    in_plane: usize,
    out_plane: usize,
    dx: &mut [T],
) -> Result<(), u32> {
    if in_plane == 0 || out_plane == 0 {
        return Ok(());
    }
    debug_assert_eq!(dy.len(), idx.len());
    let run = |((gp, ip), dxp): ((&[T], &[u32]), &mut [T])| -> Result<(), u32> {
        for (&g, &i) in gp.iter().zip(ip) {
            match dxp.get_mut(i as usize) {
                Some(d) => *d = *d + g,
                None => return Err(i),
            }
        }
        Ok(())
    };
    if dx.len() >= PAR_MIN_ELEMS {
        dy.par_chunks(out_plane)
            .zip(idx.par_chunks(out_plane))
            .zip(dx.par_chunks_mut(in_plane))
            .try_for_each(run)
    } else {
        dy.chunks(out_plane).zip(idx.chunks(out_plane)).zip(dx.chunks_mut(in_plane)).try_for_each(run)
    }
}
