//! BatchNorm2d over NCHW tensors with PyTorch's semantics: training normalizes
//! with the biased batch variance and moves the running variance towards the
//! unbiased one; weight/bias gradients accumulate like `.grad`.

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_f16;
pub mod cpu;
pub mod cuda;
pub mod f16;
pub mod f16_pool;
pub mod fused_cpu;
pub mod sync;

use super::half_emu::{any_f16, f32_acc, f32_of, store};
use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, Tensor};

// The arguments of the BatchNorm ops, named as PyTorch names them, so no two
// buffers of one type are passed by position. Generic over how the CPU ops
// (`&Tensor`, `Vec<f32>`) and the device launchers (`&CudaView<f32>`,
// `&mut CudaViewMut<f32>`) hold them; [`cuda`] takes the same shapes.

/// The affine parameters `weight` (gamma) and `bias` (beta), per channel.
#[derive(Debug, Clone, Copy)]
pub struct BnParams<P> {
    pub weight: P,
    pub bias: P,
}

/// The `running_mean` and `running_var` buffers: read by the eval forward,
/// moved by the training forward.
#[derive(Debug)]
pub struct RunningStats<S> {
    pub running_mean: S,
    pub running_var: S,
}

impl<T: ?Sized> RunningStats<&mut T> {
    /// The same buffers, borrowed again for a call that does not keep them.
    pub fn reborrow(&mut self) -> RunningStats<&mut T> {
        RunningStats { running_mean: &mut *self.running_mean, running_var: &mut *self.running_var }
    }
}

/// A training forward's hyper-parameters: the running statistics move by
/// `momentum` (`running = (1 - momentum) * running + momentum * batch`) and
/// `eps` is added to the batch variance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BnHyper {
    pub momentum: f32,
    pub eps: f32,
}

impl Default for BnHyper {
    /// PyTorch's BatchNorm2d defaults.
    fn default() -> Self {
        BnHyper { momentum: 0.1, eps: 1e-5 }
    }
}

/// The batch statistics a training forward saves for backward, per channel:
/// `mean` and `invstd = 1 / sqrt(biased_var + eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SavedStats<S> {
    pub mean: S,
    pub invstd: S,
}

/// The `.grad` of `weight` and `bias` that a backward adds into.
#[derive(Debug)]
pub struct BnGrads<G> {
    pub dweight: G,
    pub dbias: G,
}

impl<T: ?Sized> BnGrads<&mut T> {
    /// The same buffers, borrowed again for a call that does not keep them.
    pub fn reborrow(&mut self) -> BnGrads<&mut T> {
        BnGrads { dweight: &mut *self.dweight, dbias: &mut *self.dbias }
    }
}

/// What backward needs from the training forward, per channel.
pub type BatchNormSaved = SavedStats<Vec<f32>>;

fn unsupported(op: &str, t: &Tensor) -> Error {
    Error::Unsupported(format!(
        "batch_norm {op} on {:?} tensors: this path takes host f32 (f16 is widened before it)",
        t.dtype()
    ))
}

/// The CPU f32 data of a parameter-like tensor, after checking it is `[c]`.
fn param<'a>(op: &str, what: &str, t: &'a Tensor, c: usize) -> Result<&'a [f32]> {
    t.check_shape(&format!("batch_norm {op}: {what}"), &[c])?;
    match t.storage() {
        CpuStorage::F32(v) => Ok(v),
        _ => Err(unsupported(op, t)),
    }
}

fn param_mut<'a>(op: &str, what: &str, t: &'a mut Tensor, c: usize) -> Result<&'a mut [f32]> {
    t.check_shape(&format!("batch_norm {op}: {what}"), &[c])?;
    if !matches!(t.storage(), CpuStorage::F32(_)) {
        return Err(unsupported(op, t));
    }
    t.as_f32_mut()
}

