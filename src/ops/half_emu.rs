//! f16 on the CPU, per the numerics contract: f16 operands are widened to f32
//! (exactly), the f32 kernel runs, and results are rounded to f16 on store
//! (round-to-nearest-even), so overflow to inf, underflow and rounding happen
//! where they will on the GPU. Gradients that accumulate into an f16 tensor
//! are accumulated in f32 and rounded once.
//!
//! The hot kernels (conv2d, BatchNorm with f32 parameters, ReLU, add,
//! max-pool) do not widen or round whole tensors: on AVX-512 they convert
//! 16 lanes at a time in their loads and stores (`Load16`, `Store16`),
//! elsewhere they widen an image, a plane or a block at a time into scratch
//! that stays in cache, run the f32 kernel on it and round what they store
//! (F16C conversions). Either gives the same bits as the whole-tensor passes
//! the other ops still use.

use std::borrow::Cow;
use std::mem::MaybeUninit;

use half::{f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

use crate::error::Result;
use crate::tensor::{par_map, DType, Tensor};

/// Whether any operand is f16 (then the op takes its f16 arm).
pub(crate) fn any_f16<'a>(ts: impl IntoIterator<Item = Option<&'a Tensor>>) -> bool {
    ts.into_iter().flatten().any(|t| t.dtype() == DType::F16)
}

/// `t` itself when f32, else an exact f32 copy.
pub(crate) fn f32_of(t: &Tensor) -> Cow<'_, Tensor> {
    match t.dtype() {
        DType::F32 => Cow::Borrowed(t),
        DType::F16 => Cow::Owned(t.to_dtype(DType::F32)),
    }
}

/// An f32 working copy of an accumulation target (e.g. a `.grad`).
pub(crate) fn f32_acc(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F32)
}

/// Stores the f32 working copy back into `target`, rounding once for f16.
pub(crate) fn store(target: &mut Tensor, acc: &Tensor) -> Result<()> {
    target.copy_from_f32(acc.as_f32()?)
}

/// Runs `f` on a weight's and a bias's gradients as f32: the targets
/// themselves when neither is f16, else f32 working copies ([`f32_acc`])
/// stored back with one rounding each ([`store`]).
pub(crate) fn grads_in_f32<R>(
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
    f: impl FnOnce(&mut Tensor, Option<&mut Tensor>) -> Result<R>,
) -> Result<R> {
    if !any_f16([Some(&*dweight), dbias.as_deref()]) {
        return f(dweight, dbias);
    }
    let mut dw = f32_acc(dweight);
    let mut db = dbias.as_deref().map(f32_acc);
    let r = f(&mut dw, db.as_mut())?;
    store(dweight, &dw)?;
    if let (Some(target), Some(acc)) = (dbias, db) {
        store(target, &acc)?;
    }
    Ok(r)
}

