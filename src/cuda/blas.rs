//! cuBLAS GEMMs for the layers (linear, conv2d via im2col), row-major like
//! the CPU twins in `ops/gemm.rs`.
//!
//! Row-major <-> column-major: cuBLAS is column-major, and a row-major
//! `X[r, c]` with leading dimension `ld` is, bit for bit, the column-major
//! `X^T[c, r]` with the same `ld`. So the row-major `C = op(A) op(B)` is
//! computed as the column-major `C^T = op(B)^T op(A)^T`: swap the operands
//! (B first), swap `m` and `n`, and keep each operand's transpose flag (the
//! storage already holds the transpose, so `op` applied to it is what we want).
//!
//! Every call goes through `cublasGemmEx` / `cublasGemmStridedBatchedEx` with
//! f32 scalars and f32 compute: f32 operands compute in plain f32 (TF32 tensor
//! cores only with `allow_tf32`, PyTorch's `allow_tf32` flag), f16 operands
//! use tensor cores with f32 accumulation and one rounding of `alpha*AB + beta*C`
//! to f16, which is the CPU twins' "widen, f32 GEMM, round" contract (the
//! math mode forbids split-K's f16 reductions, which would break it).

use super::Gpu;
use crate::error::{Error, Result};
use cudarc::cublas::{result as cublas_result, sys};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use std::ffi::c_void;
use std::sync::Arc;

/// An element type cuBLAS and the kernels take: f32 or f16.
pub trait BlasElem: DeviceRepr + Copy + Send + Sync + 'static {
    const DATA_TYPE: sys::cudaDataType_t;
    /// The kernel entry-point suffix, `f32` / `f16` (see `DDP_INSTANTIATE`).
    const SUFFIX: &'static str;
    /// This type's instantiation of `k`.
    fn pick(k: &'static crate::cuda::TypedKernelFn) -> &'static crate::cuda::KernelFn;
}

impl BlasElem for f32 {
    const DATA_TYPE: sys::cudaDataType_t = sys::cudaDataType_t::CUDA_R_32F;
    const SUFFIX: &'static str = "f32";
    fn pick(k: &'static crate::cuda::TypedKernelFn) -> &'static crate::cuda::KernelFn {
        &k.f32
    }
}

impl BlasElem for half::f16 {
    const DATA_TYPE: sys::cudaDataType_t = sys::cudaDataType_t::CUDA_R_16F;
    const SUFFIX: &'static str = "f16";
    fn pick(k: &'static crate::cuda::TypedKernelFn) -> &'static crate::cuda::KernelFn {
        &k.f16
    }
}

/// Whether libcublas can be loaded (cudarc panics on first use otherwise).
pub fn is_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// A cuBLAS handle whose destruction never panics. cudarc's `CudaBlas`
/// unwraps `cublasDestroy`'s status in `Drop`; after a sticky device fault
/// that status can be an error, and unwinding from the real error (the first
/// failing call, already on its way to the user) would end in a panic
/// naming `cublasDestroy` instead.
#[derive(Debug)]
struct Handle(sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread, one call at a time
// (as cudarc's CudaBlas asserts); Blas hands it out only through &self calls
// that enqueue on its stream.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Handle {
    fn handle(&self) -> &sys::cublasHandle_t {
        &self.0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cublasCreate and destroyed once; an error here
        // has no one to go to (the fault that caused it was reported).
        let _ = unsafe { cublas_result::destroy_handle(self.0) };
    }
}

/// A cuBLAS handle bound to one stream.
#[derive(Debug)]
pub struct Blas {
    handle: Handle,
    stream: Arc<CudaStream>,
    allow_tf32: bool,
}

impl Blas {
    /// A handle on `gpu`'s compute stream. `allow_tf32` lets f32 GEMMs use
    /// TF32 tensor cores (10-bit mantissa products): off for O0 parity.
    pub fn new(gpu: &Gpu, allow_tf32: bool) -> Result<Blas> {
        Self::on_stream(gpu.stream().clone(), allow_tf32)
    }