/// `(n, c, h*w)` of an NCHW input.
fn dims(op: &str, x: &Tensor) -> Result<(usize, usize, usize)> {
    match *x.shape() {
        [n, c, h, w] => Ok((n, c, h * w)),
        _ => Err(Error::shape(format!(
            "batch_norm {op}: expected a 4-D [N, C, H, W] input, got shape {:?}",
            x.shape()
        ))),
    }
}

/// [`forward_train`] of an f16 `x` with f32 parameters and running
/// statistics (O2), followed by `then` in the same pass; `None` for other
/// dtypes.
fn forward_train_f16(
    op: &str,
    x: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&mut Tensor>,
    hyper: BnHyper,
    then: f16::Then<'_>,
) -> Option<Result<(Tensor, BatchNormSaved)>> {
    let CpuStorage::F16(xs) = x.storage() else {
        return None;
    };
    let RunningStats { running_mean, running_var } = running;
    if !all_f32([params.weight, params.bias, running_mean, running_var]) {
        return None;
    }
    Some((|| {
        let (n, c, hw) = dims(op, x)?;
        if n * hw <= 1 {
            return Err(too_few(op, x));
        }
        let w = param(op, "weight", params.weight, c)?;
        let b = param(op, "bias", params.bias, c)?;
        let sums = f16::local_sums(xs, n, c, hw);
        let stats = cpu::batch_stats::<f32>(&sums.sum, &sums.sumsq, sums.count, f64::from(hyper.eps));
        let out = f16::normalize_affine_then(xs, (c, hw), (&stats.mean, &stats.invstd), (w, b), then);
        let rm = param_mut(op, "running_mean", running_mean, c)?;
        let rv = param_mut(op, "running_var", running_var, c)?;
        cpu::update_running(rm, rv, &stats, hyper.momentum);
        let saved = BatchNormSaved { mean: stats.mean, invstd: stats.invstd };
        Ok((Tensor::from_f16_vec(x.shape(), out)?, saved))
    })())
}

/// `relu(forward_train(x, ...))`: the BatchNorm output, rounded to x's dtype,
/// then ReLU, in one pass for f16 `x` with f32 parameters; the two ops in
/// sequence otherwise. The same values and running statistics either way.
pub fn forward_train_relu(
    x: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&mut Tensor>,
    hyper: BnHyper,
) -> Result<(Tensor, BatchNormSaved)> {
    const OP: &str = "forward_train";
    let mut running = running;
    if let Some(r) = forward_train_f16(OP, x, params, running.reborrow(), hyper, f16::Then::Relu) {
        return r;
    }
    let (mut y, saved) = forward_train(x, params, running, hyper)?;
    super::relu::forward_(&mut y)?;
    Ok((y, saved))
}

/// `relu(forward_train(x, ...) + other)`: a residual block's last
/// BatchNorm, the add of the shortcut and the ReLU after it. For f16 `x`
/// and `other` on the host with f32 parameters, the statistics' pass and
/// one more that reads `x` and `other` and writes the ReLU's output (the
/// three ops in sequence wrote and read back BatchNorm's output and the
/// sum); the ops in sequence otherwise. The same values and running
/// statistics either way, bit for bit (addition commutes, so which
/// operand of the add `other` was does not matter).
pub fn forward_train_add_relu(
    x: &Tensor,
    other: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&mut Tensor>,
    hyper: BnHyper,
) -> Result<(Tensor, BatchNormSaved)> {
    const OP: &str = "forward_train";
    let mut running = running;
    if let (CpuStorage::F16(os), true) = (other.storage(), other.shape() == x.shape()) {
        if let Some(r) = forward_train_f16(OP, x, params, running.reborrow(), hyper, f16::Then::AddRelu(os)) {
            return r;
        }
    }
    let (z, saved) = forward_train(x, params, running, hyper)?;
    let mut y = super::add::forward(&z, other)?;
    super::relu::forward_(&mut y)?;
    Ok((y, saved))
}