/// Exact f16 -> f32 of `src` into `dst` (same length), by the CPU's
/// conversion instruction (F16C) where it has one: the same conversion as
/// [`Tensor::to_dtype`], so a kernel that widens block by block sees the
/// values a whole-tensor widening would give.
pub(crate) fn widen_into(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen_into: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if x86::usable() {
        // SAFETY: both slices hold `src.len()` elements; AVX-512F/BW/VL
        // were just checked.
        return unsafe { x86::widen(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
    }
    src.convert_to_f32_slice(dst);
}

/// f32 -> f16 of `src` into `dst`, rounded to nearest-even as
/// [`Tensor::copy_from_f32`] rounds.
pub(crate) fn round_into(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "round_into: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if x86::usable() {
        // SAFETY: both slices hold `src.len()` elements; AVX-512F/BW/VL
        // were just checked.
        return unsafe { x86::round(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
    }
    dst.convert_from_f32_slice(src);
}

/// Rounds every value of `v` to f16 and widens it back, in place: what a
/// cast to f16 and back gives, without the f16 copy. On both cores when `v`
/// is large (each element is independent).
pub(crate) fn round_trip(v: &mut [f32]) {
    const CHUNK: usize = 1 << 14;
    if v.len() >= 2 * CHUNK {
        v.par_chunks_mut(CHUNK).for_each(round_trip_serial);
    } else {
        round_trip_serial(v);
    }
}

fn round_trip_serial(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if x86::usable() {
        // SAFETY: reads and writes the `v.len()` elements of `v`; AVX-512
        // F/BW/VL were just checked.
        return unsafe { x86::round_trip(v.as_mut_ptr(), v.len()) };
    }
    let mut tmp = [f16::ZERO; 256];
    for chunk in v.chunks_mut(tmp.len()) {
        let t = &mut tmp[..chunk.len()];
        round_into(chunk, t);
        widen_into(t, chunk);
    }
}

/// [`widen_into`] into a new vector, which is not zero-filled first.
pub(crate) fn widen_to_vec(src: &[f16]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if x86::usable() {
        // SAFETY: each call converts (writes) its whole chunk.
        return unsafe { par_map(src, |s, d| x86::widen(s.as_ptr(), d.as_mut_ptr(), s.len().min(d.len()))) };
    }
    let mut out = vec![0.0; src.len()];
    src.convert_to_f32_slice(&mut out);
    out
}

/// [`round_into`] into a new vector, which is not zero-filled first.
pub(crate) fn round_to_vec(src: &[f32]) -> Vec<f16> {
    #[cfg(target_arch = "x86_64")]
    if x86::usable() {
        // SAFETY: as in `widen_to_vec`.
        return unsafe { par_map(src, |s, d| x86::round(s.as_ptr(), d.as_mut_ptr(), s.len().min(d.len()))) };
    }
    let mut out = vec![f16::ZERO; src.len()];
    out.convert_from_f32_slice(src);
    out
}

/// The conversions 16 lanes at a time: the 512-bit forms of the F16C
/// instructions the `half` crate uses (exact widening, round-to-nearest-even
/// by the immediate, not MXCSR), so the bits are the same, in fewer passes.
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{lanes_from, usable as avx512_usable, Load16, Store16};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Whether the CPU has AVX-512 F, BW and VL (what the 16-lane loads and stores use).
    pub(crate) fn usable() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }

    /// The lanes of the 16 from element `i` that lie in `0..len` (all 16
    /// when they fit): the mask of a loop's step, its tail included.
    pub(crate) fn lanes_from(i: usize, len: usize) -> __mmask16 {
        ((1u32 << (len - i).min(16)) - 1) as __mmask16
    }

    /// `len` f16 (as u16 bits) at `src` widened into `dst`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn widen(src: *const half::f16, dst: *mut MaybeUninit<f32>, len: usize) {
        let (src, dst) = (src.cast::<i16>(), dst.cast::<f32>());
        let mut i = 0;
        while i + 16 <= len {
            _mm512_storeu_ps(dst.add(i), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i).cast())));
            i += 16;
        }
        if i < len {
            let m = lanes_from(i, len);
            _mm512_mask_storeu_ps(dst.add(i), m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src.add(i))));
        }
    }

    /// `len` f32 at `v` rounded to f16 and widened back in place.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn round_trip(v: *mut f32, len: usize) {
        let rt = |x: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
        let mut i = 0;
        while i + 16 <= len {
            _mm512_storeu_ps(v.add(i), rt(_mm512_loadu_ps(v.add(i))));
            i += 16;
        }
        if i < len {
            let m = lanes_from(i, len);
            _mm512_mask_storeu_ps(v.add(i), m, rt(_mm512_maskz_loadu_ps(m, v.add(i))));
        }
    }

    /// `len` f32 at `src` rounded into f16 at `dst`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn round(src: *const f32, dst: *mut MaybeUninit<half::f16>, len: usize) {
        let dst = dst.cast::<i16>();
        let mut i = 0;
        while i + 16 <= len {
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(src.add(i)));
            _mm256_storeu_si256(dst.add(i).cast(), h);
            i += 16;
        }
        if i < len {
            let m = lanes_from(i, len);
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_maskz_loadu_ps(m, src.add(i)));
            _mm256_mask_storeu_epi16(dst.add(i), m, h);
        }
    }

    /// An element the kernels load 16 at a time as f32: f16 is widened in the
    /// load (exactly, as `widen_into` does).
    pub(crate) trait Load16: Copy {
        /// The lanes in `m` from `p`, the others zero.
        ///
        /// # Safety
        /// The lanes in `m` lie inside one allocation; AVX-512F/BW/VL.
        unsafe fn load16(p: *const Self, m: __mmask16) -> __m512;
    }

    /// An element the kernels store 16 at a time from f32: f16 is rounded to
    /// nearest-even in the store (as `round_into` does).
    pub(crate) trait Store16: Copy {
        /// Stores the lanes in `m` at `p`.
        ///
        /// # Safety
        /// The lanes in `m` lie inside one allocation; AVX-512F/BW/VL.
        unsafe fn store16(p: *mut Self, m: __mmask16, v: __m512);
    }

    impl Load16 for f32 {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn load16(p: *const f32, m: __mmask16) -> __m512 {
            _mm512_maskz_loadu_ps(m, p)
        }
    }

    impl Load16 for f16 {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn load16(p: *const f16, m: __mmask16) -> __m512 {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast()))
        }
    }

    impl Store16 for f32 {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn store16(p: *mut f32, m: __mmask16, v: __m512) {
            _mm512_mask_storeu_ps(p, m, v)
        }
    }

    impl Store16 for f16 {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn store16(p: *mut f16, m: __mmask16, v: __m512) {
            _mm256_mask_storeu_epi16(p.cast(), m, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        }
    }
}

/// Elements per staging block of the f16 kernels: 16 KB of f32, which stays
/// in L1 beside its f16 source while the f32 kernel runs over it.
pub(crate) const BLOCK: usize = 4096;

