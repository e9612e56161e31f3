//! The summation order of the device kernels that reduce a row with one warp
//! (kernels/common.cuh: `ddp::warp_sum`), for their CPU twins: lane `l` sums
//! the elements `l`, `l + 32`, ... in order, and the 32 lane sums are added
//! in a butterfly (lane `i` with lane `i ^ 16`, then `^ 8`, ..., `^ 1`). A
//! twin that sums this way gives the kernel's bits while the GPU reads a row
//! with all of a warp's lanes at once.

use super::Elem;

/// Lanes of a warp.
pub const LANES: usize = 32;

/// The per-lane sums of `values`, each from `init`.
pub fn lane_sums<T: Elem>(init: T, values: impl Iterator<Item = T>) -> [T; LANES] {
    let mut p = [init; LANES];
    for (k, v) in values.enumerate() {
        p[k % LANES] = p[k % LANES] + v;
    }
    p
}

/// [`lane_sums`] of `f` over a slice, a block of 32 values at a time: the
/// same sums in the same order, in a loop the compiler vectorizes (it does
/// not vectorize the iterator's `k % 32`, and LayerNorm's rows spent most of
/// their time there).
#[inline]
pub fn lane_sums_of<T: Elem>(init: T, values: &[T], f: impl Fn(T) -> T) -> [T; LANES] {
    let mut p = [init; LANES];
    let mut blocks = values.chunks_exact(LANES);
    for block in &mut blocks {
        for (acc, &v) in p.iter_mut().zip(block) {
            *acc = *acc + f(v);
        }
    }
    for (acc, &v) in p.iter_mut().zip(blocks.remainder()) {
        *acc = *acc + f(v);
    }
    p
}

/// [`lane_sums_of`] for `f` of two slices' elements pairwise (over the
/// shorter), as in a dot product.
#[inline]
pub fn lane_sums_of2<T: Elem>(init: T, a: &[T], b: &[T], f: impl Fn(T, T) -> T) -> [T; LANES] {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut p = [init; LANES];
    let (mut ab, mut bb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ab).zip(&mut bb) {
        for (acc, (&x, &y)) in p.iter_mut().zip(x.iter().zip(y)) {
            *acc = *acc + f(x, y);
        }
    }
    for (acc, (&x, &y)) in p.iter_mut().zip(ab.remainder().iter().zip(bb.remainder())) {
        *acc = *acc + f(x, y);
    }
    p
}

/// The lane sums added as the warp's butterfly adds them. Lanes `i` and
/// `i ^ off` hold the same sum after each step (a + b == b + a), so the low
/// half carries it.
pub fn butterfly<T: Elem>(mut p: [T; LANES]) -> T {
    let mut off = LANES / 2;
    while off > 0 {
        for i in 0..off {
            p[i] = p[i] + p[i + off];
        }
        off /= 2;
    }
    p[0]
}

/// `values` summed in the warp's order, each lane from `init`.
pub fn warp_sum<T: Elem>(init: T, values: impl Iterator<Item = T>) -> T {
    butterfly(lane_sums(init, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order, spelled out for 40 values: lane 3 holds v3 + v35, and the
    /// butterfly's first step adds lane 19 (v19) to it.
    #[test]
    fn lanes_then_butterfly() {
        let v: Vec<f64> = (0..40).map(|i| f64::from(i) * 0.5).collect();
        let p = lane_sums(0.0, v.iter().copied());
        assert_eq!(p[3], v[3] + v[35]);
        assert_eq!(p[31], v[31]);
        assert_eq!(warp_sum(0.0, v.iter().copied()), v.iter().sum::<f64>());
        // f32 rounding shows the order: 1e8 then 31 ones loses every one in
        // a sequential sum (half an ulp of 1e8 is 4), while the butterfly
        // adds the ones in pairs first and keeps 24 of them.
        let big: Vec<f32> = std::iter::once(1e8f32).chain(std::iter::repeat_n(1.0, 31)).collect();
        assert_eq!(big.iter().sum::<f32>(), 1e8);
        assert_eq!(warp_sum(0.0f32, big.iter().copied()), 1e8 + 24.0);
        // Empty lanes keep their start: -0.0 stays the sum of nothing.
        assert!(warp_sum(-0.0f32, std::iter::empty()).is_sign_negative());
    }

    /// The blocked form gives the iterator's lanes bit for bit, at every
    /// length around the block edges.
    #[test]
    fn lane_sums_of_is_lane_sums() {
        let v: Vec<f32> = crate::ops::testing::rand_vec(200, 9).iter().map(|&x| (x * 1e3) as f32).collect();
        for len in (0..100).chain([127, 128, 129, 200]) {
            let s = &v[..len];
            let want = lane_sums(-0.0, s.iter().map(|&x| x * x - 1.5));
            let got = lane_sums_of(-0.0, s, |x| x * x - 1.5);
            assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "length {len}");
            let w = &v[200 - len..];
            let want = lane_sums(-0.0, s.iter().zip(w).map(|(&x, &y)| x * y));
            let got = lane_sums_of2(-0.0, s, w, |x, y| x * y);
            assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "dot of length {len}");
        }
    }
}
