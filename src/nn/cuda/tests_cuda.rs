//! GpuModel against the CPU Model: the same batch through
//! `forward_train` + cross-entropy + `backward` on the host and
//! `train_batch` on the device, at every apex opt level; logits, loss,
//! hits, every parameter's `.grad`, the BatchNorm buffers, gradient
//! accumulation over micro-batches of different sizes, evaluation, the
//! DDP hooks and SyncBatchNorm.

use super::{GpuModel, LocalHooks, TrainHooks};
use crate::amp::{cast_model, Policy};
use crate::config::model::ResolvedLayer;
use crate::config::OptLevel;
use crate::cuda::Gpu;
use crate::dist::{Buffer, Communicator, LocalCommunicator, ReduceOp, Work};
use crate::error::Result;
use crate::nn::cuda::params::DeviceParams;
use crate::nn::cuda::plan::tests_plan::{dropout_layers, mnist_layers, tiny_layers};
use crate::nn::layers::batchnorm2d::parts;
use crate::nn::layers::LayerKind;
use crate::nn::Model;
use crate::ops::cross_entropy::{self, cuda::CrossEntropyTotals};
use crate::ops::testing::rand_vec_f32;
use crate::rng::MicroBatch;
use crate::tensor::Tensor;
use cudarc::driver::{CudaViewMut, DeviceSlice};
use std::sync::Arc;

const LEVELS: [OptLevel; 4] = [OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3];

/// The parity tolerance: cuBLAS reorders f32 sums; f16 levels round
/// activations, dlogits and f16 weights' gradients on both sides, in
/// slightly different places.
fn tol(level: OptLevel) -> f32 {
    if level == OptLevel::O0 {
        1e-4
    } else {
        2e-2
    }
}

/// Never NaN; every element within `tol` relative error above a floor of
/// 5% of `scale` (values that cancel to nearly zero carry the absolute
/// error of the terms they came from); and the whole vector within `tol`
/// in the L2 norm, above the same floor.
fn close_at(what: &str, got: &[f32], want: &[f32], tol: f32, scale: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let floor = (scale * 0.05).max(f32::MIN_POSITIVE);
    let (mut err2, mut ref2) = (0f64, 0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}[{i}]: {g}, expected {w}");
        assert!(
            (g - w).abs() <= tol * w.abs().max(floor),
            "{what}[{i}]: got {g}, expected {w} (tolerance {tol})"
        );
        err2 += f64::from(g - w).powi(2);
        ref2 += f64::from(w).powi(2);
    }
    let ref_norm = ref2.sqrt().max(f64::from(floor) * (want.len() as f64).sqrt());
    assert!(err2.sqrt() <= f64::from(tol) * ref_norm, "{what}: L2 error {} against {ref_norm}", err2.sqrt());
}

fn peak(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// [`close_at`] at the scale of `want` itself.
fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    close_at(what, got, want, tol, peak(want));
}

/// `layers` built from `seed`, BatchNorm parameters and running statistics
/// moved off their initial values (so a swapped weight and bias, or eval
/// with batch statistics, shows), then cast for `level`.
fn host_model(layers: &[ResolvedLayer], level: OptLevel, seed: u64) -> Model {
    let mut m = Model::new(layers, seed).unwrap();
    for (i, layer) in m.layers.iter_mut().enumerate() {
        if let LayerKind::BatchNorm2d(_) = layer.kind {
            let bn = parts(&mut layer.weights).unwrap();
            let c = bn.weight.value.numel();
            let r = |k: u64| rand_vec_f32(c, seed * 100 + i as u64 * 10 + k);
            let set = |t: &mut Tensor, v: Vec<f32>| t.copy_from_f32(&v).unwrap();
            set(&mut bn.weight.value, r(1).iter().map(|v| 1.0 + 0.3 * v).collect());
            set(&mut bn.bias.value, r(2).iter().map(|v| 0.2 * v).collect());
            set(bn.running_mean, r(3).iter().map(|v| 0.1 * v).collect());
            set(bn.running_var, r(4).iter().map(|v| 1.0 + 0.5 * v.abs()).collect());
        }
    }
    cast_model(&mut m, &Policy::for_level(level));
    m
}