/// Whether [`backward_relu`] takes the backward of [`forward_train_relu`]
/// of this `x`: f16 on the host with f32 parameters (apex O2's
/// `keep_batchnorm_fp32`), on a CPU with the AVX-512 kernels that recompute
/// ReLU's output. Elsewhere ReLU's output is kept for its own backward.
pub fn backward_relu_fits(x: &Tensor, params: BnParams<&Tensor>) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx512::usable() {
        return matches!(x.storage(), CpuStorage::F16(_)) && all_f32([params.weight, params.bias]);
    }
    let _ = (x, params);
    false
}

/// Backward of [`forward_train_relu`] from `dy`, the gradient at ReLU's
/// output, without that output: ReLU's mask is recomputed from `x`, the
/// saved statistics and the parameters as the forward rounded them, inside
/// BatchNorm's backward kernels. The same values, bit for bit, as ReLU's
/// backward and then [`backward`], without the copy of ReLU's output the
/// forward would keep or a pass over `dy`. Only where [`backward_relu_fits`].
pub fn backward_relu(
    x: &Tensor,
    params: BnParams<&Tensor>,
    saved: &BatchNormSaved,
    dy: &Tensor,
    grads: BnGrads<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "backward_relu";
    let (CpuStorage::F16(xs), CpuStorage::F16(dys), true) =
        (x.storage(), dy.storage(), backward_relu_fits(x, params))
    else {
        return Err(Error::internal(format!(
            "batch_norm {OP}: needs f16 x and dy on an AVX-512 CPU with f32 parameters, got x {:?}, dy {:?}",
            x.dtype(),
            dy.dtype()
        )));
    };
    let (n, c, hw) = backward_dims(OP, x, saved, dy)?;
    let w = param(OP, "weight", params.weight, c)?;
    let b = param(OP, "bias", params.bias, c)?;
    let dw = param_mut(OP, "dweight", grads.dweight, c)?;
    let db = param_mut(OP, "dbias", grads.dbias, c)?;
    let (scale, shift) = cpu::affine_coefficients(c, &saved.mean, &saved.invstd, w, b);
    let relu = Some(f16::ReluAfter { scale: &scale, shift: &shift });
    let sums = f16::backward_sums(xs, dys, n, c, hw, &saved.mean, &saved.invstd, relu);
    add_param_grads(dw, db, &sums);
    let dx = f16::backward_dx(xs, dys, c, hw, &saved.mean, &saved.invstd, w, &sums, n * hw, relu);
    Tensor::from_f16_vec(x.shape(), dx)
}

fn all_f32<const K: usize>(ts: [&Tensor; K]) -> bool {
    ts.iter().all(|t| matches!(t.storage(), CpuStorage::F32(_)))
}

fn too_few(op: &str, x: &Tensor) -> Error {
    Error::shape(format!(
        "batch_norm {op}: expected more than 1 value per channel when training, got input shape {:?}",
        x.shape()
    ))
}

/// The f16 arm of a training forward (O3, or O2's f16 activations): `op`
/// runs on f32 copies, so the statistics are f32; the output comes back in
/// x's dtype and the running statistics are rounded to their own dtype once.
/// `None` when every operand is f32.
pub(super) fn forward_widened<R>(
    x: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&mut Tensor>,
    op: impl FnOnce(&Tensor, BnParams<&Tensor>, RunningStats<&mut Tensor>) -> Result<(Tensor, R)>,
) -> Option<Result<(Tensor, R)>> {
    let BnParams { weight, bias } = params;
    let RunningStats { running_mean, running_var } = running;
    if !any_f16([Some(x), Some(weight), Some(bias), Some(&*running_mean), Some(&*running_var)]) {
        return None;
    }
    let (mut rm, mut rv) = (f32_acc(running_mean), f32_acc(running_var));
    Some((|| {
        let (w, b) = (f32_of(weight), f32_of(bias));
        let params = BnParams { weight: &*w, bias: &*b };
        let (y, r) = op(&f32_of(x), params, RunningStats { running_mean: &mut rm, running_var: &mut rv })?;
        store(running_mean, &rm)?;
        store(running_var, &rv)?;
        Ok((y.into_dtype(x.dtype()), r))
    })())
}

