//! The weight-gradient kernels of [`super`]'s AVX-512 convolution: `O`
//! along the lanes over the valid output pixels ([`dw_blocks`]), or, for few
//! input channels, the output pixels along the lanes ([`PixelDw`]).

use super::{XLayout, LANES};
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::half_emu::{Load16, Pixels};
use half::f16;
use std::arch::x86_64::*;

/// `dst[p * ld + o] = src[o * cols + p]` for `o < rows`, `p < cols`: a
/// per-image `[O, pixels]` gradient turned pixel-major for [`dw_tile`], 16
/// channels per gather (an element-by-element scatter took 3% of a step).
pub(super) fn transpose_to(src: &[f32], rows: usize, cols: usize, dst: &mut [f32], ld: usize) {
    assert!(src.len() >= rows * cols && rows <= ld && dst.len() >= cols * ld);
    // SAFETY: the gather reads src[(o0 + l) * cols + p] for unmasked lanes
    // o0 + l < rows, p < cols; the store writes dst[p * ld + o0 + l], o0 + l
    // < rows <= ld: inside the slices by the assert. AVX-512F: see `usable`.
    unsafe { transpose_avx512(src.as_ptr(), rows, cols, dst.as_mut_ptr(), ld) }
}

#[target_feature(enable = "avx512f")]
unsafe fn transpose_avx512(src: *const f32, rows: usize, cols: usize, dst: *mut f32, ld: usize) {
    let stride = cols as i32;
    let step = _mm512_set1_epi32(LANES as i32 * stride);
    for p in 0..cols {
        let mut idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(stride),
        );
        let mut o0 = 0;
        while o0 < rows {
            let m = if rows - o0 >= LANES { u16::MAX } else { (1u16 << (rows - o0)) - 1 };
            let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, idx, src.add(p));
            _mm512_mask_storeu_ps(dst.add(p * ld + o0), m, v);
            idx = _mm512_add_epi32(idx, step);
            o0 += LANES;
        }
    }
}