fn copy(m: &Model) -> Model {
    Model { layers: m.layers.clone(), resolved: m.resolved.clone(), precision: m.precision, draws: m.draws }
}

struct Batch {
    x: Vec<f32>,
    labels: Vec<u32>,
    n: usize,
}

fn batch(m: &Model, n: usize, classes: usize, seed: u64) -> Batch {
    let per: usize = m.resolved[0].in_shape.iter().product();
    let labels =
        rand_vec_f32(n, seed + 1).iter().map(|v| ((v.abs() * 1000.0) as usize % classes) as u32).collect();
    Batch { x: rand_vec_f32(n * per, seed), labels, n }
}

/// One CPU micro-batch: logits, mean loss, hits (gradients accumulate in `m`).
fn cpu_train(m: &mut Model, b: &Batch, grad_scale: f32) -> (Vec<f32>, f32, usize) {
    let mut shape = vec![b.n];
    shape.extend(&m.resolved[0].in_shape);
    let (logits, saved) = m.forward_train(Tensor::from_vec(&shape, b.x.clone()).unwrap()).unwrap();
    let out = cross_entropy::forward_backward(&logits, &b.labels, grad_scale).unwrap();
    m.backward(saved, out.dlogits).unwrap();
    (logits.to_f32_vec(), out.loss, out.correct)
}

/// One device micro-batch: logits, mean loss, hits of this batch alone.
fn gpu_train(
    gpu: &Gpu,
    d: &mut GpuModel,
    b: &Batch,
    grad_scale: f32,
    hooks: &mut dyn TrainHooks,
) -> (Vec<f32>, f32, usize) {
    let s = gpu.stream();
    let (x, labels) = (s.clone_htod(&b.x).unwrap(), s.clone_htod(&b.labels).unwrap());
    let scale = s.clone_htod(&[grad_scale]).unwrap();
    let mut totals = CrossEntropyTotals::new(gpu, b.n).unwrap();
    d.train_batch(&x.as_view(), &labels.as_view(), b.n, &scale.as_view(), &mut totals, hooks).unwrap();
    let (loss, hits) = totals.read(gpu).unwrap();
    (d.logits_f32(b.n).unwrap(), (loss / b.n as f64) as f32, hits as usize)
}

/// Every parameter's `.grad`, the BatchNorm buffers and the (untouched)
/// parameter values of the device model against the CPU model.
fn compare_state(what: &str, gpu: &Gpu, d: &GpuModel, cpu: &Model, tol: f32) {
    let mut got = copy(cpu);
    d.params.download_grads(gpu, &mut got).unwrap();
    d.download(&mut got).unwrap();
    // Each gradient at the scale of its layer's largest: a conv bias in
    // front of a training-mode BatchNorm has an exact gradient of zero (the
    // normalization removes any per-channel shift), so both sides compute
    // rounding noise there, which only the layer's scale bounds.
    // The worst gradient first, printed: how far from the tolerance a pass
    // is, and where a failure starts (on a real GPU too).
    let mut worst = (0f32, String::new());
    for (g, w) in got.layers.iter().zip(&cpu.layers) {
        let (g, w) = (&g.weights.params, &w.weights.params);
        let floor = 0.05 * w.iter().map(|p| peak(&p.grad.to_f32_vec())).fold(0f32, f32::max);
        for (g, w) in g.iter().zip(w) {
            for (a, b) in g.grad.to_f32_vec().iter().zip(w.grad.to_f32_vec()) {
                let e = (a - b).abs() / b.abs().max(floor).max(f32::MIN_POSITIVE);
                if e > worst.0 || e.is_nan() {
                    worst = (e, w.name.clone());
                }
            }
        }
    }
    println!("{what}: largest gradient error {:e} (relative) in {}", worst.0, worst.1);
    for (g, w) in got.layers.iter().zip(&cpu.layers) {
        let (g, w) = (&g.weights.params, &w.weights.params);
        let scale = w.iter().map(|p| peak(&p.grad.to_f32_vec())).fold(0f32, f32::max);
        for (g, w) in g.iter().zip(w) {
            close_at(
                &format!("{what}: {} grad", w.name),
                &g.grad.to_f32_vec(),
                &w.grad.to_f32_vec(),
                tol,
                scale,
            );
            assert_eq!(g.value.to_f32_vec(), w.value.to_f32_vec(), "{what}: {} value", w.name);
        }
    }
    for (i, (g, w)) in got.layers.iter().zip(&cpu.layers).enumerate() {
        if let (LayerKind::BatchNorm2d(_), LayerKind::BatchNorm2d(_)) = (&g.kind, &w.kind) {
            let (mut g, mut w) = (g.clone(), w.clone());
            let (g, w) = (parts(&mut g.weights).unwrap(), parts(&mut w.weights).unwrap());
            close(
                &format!("{what}: layer {i} running_mean"),
                &g.running_mean.to_f32_vec(),
                &w.running_mean.to_f32_vec(),
                tol,
            );
            close(
                &format!("{what}: layer {i} running_var"),
                &g.running_var.to_f32_vec(),
                &w.running_var.to_f32_vec(),
                tol,
            );
            assert_eq!(g.num_batches_tracked, w.num_batches_tracked, "{what}: layer {i} num_batches_tracked");
        }
    }
}