/// The f16 arm of a training backward: `op` runs on f32 copies, dx comes back
/// in x's dtype and the parameter gradients are accumulated in f32 and
/// rounded once. `None` when every operand is f32.
pub(super) fn backward_widened(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
    grads: BnGrads<&mut Tensor>,
    op: impl FnOnce(&Tensor, &Tensor, &Tensor, BnGrads<&mut Tensor>) -> Result<Tensor>,
) -> Option<Result<Tensor>> {
    let BnGrads { dweight, dbias } = grads;
    if !any_f16([Some(x), Some(weight), Some(dy), Some(&*dweight), Some(&*dbias)]) {
        return None;
    }
    let (mut dw, mut db) = (f32_acc(dweight), f32_acc(dbias));
    Some((|| {
        let dx = op(&f32_of(x), &f32_of(weight), &f32_of(dy), BnGrads { dweight: &mut dw, dbias: &mut db })?;
        store(dweight, &dw)?;
        store(dbias, &db)?;
        Ok(dx.into_dtype(x.dtype()))
    })())
}

/// Training-mode forward: normalizes with the batch statistics, updates the
/// running statistics in place, and returns what backward needs.
pub fn forward_train(
    x: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&mut Tensor>,
    hyper: BnHyper,
) -> Result<(Tensor, BatchNormSaved)> {
    const OP: &str = "forward_train";
    let mut running = running;
    if let Some(r) = forward_train_f16(OP, x, params, running.reborrow(), hyper, f16::Then::Nothing) {
        return r;
    }
    if let Some(r) = forward_widened(x, params, running.reborrow(), |x, p, r| forward_train(x, p, r, hyper)) {
        return r;
    }
    let RunningStats { running_mean, running_var } = running;
    let (n, c, hw) = dims(OP, x)?;
    if n * hw <= 1 {
        return Err(too_few(OP, x));
    }
    match x.storage() {
        CpuStorage::F32(xs) => {
            let w = param(OP, "weight", params.weight, c)?;
            let b = param(OP, "bias", params.bias, c)?;
            let sums = cpu::local_sums(xs, n, c, hw);
            let stats = cpu::batch_stats::<f32>(&sums.sum, &sums.sumsq, sums.count, f64::from(hyper.eps));
            let mut out = vec![0.0f32; xs.len()];
            cpu::normalize_affine(xs, c, hw, &stats.mean, &stats.invstd, w, b, &mut out);
            let rm = param_mut(OP, "running_mean", running_mean, c)?;
            let rv = param_mut(OP, "running_var", running_var, c)?;
            cpu::update_running(rm, rv, &stats, hyper.momentum);
            let saved = BatchNormSaved { mean: stats.mean, invstd: stats.invstd };
            Ok((Tensor::from_vec(x.shape(), out)?, saved))
        }
        _ => Err(unsupported(OP, x)),
    }
}

/// Evaluation-mode forward: normalizes with the running statistics.
pub fn forward_eval(
    x: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&Tensor>,
    eps: f32,
) -> Result<Tensor> {
    const OP: &str = "forward_eval";
    let (BnParams { weight, bias }, RunningStats { running_mean, running_var }) = (params, running);
    if any_f16([Some(x), Some(weight), Some(bias), Some(running_mean), Some(running_var)]) {
        let (w, b, rm, rv) = (f32_of(weight), f32_of(bias), f32_of(running_mean), f32_of(running_var));
        let params = BnParams { weight: &*w, bias: &*b };
        let running = RunningStats { running_mean: &*rm, running_var: &*rv };
        return Ok(forward_eval(&f32_of(x), params, running, eps)?.into_dtype(x.dtype()));
    }
    let (_, c, hw) = dims(OP, x)?;
    match x.storage() {
        CpuStorage::F32(xs) => {
            let w = param(OP, "weight", weight, c)?;
            let b = param(OP, "bias", bias, c)?;
            let rm = param(OP, "running_mean", running_mean, c)?;
            let rv = param(OP, "running_var", running_var, c)?;
            let invstd = cpu::invstd_from_var(rv, eps);
            let mut out = vec![0.0f32; xs.len()];
            cpu::normalize_affine(xs, c, hw, rm, &invstd, w, b, &mut out);
            Tensor::from_vec(x.shape(), out)
        }
        _ => Err(unsupported(OP, x)),
    }
}