/// The first `len` floats of a task's scratch `buf` (grown as needed; the
/// contents are whatever the last use left).
pub(crate) fn scratch(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

std::thread_local! {
    static STAGE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on f32 copies of `a` and `b` held in this thread's scratch, for
/// kernels called once per plane from code that has no per-task state of its
/// own. Widening plane by plane replaces a whole-tensor pass through memory.
pub(crate) fn with_widened<R>(a: &[f16], b: &[f16], f: impl FnOnce(&[f32], &[f32]) -> R) -> R {
    let run = |buf: &mut Vec<f32>| {
        let s = scratch(buf, a.len() + b.len());
        let (sa, sb) = s.split_at_mut(a.len());
        widen_into(a, sa);
        widen_into(b, sb);
        f(sa, sb)
    };
    STAGE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => run(&mut buf),
        // Only a nested use lands here; it gets a buffer of its own.
        Err(_) => run(&mut Vec::new()),
    })
}

/// `f` over f32 copies of `v`, block by block in parallel, each block rounded
/// back in place: exact for ops that only select or compare (ReLU), which
/// then store what a widen / f32 op / round sequence would.
pub(crate) fn map_inplace(v: &mut [f16], f: impl Fn(&mut [f32]) + Sync + Send) {
    v.par_chunks_mut(BLOCK).for_each_init(Vec::new, |buf, c| {
        let s = scratch(buf, c.len());
        widen_into(c, s);
        f(s);
        round_into(s, c);
    });
}

/// [`map_inplace`] over `v` with a read-only f16 operand `a` of the same length.
pub(crate) fn zip_map_inplace(a: &[f16], v: &mut [f16], f: impl Fn(&[f32], &mut [f32]) + Sync + Send) {
    a.par_chunks(BLOCK).zip(v.par_chunks_mut(BLOCK)).for_each_init(Vec::new, |buf, (ca, cv)| {
        let s = scratch(buf, ca.len() + cv.len());
        let (sa, sv) = s.split_at_mut(ca.len());
        widen_into(ca, sa);
        widen_into(cv, sv);
        f(sa, sv);
        round_into(sv, cv);
    });
}

/// An activation element a kernel can take directly: f32 as it is, f16
/// widened (exactly) as the kernel loads it ([`Pixels`]) and rounded to
/// nearest-even as it stores ([`Planes`]), so the f32 arithmetic between
/// sees the values a widened copy of the whole tensor would give and its
/// results are rounded once. (`widened` copies into scratch instead, for
/// kernels without such loads.)
pub(crate) trait Act: Copy + Send + Sync + 'static {
    /// What an output the kernel writes in full is made of (f32 outputs may
    /// start uninitialized).
    type Out: Send;
    /// `v` as f32: itself, or widened into `buf`.
    fn widened<'a>(v: &'a [Self], buf: &'a mut Vec<f32>) -> &'a [f32];
    /// `v` as the kernels' loads take it.
    fn pixels(v: &[Self]) -> Pixels<'_>;
    /// `dst` as the kernels' stores take it.
    fn planes(dst: &mut [Self::Out]) -> Planes<'_>;
}

/// Activations a kernel reads: f32, or f16 that it widens as it loads them.
#[derive(Clone, Copy)]
pub(crate) enum Pixels<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl<'a> Pixels<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Pixels::F32(v) => v.len(),
            Pixels::F16(v) => v.len(),
        }
    }

    /// The elements in `r`.
    pub(crate) fn slice(&self, r: std::ops::Range<usize>) -> Pixels<'a> {
        match self {
            Pixels::F32(v) => Pixels::F32(&v[r]),
            Pixels::F16(v) => Pixels::F16(&v[r]),
        }
    }
}

/// An output a kernel writes in full (possibly uninitialized): f32, or f16
/// that it rounds to nearest-even as it stores, as [`round_into`] does.
pub(crate) enum Planes<'a> {
    F32(&'a mut [MaybeUninit<f32>]),
    F16(&'a mut [MaybeUninit<f16>]),
}

impl Planes<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Planes::F32(v) => v.len(),
            Planes::F16(v) => v.len(),
        }
    }

    /// The elements in `r`, borrowed.
    pub(crate) fn slice(&mut self, r: std::ops::Range<usize>) -> Planes<'_> {
        match self {
            Planes::F32(v) => Planes::F32(&mut v[r]),
            Planes::F16(v) => Planes::F16(&mut v[r]),
        }
    }
}

impl Act for f32 {
    type Out = MaybeUninit<f32>;
    fn widened<'a>(v: &'a [f32], _: &'a mut Vec<f32>) -> &'a [f32] {
        v
    }
    fn pixels(v: &[f32]) -> Pixels<'_> {
        Pixels::F32(v)
    }
    fn planes(dst: &mut [MaybeUninit<f32>]) -> Planes<'_> {
        Planes::F32(dst)
    }
}

impl Act for f16 {
    type Out = MaybeUninit<f16>;
    fn widened<'a>(v: &'a [f16], buf: &'a mut Vec<f32>) -> &'a [f32] {
        if buf.len() < v.len() {
            // A task's first use: a vector written once, not zero-filled first.
            *buf = widen_to_vec(v);
            return buf;
        }
        let s = &mut buf[..v.len()];
        widen_into(v, s);
        s
    }
    fn pixels(v: &[f16]) -> Pixels<'_> {
        Pixels::F16(v)
    }
    fn planes(dst: &mut [MaybeUninit<f16>]) -> Planes<'_> {
        Planes::F16(dst)
    }
}