fn compare_step(what: &str, level: OptLevel, cpu: (Vec<f32>, f32, usize), dev: (Vec<f32>, f32, usize)) {
    close(&format!("{what}: logits"), &dev.0, &cpu.0, tol(level));
    close(&format!("{what}: loss"), &[dev.1], &[cpu.1], tol(level));
    // f16 logits may reorder a near tie.
    let slack = if level == OptLevel::O0 { 0 } else { 1 };
    assert!(dev.2.abs_diff(cpu.2) <= slack, "{what}: {} hits, CPU {}", dev.2, cpu.2);
}

/// Two micro-batches of different sizes (7, then 5 of at most 9) with the
/// gradients accumulating, then an evaluation batch of 9.
fn accumulate_then_eval(gpu: &Arc<Gpu>, layers: &[ResolvedLayer], level: OptLevel, buckets: (usize, usize)) {
    let what = format!("{level}");
    let mut cpu = host_model(layers, level, 5);
    let classes = *cpu.resolved.last().unwrap().out_shape.last().unwrap();
    let mut dev = GpuModel::new(gpu.clone(), &cpu, 9, buckets.0, buckets.1, false).unwrap();
    // A loss scale, as amp would apply (and O1-O3's f16 gradients need).
    let scale = 128.0;
    let b1 = batch(&cpu, 7, classes, 11);
    let c = cpu_train(&mut cpu, &b1, scale);
    let g = gpu_train(gpu, &mut dev, &b1, scale, &mut LocalHooks);
    compare_step(&format!("{what} micro-batch 1"), level, c, g);
    compare_state(&format!("{what} micro-batch 1"), gpu, &dev, &cpu, tol(level));

    let b2 = batch(&cpu, 5, classes, 21);
    let c = cpu_train(&mut cpu, &b2, scale);
    let g = gpu_train(gpu, &mut dev, &b2, scale, &mut LocalHooks);
    compare_step(&format!("{what} micro-batch 2"), level, c, g);
    compare_state(&format!("{what} after 2 micro-batches"), gpu, &dev, &cpu, tol(level));

    let b3 = batch(&cpu, 9, classes, 31);
    let mut shape = vec![9];
    shape.extend(&cpu.resolved[0].in_shape);
    let want = cpu.forward_eval(Tensor::from_vec(&shape, b3.x.clone()).unwrap()).unwrap();
    let (want_loss, want_hits) = cross_entropy::forward(&want, &b3.labels).unwrap();
    let s = gpu.stream();
    let (x, labels) = (s.clone_htod(&b3.x).unwrap(), s.clone_htod(&b3.labels).unwrap());
    let mut totals = CrossEntropyTotals::new(gpu, 9).unwrap();
    dev.eval_batch(&x.as_view(), &labels.as_view(), 9, &mut totals).unwrap();
    let (loss, hits) = totals.read(gpu).unwrap();
    compare_step(
        &format!("{what} eval"),
        level,
        (want.to_f32_vec(), (want_loss / 9.0) as f32, want_hits),
        (dev.logits_f32(9).unwrap(), (loss / 9.0) as f32, hits as usize),
    );
    // Evaluation leaves the running statistics alone.
    compare_state(&format!("{what} after eval"), gpu, &dev, &cpu, tol(level));
}