/// `acc[r, :] += sum_pixels x[offs[r] + oh * pitch + ow] * dyt[oh * wo + ow, :]`
/// for `KR` rows `r` and `16 * OV` columns, over the `ho x wo` output
/// pixels (the wide layout's junk columns are skipped, 1/8 of conv2's work).
/// `acc` and `dyt` have row stride `ld`.
#[target_feature(enable = "avx512f")]
unsafe fn dw_tile<const KR: usize, const OV: usize>(
    (ho, wo, pitch): (usize, usize, usize),
    offs: &[usize; KR],
    x: *const f32,
    dyt: *const f32,
    ld: usize,
    acc_mem: *mut f32,
) {
    let mut acc = [[_mm512_setzero_ps(); OV]; KR];
    for (r, row) in acc.iter_mut().enumerate() {
        for (v, s) in row.iter_mut().enumerate() {
            *s = _mm512_loadu_ps(acc_mem.add(r * ld + v * LANES));
        }
    }
    for oh in 0..ho {
        for ow in 0..wo {
            let (j, jd) = (oh * pitch + ow, oh * wo + ow);
            let mut d = [_mm512_setzero_ps(); OV];
            for (v, s) in d.iter_mut().enumerate() {
                *s = _mm512_loadu_ps(dyt.add(jd * ld + v * LANES));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*x.add(offs[r] + j));
                for (s, dv) in row.iter_mut().zip(&d) {
                    *s = _mm512_fmadd_ps(xv, *dv, *s);
                }
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (v, s) in row.iter().enumerate() {
            _mm512_storeu_ps(acc_mem.add(r * ld + v * LANES), *s);
        }
    }
}

/// `dwt[CKKp, ld] += col * dyt` (see [`dw_tile`]): rows in blocks of `KR`,
/// columns in blocks of `OV` vectors. `offs` is padded to a multiple of `KR`.
pub(super) fn dw_blocks<const KR: usize, const OV: usize>(
    px @ (ho, wo, pitch): (usize, usize, usize),
    offs: &[usize],
    x: &[f32],
    dyt: &[f32],
    ld: usize,
    v0: usize,
    dwt: &mut [f32],
) {
    let ncol = (ho.max(1) - 1) * pitch + wo;
    assert!(offs.len().is_multiple_of(KR) && (v0 + OV) * LANES <= ld && dwt.len() >= offs.len() * ld);
    assert!(wo <= pitch && dyt.len() >= ho * wo * ld && offs.iter().all(|&o| o + ncol <= x.len()));
    for (blk, o) in offs.chunks_exact(KR).enumerate() {
        let o: &[usize; KR] = o.try_into().expect("chunks_exact gives KR offsets");
        // SAFETY: reads x[o[r] + oh * pitch + ow] (< o[r] + ncol) and
        // dyt[(oh * wo + ow) * ld + (v0 + v) * 16 + l], and read/writes
        // dwt[(blk * KR + r) * ld + (v0 + v) * 16 + l]: all inside the slices
        // by the asserts. AVX-512F: see `usable`.
        unsafe {
            let am = dwt.as_mut_ptr().add(blk * KR * ld + v0 * LANES);
            dw_tile::<KR, OV>(px, o, x.as_ptr(), dyt.as_ptr().add(v0 * LANES), ld, am);
        }
    }
}

/// Output channels and im2col rows per [`dw_pixel_tile`]: 20 accumulators,
/// fed by 4 + 5 loads per 20 FMAs.
pub(super) const PO: usize = 4;
const PR: usize = 5;

/// `acc[o, r, :] += sum_v dyw[o * ld + 16 v + l] * x[offs[r] + 16 v + l]`
/// lane-wise for `PO` outputs and `PR` rows, `v < nv`. `acc` holds
/// `PO * PR` vectors, output-major.
#[target_feature(enable = "avx512f")]
unsafe fn dw_pixel_tile(
    nv: usize,
    offs: &[usize; PR],
    x: *const f32,
    dyw: *const f32,
    ld: usize,
    acc_mem: *mut f32,
) {
    let mut acc = [[_mm512_setzero_ps(); PR]; PO];
    for v in 0..nv {
        let mut d = [_mm512_setzero_ps(); PO];
        for (o, s) in d.iter_mut().enumerate() {
            *s = _mm512_loadu_ps(dyw.add(o * ld + v * LANES));
        }
        for (r, &off) in offs.iter().enumerate() {
            let xv = _mm512_loadu_ps(x.add(off + v * LANES));
            for (row, dv) in acc.iter_mut().zip(&d) {
                row[r] = _mm512_fmadd_ps(*dv, xv, row[r]);
            }
        }
    }
    for (o, row) in acc.iter().enumerate() {
        for (r, s) in row.iter().enumerate() {
            let p = acc_mem.add((o * PR + r) * LANES);
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), *s));
        }
    }
}

/// The weight gradient with the output pixels along the vector lanes: for
/// few input channels (MNIST's conv1 has one), `O` along the lanes wastes
/// most of the row blocks and needs `dy` transposed, while here `dy` is read
/// in its own (wide) layout and each lane keeps a partial sum until
/// [`PixelDw::finish`] adds the 16 lanes.
pub(super) struct PixelDw {
    /// im2col row offsets, padded to a multiple of `PR` (extras read offset 0).
    offs: Vec<usize>,
    /// Output channels rounded up to `PO` (the extra `dy` rows are zero).
    om: usize,
    /// `[om / PO][rows / PR][PO][PR]` lane vectors.
    acc: Vec<f32>,
}

impl PixelDw {
    pub(super) fn new(g: &ConvGeom, xl: &XLayout) -> Self {
        let mut offs = xl.offs.clone();
        offs.resize(g.ckk().next_multiple_of(PR), 0);
        let om = g.o.next_multiple_of(PO);
        let acc = vec![0f32; om * offs.len() * LANES];
        PixelDw { offs, om, acc }
    }

