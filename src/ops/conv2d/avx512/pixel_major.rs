//! NCHW planes to the pixel-major images the AVX-512 convolutions read
//! (`[rows][cols][ld]`, channels along the lanes): the whole image, padded,
//! or only every other pixel of every other row (a 1x1 stride-2 conv's).
//! Both transpose 16 channels by 16 pixels in registers, f16 widened as it
//! is loaded, and fetch the next image's planes ahead: they read 16 to 64
//! planes at once, more streams than the hardware prefetcher follows.

use crate::ops::conv2d::avx512_direct::transpose16;
use crate::ops::half_emu::{Load16, Pixels};
use std::arch::x86_64::*;

const LANES: usize = 16;

/// [`to_pixel_major`] of `src` into `buf` from float `start`, checked: the
/// pixels land at `(pad, pad)` of a pixel-major image of `cols` pixels a
/// row, `ld` floats a pixel (lanes past `ch` zero); the rest of `buf` stays.
pub(super) fn fill_pixel_major(
    src: Pixels<'_>,
    (ch, h, w): (usize, usize, usize),
    buf: &mut [f32],
    start: usize,
    (pad, cols, ld): (usize, usize, usize),
) {
    assert!(src.len() >= ch * h * w && ch <= ld && ld.is_multiple_of(LANES) && pad + w <= cols);
    let end = start + ((pad + h.max(1) - 1) * cols + pad + w) * ld;
    assert!(end <= buf.len(), "pixel-major image past its buffer");
    // SAFETY: the asserts are `to_pixel_major`'s contract from `start`.
    // AVX-512F/BW/VL: the callers run only where `avx512::usable` found them.
    unsafe {
        let dst = buf.as_mut_ptr().add(start);
        match src {
            Pixels::F32(s) => to_pixel_major(s.as_ptr(), (ch, h, w), dst, (pad, cols, ld)),
            Pixels::F16(s) => to_pixel_major(s.as_ptr(), (ch, h, w), dst, (pad, cols, ld)),
        }
    }
}

/// `dst[((pad + y) * cols + pad + x) * ld + c] = src[(c * h + y) * w + x]`
/// for `c < ch`, and zero for `ch <= c < ld`: planes to pixel-major, in
/// 16 x 16 blocks transposed in registers (a gather per pixel took a tenth
/// of a training step); f16 sources are widened as they are loaded.
///
/// # Safety
/// `src` has `ch * h * w` elements; `dst` holds the pixels up to
/// `(pad + h - 1) * cols + pad + w - 1` (`ld` floats each); `ch <= ld`,
/// `ld` a multiple of 16; AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn to_pixel_major<S: Load16>(
    src: *const S,
    (ch, h, w): (usize, usize, usize),
    dst: *mut f32,
    (pad, cols, ld): (usize, usize, usize),
) {
    let hw = h * w;
    // The next image's planes follow these: fetch them into the cache a
    // slice per pixel block, so the next call's loads find them there. The
    // loads read 16 to 64 planes at once, a stride of a plane apart, more
    // streams than the hardware prefetcher follows: they waited on memory
    // for two thirds of this function's time, and ResNet-20 O2 trains 5-9%
    // faster with the hint (the activations come from the step's earlier
    // layers, out of L2 by now).
    let next = src.wrapping_add(ch * hw).cast::<u8>();
    let bytes = ch * hw * std::mem::size_of::<S>();
    let per_block = bytes.div_ceil(hw.div_ceil(LANES)).next_multiple_of(64);
    // The pixel the next block starts at, stepped along instead of divided
    // out: a division per pixel stored (for every 16 channels) took a third
    // of this function's time.
    let (mut y, mut x) = (0, 0);
    for p0 in (0..hw).step_by(LANES) {
        let np = (hw - p0).min(LANES);
        let mask = ((1u32 << np) - 1) as u16;
        // Where each pixel of the block lands, in floats from `dst`.
        let mut at = [0usize; LANES];
        for a in at.iter_mut().take(np) {
            *a = ((pad + y) * cols + pad + x) * ld;
            x += 1;
            if x == w {
                (y, x) = (y + 1, 0);
            }
        }
        let from = p0 / LANES * per_block;
        for at in (from..(from + per_block).min(bytes)).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(at).cast());
        }
        for c0 in (0..ld).step_by(LANES) {
            // Fixed counts keep `m` in registers (see `to_planes`): channels
            // past `ch` load nothing (zeros) from a channel that exists.
            let nc = ch.saturating_sub(c0);
            let mut m: [__m512; LANES] = std::array::from_fn(|i| {
                let k = if i < nc { mask } else { 0 };
                S::load16(src.add((c0 + i.min(ch.max(1) - 1)) * hw + p0), k)
            });
            transpose16(&mut m);
            for (v, &a) in m.iter().zip(&at).take(np) {
                _mm512_storeu_ps(dst.add(a + c0), *v);
            }
        }
    }
}

