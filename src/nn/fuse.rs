//! Which runs of layers the model hands to one fused kernel: BatchNorm2d +
//! ReLU + MaxPool2d(2, 2) on f32 activations and on f16 ones with f32
//! BatchNorm state (O2), BatchNorm2d + ReLU on other f16 ones, and a
//! residual block's end (BatchNorm2d + the add + ReLU) on f16 ones.

use super::layers::batchnorm2d::{parts, BatchNorm2d, Parts};
use super::layers::maxpool2d::MaxPool2d;
use super::layers::LayerKind;
use super::Node;
use crate::tensor::{CpuStorage, DType, Tensor};

fn is_cpu_f32(t: &Tensor) -> bool {
    matches!(t.storage(), CpuStorage::F32(_))
}

fn is_cpu_f16(t: &Tensor) -> bool {
    matches!(t.storage(), CpuStorage::F16(_))
}

/// The BatchNorm2d heading `layers` when it is followed by ReLU and
/// MaxPool2d(2, 2) and the fused kernel takes `x` (host f32, or f16 with f32
/// BatchNorm state; even H and W, more than one value per channel);
/// otherwise the layers run one by one.
pub(super) fn fusable_bn_relu_pool<'a>(
    layers: &'a mut [Node],
    x: &Tensor,
) -> Option<(&'a BatchNorm2d, Parts<'a>)> {
    let [Node { kind: LayerKind::BatchNorm2d(bn), weights, sync, tie: None }, Node { kind: LayerKind::Relu(_), .. }, Node { kind: LayerKind::MaxPool2d(MaxPool2d { kernel_size: 2, stride: 2 }), .. }, ..] =
        layers
    else {
        return None;
    };
    let &[n, _, h, w] = x.shape() else {
        return None;
    };
    // SyncBatchNorm reduces its statistics across ranks: the fused kernel does not.
    if sync.is_some() {
        return None;
    }
    let p = parts(weights).ok()?;
    let fits = h % 2 == 0 && w % 2 == 0 && n * h * w > 1;
    let f32_params = is_cpu_f32(&p.weight.value) && is_cpu_f32(&p.bias.value);
    // f16 activations with f32 BatchNorm state (O2); O3's f16 BatchNorm runs
    // as the f16 BN + ReLU pair below.
    let f16_o2 = is_cpu_f16(x) && f32_params && is_cpu_f32(p.running_mean) && is_cpu_f32(p.running_var);
    let supported = (is_cpu_f32(x) && f32_params) || f16_o2;
    (fits && supported).then_some((&*bn, p))
}

/// The BatchNorm2d heading `layers` when ReLU follows it and `x` is f16 (O2,
/// O3): one pass writes ReLU's output, and the layers save what they would
/// have saved one by one. SyncBatchNorm runs on its own.
pub(super) fn fusable_bn_relu_f16<'a>(
    layers: &'a mut [Node],
    x: &Tensor,
) -> Option<(&'a BatchNorm2d, Parts<'a>)> {
    let [Node { kind: LayerKind::BatchNorm2d(bn), weights, sync, tie: None }, Node { kind: LayerKind::Relu(_), .. }, ..] =
        layers
    else {
        return None;
    };
    if x.dtype() != DType::F16 || sync.is_some() {
        return None;
    }
    Some((&*bn, parts(weights).ok()?))
}

/// The BatchNorm2d heading `layers` when an add of its output and one other
/// value follows, then ReLU, and `x` is f16 (O2, O3): a residual block's
/// end, whose BatchNorm output and sum are then never stored (see
/// `ops::batch_norm::forward_train_add_relu`). The caller checks the
/// values' readers. SyncBatchNorm runs on its own.
pub(super) fn fusable_bn_add_relu<'a>(
    layers: &'a mut [Node],
    x: &Tensor,
) -> Option<(&'a BatchNorm2d, Parts<'a>)> {
    let [Node { kind: LayerKind::BatchNorm2d(bn), weights, sync, tie: None }, Node { kind: LayerKind::Add(_), .. }, Node { kind: LayerKind::Relu(_), .. }, ..] =
        layers
    else {
        return None;
    };
    if x.dtype() != DType::F16 || sync.is_some() {
        return None;
    }
    #[cfg(test)]
    if !FUSE_ADD_RELU.with(|f| f.get()) {
        return None;
    }
    Some((&*bn, parts(weights).ok()?))
}

#[cfg(test)]
std::thread_local! {
    /// Tests turn [`fusable_bn_add_relu`] off to run the layers one by one.
    pub(super) static FUSE_ADD_RELU: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

#[cfg(test)]
std::thread_local! {
    /// How many block ends this thread's forwards fused (for tests).
    pub(super) static ADD_RELU_FUSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
