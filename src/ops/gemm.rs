//! Row-major matrix product over the `gemm` crate, the one place its raw
//! strided interface is touched: `C[m x n] = op(A) * op(B) (+ C)`.

use crate::ops::Elem;
use std::mem::MaybeUninit;

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
    let (lda, ldb) = dense_ld(m, n, k, trans_a, trans_b);
    gemm_ld(m, n, k, (a, lda, trans_a), (b, ldb, trans_b), (c, n), accumulate, par)
}

/// The leading dimensions of dense A and B as [`gemm`] takes them.
fn dense_ld(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> (usize, usize) {
    (if trans_a { m } else { k }, if trans_b { k } else { n })
}

/// [`gemm`] on row-major matrices whose rows lie `ld` elements apart (each
/// matrix given as `(slice, ld, transposed)`, C as `(slice, ldc)`): a block
/// of columns read or written in place, as attention's heads are in their
/// `[T, 3C]` and `[T, C]` rows. Only C's `n` columns of each row are written.
///
/// # Panics
/// If a slice is shorter than its strided matrix, or a leading dimension is
/// narrower than its rows (C's rows would overlap).
#[allow(clippy::too_many_arguments)]
pub fn gemm_ld<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    a: (&[T], usize, bool),
    b: (&[T], usize, bool),
    (c, ldc): (&mut [T], usize),
    accumulate: bool,
    par: Par,
) {
    gemm_raw(m, n, k, a, b, (c.as_mut_ptr(), c.len(), ldc), accumulate, par)
}

/// [`gemm`]'s `C = op(A) * op(B)` into a C that may be uninitialized (a
/// fresh output): the crate never reads C when it does not accumulate, and
/// every element of `c[..m * n]` is written.
#[allow(clippy::too_many_arguments)]
pub fn gemm_into<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    trans_a: bool,
    b: &[T],
    trans_b: bool,
    c: &mut [MaybeUninit<T>],
    par: Par,
) {
    let (lda, ldb) = dense_ld(m, n, k, trans_a, trans_b);
    let c = (c.as_mut_ptr().cast::<T>(), c.len(), n);
    gemm_raw(m, n, k, (a, lda, trans_a), (b, ldb, trans_b), c, false, par)
}