/// Training-mode backward: returns dx and adds the weight and bias gradients
/// into `dweight` and `dbias`.
pub fn backward(
    x: &Tensor,
    weight: &Tensor,
    saved: &BatchNormSaved,
    dy: &Tensor,
    grads: BnGrads<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "backward";
    let mut grads = grads;
    if let (CpuStorage::F16(xs), CpuStorage::F16(dys), true) =
        (x.storage(), dy.storage(), all_f32([weight, &*grads.dweight, &*grads.dbias]))
    {
        let (n, c, hw) = backward_dims(OP, x, saved, dy)?;
        let w = param(OP, "weight", weight, c)?;
        let dw = param_mut(OP, "dweight", &mut *grads.dweight, c)?;
        let db = param_mut(OP, "dbias", &mut *grads.dbias, c)?;
        let sums = f16::backward_sums(xs, dys, n, c, hw, &saved.mean, &saved.invstd, None);
        add_param_grads(dw, db, &sums);
        let dx = f16::backward_dx(xs, dys, c, hw, &saved.mean, &saved.invstd, w, &sums, n * hw, None);
        return Tensor::from_f16_vec(x.shape(), dx);
    }
    if let Some(r) =
        backward_widened(x, weight, dy, grads.reborrow(), |x, w, dy, g| backward(x, w, saved, dy, g))
    {
        return r;
    }
    let BnGrads { dweight, dbias } = grads;
    let (n, c, hw) = backward_dims(OP, x, saved, dy)?;
    match (x.storage(), dy.storage()) {
        (CpuStorage::F32(xs), CpuStorage::F32(dys)) => {
            let w = param(OP, "weight", weight, c)?;
            // Both gradients are validated before either is written.
            let dw = param_mut(OP, "dweight", dweight, c)?;
            let db = param_mut(OP, "dbias", dbias, c)?;
            let sums = cpu::backward_sums(xs, dys, n, c, hw, &saved.mean, &saved.invstd);
            add_param_grads(dw, db, &sums);
            let mut dx = vec![0.0f32; xs.len()];
            cpu::backward_dx(xs, dys, c, hw, &saved.mean, &saved.invstd, w, &sums, n * hw, &mut dx);
            Tensor::from_vec(x.shape(), dx)
        }
        (CpuStorage::F32(_), _) => Err(unsupported(OP, dy)),
        _ => Err(unsupported(OP, x)),
    }
}

/// `(n, c, h*w)` of a backward's `x`, after checking `dy` and the saved
/// statistics fit it.
fn backward_dims(op: &str, x: &Tensor, saved: &BatchNormSaved, dy: &Tensor) -> Result<(usize, usize, usize)> {
    let (n, c, hw) = dims(op, x)?;
    dy.check_shape(&format!("batch_norm {op}: dy (must match x)"), x.shape())?;
    if saved.mean.len() != c || saved.invstd.len() != c {
        return Err(Error::shape(format!(
            "batch_norm {op}: saved statistics have {} means and {} invstds for {c} channels",
            saved.mean.len(),
            saved.invstd.len()
        )));
    }
    Ok((n, c, hw))
}

/// `.grad += ` the backward sums (rounded from f64 once).
fn add_param_grads(dw: &mut [f32], db: &mut [f32], sums: &cpu::BackwardSums) {
    for (g, &s) in dw.iter_mut().zip(&sums.sum_dy_xhat) {
        *g += s as f32;
    }
    for (g, &s) in db.iter_mut().zip(&sums.sum_dy) {
        *g += s as f32;
    }
}