#[test]
fn small_convnet_trains_like_the_cpu_model_at_every_opt_level() {
    let Some(gpu) = crate::cuda::test_gpu("small_convnet_trains_like_the_cpu_model_at_every_opt_level")
    else {
        return;
    };
    for level in LEVELS {
        // Small buckets: the parameters spread over several allocations.
        accumulate_then_eval(&gpu, &tiny_layers(), level, (64, 256));
    }
}

#[test]
fn mnist_convnet_trains_like_the_cpu_model_at_every_opt_level() {
    let Some(gpu) = crate::cuda::test_gpu("mnist_convnet_trains_like_the_cpu_model_at_every_opt_level")
    else {
        return;
    };
    for level in LEVELS {
        accumulate_then_eval(&gpu, &mnist_layers(), level, (1 << 20, 25 << 20));
    }
}

#[test]
fn dropout_draws_the_cpu_models_masks_on_the_device() {
    let Some(gpu) = crate::cuda::test_gpu("dropout_draws_the_cpu_models_masks_on_the_device") else {
        return;
    };
    // Training with masks (the same on both sides, or the logits would be
    // far apart), evaluation without.
    for level in LEVELS {
        accumulate_then_eval(&gpu, &dropout_layers(), level, (64, 256));
    }
    // Another rank and micro-batches: other masks, still the CPU's.
    let mut cpu = host_model(&dropout_layers(), OptLevel::O0, 5);
    cpu.draws.rank = 1;
    cpu.draws.at = MicroBatch { epoch: 2, index: 3 };
    let mut dev = GpuModel::new(gpu.clone(), &cpu, 9, 64, 256, false).unwrap();
    let b = batch(&cpu, 7, 4, 11);
    let c0 = cpu_train(&mut cpu, &b, 1.0);
    let g0 = gpu_train(&gpu, &mut dev, &b, 1.0, &mut LocalHooks);
    compare_step("rank 1, micro-batch 3", OptLevel::O0, c0.clone(), g0);
    compare_state("rank 1, micro-batch 3", &gpu, &dev, &cpu, tol(OptLevel::O0));
    cpu.draws.at.index = 4;
    dev.draws.at.index = 4;
    let c1 = cpu_train(&mut cpu, &b, 1.0);
    let g1 = gpu_train(&gpu, &mut dev, &b, 1.0, &mut LocalHooks);
    assert_ne!(c0.0, c1.0, "the next micro-batch drew the same masks");
    compare_step("rank 1, micro-batch 4", OptLevel::O0, c1, g1);
    compare_state("rank 1, micro-batches 3 and 4", &gpu, &dev, &cpu, tol(OptLevel::O0));
}

/// Records what the step asks of DDP; `twins` makes it a world of two
/// ranks with identical batches (the all-reduce doubles the buffer).
#[derive(Default)]
struct Recorder {
    ready: Vec<Vec<usize>>,
    reduced: Vec<(String, usize)>,
    twins: bool,
}

impl TrainHooks for Recorder {
    fn grads_ready(&mut self, params: &mut DeviceParams, ready: &[usize]) -> Result<()> {
        assert!(ready.iter().all(|&i| i < params.slots.len()));
        self.ready.push(ready.to_vec());
        Ok(())
    }
    fn all_reduce_sum(&mut self, buf: &mut CudaViewMut<'_, f32>, what: &str) -> Result<()> {
        self.reduced.push((what.to_string(), buf.len()));
        if self.twins {
            let s = buf.stream().clone();
            let mut host = s.clone_dtoh(&*buf).unwrap();
            host.iter_mut().for_each(|v| *v *= 2.0);
            s.memcpy_htod(&host, buf).unwrap();
        }
        Ok(())
    }
    fn world_size(&self) -> usize {
        if self.twins {
            2
        } else {
            1
        }
    }
}

