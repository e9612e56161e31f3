//! The GEMM path's im2col and col2im for stride 2 on AVX-512: every other
//! element of a padded row gathered into (or added back from) an im2col row
//! 16 at a time by one two-source permute, where the generic loop moves one
//! element a step. ResNets' downsampling convs (3x3 and 1x1, stride 2) have
//! rows of 14 and 7 outputs, and those element loops took more time than
//! their GEMMs. (Those convs now run on `avx512/strided.rs`; this path takes
//! the strided convs with fewer than 8 channels a side, such as a
//! 3-channel stem.) The same values land in the same places (col2im adds
//! each element once, in the generic loop's order), so results are bit for
//! bit.

use super::cpu::ConvGeom;
use std::arch::x86_64::*;

const LANES: usize = 16;

/// Whether this machine can take [`im2col`] and [`col2im_add`].
pub(super) fn usable() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// What both kernels check: `padded` holds `g.c` planes of `plane` floats,
/// in which every window of the conv lies (rows of pitch `wp`), and `col`
/// is `CKK x (Ho Wo)`.
fn check(g: &ConvGeom, plane: usize, wp: usize, padded: usize, col: usize) {
    assert!(g.stride == 2 && g.ho > 0 && g.wo > 0 && padded >= g.c * plane && col >= g.ckk() * g.out_hw());
    // The last element a window of the last output row and column reads.
    let last = (2 * (g.ho - 1) + g.k - 1) * wp + g.k - 1 + 2 * (g.wo - 1);
    assert!(last < plane && g.k - 1 + 2 * (g.wo - 1) < wp, "stride-2 rows outside the padded plane");
}

/// `col[(c, ki, kj)][oh * Wo + ow] = xp[c][(2 oh + ki) * wp + kj + 2 ow]`.
pub(super) fn im2col(g: &ConvGeom, xp: &[f32], plane: usize, wp: usize, col: &mut [f32]) {
    check(g, plane, wp, xp.len(), col.len());
    // SAFETY: `check` bounds every element read (inside its plane) and
    // written (inside `col`); AVX-512F by the caller's `usable`.
    unsafe { im2col_avx512(g, xp.as_ptr(), plane, wp, col.as_mut_ptr()) }
}

/// The adjoint of [`im2col`]: `acc[c][(2 oh + ki) * wp + kj + 2 ow] +=
/// col[(c, ki, kj)][oh * Wo + ow]`, row by row in im2col's order.
pub(super) fn col2im_add(g: &ConvGeom, col: &[f32], plane: usize, wp: usize, acc: &mut [f32]) {
    check(g, plane, wp, acc.len(), col.len());
    // SAFETY: as in `im2col`, with reads and writes swapped.
    unsafe { col2im_avx512(g, col.as_ptr(), plane, wp, acc.as_mut_ptr()) }
}

/// Lanes `0..n` set.
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n.min(LANES)) - 1) as __mmask16
}

