//! f32 <-> f16 casts on the device (kernels/cast.cu), bit-identical with
//! `half::f16::from_f32` / `to_f32` (the CPU tensors' `into_dtype`), NaN
//! payloads included; plus an f16 -> f32 accumulate (O1's gradients) and an
//! outer-dimension swap (the device conv2d's weight gradient).

use super::{as_i64, check_len, launch_1d, DeviceFloat, Gpu, KernelFn, TypedKernelFn};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use half::f16;

const FILE: &str = "cast.cu";
static CAST_F32_TO_F16: KernelFn = KernelFn::new(FILE, "cast_f32_to_f16");
static CAST_F16_TO_F32: KernelFn = KernelFn::new(FILE, "cast_f16_to_f32");
static CAST_F16_ADD_TO_F32: KernelFn = KernelFn::new(FILE, "cast_f16_add_to_f32");
static SWAP_OUTER: TypedKernelFn = typed_kernel!(FILE, "swap_outer");

/// `dst = f16(src)`, rounding to nearest even; values beyond the f16 range
/// become infinities, as on the CPU.
pub fn f32_to_f16(gpu: &Gpu, src: &impl DevicePtr<f32>, dst: &mut impl DevicePtrMut<f16>) -> Result<()> {
    cast(gpu, &CAST_F32_TO_F16, src, dst)
}

/// `dst = f32(src)` (exact).
pub fn f16_to_f32(gpu: &Gpu, src: &impl DevicePtr<f16>, dst: &mut impl DevicePtrMut<f32>) -> Result<()> {
    cast(gpu, &CAST_F16_TO_F32, src, dst)
}

