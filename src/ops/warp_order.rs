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
}
