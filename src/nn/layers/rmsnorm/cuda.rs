//! RMSNorm on the device: the launchers of kernels/rmsnorm.cu over a
//! `[rows, C]` view and the layer's [`DeviceLayer`]. The forward keeps each
//! row's 1/rms for the backward. With f16 parameters (O2) it runs on an f32
//! copy of the weight and rounds its gradient back once, as the CPU widens
//! them. Backward: `+=` into dW, `=` into dx.

use super::{cpu, RmsNorm};
use crate::cuda::{as_i64, cast, check_len, Rows, launch_1d, launch_rows, DeviceFloat, Gpu, KernelFn, TypedKernelFn};
use crate::error::{Error, Result};
use crate::nn::cuda::layer::{f32_param, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, Scratch, StateArgs};
use crate::nn::cuda::model::alloc;
use crate::tensor::DType;
use crate::typed_kernel;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use half::f16;

const FILE: &str = "rmsnorm.cu";
static FORWARD: TypedKernelFn = typed_kernel!(FILE, "rmsnorm_forward");
static BACKWARD_DX: TypedKernelFn = typed_kernel!(FILE, "rmsnorm_backward_dx");
static BACKWARD_PARTIALS: TypedKernelFn = typed_kernel!(FILE, "rmsnorm_backward_partials");
static BACKWARD_ACCUMULATE: KernelFn = KernelFn::new(FILE, "rmsnorm_backward_accumulate");

/// The f32 scratch [`backward`] needs with a weight: its per-chunk partial sums.
pub fn backward_workspace_len(shape: Rows) -> usize {
    shape.chunks(cpu::ROWS) * shape.c
}

fn ptr_or_null<P>(p: Option<(u64, P)>) -> (u64, Option<P>) {
    match p {
        Some((ptr, guard)) => (ptr, Some(guard)),
        None => (0, None),
    }
}

/// `y = x * rstd (* weight)` per row; `y` and `rstd` overwritten.
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    shape: Rows,
    x: &CudaView<'_, T>,
    weight: Option<&CudaView<'_, f32>>,
    eps: f32,
    y: &mut CudaViewMut<'_, T>,
    rstd: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "rmsnorm forward";
    let (rows, c) = shape.args(OP)?;
    check_len(OP, "x", x.len(), shape.numel())?;
    check_len(OP, "y", y.len(), shape.numel())?;
    if let Some(w) = weight {
        check_len(OP, "weight", w.len(), shape.c)?;
    }
    check_len(OP, "rstd", rstd.len(), shape.rows)?;
    if shape.numel() == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(&FORWARD))?;
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (wp, _w) = ptr_or_null(weight.map(|w| w.device_ptr(stream)));
    let (yp, _y) = y.device_ptr_mut(stream);
    let (rp, _r) = rstd.device_ptr_mut(stream);
    let mut b = f.launch_on(stream);
    b.arg(&xp).arg(&wp).arg(&yp).arg(&rp).arg(&rows).arg(&c).arg(&eps);
    // SAFETY: every buffer's length was checked against [rows, c] above; a
    // null weight is the kernel's elementwise_affine = False.
    unsafe { b.launch(launch_rows(shape.rows)) }.map_err(|e| Error::cuda(OP, e))
}

/// What [`backward`] reads: the forward's input and saved 1/rms, the weight.
pub struct Saved<'v, T> {
    pub x: CudaView<'v, T>,
    pub rstd: CudaView<'v, f32>,
    pub weight: Option<CudaView<'v, f32>>,
}

