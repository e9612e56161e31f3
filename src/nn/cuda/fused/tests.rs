//! Each fused group against its members run one by one (the pass off: the
//! group's reference twin), bit for bit on the device: the logits and
//! loss of two accumulated micro-batches of different sizes, every
//! parameter's `.grad`, BatchNorm's running statistics, then an
//! evaluation batch, at every opt level.

use super::unfused;
use crate::amp::{cast_model, Policy};
use crate::config::model::ResolvedLayer;
use crate::config::OptLevel;
use crate::cuda::Gpu;
use crate::nn::cuda::plan::tests_plan::resolved;
use crate::nn::cuda::plan::Route;
use crate::nn::cuda::{GpuModel, LocalHooks};
use crate::nn::layers::DeviceOp;
use crate::nn::Model;
use crate::ops::cross_entropy::cuda::CrossEntropyTotals;
use crate::ops::testing::rand_vec_f32;
use std::sync::Arc;

/// conv, BatchNorm + ReLU, dropout (whose masks come from its own node's
/// draws, past the group) into `h`; a block whose end (BatchNorm + add +
/// ReLU) adds `h`, inside a residual that adds `h` again, so the group's dx
/// for `h` is added to the outer add's; a second BatchNorm + ReLU, the
/// classifier.
fn layers() -> Vec<ResolvedLayer> {
    resolved(
        r#"
        input_shape = [2, 7, 7]
        layers = [
          { type = "conv2d", out_channels = 4, kernel_size = 3, padding = 1 },
          { type = "batchnorm2d" },
          { type = "relu" },
          { type = "dropout", p = 0.25 },
          { type = "residual", layers = [
            { type = "residual", layers = [
              { type = "conv2d", out_channels = 4, kernel_size = 3, padding = 1 },
              { type = "batchnorm2d" },
            ] },
            { type = "relu" },
            { type = "conv2d", out_channels = 4, kernel_size = 3, padding = 1 },
          ] },
          { type = "relu" },
          { type = "conv2d", out_channels = 3, kernel_size = 3 },
          { type = "batchnorm2d" },
          { type = "relu" },
          { type = "flatten" },
          { type = "linear", out_features = 5 },
        ]
        "#,
    )
}

/// What a run shows: each micro-batch's logits and loss, the evaluation's,
/// and the model's parameters, gradients and buffers after it.
#[derive(Debug, PartialEq)]
struct Seen {
    logits: Vec<Vec<u32>>,
    losses: Vec<(u64, u64)>,
    state: Vec<(String, Vec<u32>)>,
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn run(gpu: &Arc<Gpu>, host: &Model, fuse: bool) -> Seen {
    let make = || GpuModel::new(gpu.clone(), host, 9, 64, 256, false).unwrap();
    let mut dev = if fuse { make() } else { unfused(make) };
    let count = |f: fn(&DeviceOp) -> bool| dev.plan().layers.iter().filter(|l| f(&l.op)).count();
    let pairs = count(|op| matches!(op, DeviceOp::BnRelu(_)));
    let ends = count(|op| matches!(op, DeviceOp::BnAddRelu(_)));
    assert_eq!((pairs, ends), if fuse { (2, 1) } else { (0, 0) }, "fused groups");
    if fuse {
        let end = dev.plan().layers.iter().find(|l| matches!(l.op, DeviceOp::BnAddRelu(_))).unwrap();
        assert_eq!(end.routes, [Route::Write, Route::Add], "{}", end.name);
    }
    let per: usize = host.resolved[0].in_shape.iter().product();
    let s = gpu.stream();
    let mut seen = Seen { logits: Vec::new(), losses: Vec::new(), state: Vec::new() };
    for (k, n) in [7usize, 5, 9].into_iter().enumerate() {
        let x = s.clone_htod(&rand_vec_f32(n * per, 40 + k as u64)).unwrap();
        let labels: Vec<u32> = (0..n as u32).map(|i| (i * 3 + k as u32) % 5).collect();
        let labels = s.clone_htod(&labels).unwrap();
        let mut totals = CrossEntropyTotals::new(gpu, n).unwrap();
        if k < 2 {
            dev.draws.at.index = k as u64;
            let scale = s.clone_htod(&[64.0f32]).unwrap();
            dev.train_batch(
                &x.as_view(),
                &labels.as_view(),
                n,
                &scale.as_view(),
                &mut totals,
                &mut LocalHooks,
            )
            .unwrap();
        } else {
            dev.eval_batch(&x.as_view(), &labels.as_view(), n, &mut totals).unwrap();
        }
        let (loss, hits) = totals.read(gpu).unwrap();
        seen.logits.push(bits(&dev.logits_f32(n).unwrap()));
        seen.losses.push((loss.to_bits(), hits));
    }
    let mut after = Model {
        layers: host.layers.clone(),
        resolved: host.resolved.clone(),
        precision: host.precision,
        draws: host.draws,
    };
    dev.params.download_grads(gpu, &mut after).unwrap();
    dev.download(&mut after).unwrap();
    for e in after.state_dict().unwrap() {
        let v = match e.value {
            crate::nn::StateValue::F32(v) => bits(&v),
            crate::nn::StateValue::I64(c) => vec![c as u32],
        };
        seen.state.push((e.name, v));
    }
    for p in after.params() {
        seen.state.push((format!("{}.grad", p.name), bits(&p.grad.to_f32_vec())));
    }
    seen
}

#[test]
fn fused_groups_are_their_layers_bit_for_bit_at_every_opt_level() {
    let Some(gpu) = crate::cuda::test_gpu("fused_groups_are_their_layers_bit_for_bit_at_every_opt_level")
    else {
        return;
    };
    for level in [OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3] {
        let mut host = Model::new(&layers(), 3).unwrap();
        cast_model(&mut host, &Policy::for_level(level));
        let (fused, alone) = (run(&gpu, &host, true), run(&gpu, &host, false));
        assert_eq!(fused.logits, alone.logits, "{level}: logits");
        assert_eq!(fused.losses, alone.losses, "{level}: losses");
        assert_eq!(fused.state.len(), alone.state.len());
        for (f, a) in fused.state.iter().zip(&alone.state) {
            assert_eq!(f, a, "{level}: {}", a.0);
        }
        assert!(fused.state.iter().any(|(n, _)| n.ends_with("running_mean")));
    }
}