/// What the fused BatchNorm + ReLU + MaxPool2d(2, 2) backward needs: the BN
/// statistics and one window code per pooled element (see [`fused_cpu`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BnReluPoolSaved {
    pub stats: BatchNormSaved,
    pub codes: Vec<u8>,
}

/// `(n, c, h, w)` of an input the fused block takes: 4-D with even H and W
/// (where 2x2 stride-2 pooling covers every element).
fn fused_dims(op: &str, x: &Tensor) -> Result<(usize, usize, usize, usize)> {
    match *x.shape() {
        [n, c, h, w] if h % 2 == 0 && w % 2 == 0 => Ok((n, c, h, w)),
        _ => Err(Error::shape(format!(
            "batch_norm {op}: expected a 4-D [N, C, H, W] input with even H and W, got shape {:?}",
            x.shape()
        ))),
    }
}

/// `max_pool2d(relu(batch_norm_train(x)), 2, 2)` in one pass, with the same
/// values and running-statistics update as the three ops in sequence, for
/// f32 `x`, or f16 `x` with f32 parameters and running statistics (O2; see
/// [`f16_pool`]). Returns the pooled `[N, C, H/2, W/2]` tensor and what the
/// backward needs.
pub fn forward_train_relu_maxpool2(
    x: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&mut Tensor>,
    hyper: BnHyper,
) -> Result<(Tensor, BnReluPoolSaved)> {
    const OP: &str = "forward_train_relu_maxpool2";
    let (BnParams { weight, bias }, RunningStats { running_mean, running_var }) = (params, running);
    let BnHyper { momentum, eps } = hyper;
    let (n, c, h, w) = fused_dims(OP, x)?;
    if n * h * w <= 1 {
        return Err(Error::shape(format!(
            "batch_norm {OP}: expected more than 1 value per channel when training, got input shape {:?}",
            x.shape()
        )));
    }
    match x.storage() {
        CpuStorage::F32(xs) => {
            let wt = param(OP, "weight", weight, c)?;
            let b = param(OP, "bias", bias, c)?;
            let sums = cpu::local_sums(xs, n, c, h * w);
            let stats = cpu::batch_stats::<f32>(&sums.sum, &sums.sumsq, sums.count, f64::from(eps));
            let (scale, shift) = cpu::affine_coefficients(c, &stats.mean, &stats.invstd, wt, b);
            let len = n * c * (h / 2) * (w / 2);
            let mut out = vec![0.0f32; len];
            let mut codes = vec![0u8; len];
            fused_cpu::forward(xs, c, h, w, &scale, &shift, &mut out, &mut codes);
            let rm = param_mut(OP, "running_mean", running_mean, c)?;
            let rv = param_mut(OP, "running_var", running_var, c)?;
            cpu::update_running(rm, rv, &stats, momentum);
            let saved =
                BnReluPoolSaved { stats: BatchNormSaved { mean: stats.mean, invstd: stats.invstd }, codes };
            Ok((Tensor::from_vec(&[n, c, h / 2, w / 2], out)?, saved))
        }
        CpuStorage::F16(xs) if all_f32([weight, bias, &*running_mean, &*running_var]) => {
            let wt = param(OP, "weight", weight, c)?;
            let b = param(OP, "bias", bias, c)?;
            let sums = f16::local_sums(xs, n, c, h * w);
            let stats = cpu::batch_stats::<f32>(&sums.sum, &sums.sumsq, sums.count, f64::from(eps));
            let (scale, shift) = cpu::affine_coefficients(c, &stats.mean, &stats.invstd, wt, b);
            let len = n * c * (h / 2) * (w / 2);
            let mut out = vec![half::f16::ZERO; len];
            let mut codes = vec![0u8; len];
            f16_pool::forward(xs, c, h, w, &scale, &shift, &mut out, &mut codes);
            let rm = param_mut(OP, "running_mean", running_mean, c)?;
            let rv = param_mut(OP, "running_var", running_var, c)?;
            cpu::update_running(rm, rv, &stats, momentum);
            let saved =
                BnReluPoolSaved { stats: BatchNormSaved { mean: stats.mean, invstd: stats.invstd }, codes };
            Ok((Tensor::from_f16_vec(&[n, c, h / 2, w / 2], out)?, saved))
        }
        _ => Err(unsupported(OP, x)),
    }
}