/// The CPU side of [`Recorder`]'s twins: two ranks with identical batches.
struct Twins;

impl Communicator for Twins {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        2
    }
    fn all_reduce_async(&self, buf: Buffer, op: ReduceOp, label: &str) -> Work {
        assert_eq!(op, ReduceOp::Sum, "{label}");
        Work::ready(buf.into_f32().map(|v| Buffer::F32(v.iter().map(|x| 2.0 * x).collect())))
    }
    fn broadcast_async(&self, buf: Buffer, root: usize, label: &str) -> Work {
        LocalCommunicator.broadcast_async(buf, root, label)
    }
    fn all_gather_async(&self, buf: Buffer, _label: &str) -> Work {
        Work::ready(Ok(buf))
    }
    fn barrier_async(&self, label: &str) -> Work {
        LocalCommunicator.barrier_async(label)
    }
}

#[test]
fn hooks_see_each_layers_parameters_in_backward_order() {
    let Some(gpu) = crate::cuda::test_gpu("hooks_see_each_layers_parameters_in_backward_order") else {
        return;
    };
    let cpu = host_model(&mnist_layers(), OptLevel::O0, 3);
    let mut dev = GpuModel::new(gpu.clone(), &cpu, 4, 1 << 20, 25 << 20, false).unwrap();
    let mut hooks = Recorder::default();
    gpu_train(&gpu, &mut dev, &batch(&cpu, 4, 10, 41), 1.0, &mut hooks);
    assert_eq!(hooks.ready, [vec![8, 9], vec![6, 7], vec![4, 5], vec![2, 3], vec![0, 1]]);
    assert!(hooks.reduced.is_empty(), "plain BatchNorm reduces nothing: {:?}", hooks.reduced);
}

#[test]
fn sync_batchnorm_reduces_its_statistics_like_the_cpu_model() {
    let Some(gpu) = crate::cuda::test_gpu("sync_batchnorm_reduces_its_statistics_like_the_cpu_model") else {
        return;
    };
    for level in [OptLevel::O0, OptLevel::O2, OptLevel::O3] {
        let what = format!("SyncBatchNorm {level}");
        let mut cpu = host_model(&tiny_layers(), level, 7);
        cpu.convert_sync_batchnorm(Arc::new(Twins));
        let mut dev = GpuModel::new(gpu.clone(), &cpu, 7, 1 << 20, 25 << 20, false).unwrap();
        let b = batch(&cpu, 7, 5, 51);
        let c = cpu_train(&mut cpu, &b, 64.0);
        let mut hooks = Recorder { twins: true, ..Recorder::default() };
        let g = gpu_train(&gpu, &mut dev, &b, 64.0, &mut hooks);
        assert_eq!(
            hooks.reduced,
            [("SyncBatchNorm forward".to_string(), 7), ("SyncBatchNorm backward".to_string(), 6)],
            "{what}: [count, sum, sumsq] of 3 channels, then [sum dy, sum dy*xhat]"
        );
        compare_step(&what, level, c, g);
        compare_state(&what, &gpu, &dev, &cpu, tol(level));
    }
}