/// The checks and the crate call behind [`gemm_ld`] and [`gemm_into`]; C is
/// `(pointer, length, ldc)` of one exclusively borrowed slice, initialized
/// wherever `accumulate` reads it.
#[allow(clippy::too_many_arguments)]
fn gemm_raw<T: Elem>(
    m: usize,
    n: usize,
    k: usize,
    (a, lda, trans_a): (&[T], usize, bool),
    (b, ldb, trans_b): (&[T], usize, bool),
    (c, c_len, ldc): (*mut T, usize, usize),
    accumulate: bool,
    par: Par,
) {
    // (rows, columns) of A, B and C as stored.
    let (a_rows, a_cols) = if trans_a { (k, m) } else { (m, k) };
    let (b_rows, b_cols) = if trans_b { (n, k) } else { (k, n) };
    // These checks are what make the raw-pointer calls below sound.
    let span =
        |rows: usize, cols: usize, ld: usize| if rows == 0 || cols == 0 { 0 } else { (rows - 1) * ld + cols };
    assert!(
        lda >= a_cols && ldb >= b_cols && ldc >= n,
        "gemm: leading dimensions {lda}, {ldb}, {ldc} too narrow"
    );
    assert!(a.len() >= span(a_rows, a_cols, lda), "gemm: A has {} elements, needs {m}x{k}", a.len());
    assert!(b.len() >= span(b_rows, b_cols, ldb), "gemm: B has {} elements, needs {k}x{n}", b.len());
    assert!(c_len >= span(m, n, ldc), "gemm: C has {c_len} elements, needs {m}x{n}");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum; handled here so the result never depends on how the
        // crate treats a zero inner dimension.
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: i * ldc + j < span(m, n, ldc) <= c_len.
                    unsafe { c.add(i * ldc + j).write(T::zero()) };
                }
            }
        }
        return;
    }
    // Element (i, p) of op(A) sits at i*a_rs + p*a_cs.
    let (a_rs, a_cs) = if trans_a { (1, lda) } else { (lda, 1) };
    let (b_rs, b_cs) = if trans_b { (1, ldb) } else { (ldb, 1) };
    let parallelism = match par {
        Par::Seq => gemm::Parallelism::None,
        Par::Rayon(t) => gemm::Parallelism::Rayon(t),
    };
    // SAFETY: the asserts above keep every index the strides reach
    // (max (m-1)*rs + (k-1)*cs etc.) inside the slices, and C's rows apart
    // (ldc >= n); C is borrowed exclusively by the caller, so it cannot
    // alias `a` or `b`; without `accumulate` the crate only writes C.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
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

    /// The uninitialized-output form writes every element, as `gemm` would
    /// (NaN where it wrote nothing), split or not, an empty K included.
    #[test]
    fn gemm_into_writes_every_element() {
        for (m, n, k) in [(1, 1, 1), (17, 9, 33), (64, 31, 5), (3, 4, 0)] {
            for (ta, tb) in [(false, true), (true, false), (false, false)] {
                let (a, b) = (rand_vec(m * k, 1), rand_vec(k * n, 2));
                let mut want = vec![0.0; m * n];
                gemm(m, n, k, &a, ta, &b, tb, &mut want, false, Par::Seq);
                for par in [Par::Seq, Par::Rayon(0)] {
                    let mut c = vec![std::mem::MaybeUninit::new(f64::NAN); m * n];
                    gemm_into(m, n, k, &a, ta, &b, tb, &mut c, par);
                    // SAFETY: every element was initialized (to NaN, then by the product).
                    let got: Vec<f64> = c.iter().map(|v| unsafe { v.assume_init() }).collect();
                    assert_eq!(got, want, "{m}x{n}x{k} ta={ta} tb={tb} {par:?}");
                }
            }
        }
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

    /// Blocks of columns inside wider rows, as attention reads its heads:
    /// the same results as the gathered dense matrices, C's other columns untouched.
    #[test]
    fn strided_blocks_match_the_dense_product() {
        let (m, n, k, pad) = (7, 5, 9, 3);
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let (ar, ac) = if ta { (k, m) } else { (m, k) };
            let (br, bc) = if tb { (n, k) } else { (k, n) };
            let wide_a = rand_vec(ar * (ac + pad), 1);
            let wide_b = rand_vec(br * (bc + pad), 2);
            let dense = |w: &[f64], rows: usize, cols: usize| -> Vec<f64> {
                (0..rows)
                    .flat_map(|r| w[r * (cols + pad) + 1..r * (cols + pad) + 1 + cols].to_vec())
                    .collect()
            };
            let (a, b) = (dense(&wide_a, ar, ac), dense(&wide_b, br, bc));
            let want = naive(m, n, k, &a, ta, &b, tb);
            let mut c = vec![-1.0; m * (n + pad)];
            let ca = (&wide_a[1..], ac + pad, ta);
            let cb = (&wide_b[1..], bc + pad, tb);
            gemm_ld(m, n, k, ca, cb, (&mut c[2..], n + pad), false, Par::Seq);
            for i in 0..m {
                for j in 0..n + pad {
                    let got = c[i * (n + pad) + j];
                    if (2..2 + n).contains(&j) {
                        assert!((got - want[i * n + j - 2]).abs() < 1e-12, "ta={ta} tb={tb} ({i}, {j})");
                    } else {
                        assert_eq!(got, -1.0, "ta={ta} tb={tb}: ({i}, {j}) written");
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "gemm: B has")]
    fn gemm_short_slice_panics() {
        let mut c = vec![0f32; 4];
        gemm(2, 2, 2, &[0.0; 4], false, &[0.0; 3], false, &mut c, false, Par::Seq);
    }
}
