//! Row-major matrix product over the `gemm` crate, the one place its raw
//! strided interface is touched: `C[m x n] = op(A) * op(B) (+ C)`.

use crate::ops::Elem;

/// How one product may be split across threads. Kernels that already run one
/// product per rayon task pass `Seq`, so the two levels do not fight over the
/// (small) pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Par {
    Seq,
    /// Split over rayon's current pool; `0` means all of its threads.
    Rayon(usize),
}

/// `C = op(A) * op(B)`, or `C += op(A) * op(B)` when `accumulate`.
///
/// All matrices are dense row-major. `op(A)` is `m x k`: `a` holds `m x k`, or
/// `k x m` when `trans_a`. `op(B)` is `k x n`: `b` holds `k x n`, or `n x k`
/// when `trans_b`. `c` holds `m x n`.
///
/// # Panics
/// If a slice is shorter than its matrix (a caller bug: the tensor-level ops
/// validate shapes before reaching here), or if `T` is not f32/f64.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    trans_a: bool,
    b: &[T],
    trans_b: bool,
    c: &mut [T],
    accumulate: bool,
    par: Par,
) {
    // These checks are what make the raw-pointer call below sound.
    assert!(a.len() >= m * k, "gemm: A has {} elements, needs {m}x{k}", a.len());
    assert!(b.len() >= k * n, "gemm: B has {} elements, needs {k}x{n}", b.len());
    assert!(c.len() >= m * n, "gemm: C has {} elements, needs {m}x{n}", c.len());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum; handled here so the result never depends on how the
        // crate treats a zero inner dimension.
        if !accumulate {
            c[..m * n].fill(T::zero());
        }
        return;
    }
    // Element (i, p) of op(A) sits at i*a_rs + p*a_cs.
    let (a_rs, a_cs) = if trans_a { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if trans_b { (1, k) } else { (n, 1) };
    let parallelism = match par {
        Par::Seq => gemm::Parallelism::None,
        Par::Rayon(t) => gemm::Parallelism::Rayon(t),
    };
    // SAFETY: the asserts above keep every index the strides reach
    // (max (m-1)*rs + (k-1)*cs etc.) inside the slices; `c` is borrowed
    // mutably, so it cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::rand_vec;

    fn naive(m: usize, n: usize, k: usize, a: &[f64], ta: bool, b: &[f64], tb: bool) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let av = if ta { a[p * m + i] } else { a[i * k + p] };
                    let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                    s += av * bv;
                }
                c[i * n + j] = s;
            }
        }
        c
    }

    fn check_all(par: Par) {
        let sizes = [(1, 1, 1), (3, 5, 7), (17, 9, 33), (64, 31, 5), (5, 70, 129), (2, 3, 0)];
        for (si, &(m, n, k)) in sizes.iter().enumerate() {
            for ta in [false, true] {
                for tb in [false, true] {
                    let seed = si as u64 * 10;
                    let a = rand_vec(m * k, seed + 1);
                    let b = rand_vec(k * n, seed + 2);
                    let c0 = rand_vec(m * n, seed + 3);
                    let want = naive(m, n, k, &a, ta, &b, tb);

                    let mut c = c0.clone();
                    gemm(m, n, k, &a, ta, &b, tb, &mut c, false, par);
                    for (g, w) in c.iter().zip(&want) {
                        assert!((g - w).abs() < 1e-12, "{m}x{n}x{k} ta={ta} tb={tb}: {g} vs {w}");
                    }

                    let mut c = c0.clone();
                    gemm(m, n, k, &a, ta, &b, tb, &mut c, true, par);
                    for ((g, w), c0) in c.iter().zip(&want).zip(&c0) {
                        assert!((g - (w + c0)).abs() < 1e-12, "acc {m}x{n}x{k} ta={ta} tb={tb}");
                    }
                }
            }
        }
    }

    #[test]
    fn gemm_matches_naive_all_transposes_seq() {
        check_all(Par::Seq);
    }

    #[test]
    fn gemm_matches_naive_all_transposes_rayon() {
        check_all(Par::Rayon(0));
    }

    #[test]
    fn gemm_f32_matches_naive() {
        let (m, n, k) = (13, 11, 19);
        let a = rand_vec(m * k, 7);
        let b = rand_vec(k * n, 8);
        let want = naive(m, n, k, &a, true, &b, false);
        let af: Vec<f32> = a.iter().map(|&v| v as f32).collect();
        let bf: Vec<f32> = b.iter().map(|&v| v as f32).collect();
        let mut c = vec![0f32; m * n];
        gemm(m, n, k, &af, true, &bf, false, &mut c, false, Par::Seq);
        for (g, w) in c.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-4);
        }
    }

    #[test]
    #[should_panic(expected = "gemm: B has")]
    fn gemm_short_slice_panics() {
        let mut c = vec![0f32; 4];
        gemm(2, 2, 2, &[0.0; 4], false, &[0.0; 3], false, &mut c, false, Par::Seq);
    }
}