#[test]
fn batches_the_buffers_cannot_hold_are_refused() {
    let Some(gpu) = crate::cuda::test_gpu("batches_the_buffers_cannot_hold_are_refused") else { return };
    let cpu = host_model(&tiny_layers(), OptLevel::O0, 1);
    let mut dev = GpuModel::new(gpu.clone(), &cpu, 4, 1 << 20, 25 << 20, false).unwrap();
    let b = batch(&cpu, 5, 5, 61);
    let s = gpu.stream();
    let (x, labels, scale) =
        (s.clone_htod(&b.x).unwrap(), s.clone_htod(&b.labels).unwrap(), s.clone_htod(&[1f32]).unwrap());
    let mut totals = CrossEntropyTotals::new(&gpu, 5).unwrap();
    let e = dev
        .train_batch(&x.as_view(), &labels.as_view(), 5, &scale.as_view(), &mut totals, &mut LocalHooks)
        .unwrap_err()
        .to_string();
    assert!(e.contains("train_batch: a batch of 5 images, but the device model holds 1 to 4"), "{e}");
    let e = dev.eval_batch(&x.slice(0..100), &labels.slice(0..3), 3, &mut totals).unwrap_err().to_string();
    assert!(
        e.contains("eval_batch: 100 input values and 3 labels for 3 samples of 169 values and 1 labels each"),
        "{e}"
    );
    let mut other = host_model(&tiny_layers(), OptLevel::O0, 1);
    other.layers.remove(1);
    assert!(dev.upload(&other).is_err());
}

/// A graph with a three-way sum (one branch the identity, so its input has
/// three readers) and `x + x` (one value read twice by the same add).
fn branching_layers() -> Vec<ResolvedLayer> {
    let conv = r#"{ type = "conv2d", out_channels = 2, kernel_size = 3, padding = 1 }"#;
    let text = format!(
        r#"
[model]
input_shape = [1, 6, 6]
layers = [
  {conv}, {{ type = "batchnorm2d" }}, {{ type = "relu" }},
  {{ type = "sum", branches = [[{conv}], [], [{conv}, {{ type = "relu" }}]] }},
  {{ type = "sum", branches = [[], []] }},
  {{ type = "flatten" }}, {{ type = "linear", out_features = 10 }},
]
[data]
batch_size = 8
[optimizer]
lr = 0.1
[train]
max_steps = 1
"#
    );
    crate::config::tests_load::load_text(&text, &[], &[]).0.unwrap().resolve_model().unwrap()
}

#[test]
fn a_graph_with_sums_trains_like_the_cpu_model_at_every_opt_level() {
    let Some(gpu) = crate::cuda::test_gpu("a_graph_with_sums_trains_like_the_cpu_model_at_every_opt_level")
    else {
        return;
    };
    let layers = branching_layers();
    assert!(
        layers.iter().any(|l| l.inputs.len() == 3)
            && layers.iter().any(|l| l.inputs.len() == 2 && l.inputs[0] == l.inputs[1]),
        "{layers:?}"
    );
    for level in LEVELS {
        accumulate_then_eval(&gpu, &layers, level, (64, 256));
    }
}

#[test]
fn a_model_with_tied_weights_trains_like_the_cpu_model_at_every_opt_level() {
    let Some(gpu) =
        crate::cuda::test_gpu("a_model_with_tied_weights_trains_like_the_cpu_model_at_every_opt_level")
    else {
        return;
    };
    // A conv and a linear each used twice: the device reads and accumulates
    // the owner's parameter at both uses.
    let layers = crate::config::tests_tie::tied_layers();
    for level in LEVELS {
        accumulate_then_eval(&gpu, &layers, level, (64, 256));
    }
}

/// A normalization reading the model input: its backward has no dx to
/// write (the input has no gradient), only its parameters' gradients.
#[test]
fn a_normalization_on_the_input_learns_without_a_dx() {
    let Some(gpu) = crate::cuda::test_gpu("a_normalization_on_the_input_learns_without_a_dx") else {
        return;
    };
    for (shape, norm) in [
        ("[4, 6]", r#"{ type = "layernorm" }"#),
        ("[4, 6]", r#"{ type = "rmsnorm" }"#),
        ("[2, 3, 3]", r#"{ type = "batchnorm2d" }"#),
    ] {
        let layers = crate::nn::cuda::plan::tests_plan::resolved(&format!(
            r#"
            input_shape = {shape}
            layers = [{norm}, {{ type = "flatten" }}, {{ type = "linear", out_features = 3 }}]
            "#
        ));
        for level in LEVELS {
            accumulate_then_eval(&gpu, &layers, level, (64, 256));
        }
    }
}