/// `buf[(y * ceil(w / 2) + x) * ld + c] = src[(c * h + 2 y) * w + 2 x]`
/// for `c < ch` (zero for `ch <= c < ld`): the pixels of even rows and
/// columns, pixel-major.
pub(super) fn fill_every_other(
    src: Pixels<'_>,
    (ch, h, w): (usize, usize, usize),
    buf: &mut [f32],
    ld: usize,
) {
    assert!(src.len() >= ch * h * w && ch <= ld && ld.is_multiple_of(LANES));
    assert!(h.div_ceil(2) * w.div_ceil(2) * ld <= buf.len(), "pixel-major image past its buffer");
    // SAFETY: the asserts are `every_other`'s contract. AVX-512F/BW/VL:
    // the callers run only where `avx512::usable` found them.
    unsafe {
        match src {
            Pixels::F32(s) => every_other(s.as_ptr(), (ch, h, w), buf.as_mut_ptr(), ld),
            Pixels::F16(s) => every_other(s.as_ptr(), (ch, h, w), buf.as_mut_ptr(), ld),
        }
    }
}

/// [`fill_every_other`] once checked: for each output row, 16 pixels of a
/// row at a time, loaded as 32 source values (f16 widened) and their even
/// lanes picked, then 16 channels by 16 pixels transposed in registers.
///
/// # Safety
/// `src` has `ch * h * w` elements, `dst` `ceil(h / 2) * ceil(w / 2) * ld`
/// floats; `ch <= ld`, `ld` a multiple of 16; AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn every_other<S: Load16>(src: *const S, (ch, h, w): (usize, usize, usize), dst: *mut f32, ld: usize) {
    let (hw, ho, wo) = (h * w, h.div_ceil(2), w.div_ceil(2));
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let mask = |n: usize| ((1u32 << n.min(LANES)) - 1) as u16;
    // The next image's planes follow these: fetched into the cache a slice
    // per output row, as `to_pixel_major` does (and for its reason: more
    // planes at once than the hardware prefetcher follows).
    let next = src.wrapping_add(ch * hw).cast::<u8>();
    let bytes = ch * hw * std::mem::size_of::<S>();
    let per_row = bytes.div_ceil(ho.max(1)).next_multiple_of(64);
    for y in 0..ho {
        for at in (y * per_row..((y + 1) * per_row).min(bytes)).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(at).cast());
        }
        for x0 in (0..wo).step_by(LANES) {
            let nx = (wo - x0).min(LANES);
            // Source values 2 x0 ..= 2 (x0 + nx - 1) of row 2 y.
            let span = 2 * nx - 1;
            let (lo, hi) = (mask(span), mask(span.saturating_sub(LANES)));
            for c0 in (0..ld).step_by(LANES) {
                // Channels past `ch` load nothing (zeros) from one that exists.
                let nc = ch.saturating_sub(c0);
                let mut m: [__m512; LANES] = std::array::from_fn(|i| {
                    let (ml, mh) = if i < nc { (lo, hi) } else { (0, 0) };
                    let p = src.add((c0 + i.min(ch.max(1) - 1)) * hw + 2 * (y * w + x0));
                    _mm512_permutex2var_ps(S::load16(p, ml), even, S::load16(p.wrapping_add(LANES), mh))
                });
                transpose16(&mut m);
                for (i, v) in m.iter().enumerate().take(nx) {
                    _mm512_storeu_ps(dst.add((y * wo + x0 + i) * ld + c0), *v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::half_emu::avx512_usable;
    use half::f16;

    /// The every-other-pixel copy equals the whole image's copy at the
    /// even rows and columns, bit for bit (zeros of both signs, infinities,
    /// NaN, subnormals, f16 widened), over odd and even sides, rows of
    /// several 16-pixel blocks and channel counts off the lanes.
    #[test]
    fn every_other_pixel_is_the_whole_copy_subsampled() {
        if !avx512_usable() {
            eprintln!("no AVX-512 on this CPU: kernel not checked");
            return;
        }
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-41, -3.5, 65504.0];
        for (ch, h, w) in [(16usize, 28usize, 28usize), (9, 15, 13), (20, 5, 70), (33, 1, 1), (1, 4, 33)] {
            let ld = ch.next_multiple_of(LANES);
            let vals: Vec<f32> = (0..ch * h * w)
                .map(
                    |i| if i % 7 == 3 { specials[i % specials.len()] } else { (i as f32 * 0.37).sin() * 1e3 },
                )
                .collect();
            let halves: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
            for src in [Pixels::F32(&vals), Pixels::F16(&halves)] {
                let mut whole = vec![f32::NAN; h * w * ld];
                fill_pixel_major(src, (ch, h, w), &mut whole, 0, (0, w, ld));
                let (ho, wo) = (h.div_ceil(2), w.div_ceil(2));
                let mut sub = vec![f32::NAN; ho * wo * ld];
                fill_every_other(src, (ch, h, w), &mut sub, ld);
                for y in 0..ho {
                    for x in 0..wo {
                        for c in 0..ld {
                            let (a, b) = (sub[(y * wo + x) * ld + c], whole[(2 * y * w + 2 * x) * ld + c]);
                            assert_eq!(a.to_bits(), b.to_bits(), "{ch}x{h}x{w} pixel ({y}, {x}) lane {c}");
                        }
                    }
                }
            }
        }
    }
}