    /// Adds one image: `x` is the padded image, `dyw` its `dy` as `om` rows
    /// of `ld` starting at `base`, in the wide column layout with zeros at
    /// the junk columns and up to `16 * nv`.
    pub(super) fn add(&mut self, nv: usize, x: &[f32], dyw: &[f32], base: usize, ld: usize) {
        assert!(ld >= nv * LANES && base + (self.om - 1) * ld + nv * LANES <= dyw.len());
        assert!(self.offs.iter().all(|&o| o + nv * LANES <= x.len()));
        let tile = PO * PR * LANES;
        let rb = self.offs.len() / PR;
        assert!(self.acc.len() >= (self.om / PO) * rb * tile);
        for ob in 0..self.om / PO {
            for (r, o) in self.offs.chunks_exact(PR).enumerate() {
                let o: &[usize; PR] = o.try_into().expect("chunks_exact gives PR offsets");
                // SAFETY: reads x[o[r] + 16 v + l] and dyw[base + (ob * PO + i)
                // * ld + 16 v + l] for v < nv, i < PO, and read/writes one
                // tile of acc: all inside the slices by the asserts.
                // AVX-512F: see `usable`.
                unsafe {
                    let d = dyw.as_ptr().add(base + ob * PO * ld);
                    let am = self.acc.as_mut_ptr().add((ob * rb + r) * tile);
                    dw_pixel_tile(nv, o, x.as_ptr(), d, ld, am);
                }
            }
        }
    }

    /// The lane sums as `dW[O, CKK]`.
    pub(super) fn finish(&self, g: &ConvGeom) -> Vec<f32> {
        let (ckk, rb) = (g.ckk(), self.offs.len() / PR);
        let mut out = vec![0f32; g.o * ckk];
        for (o, row) in out.chunks_exact_mut(ckk).enumerate() {
            for (r, v) in row.iter_mut().enumerate() {
                let at = (((o / PO) * rb + r / PR) * PO * PR + (o % PO) * PR + r % PR) * LANES;
                *v = lane_sum(&self.acc[at..at + LANES]);
            }
        }
        out
    }
}

/// `v.iter().sum()` in 16 interleaved partial sums (vectorizable).
pub(super) fn lane_sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += *x;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// [`lane_sum`] of `v`, f16 widened in the loads (the same sums, bit for
/// bit: lane `l` of the vector sum is `acc[l]`).
pub(super) fn pixels_sum(v: Pixels<'_>) -> f32 {
    match v {
        Pixels::F32(v) => lane_sum(v),
        // SAFETY: reads `h.len()` f16; AVX-512F/BW/VL: see `super::usable`.
        Pixels::F16(h) => unsafe { f16_lane_sum(h.as_ptr(), h.len()) },
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn f16_lane_sum(p: *const f16, n: usize) -> f32 {
    let whole = n - n % LANES;
    let mut acc = _mm512_setzero_ps();
    for i in (0..whole).step_by(LANES) {
        acc = _mm512_add_ps(acc, f16::load16(p.add(i), !0));
    }
    let (mut lanes, mut rest) = ([0f32; LANES], [0f32; LANES]);
    _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
    let tail = ((1u32 << (n - whole)) - 1) as __mmask16;
    _mm512_storeu_ps(rest.as_mut_ptr(), f16::load16(p.add(whole), tail));
    let tail: f32 = rest[..n - whole].iter().sum();
    lanes.iter().sum::<f32>() + tail
}

/// Whether the weight gradient goes through [`PixelDw`] rather than
/// [`dw_blocks`]: when padding `O` to whole vectors and `CKK` to the row
/// block would make a third or more of `dw_blocks`' FMAs wasted work. MNIST's
/// conv1 (25 rows padded to 48) takes 1.0 ms instead of 3.1 per 100 images;
/// for conv2 (400 rows, O = 32) `dw_blocks` is faster (measured).
pub(super) fn pixel_dw(g: &ConvGeom) -> bool {
    let ldo = g.o.next_multiple_of(LANES);
    let kr = if ldo == LANES { 24 } else { 12 };
    2 * g.ckk().next_multiple_of(kr) * ldo >= 3 * g.ckk() * g.o
}