/// `dx` (`=`, where asked) and `dw` (`+=`, where given: the weight's, using
/// `workspace` of [`backward_workspace_len`] f32s) from `dy`. dx reads the
/// weight (none is elementwise_affine = False); dw does not.
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    shape: Rows,
    saved: &Saved<'_, T>,
    dy: &CudaView<'_, T>,
    dx: Option<&mut CudaViewMut<'_, T>>,
    dw: Option<(&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, f32>)>,
) -> Result<()> {
    const OP: &str = "rmsnorm backward";
    let (rows, c) = shape.args(OP)?;
    check_len(OP, "x", saved.x.len(), shape.numel())?;
    check_len(OP, "dy", dy.len(), shape.numel())?;
    check_len(OP, "rstd", saved.rstd.len(), shape.rows)?;
    if let Some(w) = &saved.weight {
        check_len(OP, "weight", w.len(), shape.c)?;
    }
    if shape.numel() == 0 {
        return Ok(());
    }
    let stream = gpu.stream();
    let (xp, _x) = saved.x.device_ptr(stream);
    let (rp, _r) = saved.rstd.device_ptr(stream);
    let (gp, _g) = dy.device_ptr(stream);
    if let Some(dx) = dx {
        check_len(OP, "dx", dx.len(), shape.numel())?;
        let (wp, _w) = ptr_or_null(saved.weight.as_ref().map(|w| w.device_ptr(stream)));
        let (dxp, _dx) = dx.device_ptr_mut(stream);
        let f = gpu.kernel(T::pick(&BACKWARD_DX))?;
        let mut b = f.launch_on(stream);
        b.arg(&xp).arg(&wp).arg(&rp).arg(&gp).arg(&dxp).arg(&rows).arg(&c);
        // SAFETY: x, dy, dx are [rows, c], rstd [rows], a weight [c] (checked).
        unsafe { b.launch(launch_rows(shape.rows)) }.map_err(|e| Error::cuda(format!("{OP} (dx)"), e))?;
    }
    let Some((dw, workspace)) = dw else { return Ok(()) };
    check_len(OP, "weight.grad", dw.len(), shape.c)?;
    check_len(OP, "workspace", workspace.len(), backward_workspace_len(shape))?;
    let (pwp, _pw) = workspace.device_ptr_mut(stream);
    {
        let f = gpu.kernel(T::pick(&BACKWARD_PARTIALS))?;
        let mut b = f.launch_on(stream);
        let chunk_rows = cpu::ROWS as i64;
        b.arg(&xp).arg(&rp).arg(&gp).arg(&pwp).arg(&rows).arg(&c).arg(&chunk_rows);
        // SAFETY: as above; the workspace holds chunks * c (checked).
        unsafe { b.launch(launch_1d(shape.chunks(cpu::ROWS) * shape.c)) }
            .map_err(|e| Error::cuda(format!("{OP} (partials)"), e))?;
    }
    let (dwp, _dw) = dw.device_ptr_mut(stream);
    let chunks = as_i64(OP, shape.chunks(cpu::ROWS))?;
    let f = gpu.kernel(&BACKWARD_ACCUMULATE)?;
    let mut b = f.launch_on(stream);
    b.arg(&pwp).arg(&dwp).arg(&chunks).arg(&c);
    // SAFETY: the partials were written above; dw holds c (checked).
    unsafe { b.launch(launch_1d(shape.c)) }.map_err(|e| Error::cuda(format!("{OP} (accumulate)"), e))
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNormPlan {
    /// Over the last `c` values of each of a sample's `rows` rows.
    pub c: usize,
    pub rows: usize,
    pub eps: f32,
    /// The weight's dtype (f16 under O2); `None` without one.
    pub weight: Option<DType>,
}

impl RmsNormPlan {
    fn shape(&self, n: usize) -> Rows {
        Rows { rows: n * self.rows, c: self.c }
    }
}

/// Each row's 1/rms of the last training forward, for up to the largest batch.
pub struct RmsState {
    rstd: CudaSlice<f32>,
}


impl DeviceLayer for RmsNorm {
    type Plan = RmsNormPlan;
    type State = RmsState;

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(RmsNormPlan, Needs)> {
        let c = self.normalized_shape;
        let rows = a.in_numel() / c.max(1);
        if rows * c != a.in_numel() || a.out_numel() != a.in_numel() {
            return Err(a.bad(format!("is not an rmsnorm over {c}")));
        }
        let weight = self.elementwise_affine.then(|| a.param_dtype(0)).transpose()?;
        let p = RmsNormPlan { c, rows, eps: self.eps, weight };
        // The f32 weight and its gradient, then the backward's partial sums.
        let mut s = Scratch::default();
        s.push(DType::F32, c).push(DType::F32, c).push(DType::F32, backward_workspace_len(p.shape(a.max_batch)));
        Ok((p, Needs::new().reads_input().scratch(s)))
    }

    fn state(p: &RmsNormPlan, a: &StateArgs<'_>) -> Result<RmsState> {
        Ok(RmsState { rstd: alloc(a.gpu, p.rows * a.max_batch)? })
    }

    fn forward<A: Elem>(p: &RmsNormPlan, s: &mut RmsState, f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, n, params, x, mut y, mut ws, .. } = f;
        let shape = p.shape(n);
        let [mut w32] = ws.take::<f32, 1>([p.c])?;
        let w = p.weight.map(|dt| f32_param(gpu, &params, &mut w32, 0, dt)).transpose()?;
        // Allocated for the largest batch.
        let mut rstd = s.rstd.slice_mut(0..shape.rows);
        forward(gpu, shape, &x, w.as_ref(), p.eps, &mut y, &mut rstd)
    }

    fn backward<A: Elem>(p: &RmsNormPlan, s: &RmsState, b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, n, mut params, x, dy, mut dx, mut ws, .. } = b;
        let shape = p.shape(n);
        let x = crate::nn::cuda::layer::read(x, "input")?;
        let [mut w32, mut dw32, mut sums] = ws.take::<f32, 3>([p.c, p.c, backward_workspace_len(shape)])?;
        let rstd = s.rstd.slice(0..shape.rows);
        let Some(dt) = p.weight else {
            let saved = Saved { x, rstd, weight: None };
            return backward(gpu, shape, &saved, &dy, dx.as_mut(), None);
        };
        match dt {
            DType::F32 => params.with_weight_and_grads::<f32, f32, ()>(|w, (dw, _)| {
                let saved = Saved { x, rstd, weight: Some(w.slice(0..p.c)) };
                backward(gpu, shape, &saved, &dy, dx.as_mut(), Some((dw, &mut sums)))
            }),
            // An f16 .grad (O2): accumulated in f32, rounded once.
            DType::F16 => {
                cast::f16_to_f32(gpu, &params.value::<f16>(0)?, &mut w32)?;
                let saved = Saved { x, rstd, weight: Some(w32.as_view()) };
                params.with_grads::<f16, ()>(|(dw, _)| {
                    cast::f16_to_f32(gpu, &*dw, &mut dw32)?;
                    backward(gpu, shape, &saved, &dy, dx.as_mut(), Some((&mut dw32, &mut sums)))?;
                    cast::f32_to_f16(gpu, &dw32, dw)
                })
            }
        }
    }
}