    pub fn on_stream(stream: Arc<CudaStream>, allow_tf32: bool) -> Result<Blas> {
        if !is_available() {
            return Err(Error::cuda(
                "loading cuBLAS",
                "libcublas not found: install the `nvidia-cublas` wheel (CUDA 13) or the CUDA toolkit \
                 and put its lib folder (with libcublas.so.13 and libcublasLt.so.13) on LD_LIBRARY_PATH",
            ));
        }
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::cuda("binding the CUDA context for cuBLAS", e))?;
        let handle = Handle(cublas_result::create_handle().map_err(|e| Error::cuda("cublasCreate", e))?);
        // SAFETY: a live handle and this context's stream.
        unsafe { cublas_result::set_stream(handle.0, stream.cu_stream() as _) }
            .map_err(|e| Error::cuda("cublasSetStream", e))?;
        // The default math mode lets split-K reduce f16 outputs' partial
        // sums in f16 (PyTorch's allow_fp16_reduced_precision_reduction):
        // on an H200 that put the O1 seed ConvNet's conv1 weight gradient
        // 46 f16 ulps from the CPU twin's f32-accumulate-then-round-once.
        // Forbid it. TF32 is asked per call by the compute type (below),
        // which is all cublasGemmEx needs, so this is the only mode bit.
        let mode = sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
        // SAFETY: a live handle and a valid enum value.
        unsafe { sys::cublasSetMathMode(*handle.handle(), mode) }
            .result()
            .map_err(|e| Error::cuda("cublasSetMathMode", e))?;
        Ok(Blas { handle, stream, allow_tf32 })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn allow_tf32(&self) -> bool {
        self.allow_tf32
    }

    fn compute_type<T: BlasElem>(&self) -> sys::cublasComputeType_t {
        if T::DATA_TYPE == sys::cudaDataType_t::CUDA_R_32F && self.allow_tf32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        }
    }
}

/// The shape of one row-major `C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

/// Elements a row-major `rows x cols` matrix with leading dimension `ld` spans.
fn span(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * ld + cols
    }
}

fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::shape(format!("gemm: {what} = {v} exceeds cuBLAS's 32-bit limit")))
}

impl GemmShape {
    /// (rows, cols) of A and B as stored (row-major, before `op`).
    fn stored(&self) -> ((usize, usize), (usize, usize)) {
        let a = if self.trans_a { (self.k, self.m) } else { (self.m, self.k) };
        let b = if self.trans_b { (self.n, self.k) } else { (self.k, self.n) };
        (a, b)
    }

    /// Elements of A, B and C one product touches.
    pub fn spans(&self) -> (usize, usize, usize) {
        let ((ar, ac), (br, bc)) = self.stored();
        (span(ar, ac, self.lda), span(br, bc, self.ldb), span(self.m, self.n, self.ldc))
    }

    /// Refuses leading dimensions shorter than a row and buffers shorter than
    /// the matrices, so a wrong size never reaches cuBLAS.
    pub fn check(&self, op: &str, a_len: usize, b_len: usize, c_len: usize) -> Result<()> {
        let ((_, ac), (_, bc)) = self.stored();
        for (name, ld, cols) in [("lda", self.lda, ac), ("ldb", self.ldb, bc), ("ldc", self.ldc, self.n)] {
            if ld < cols.max(1) {
                return Err(Error::shape(format!(
                    "{op}: {name} = {ld} is less than the row length {cols} ({self:?})"
                )));
            }
        }
        let (sa, sb, sc) = self.spans();
        for (name, need, have) in [("A", sa, a_len), ("B", sb, b_len), ("C", sc, c_len)] {
            if have < need {
                return Err(Error::shape(format!(
                    "{op}: {name} has {have} elements but the product needs {need} ({self:?})"
                )));
            }
        }
        for (name, v) in [
            ("m", self.m),
            ("n", self.n),
            ("k", self.k),
            ("lda", self.lda),
            ("ldb", self.ldb),
            ("ldc", self.ldc),
        ] {
            int(name, v)?;
        }
        Ok(())
    }
}

fn op(trans: bool) -> sys::cublasOperation_t {
    if trans {
        sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        sys::cublasOperation_t::CUBLAS_OP_N
    }
}

