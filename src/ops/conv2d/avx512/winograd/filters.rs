//! The filter side of the Winograd convolutions, in f64: the transformed
//! filters `G w G^T` before a call's products, and the weight gradient out
//! of the transformed domain after them. Every sum starts from its first
//! term and adds the others in order (zero coefficients included), and each
//! value is rounded to f32 once, so the bits do not depend on how the sums
//! are cut across lanes. The output channel runs along the lanes, eight to
//! a vector, with each vector's intermediates in registers: the generic row
//! loops these replace (kept in the tests as the reference) took a tenth
//! of a 64-channel conv's forward.

use super::kernels::{self, INV_F, LANES, T, TT};
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::lines::Lines;
use rayon::prelude::*;
use std::arch::x86_64::*;

/// f64 lanes of a vector.
const V: usize = 8;

/// Where [`filters`] finds filter `(o, i)`'s `k x k` taps in conv weights
/// `[O][C][k][k]`.
#[derive(Clone, Copy)]
pub(super) enum Taps<'a> {
    /// The forward's: output channel `o` of the weights, input `i`.
    Forward(&'a [f32]),
    /// The input gradient's: the weights' output channel `i`, input `o`,
    /// the taps in reverse order (the filter flipped).
    Flipped(&'a [f32]),
}

/// The transformed filters `u[p][i][ld]` (`ld` = `nout` rounded up to
/// lanes) of `taps`, `G w G^T` for a `k x k` kernel (3 or 5), one input
/// channel per rayon job (the rest of the pool would otherwise wait).
pub(super) fn filters(k: usize, nin: usize, nout: usize, taps: Taps<'_>) -> Lines {
    debug_assert!(k == 3 || k == 5, "Winograd takes 3x3 and 5x5 kernels, not {k}x{k}");
    let (kk, ld) = (k * k, nout.next_multiple_of(LANES));
    let gt: Vec<f64> = (0..T * k).map(|x| kernels::g(k, x / k, x % k)).collect();
    let job = |dst: &Dst, i: usize| {
        // w[t][o]: filter (o, i)'s taps, each output channel's together in
        // the weights.
        let mut w = vec![0f64; kk * nout];
        for o in 0..nout {
            let (src, flip) = match taps {
                Taps::Forward(src) => (&src[(o * nin + i) * kk..][..kk], false),
                Taps::Flipped(src) => (&src[(i * nout + o) * kk..][..kk], true),
            };
            for (t, v) in src.iter().enumerate() {
                w[if flip { kk - 1 - t } else { t } * nout + o] = *v as f64;
            }
        }
        // SAFETY: `fits` callers run only where `avx512::usable` found
        // AVX-512F and VL; `w` and `gt` have the lengths asked for. Job i
        // writes only u[p][i][..ld] (row p * nin + i of `ld` floats, its
        // padding lanes zeroed), inside `u` and apart from every other job's.
        unsafe {
            let row0 = dst.0.add(i * ld);
            if k == 3 {
                filter_block::<3>(nout, &w, &gt, row0, nin * ld)
            } else {
                filter_block::<5>(nout, &w, &gt, row0, nin * ld)
            }
            for p in 0..TT {
                row0.add(p * nin * ld + nout).write_bytes(0, ld - nout);
            }
        }
    };
    // SAFETY: the jobs write every row of every point (see `job`), a serial
    // zero-fill of 1 MB (64 x 64 channels) left the other core idle.
    unsafe {
        Lines::written_by(TT * nin * ld, |u| {
            let dst = Dst(u);
            (0..nin).into_par_iter().for_each(|i| job(&dst, i));
        })
    }
}

/// `u`'s floats, written by [`filters`]' jobs, each its own rows.
struct Dst(*mut f32);
// SAFETY: the jobs that share it write disjoint rows (see `filters`).
unsafe impl Sync for Dst {}

/// `dw[o][c] += A^T (diag(f) acc[.][c][o] diag(f)) A`: the weight gradient
/// out of the transformed domain (`f` = [`INV_F`], the filter transform's
/// fractions), input channels in parallel.
pub(super) fn finish_dw(g: &ConvGeom, acc: &[f32], ldc: usize, ldo: usize, dw: &mut [f32]) {
    let (k, no) = (g.k, g.o);
    let kk = k * k;
    debug_assert!(k == 3 || k == 5, "Winograd takes 3x3 and 5x5 kernels, not {k}x{k}");
    assert!(acc.len() >= TT * ldc * ldo && g.c <= ldc && no <= ldo, "finish_dw: accumulators too short");
    let att: Vec<f64> = (0..k * T).map(|x| kernels::at(k, x / T, x % T)).collect();
    let blocks: Vec<Vec<f32>> = (0..g.c)
        .into_par_iter()
        .map(|c| {
            let src = acc[c * ldo..].as_ptr();
            // SAFETY: AVX-512F and VL as in `filters`; channel c's sums lie
            // at src + p * ldc * ldo + o for p < TT, o < no, inside `acc`
            // (asserted above).
            unsafe {
                if k == 3 {
                    dw_block::<3>(no, src, ldc * ldo, &att)
                } else {
                    dw_block::<5>(no, src, ldc * ldo, &att)
                }
            }
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

/// The mask of the lanes of output channels `o0..` below `n`.
fn lanes(n: usize, o0: usize) -> __mmask8 {
    if n - o0 >= V {
        0xff
    } else {
        ((1u32 << (n - o0)) - 1) as __mmask8
    }
}

/// `sum_j c[j] * x[j]`, from the first term, in order.
#[inline(always)]
unsafe fn dot<const N: usize>(c: &[f64], x: &[__m512d; N]) -> __m512d {
    let mut s = _mm512_mul_pd(_mm512_set1_pd(c[0]), x[0]);
    for j in 1..N {
        s = _mm512_add_pd(s, _mm512_mul_pd(_mm512_set1_pd(c[j]), x[j]));
    }
    s
}

/// One input channel's transformed filters `out[p * ps + o]` from its taps
/// `w[ki][kj][o]`: `(G w)[a][kj]` for every output channel first (into
/// `gw`, 24 or 40 rows of `nout`), then `G w G^T` a point at a time, each
/// point's row stored whole: one vector of channels at a time through all
/// 64 points wrote 64 rows 16 KB apart (at 64 x 64 channels) per vector and
/// took four times as long. Rounded once.
///
/// # Safety
/// AVX-512F and VL; `w` has `K * K * nout` values, `gt` `T * K`; `out` is
/// valid for writes of `nout` floats at each `p * ps`, `p < TT`.
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn filter_block<const K: usize>(nout: usize, w: &[f64], gt: &[f64], out: *mut f32, ps: usize) {
    let ld = nout.next_multiple_of(V);
    let mut gw = vec![0f64; T * K * ld];
    for o0 in (0..nout).step_by(V) {
        let m = lanes(nout, o0);
        // wt[kj][ki]: column kj of the filter.
        let wt: [[__m512d; K]; K] = std::array::from_fn(|kj| {
            std::array::from_fn(|ki| _mm512_maskz_loadu_pd(m, w.as_ptr().add((ki * K + kj) * nout + o0)))
        });
        for a in 0..T {
            for (kj, col) in wt.iter().enumerate() {
                _mm512_storeu_pd(gw.as_mut_ptr().add((a * K + kj) * ld + o0), dot(&gt[a * K..], col));
            }
        }
    }
    for p in 0..TT {
        let (a, c) = (p / T, &gt[p % T * K..]);
        for o0 in (0..nout).step_by(V) {
            let row: [__m512d; K] =
                std::array::from_fn(|kj| _mm512_loadu_pd(gw.as_ptr().add((a * K + kj) * ld + o0)));
            _mm256_mask_storeu_ps(out.add(p * ps + o0), lanes(nout, o0), _mm512_cvtpd_ps(dot(c, &row)));
        }
    }
}

/// One input channel's weight gradient `out[ki * K + kj][o]` from its
/// transformed-domain sums at `src + p * ps + o` (see [`finish_dw`]).
///
/// # Safety
/// AVX-512F and VL; `src` holds `(TT - 1) * ps + no` floats; `att` `K * T`.
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn dw_block<const K: usize>(no: usize, src: *const f32, ps: usize, att: &[f64]) -> Vec<f32> {
    let mut out = vec![0f32; K * K * no];
    for o0 in (0..no).step_by(V) {
        let m = lanes(no, o0);
        // r[ki][b] = (A^T s)[ki][b] for s[a][b] = acc[a][b] f_a f_b.
        let mut r = [[_mm512_setzero_pd(); T]; K];
        for b in 0..T {
            let s: [__m512d; T] = std::array::from_fn(|a| {
                let x = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, src.add((a * T + b) * ps + o0)));
                _mm512_mul_pd(_mm512_mul_pd(x, _mm512_set1_pd(INV_F[a])), _mm512_set1_pd(INV_F[b]))
            });
            for (ki, rk) in r.iter_mut().enumerate() {
                rk[b] = dot(&att[ki * T..], &s);
            }
        }
        for t in 0..K * K {
            let s = dot(&att[t % K * T..], &r[t / K]);
            _mm256_mask_storeu_ps(out.as_mut_ptr().add(t * no + o0), m, _mm512_cvtpd_ps(s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dst = sum_k c_k * src_k`, the terms added in order from the first:
    /// the row loops the vector kernels replaced.
    fn mul_add_rows<'a>(dst: &mut [f64], terms: impl Iterator<Item = (f64, &'a [f64])>) {
        for (j, (c, src)) in terms.enumerate() {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = if j == 0 { c * s } else { *d + c * s };
            }
        }
    }

    /// [`filters`] as the row loops computed it, `u[p][i][o]` unpadded.
    fn filters_rows(k: usize, nin: usize, nout: usize, w: &[f32]) -> Vec<f32> {
        let mut u = vec![0f32; TT * nin * nout];
        for i in 0..nin {
            let tap =
                |t: usize| -> Vec<f64> { (0..nout).map(|o| w[(o * nin + i) * k * k + t] as f64).collect() };
            let taps: Vec<Vec<f64>> = (0..k * k).map(tap).collect();
            let mut gw = vec![vec![0f64; nout]; T * k];
            for (t, dst) in gw.iter_mut().enumerate() {
                let (a, kj) = (t / k, t % k);
                mul_add_rows(dst, (0..k).map(|ki| (kernels::g(k, a, ki), &taps[ki * k + kj][..])));
            }
            for p in 0..TT {
                let mut row = vec![0f64; nout];
                mul_add_rows(&mut row, (0..k).map(|kj| (kernels::g(k, p % T, kj), &gw[p / T * k + kj][..])));
                for (o, v) in row.iter().enumerate() {
                    u[(p * nin + i) * nout + o] = *v as f32;
                }
            }
        }
        u
    }

    /// [`finish_dw`] as the row loops computed it.
    fn finish_dw_rows(g: &ConvGeom, acc: &[f32], ldc: usize, ldo: usize) -> Vec<f32> {
        let (k, no) = (g.k, g.o);
        let mut dw = vec![0f32; no * g.c * k * k];
        for c in 0..g.c {
            let sv: Vec<Vec<f64>> = (0..TT)
                .map(|p| {
                    let (fa, fb) = (INV_F[p / T], INV_F[p % T]);
                    (0..no).map(|o| acc[(p * ldc + c) * ldo + o] as f64 * fa * fb).collect()
                })
                .collect();
            let mut r = vec![vec![0f64; no]; k * T];
            for (t, dst) in r.iter_mut().enumerate() {
                let (ki, b) = (t / T, t % T);
                mul_add_rows(dst, (0..T).map(|a| (kernels::at(k, ki, a), &sv[a * T + b][..])));
            }
            for t in 0..k * k {
                let mut row = vec![0f64; no];
                mul_add_rows(&mut row, (0..T).map(|b| (kernels::at(k, t % k, b), &r[t / k * T + b][..])));
                for (o, v) in row.iter().enumerate() {
                    dw[o * g.c * k * k + c * k * k + t] += *v as f32;
                }
            }
        }
        dw
    }

    /// Values over many magnitudes, with zeros of both signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let r = crate::ops::testing::rand_vec_f32(n, seed);
        let scale = [1e-30, 1e-3, 1.0, 7.5, 1e4, 1e30];
        let zero = |i: usize| if i.is_multiple_of(2) { 0.0 } else { -0.0 };
        r.iter()
            .enumerate()
            .map(|(i, v)| if i % 13 == 5 { zero(i) } else { v * scale[i % scale.len()] })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The vector kernels give the row loops' bits: 3x3 and 5x5, channel
    /// counts on and off the 8 lanes (a partial last vector, fewer than 8).
    #[test]
    fn vector_transforms_equal_the_row_loops_bit_for_bit() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl")) {
            return;
        }
        for (k, nin, nout) in [(3, 16, 16), (3, 5, 64), (3, 9, 21), (5, 3, 7), (5, 16, 32)] {
            let w = values(nout * nin * k * k, 7);
            let ld = nout.next_multiple_of(LANES);
            let u = filters(k, nin, nout, Taps::Forward(&w));
            let got: Vec<f32> = (0..TT * nin).flat_map(|r| u[r * ld..][..nout].to_vec()).collect();
            assert_eq!(bits(&got), bits(&filters_rows(k, nin, nout, &w)), "filters, k {k}, {nin} -> {nout}");
            assert!(u[..].chunks_exact(ld).all(|r| r[nout..].iter().all(|x| x.to_bits() == 0)), "padding");
            // The weights of a conv nout -> nin, flipped and transposed, are
            // the filters `w_dx[o][i] = flip(w[i][o])`.
            let mut w_dx = vec![0f32; w.len()];
            for (i, o, t) in
                (0..nin).flat_map(|i| (0..nout).flat_map(move |o| (0..k * k).map(move |t| (i, o, t))))
            {
                w_dx[(o * nin + i) * k * k + t] = w[(i * nout + o) * k * k + k * k - 1 - t];
            }
            let u = filters(k, nin, nout, Taps::Flipped(&w));
            let got: Vec<f32> = (0..TT * nin).flat_map(|r| u[r * ld..][..nout].to_vec()).collect();
            assert_eq!(
                bits(&got),
                bits(&filters_rows(k, nin, nout, &w_dx)),
                "flipped, k {k}, {nin} -> {nout}"
            );

            let (ldc, ldo) = (nin.next_multiple_of(LANES), ld);
            let g = ConvGeom { n: 1, c: nin, h: 8, w: 8, o: nout, k, stride: 1, padding: 1, ho: 8, wo: 8 };
            let acc = values(TT * ldc * ldo, 11);
            let mut dw = vec![0f32; nout * nin * k * k];
            finish_dw(&g, &acc, ldc, ldo, &mut dw);
            assert_eq!(
                bits(&dw),
                bits(&finish_dw_rows(&g, &acc, ldc, ldo)),
                "finish_dw, k {k}, {nin} -> {nout}"
            );
        }
    }
}