/// `row(at, out)` for every row `(c, ki, kj, oh)` of the im2col matrix in
/// order: `at` where it starts in the padded planes, `out` in `col`.
#[inline(always)]
fn for_each_row(g: &ConvGeom, plane: usize, wp: usize, mut row: impl FnMut(usize, usize)) {
    let mut out = 0;
    for c in 0..g.c {
        for ki in 0..g.k {
            for kj in 0..g.k {
                for oh in 0..g.ho {
                    row(c * plane + (2 * oh + ki) * wp + kj, out);
                    out += g.wo;
                }
            }
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn im2col_avx512(g: &ConvGeom, xp: *const f32, plane: usize, wp: usize, col: *mut f32) {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for_each_row(g, plane, wp, |at, out| {
        for j in (0..g.wo).step_by(LANES) {
            let n = (g.wo - j).min(LANES);
            // Elements 2j .. 2(j + n - 1) of the row.
            let reach = 2 * n - 1;
            // SAFETY: inside the plane and `col` (the caller's contract).
            unsafe {
                let src = xp.add(at + 2 * j);
                let lo = _mm512_maskz_loadu_ps(lanes(reach), src);
                let hi = _mm512_maskz_loadu_ps(lanes(reach.saturating_sub(LANES)), src.add(LANES));
                _mm512_mask_storeu_ps(col.add(out + j), lanes(n), _mm512_permutex2var_ps(lo, even, hi));
            }
        }
    });
}

#[target_feature(enable = "avx512f")]
unsafe fn col2im_avx512(g: &ConvGeom, col: *const f32, plane: usize, wp: usize, acc: *mut f32) {
    // Element j of a 16-wide chunk goes to lane 2j of the 32 it spans:
    // `lo` takes chunk lanes 0..8, `hi` lanes 8..16 (index 16: a zero).
    let z = 16;
    let lo_idx = _mm512_setr_epi32(0, z, 1, z, 2, z, 3, z, 4, z, 5, z, 6, z, 7, z);
    let hi_idx = _mm512_setr_epi32(8, z, 9, z, 10, z, 11, z, 12, z, 13, z, 14, z, 15, z);
    let even = 0x5555;
    let zero = _mm512_setzero_ps();
    for_each_row(g, plane, wp, |at, src| {
        for j in (0..g.wo).step_by(LANES) {
            let n = (g.wo - j).min(LANES);
            // Only the even lanes are stored: the odd ones keep their bits
            // (adding +0 would turn -0 into +0).
            let reach = 2 * n - 1;
            let (m_lo, m_hi) = (lanes(reach) & even, lanes(reach.saturating_sub(LANES)) & even);
            // SAFETY: inside `col` and the plane (the caller's contract).
            unsafe {
                let v = _mm512_maskz_loadu_ps(lanes(n), col.add(src + j));
                let (p_lo, p_hi) = (acc.add(at + 2 * j), acc.add(at + 2 * j + LANES));
                let s_lo =
                    _mm512_add_ps(_mm512_maskz_loadu_ps(m_lo, p_lo), _mm512_permutex2var_ps(v, lo_idx, zero));
                let s_hi =
                    _mm512_add_ps(_mm512_maskz_loadu_ps(m_hi, p_hi), _mm512_permutex2var_ps(v, hi_idx, zero));
                _mm512_mask_storeu_ps(p_lo, m_lo, s_lo);
                _mm512_mask_storeu_ps(p_hi, m_hi, s_hi);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv2d::out_size;
    use crate::ops::testing::rand_vec_f32;

    /// Padded planes of a (c, h, w) image with padding p, stride 2, kernel k.
    fn geom(c: usize, h: usize, w: usize, k: usize, p: usize) -> (ConvGeom, usize, usize) {
        let (ho, wo) = (out_size(h, k, 2, p), out_size(w, k, 2, p));
        let g = ConvGeom { n: 1, c, h, w, o: 1, k, stride: 2, padding: p, ho, wo };
        let wp = w + 2 * p;
        (g, (h + 2 * p) * wp, wp)
    }

    /// Where each element of the im2col matrix comes from in the padded
    /// planes, in `col`'s order (the element loops' order).
    fn sources(g: &ConvGeom, plane: usize, wp: usize) -> impl Iterator<Item = usize> + '_ {
        let (k, ho, wo) = (g.k, g.ho, g.wo);
        (0..g.c * k * k * ho * wo).map(move |i| {
            let (row, ow) = (i / wo, i % wo);
            let (rck, oh) = (row / ho, row % ho);
            let (c, ki, kj) = (rck / (k * k), rck / k % k, rck % k);
            c * plane + (2 * oh + ki) * wp + kj + 2 * ow
        })
    }

    /// Both kernels against the element loops they replace, bit for bit:
    /// rows of 1 to 33 outputs (one to three 16-lane chunks), 1x1 to 4x4
    /// windows, with and without padding.
    #[test]
    fn stride2_rows_match_the_element_loops() {
        if !usable() {
            return;
        }
        let cases = [
            (3, 28, 28, 3, 1),
            (2, 14, 14, 1, 0),
            (2, 14, 13, 3, 1),
            (1, 3, 3, 3, 1),
            (2, 66, 9, 4, 2),
            (1, 40, 40, 3, 0),
        ];
        for (seed, &(c, h, w, k, p)) in cases.iter().enumerate() {
            let (g, plane, wp) = geom(c, h, w, k, p);
            let xp = rand_vec_f32(c * plane, seed as u64);
            let want: Vec<f32> = sources(&g, plane, wp).map(|i| xp[i]).collect();
            let mut got = vec![f32::NAN; want.len()];
            im2col(&g, &xp, plane, wp, &mut got);
            assert!(
                got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "im2col {:?}",
                (c, h, w, k, p)
            );

            // col2im adds onto what is there: start from values with -0 in
            // them, which the odd (untouched) lanes must keep.
            let col = rand_vec_f32(want.len(), 100 + seed as u64);
            let start: Vec<f32> = rand_vec_f32(c * plane, 200 + seed as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 5 == 0 { -0.0 } else { *v })
                .collect();
            let mut want = start.clone();
            for (i, v) in sources(&g, plane, wp).zip(&col) {
                want[i] += v;
            }
            let mut got = start;
            col2im_add(&g, &col, plane, wp, &mut got);
            assert!(
                got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "col2im {:?}",
                (c, h, w, k, p)
            );
        }
    }
}