fn cast<A, B>(
    gpu: &Gpu,
    k: &'static KernelFn,
    src: &impl DevicePtr<A>,
    dst: &mut impl DevicePtrMut<B>,
) -> Result<()> {
    let name = k.name();
    let n = src.len();
    check_len(name, "dst", dst.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(k)?;
    let stream = gpu.stream();
    let (s, _s) = src.device_ptr(stream);
    let (d, _d) = dst.device_ptr_mut(stream);
    let n64 = n as i64;
    // SAFETY: both pointers hold n elements of the kernel's types (checked above).
    unsafe { f.launch_on(stream).arg(&s).arg(&d).arg(&n64).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda(name, e))?;
    Ok(())
}

/// `dst += f32(src)`, elementwise in f32: an f16 gradient accumulated into
/// an f32 `.grad` (O1's conv and linear), as `accumulate_grad` on the CPU.
pub fn f16_add_to_f32(gpu: &Gpu, src: &impl DevicePtr<f16>, dst: &mut impl DevicePtrMut<f32>) -> Result<()> {
    cast(gpu, &CAST_F16_ADD_TO_F32, src, dst)
}

/// `dst[B, A, C] = src[A, B, C]` for `shape = [A, B, C]`: the two outer
/// dimensions swapped, values copied bit for bit.
pub fn swap_outer<T: DeviceFloat>(
    gpu: &Gpu,
    shape: [usize; 3],
    src: &impl DevicePtr<T>,
    dst: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    const OP: &str = "swap_outer";
    let n = shape.iter().product::<usize>();
    check_len(OP, "src", src.len(), n)?;
    check_len(OP, "dst", dst.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let [a, b, c] = [as_i64(OP, shape[0])?, as_i64(OP, shape[1])?, as_i64(OP, shape[2])?];
    let f = gpu.kernel(T::pick(&SWAP_OUTER))?;
    let stream = gpu.stream();
    let (s, _s) = src.device_ptr(stream);
    let (d, _d) = dst.device_ptr_mut(stream);
    // SAFETY: src and dst hold a*b*c elements of T (checked above).
    unsafe { f.launch_on(stream).arg(&s).arg(&d).arg(&a).arg(&b).arg(&c).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::{poisoned, upload};
    use crate::ops::testing::rand_vec_f32;

    /// Random values over the whole f16 range plus the edge cases: signed
    /// zeros, infinities, NaNs with payloads, the overflow boundary,
    /// subnormals and exact ties.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = rand_vec_f32(4099, 61).iter().map(|x| x * 70000.0).collect();
        v.extend(rand_vec_f32(1001, 62).iter().map(|x| x * 1e-4));
        v.extend(rand_vec_f32(503, 63).iter().map(|x| x * 1e-7));
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffa1_2345),
            65504.0,
            65519.99,
            65520.0,
            -65520.0,
            1e6,
            5.960_464_5e-8,
            2.980_232_2e-8,
            2.980_233e-8,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            f32::MIN_POSITIVE,
            f32::MAX,
        ]);
        v
    }

    #[test]
    fn f32_to_f16_is_bit_identical_with_half() {
        let Some(gpu) = crate::cuda::test_gpu("f32_to_f16_is_bit_identical_with_half") else { return };
        let host = inputs();
        let src = gpu.stream().clone_htod(&host).unwrap();
        let mut dst = poisoned::<f16>(&gpu, host.len());
        f32_to_f16(&gpu, &src, &mut dst).unwrap();
        let got: Vec<f16> = gpu.stream().clone_dtoh(&dst).unwrap();
        for (i, (&x, g)) in host.iter().zip(&got).enumerate() {
            let want = f16::from_f32(x);
            assert_eq!(g.to_bits(), want.to_bits(), "[{i}] f16({x:e}): got {g}, half gives {want}");
        }
    }

    #[test]
    fn f16_to_f32_is_bit_identical_with_half() {
        let Some(gpu) = crate::cuda::test_gpu("f16_to_f32_is_bit_identical_with_half") else { return };
        // Every f16 bit pattern.
        let host: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let src = gpu.stream().clone_htod(&host).unwrap();
        let mut dst = poisoned::<f32>(&gpu, host.len());
        f16_to_f32(&gpu, &src, &mut dst).unwrap();
        let got: Vec<f32> = gpu.stream().clone_dtoh(&dst).unwrap();
        for (h, g) in host.iter().zip(&got) {
            assert_eq!(g.to_bits(), h.to_f32().to_bits(), "f32({:#06x}): got {g}", h.to_bits());
        }
    }

    #[test]
    fn casts_on_views_touch_only_the_view() {
        let Some(gpu) = crate::cuda::test_gpu("casts_on_views_touch_only_the_view") else { return };
        let host = rand_vec_f32(37, 64);
        let src = gpu.stream().clone_htod(&host).unwrap();
        let mut dst = upload::<f16>(&gpu, &[7.0; 37]);
        f32_to_f16(&gpu, &src.slice(5..30), &mut dst.slice_mut(5..30)).unwrap();
        let got: Vec<f16> = gpu.stream().clone_dtoh(&dst).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = if (5..30).contains(&i) { f16::from_f32(host[i]) } else { f16::from_f32(7.0) };
            assert_eq!(g.to_bits(), want.to_bits(), "[{i}]");
        }
    }

    #[test]
    fn a_length_mismatch_is_refused_before_launch() {
        let Some(gpu) = crate::cuda::test_gpu("a_length_mismatch_is_refused_before_launch") else { return };
        let src = gpu.stream().alloc_zeros::<f32>(10).unwrap();
        let mut dst = gpu.stream().alloc_zeros::<f16>(9).unwrap();
        let e = f32_to_f16(&gpu, &src, &mut dst).unwrap_err().to_string();
        assert!(e.contains("cast_f32_to_f16: dst holds 9 elements, expected 10"), "{e}");
    }

    #[test]
    fn f16_add_to_f32_accumulates_like_the_cpu() {
        let Some(gpu) = crate::cuda::test_gpu("f16_add_to_f32_accumulates_like_the_cpu") else { return };
        let g: Vec<f16> = rand_vec_f32(1037, 65).iter().map(|&v| f16::from_f32(v * 300.0)).collect();
        let acc = rand_vec_f32(1037, 66);
        let src = gpu.stream().clone_htod(&g).unwrap();
        let mut dst = gpu.stream().clone_htod(&acc).unwrap();
        // Twice: the second call must add onto the first, not overwrite it.
        f16_add_to_f32(&gpu, &src, &mut dst).unwrap();
        f16_add_to_f32(&gpu, &src, &mut dst).unwrap();
        let got: Vec<f32> = gpu.stream().clone_dtoh(&dst).unwrap();
        for (i, ((&a, h), &r)) in acc.iter().zip(&g).zip(&got).enumerate() {
            let want = a + h.to_f32() + h.to_f32();
            assert_eq!(r.to_bits(), want.to_bits(), "[{i}] {a} + 2 * {h}: got {r}");
        }
        let mut short = gpu.stream().alloc_zeros::<f32>(5).unwrap();
        let e = f16_add_to_f32(&gpu, &src, &mut short).unwrap_err().to_string();
        assert!(e.contains("cast_f16_add_to_f32: dst holds 5 elements, expected 1037"), "{e}");
    }

    fn check_swap_outer<T: crate::cuda::DeviceFloat>(gpu: &Gpu, [a, b, c]: [usize; 3]) {
        let host = crate::cuda::testing::rounded::<T>(&rand_vec_f32(a * b * c, 67));
        let src = upload::<T>(gpu, &host);
        let mut dst = poisoned::<T>(gpu, a * b * c);
        swap_outer(gpu, [a, b, c], &src, &mut dst).unwrap();
        let got = crate::cuda::testing::download(gpu, &dst);
        for bi in 0..b {
            for ai in 0..a {
                for k in 0..c {
                    let (g, w) = (got[(bi * a + ai) * c + k], host[(ai * b + bi) * c + k]);
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{} [{a}, {b}, {c}] at ({bi}, {ai}, {k})",
                        T::SUFFIX
                    );
                }
            }
        }
    }

    #[test]
    fn swap_outer_moves_every_element() {
        let Some(gpu) = crate::cuda::test_gpu("swap_outer_moves_every_element") else { return };
        for shape in [[3, 5, 7], [7, 16, 1], [1, 4, 9], [100, 16, 13]] {
            check_swap_outer::<f32>(&gpu, shape);
            check_swap_outer::<f16>(&gpu, shape);
        }
        let src = gpu.stream().alloc_zeros::<f32>(24).unwrap();
        let mut dst = gpu.stream().alloc_zeros::<f32>(24).unwrap();
        let e = swap_outer(&gpu, [2, 3, 5], &src, &mut dst).unwrap_err().to_string();
        assert!(e.contains("swap_outer: src holds 24 elements, expected 30"), "{e}");
    }

    #[test]
    fn check_len_names_the_op_and_the_buffer() {
        let e = check_len("relu forward", "y", 3, 4).unwrap_err().to_string();
        assert!(e.contains("relu forward: y holds 3 elements, expected 4"), "{e}");
        assert!(check_len("relu forward", "y", 4, 4).is_ok());
    }
}