/// Backward of [`forward_train_relu_maxpool2`] for the pooled gradient `dy`:
/// returns dx (shape of `x`) and adds into `dweight` and `dbias`. Takes the
/// saved input by value: dx is written over it, its last use.
pub fn backward_relu_maxpool2(
    x: Tensor,
    weight: &Tensor,
    saved: &BnReluPoolSaved,
    dy: &Tensor,
    grads: BnGrads<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "backward_relu_maxpool2";
    let BnGrads { dweight, dbias } = grads;
    let (n, c, h, w) = fused_dims(OP, &x)?;
    dy.check_shape(&format!("batch_norm {OP}: dy (must be x pooled 2x2)"), &[n, c, h / 2, w / 2])?;
    let stats = &saved.stats;
    if stats.mean.len() != c || stats.invstd.len() != c || saved.codes.len() != dy.numel() {
        return Err(Error::shape(format!(
            "batch_norm {OP}: saved state ({} means, {} invstds, {} codes) does not fit input shape {:?}",
            stats.mean.len(),
            stats.invstd.len(),
            saved.codes.len(),
            x.shape()
        )));
    }
    let shape = x.shape().to_vec();
    match (x.storage(), dy.storage()) {
        (CpuStorage::F32(_), CpuStorage::F32(dys)) => {
            let wt = param(OP, "weight", weight, c)?;
            let dw = param_mut(OP, "dweight", dweight, c)?;
            let db = param_mut(OP, "dbias", dbias, c)?;
            let codes = &saved.codes;
            let mut xs = x.into_f32_vec()?;
            let sums = fused_cpu::backward_sums(&xs, dys, codes, n, c, h, w, &stats.mean, &stats.invstd);
            for (g, &s) in dw.iter_mut().zip(&sums.sum_dy_xhat) {
                *g += s as f32;
            }
            for (g, &s) in db.iter_mut().zip(&sums.sum_dy) {
                *g += s as f32;
            }
            let count = n * h * w;
            fused_cpu::backward_dx(
                &mut xs,
                dys,
                codes,
                c,
                h,
                w,
                &stats.mean,
                &stats.invstd,
                wt,
                &sums,
                count,
            );
            Tensor::from_vec(&shape, xs)
        }
        (CpuStorage::F32(_), _) => Err(unsupported(OP, dy)),
        (CpuStorage::F16(_), _) if all_f32([weight, &*dweight, &*dbias]) => {
            let wt = param(OP, "weight", weight, c)?;
            let dw = param_mut(OP, "dweight", dweight, c)?;
            let db = param_mut(OP, "dbias", dbias, c)?;
            let (codes, count) = (&saved.codes, n * h * w);
            let (mean, invstd) = (&stats.mean, &stats.invstd);
            let mut xs = x.into_f16_vec()?;
            match dy.storage() {
                CpuStorage::F16(d) => {
                    let sums = f16_pool::backward_sums(&xs, d, codes, n, c, h, w, mean, invstd);
                    add_param_grads(dw, db, &sums);
                    f16_pool::backward_dx(&mut xs, d, codes, c, h, w, mean, invstd, wt, &sums, count);
                }
                CpuStorage::F32(d) => {
                    let sums = f16_pool::backward_sums(&xs, d, codes, n, c, h, w, mean, invstd);
                    add_param_grads(dw, db, &sums);
                    f16_pool::backward_dx(&mut xs, d, codes, c, h, w, mean, invstd, wt, &sums, count);
                }
            }
            Tensor::from_f16_vec(&shape, xs)
        }
        _ => Err(unsupported(OP, &x)),
    }
}

#[cfg(test)]
mod tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_avx512;
#[cfg(test)]
mod tests_f16;
#[cfg(test)]
mod tests_f16_pool;
#[cfg(test)]
mod tests_fused;
