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

/// One plane. `kernel` is passed as a literal by the callers below for the
/// common sizes, so after inlining the window loops are fully unrolled.
#[inline(always)]
fn pool_plane<T: Elem>(x: &[T], g: Geometry, kernel: usize, y: &mut [T], idx: &mut [u32]) {
    let (oh, ow) = g.out_hw();
    let (w, s) = (g.w, g.stride);
    for oy in 0..oh {
        let h0 = oy * s;
        let (yrow, irow) = (&mut y[oy * ow..][..ow], &mut idx[oy * ow..][..ow]);
        for (ox, (yo, io)) in yrow.iter_mut().zip(irow.iter_mut()).enumerate() {
            let w0 = ox * s;
            // PyTorch's CPU rule: strictly greater wins (so the first of equal
            // maxima stays), and any NaN is taken (so NaN propagates).
            let mut best = T::neg_infinity();
            let mut best_i = h0 * w + w0;
            for ky in 0..kernel {
                let row = (h0 + ky) * w + w0;
                for kx in 0..kernel {
                    let v = x[row + kx];
                    if v > best || v.is_nan() {
                        best = v;
                        best_i = row + kx;
                    }
                }
            }
            *yo = best;
            // Fits: the caller checks that h * w fits in u32.
            *io = best_i as u32;
        }
    }
}

fn pool_plane_dispatch<T: Elem>(x: &[T], g: Geometry, y: &mut [T], idx: &mut [u32]) {
    match g.kernel {
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