/// Row-major `C = alpha op(A) op(B) + beta C` on the handle's stream. With
/// `beta == 0`, C is write-only (cuBLAS does not read it, NaNs included).
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: BlasElem>(
    blas: &Blas,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &CudaView<T>,
    lda: usize,
    b: &CudaView<T>,
    ldb: usize,
    beta: f32,
    c: &mut CudaViewMut<T>,
    ldc: usize,
) -> Result<()> {
    let s = GemmShape { trans_a, trans_b, m, n, k, lda, ldb, ldc };
    let what =
        format!("cublasGemmEx {} (m={m}, n={n}, k={k}, trans_a={trans_a}, trans_b={trans_b})", T::SUFFIX);
    s.check(&what, a.len(), b.len(), c.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let stream = &blas.stream;
    let (pa, _ra) = a.device_ptr(stream);
    let (pb, _rb) = b.device_ptr(stream);
    let (pc, _rc) = c.device_ptr_mut(stream);
    // SAFETY: the spans of A, B and C were checked against the buffers above;
    // alpha and beta are f32 host scalars as CUBLAS_COMPUTE_32F* requires.
    unsafe {
        cublas_result::gemm_ex(
            *blas.handle.handle(),
            op(trans_b),
            op(trans_a),
            n as i32,
            m as i32,
            k as i32,
            (&alpha) as *const f32 as *const c_void,
            pb as *const c_void,
            T::DATA_TYPE,
            ldb as i32,
            pa as *const c_void,
            T::DATA_TYPE,
            lda as i32,
            (&beta) as *const f32 as *const c_void,
            pc as *mut c_void,
            T::DATA_TYPE,
            ldc as i32,
            blas.compute_type::<T>(),
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| Error::cuda(what, e))
}

/// Strides (in elements) between consecutive matrices of a batched GEMM.
/// A stride of 0 reuses one A or B for the whole batch (a shared weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchStrides {
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl BatchStrides {
    pub fn check(&self, op: &str, s: &GemmShape, a_len: usize, b_len: usize, c_len: usize) -> Result<()> {
        let (sa, sb, sc) = s.spans();
        if self.batch > 1 && self.stride_c < sc {
            return Err(Error::shape(format!(
                "{op}: stride_c = {} overlaps consecutive outputs of {sc} elements",
                self.stride_c
            )));
        }
        let last = self.batch.saturating_sub(1);
        let need = |stride: usize, one: usize| if self.batch == 0 { 0 } else { last * stride + one };
        s.check(op, a_len, b_len, c_len)?;
        for (name, n, have) in [
            ("A", need(self.stride_a, sa), a_len),
            ("B", need(self.stride_b, sb), b_len),
            ("C", need(self.stride_c, sc), c_len),
        ] {
            if have < n {
                return Err(Error::shape(format!(
                    "{op}: {name} has {have} elements but {} batched products need {n} ({self:?})",
                    self.batch
                )));
            }
        }
        int("batch", self.batch)?;
        for (name, v) in
            [("stride_a", self.stride_a), ("stride_b", self.stride_b), ("stride_c", self.stride_c)]
        {
            i64::try_from(v).map_err(|_| Error::shape(format!("{op}: {name} = {v} is too large")))?;
        }
        Ok(())
    }
}

/// `batch` independent row-major GEMMs: matrix `i` of each operand starts at
/// `i * stride`. Same numerics as [`gemm`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_strided_batched<T: BlasElem>(
    blas: &Blas,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &CudaView<T>,
    lda: usize,
    b: &CudaView<T>,
    ldb: usize,
    beta: f32,
    c: &mut CudaViewMut<T>,
    ldc: usize,
    strides: BatchStrides,
) -> Result<()> {
    let s = GemmShape { trans_a, trans_b, m, n, k, lda, ldb, ldc };
    let what = format!(
        "cublasGemmStridedBatchedEx {} (batch={}, m={m}, n={n}, k={k}, trans_a={trans_a}, trans_b={trans_b})",
        T::SUFFIX,
        strides.batch
    );
    strides.check(&what, &s, a.len(), b.len(), c.len())?;
    if m == 0 || n == 0 || strides.batch == 0 {
        return Ok(());
    }
    let stream = &blas.stream;
    let (pa, _ra) = a.device_ptr(stream);
    let (pb, _rb) = b.device_ptr(stream);
    let (pc, _rc) = c.device_ptr_mut(stream);
    // SAFETY: every batch member's span was checked against the buffers above.
    unsafe {
        cublas_result::gemm_strided_batched_ex(
            *blas.handle.handle(),
            op(trans_b),
            op(trans_a),
            n as i32,
            m as i32,
            k as i32,
            (&alpha) as *const f32 as *const c_void,
            pb as *const c_void,
            T::DATA_TYPE,
            ldb as i32,
            strides.stride_b as i64,
            pa as *const c_void,
            T::DATA_TYPE,
            lda as i32,
            strides.stride_a as i64,
            (&beta) as *const f32 as *const c_void,
            pc as *mut c_void,
            T::DATA_TYPE,
            ldc as i32,
            strides.stride_c as i64,
            strides.batch as i32,
            blas.compute_type::<T>(),
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| Error::cuda(what, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::rand_vec_f32;
    use half::f16;

    /// Row-major reference in f64 over the (already rounded) inputs.
    fn reference(s: &GemmShape, alpha: f32, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
        for i in 0..s.m {
            for j in 0..s.n {
                let mut acc = 0f64;
                for p in 0..s.k {
                    let av = if s.trans_a { a[p * s.lda + i] } else { a[i * s.lda + p] };
                    let bv = if s.trans_b { b[j * s.ldb + p] } else { b[p * s.ldb + j] };
                    acc += av as f64 * bv as f64;
                }
                let o = &mut c[i * s.ldc + j];
                let old = if beta == 0.0 { 0.0 } else { beta as f64 * *o as f64 };
                *o = (alpha as f64 * acc + old) as f32;
            }
        }
    }

    /// max |got - want| / max |want| over the touched elements; NaN fails.
    fn rel_err(got: &[f32], want: &[f32]) -> f32 {
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        got.iter().zip(want).fold(0f32, |m, (g, w)| {
            assert!(!g.is_nan(), "NaN in the GEMM output (unwritten or poisoned element)");
            m.max((g - w).abs() / scale)
        })
    }

    fn shape(trans_a: bool, trans_b: bool, m: usize, n: usize, k: usize, pad: usize) -> GemmShape {
        let (ac, bc) = (if trans_a { m } else { k }, if trans_b { k } else { n });
        GemmShape { trans_a, trans_b, m, n, k, lda: ac + pad, ldb: bc + pad, ldc: n + pad }
    }

    /// Runs one GEMM of element type T on the GPU and checks it against [`reference`].
    fn run_case<T: BlasElem>(
        gpu: &Gpu,
        blas: &Blas,
        s: GemmShape,
        beta: f32,
        conv: fn(f32) -> T,
        back: fn(T) -> f32,
        tol: f32,
    ) {
        let (sa, sb, sc) = s.spans();
        let round = |v: Vec<f32>| v.into_iter().map(|x| back(conv(x))).collect::<Vec<f32>>();
        let a = round(rand_vec_f32(sa, 1));
        let b = round(rand_vec_f32(sb, 2));
        // With beta = 0 the output is poisoned: cuBLAS must not read it, and
        // any element it fails to write stays NaN.
        let c0 = if beta == 0.0 { vec![f32::NAN; sc] } else { round(rand_vec_f32(sc, 3)) };
        let up =
            |v: &[f32]| gpu.stream().clone_htod(&v.iter().map(|&x| conv(x)).collect::<Vec<T>>()).unwrap();
        let (da, db, mut dc) = (up(&a), up(&b), up(&c0));
        gemm(
            blas,
            s.trans_a,
            s.trans_b,
            s.m,
            s.n,
            s.k,
            0.5,
            &da.as_view(),
            s.lda,
            &db.as_view(),
            s.ldb,
            beta,
            &mut dc.as_view_mut(),
            s.ldc,
        )
        .unwrap();
        let got: Vec<f32> = gpu.stream().clone_dtoh(&dc).unwrap().into_iter().map(back).collect();
        let mut want = c0.clone();
        reference(&s, 0.5, &a, &b, beta, &mut want);
        let (mut g, mut w) = (Vec::new(), Vec::new());
        for i in 0..s.m {
            g.extend_from_slice(&got[i * s.ldc..i * s.ldc + s.n]);
            w.extend_from_slice(&want[i * s.ldc..i * s.ldc + s.n]);
            // The padding between rows is not part of C and must be left alone.
            if i + 1 < s.m {
                for p in i * s.ldc + s.n..(i + 1) * s.ldc {
                    assert!(got[p].is_nan() == c0[p].is_nan(), "padding of C written at {p}");
                }
            }
        }
        let e = rel_err(&g, &w);
        assert!(e < tol, "{:?} beta={beta} {}: relative error {e}", s, T::SUFFIX);
    }

    #[test]
    fn gemm_matches_the_reference_for_every_transpose_f32_and_f16() {
        let Some(gpu) = crate::cuda::test_gpu("gemm_matches_the_reference_for_every_transpose_f32_and_f16")
        else {
            return;
        };
        let blas = Blas::new(&gpu, false).unwrap();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (m, n, k, pad) in [(3, 5, 7, 0), (13, 7, 33, 2), (1, 1, 1, 0), (10, 4, 2, 1)] {
                for beta in [0.0, 1.0] {
                    let s = shape(ta, tb, m, n, k, pad);
                    run_case::<f32>(&gpu, &blas, s, beta, |x| x, |x| x, 1e-5);
                    run_case::<f16>(&gpu, &blas, s, beta, f16::from_f32, f16::to_f32, 1e-2);
                }
            }
        }
    }

    #[test]
    fn tf32_mode_still_computes_the_product() {
        let Some(gpu) = crate::cuda::test_gpu("tf32_mode_still_computes_the_product") else { return };
        let blas = Blas::new(&gpu, true).unwrap();
        assert!(blas.allow_tf32());
        // TF32 keeps 10 mantissa bits of each operand: 1e-3 relative, not 1e-5.
        run_case::<f32>(&gpu, &blas, shape(false, true, 17, 9, 65, 0), 1.0, |x| x, |x| x, 2e-3);
    }

    #[test]
    fn strided_batched_gemm_matches_per_matrix_gemms_with_a_shared_operand() {
        let Some(gpu) =
            crate::cuda::test_gpu("strided_batched_gemm_matches_per_matrix_gemms_with_a_shared_operand")
        else {
            return;
        };
        let blas = Blas::new(&gpu, false).unwrap();
        let s = shape(false, true, 5, 7, 11, 0);
        let (sa, sb, sc) = s.spans();
        let batch = 3;
        // A is shared (stride 0, like a conv weight); B and C are per item, with a gap.
        let st = BatchStrides { batch, stride_a: 0, stride_b: sb + 3, stride_c: sc + 2 };
        let a = rand_vec_f32(sa, 4);
        let b = rand_vec_f32(st.stride_b * batch, 5);
        let c0 = vec![f32::NAN; st.stride_c * batch];
        let (da, db) = (gpu.stream().clone_htod(&a).unwrap(), gpu.stream().clone_htod(&b).unwrap());
        let mut dc = gpu.stream().clone_htod(&c0).unwrap();
        gemm_strided_batched(
            &blas,
            s.trans_a,
            s.trans_b,
            s.m,
            s.n,
            s.k,
            1.0,
            &da.as_view(),
            s.lda,
            &db.as_view(),
            s.ldb,
            0.0,
            &mut dc.as_view_mut(),
            s.ldc,
            st,
        )
        .unwrap();
        let got = gpu.stream().clone_dtoh(&dc).unwrap();
        for i in 0..batch {
            let mut want = vec![0f32; sc];
            reference(&s, 1.0, &a, &b[i * st.stride_b..], 0.0, &mut want);
            let e = rel_err(&got[i * st.stride_c..i * st.stride_c + sc], &want);
            assert!(e < 1e-5, "batch item {i}: relative error {e}");
            assert!(
                got[i * st.stride_c + sc..(i + 1) * st.stride_c].iter().all(|v| v.is_nan()),
                "gap written"
            );
        }
    }

    #[test]
    fn shape_check_refuses_short_buffers_and_leading_dimensions() {
        let s = shape(false, false, 3, 5, 7, 0);
        assert_eq!(s.spans(), (21, 35, 15));
        assert!(s.check("g", 21, 35, 15).is_ok());
        let e = s.check("g", 20, 35, 15).unwrap_err().to_string();
        assert!(e.contains("g: A has 20 elements but the product needs 21"), "{e}");
        let e = s.check("g", 21, 35, 14).unwrap_err().to_string();
        assert!(e.contains("C has 14 elements but the product needs 15"), "{e}");
        let t = GemmShape { trans_b: true, ldb: 5, ..s };
        let e = t.check("g", 100, 100, 100).unwrap_err().to_string();
        assert!(e.contains("ldb = 5 is less than the row length 7"), "{e}");
        // Transposed A is stored [k, m]: 7 rows of lda = 3.
        let ta = GemmShape { trans_a: true, lda: 3, ..s };
        assert_eq!(ta.spans().0, 21);
        let big = GemmShape { m: 1 << 31, ldc: 5, ..s };
        let e = big.check("g", usize::MAX, usize::MAX, usize::MAX).unwrap_err().to_string();
        assert!(e.contains("m = 2147483648 exceeds cuBLAS's 32-bit limit"), "{e}");
    }

    #[test]
    fn batch_check_refuses_overlapping_outputs_and_short_batches() {
        let s = shape(false, false, 3, 5, 7, 0);
        let ok = BatchStrides { batch: 4, stride_a: 0, stride_b: 35, stride_c: 15 };
        assert!(ok.check("b", &s, 21, 140, 60).is_ok());
        let e = ok.check("b", &s, 21, 139, 60).unwrap_err().to_string();
        assert!(e.contains("B has 139 elements but 4 batched products need 140"), "{e}");
        let overlap = BatchStrides { stride_c: 14, ..ok };
        let e = overlap.check("b", &s, 21, 140, 100).unwrap_err().to_string();
        assert!(e.contains("stride_c = 14 overlaps consecutive outputs of 15 elements"), "{e}");
        // One item may use stride 0 for C: nothing to overlap with.
        assert!(BatchStrides { batch: 1, stride_c: 0, ..ok }.check("b", &s, 21, 35, 15).is_ok());
    }
}
