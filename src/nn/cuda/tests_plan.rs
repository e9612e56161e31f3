//! The device model's buffer plan, on the host (no GPU needed).

use super::{activation_dtype, Plan, Route};
use crate::amp::{cast_model, Policy};
use crate::config::model::ResolvedLayer;
use crate::config::{ModelConfig, OptLevel};
use crate::nn::cuda::fused::bn_relu::BnReluPlan;
use crate::nn::cuda::layer::Grad;
use crate::nn::layers::batchnorm2d::cuda::BatchNormPlan;
use crate::nn::layers::linear::cuda::LinearPlan;
use crate::nn::layers::maxpool2d::cuda::MaxPoolPlan;
use crate::nn::layers::DeviceOp;
use crate::nn::Model;
use crate::tensor::DType;

/// The layers of a `[model]` table written in TOML, resolved as a config's are.
pub(crate) fn resolved(model: &str) -> Vec<ResolvedLayer> {
    let model: ModelConfig = toml::from_str(model).unwrap();
    crate::config::model::resolve(&model).unwrap()
}

/// A small ConvNet with odd sizes: 1x13x13, conv 1->3 k3 p1, BN, ReLU,
/// max-pool 2 (13 -> 6, the last row and column dropped), flatten, linear
/// 108 -> 5.
pub(crate) fn tiny_layers() -> Vec<ResolvedLayer> {
    resolved(
        r#"
        input_shape = [1, 13, 13]
        layers = [
          { type = "conv2d", out_channels = 3, kernel_size = 3, padding = 1 },
          { type = "batchnorm2d" },
          { type = "relu" },
          { type = "maxpool2d", kernel_size = 2 },
          { type = "flatten" },
          { type = "linear", out_features = 5 },
        ]
        "#,
    )
}

/// Dropout on a conv's output and on the features before the classifier:
/// 1x6x6, conv 1->2 k3 p1, ReLU, dropout 0.5, flatten, dropout 0.25,
/// linear 72 -> 4.
pub(crate) fn dropout_layers() -> Vec<ResolvedLayer> {
    resolved(
        r#"
        input_shape = [1, 6, 6]
        layers = [
          { type = "conv2d", out_channels = 2, kernel_size = 3, padding = 1 },
          { type = "relu" },
          { type = "dropout", p = 0.5 },
          { type = "flatten" },
          { type = "dropout", p = 0.25 },
          { type = "linear", out_features = 4 },
        ]
        "#,
    )
}

#[test]
fn dropout_plans_keep_their_probability() {
    let model = Model::new(&dropout_layers(), 1).unwrap();
    let p = Plan::new(&model, 3).unwrap();
    assert_eq!(p.layers[2].op, DeviceOp::Dropout(0.5));
    assert_eq!(p.layers[4].op, DeviceOp::Dropout(0.25));
    // Its own output buffer, as any layer but flatten.
    assert_eq!((p.layers[2].src, p.layers[2].dst), (2, 3));
}

/// The plan of the MNIST ConvNet's first BatchNorm2d (16 channels of 28x28).
fn mnist_bn1() -> BatchNormPlan {
    BatchNormPlan { channels: 16, hw: 784, sync: false, param_dtype: DType::F32, eps: 1e-5, momentum: 0.1 }
}

pub(crate) fn mnist_layers() -> Vec<ResolvedLayer> {
    let path = crate::testing::repo_root().join("configs/mnist_o0.toml");
    crate::config::model::resolve(&crate::config::load(&path, &[]).unwrap().model).unwrap()
}

/// The plan with the fusion pass off: one node per layer.
fn unfused_plan(model: &Model, max_batch: usize) -> Plan {
    crate::nn::cuda::fused::unfused(|| Plan::new(model, max_batch)).unwrap()
}

#[test]
fn mnist_plan_sizes_every_buffer() {
    let model = Model::new(&mnist_layers(), 1).unwrap();
    let p = unfused_plan(&model, 100);
    assert_eq!(p.acts, [784, 12544, 12544, 12544, 3136, 6272, 6272, 6272, 1568, 10]);
    assert_eq!(p.grad, 12544);
    // conv2's im2col: 100 images x (16*5*5) rows x (14*14) columns; conv1's
    // dy: 100 x 16*28*28; then the rest of BatchNorm's eight f32 regions
    // (32 channels at most: backward's sums 2c, SyncBatchNorm's 1 + 2c).
    assert_eq!(p.scratch.f32, [100 * 400 * 196, 100 * 12544, 32, 32, 32, 32, 64, 65]);
    assert!(p.scratch.f16.is_empty());
    assert_eq!(p.classes, 10);
    let io: Vec<(usize, usize)> = p.layers.iter().map(|l| (l.src, l.dst)).collect();
    assert_eq!(io, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 8), (8, 9)]);
    assert_eq!(p.logits(), 9);
    let params: Vec<Vec<usize>> = p.layers.iter().map(|l| l.params.clone()).collect();
    let want: Vec<Vec<usize>> = vec![
        vec![0, 1],
        vec![2, 3],
        vec![],
        vec![],
        vec![4, 5],
        vec![6, 7],
        vec![],
        vec![],
        vec![],
        vec![8, 9],
    ];
    assert_eq!(params, want);
    let DeviceOp::Conv2d(geom) = &p.layers[4].op else { panic!("layer 4: {:?}", p.layers[4].op) };
    assert_eq!((geom.n, geom.c, geom.h, geom.o, geom.k, geom.padding, geom.ho), (0, 16, 14, 32, 5, 2, 14));
    let bn = mnist_bn1();
    assert_eq!(p.layers[1].op, DeviceOp::BatchNorm2d(bn));
    let pool = MaxPoolPlan { shape: [16, 28, 28], kernel: 2, stride: 2, out_numel: 16 * 14 * 14 };
    assert_eq!(p.layers[3].op, DeviceOp::MaxPool2d(pool));
    let fc = LinearPlan { in_features: 1568, out_features: 10, rows: 1 };
    assert_eq!(p.layers[9].op, DeviceOp::Linear(fc));
    // A chain: every dx is the first into its gradient, but conv1's (the input's).
    let routes: Vec<Vec<Route>> = p.layers.iter().map(|l| l.routes.clone()).collect();
    assert_eq!(routes[0], [Route::None]);
    for (l, r) in p.layers.iter().zip(&routes).skip(1) {
        let want = if l.needs.grad == Grad::Alias { Route::None } else { Route::Write };
        assert_eq!(r, &[want], "{}", l.name);
    }
    assert!(!p.dx_scratch);
}

#[test]
fn odd_sizes_plan_with_a_truncating_pool() {
    let mut model = Model::new(&tiny_layers(), 1).unwrap();
    cast_model(&mut model, &Policy::for_level(OptLevel::O3));
    let p = unfused_plan(&model, 7);
    assert_eq!(p.acts, [169, 507, 507, 507, 108, 5]);
    assert_eq!(p.grad, 507);
    // O3: the conv's im2col and swapped dy in f16; BatchNorm's f32 regions for 3 channels.
    assert_eq!(p.scratch.f16, [7 * 9 * 169, 7 * 507]);
    assert_eq!(p.scratch.f32, [3, 3, 3, 3, 3, 3, 6, 7]);
    assert_eq!(p.classes, 5);
    assert_eq!(
        (p.layers[4].src, p.layers[4].dst, p.layers[4].in_numel, p.layers[4].out_numel),
        (4, 4, 108, 108)
    );
    assert!(matches!(p.layers[1].op, DeviceOp::BatchNorm2d(BatchNormPlan { param_dtype: DType::F16, .. })));
}

#[test]
fn a_zero_max_batch_is_refused() {
    let model = Model::new(&tiny_layers(), 1).unwrap();
    let e = Plan::new(&model, 0).unwrap_err().to_string();
    assert!(e.contains("device model: max_batch must be at least 1"), "{e}");
}

#[test]
fn a_model_whose_descriptions_do_not_match_is_refused() {
    let mut model = Model::new(&tiny_layers(), 1).unwrap();
    model.resolved.pop();
    let e = Plan::new(&model, 2).unwrap_err().to_string();
    assert!(e.contains("6 layers but 5 resolved descriptions"), "{e}");
    let mut model = Model::new(&tiny_layers(), 1).unwrap();
    model.resolved[5].in_shape = vec![107];
    let e = Plan::new(&model, 2).unwrap_err().to_string();
    assert!(e.contains("layer 5 takes [107] but its input holds 108 values"), "{e}");
}

#[test]
fn activation_dtype_follows_the_opt_level() {
    for (level, want) in [
        (OptLevel::O0, DType::F32),
        (OptLevel::O1, DType::F32),
        (OptLevel::O2, DType::F16),
        (OptLevel::O3, DType::F16),
    ] {
        let mut model = Model::new(&tiny_layers(), 1).unwrap();
        cast_model(&mut model, &Policy::for_level(level));
        assert_eq!(activation_dtype(&model).unwrap(), want, "{level}");
    }
}

#[test]
fn parameters_the_device_path_cannot_run_are_refused() {
    let mut model = Model::new(&tiny_layers(), 1).unwrap();
    cast_model(&mut model, &Policy::for_level(OptLevel::O2));
    model.precision.input = DType::F32;
    let e = activation_dtype(&model).unwrap_err().to_string();
    assert!(e.contains("device model: 0.weight is F16 but the model's inputs are F32"), "{e}");
    let mut model = Model::new(&tiny_layers(), 1).unwrap();
    cast_model(&mut model, &Policy::for_level(OptLevel::O3));
    model.precision.patch_conv_linear = Some(DType::F16);
    let e = activation_dtype(&model).unwrap_err().to_string();
    assert!(e.contains("conv and linear patched to F16 on F16 inputs"), "{e}");
}

/// Every value's buffer holds it, and a buffer passes to a new value only
/// once nothing will read the one it held: no later forward reads it, and
/// no backward does (conv, linear and BatchNorm read their input unless O1
/// keeps an f16 copy, ReLU its output; the loss reads the logits).
fn check_storage(p: &Plan, o1: bool, what: &str) {
    assert_eq!(p.storage.len(), p.acts.len(), "{what}");
    for (v, &b) in p.storage.iter().enumerate() {
        assert!(p.buffers[b] >= p.acts[v], "{what}: value {v} in buffer {b}");
    }
    let needed_after = |v: usize, node: usize| {
        let backward = v == 0
            || v == p.logits()
            || p.layers.iter().any(|l| {
                let (x, y) = (l.needs.reads_input, l.needs.reads_output);
                (x && l.srcs.contains(&v)) || (y && l.dst == v)
            });
        backward || p.layers[node + 1..].iter().any(|l| l.srcs.contains(&v))
    };
    let mut owner = vec![None; p.buffers.len()];
    owner[p.storage[0]] = Some(0);
    for (i, l) in p.layers.iter().enumerate() {
        for &s in &l.srcs {
            assert_eq!(owner[p.storage[s]], Some(s), "{what}: node {i} reads value {s}, overwritten");
        }
        let b = p.storage[l.dst];
        if let Some(prev) = owner[b].filter(|&prev| prev != l.dst) {
            assert!(!needed_after(prev, i - 1), "{what}: node {i} writes over value {prev}");
            assert!(
                !l.srcs.iter().any(|&s| p.storage[s] == b),
                "{what}: node {i} reads and writes buffer {b}"
            );
        }
        owner[b] = Some(l.dst);
    }
    for l in &p.layers {
        // O1's wrapper keeps its own f16 copy of a conv's or linear's input.
        let fp16 = matches!(l.op, DeviceOp::Conv2d(_) | DeviceOp::Linear(_));
        assert_eq!(l.o1, o1 && fp16, "{what}: {}", l.name);
        if fp16 {
            assert_eq!(l.needs.reads_input, !o1, "{what}: {}", l.name);
        }
        let (x, y) = (l.needs.reads_input, l.needs.reads_output);
        let kept = l.srcs.iter().filter(|_| x).chain(std::iter::once(&l.dst).filter(|_| y));
        for &v in kept.chain([&0, &p.logits()]) {
            assert_eq!(owner[p.storage[v]], Some(v), "{what}: value {v} overwritten before backward");
        }
    }
}

#[test]
fn mnist_activations_share_buffers_by_liveness() {
    let model = Model::new(&mnist_layers(), 1).unwrap();
    let p = unfused_plan(&model, 100);
    // BatchNorm's outputs die at the ReLU that reads them (it keeps its
    // own output for backward); the pools' outputs take their buffers.
    assert_eq!(p.storage, [0, 1, 2, 3, 2, 4, 5, 6, 5, 7]);
    assert_eq!(p.buffers, [784, 12544, 12544, 12544, 6272, 6272, 6272, 10]);
    check_storage(&p, false, "mnist");
}

#[test]
fn mnist_plan_fuses_each_batchnorm_and_its_relu() {
    let model = Model::new(&mnist_layers(), 1).unwrap();
    let p = Plan::new(&model, 100).unwrap();
    let names: Vec<&str> = p.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        ["layer1.0", "layer1.1+layer1.2", "layer1.3", "layer2.0", "layer2.1+layer2.2", "layer2.3", "2", "fc"]
    );
    let nodes: Vec<_> = p.layers.iter().map(|l| l.nodes.clone()).collect();
    assert_eq!(nodes, [0..1, 1..3, 3..4, 4..5, 5..7, 7..8, 8..9, 9..10]);
    let bn = mnist_bn1();
    assert_eq!(p.layers[1].op, DeviceOp::BnRelu(BnReluPlan { bn, numel: 12544 }));
    // BatchNorm's input for its statistics, the group's output for ReLU's mask.
    assert!(p.layers[1].needs.reads_input && p.layers[1].needs.reads_output);
    assert_eq!(p.layers[1].params, [2, 3]);
    // BatchNorm's outputs are gone: no buffer, no gradient.
    assert_eq!(p.acts, [784, 12544, 12544, 3136, 6272, 6272, 1568, 10]);
    let io: Vec<(usize, usize)> = p.layers.iter().map(|l| (l.src, l.dst)).collect();
    assert_eq!(io, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 6), (6, 7)]);
    // Every value left is read by some backward: one buffer each.
    assert_eq!(p.buffers, p.acts);
    check_storage(&p, false, "mnist fused");
    check_routes(&p, "mnist fused");
    let unfused = unfused_plan(&model, 100);
    let total = |p: &Plan| p.buffers.iter().sum::<usize>();
    assert!(total(&p) < total(&unfused), "{} vs {}", total(&p), total(&unfused));
    // ReLU's dx (a batch of the group's output) first, then BatchNorm's
    // regions: one more small region than the layers one by one take.
    assert_eq!(p.scratch.f32, [100 * 400 * 196, 100 * 12544, 32, 32, 32, 32, 32, 64, 65]);
    assert_eq!(unfused.scratch.f32, [100 * 400 * 196, 100 * 12544, 32, 32, 32, 32, 64, 65]);
}

/// A BatchNorm whose output something else reads too, or a ReLU that reads
/// another value, stays alone.
#[test]
fn a_batchnorm_whose_output_has_another_reader_is_not_fused() {
    let layers = resolved(
        r#"
        input_shape = [2, 4, 4]
        layers = [
          { type = "batchnorm2d", name = "bn" },
          { type = "residual", layers = [{ type = "relu", name = "relu" }] },
          { type = "relu", name = "after" },
          { type = "flatten" },
          { type = "linear", out_features = 3 },
        ]
        "#,
    );
    let model = Model::new(&layers, 1).unwrap();
    let p = Plan::new(&model, 2).unwrap();
    assert!(p.layers.iter().all(|l| !matches!(l.op, DeviceOp::BnRelu(_))), "{:?}", p.layers);
    assert_eq!(p.layers.len(), model.layers.len());
    check_storage(&p, false, "residual");
}

#[test]
fn every_config_plans_its_activations_by_liveness() {
    let dir = crate::testing::repo_root().join("configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in files {
        let layers = crate::config::model::resolve(&crate::config::load(&path, &[]).unwrap().model).unwrap();
        for level in [OptLevel::O0, OptLevel::O1, OptLevel::O2] {
            let mut model = Model::new(&layers, 1).unwrap();
            cast_model(&mut model, &Policy::for_level(level));
            let what = format!("{} {level}", path.display());
            for (p, fused) in [(Plan::new(&model, 2).unwrap(), true), (unfused_plan(&model, 2), false)] {
                let what = format!("{what}{}", if fused { "" } else { " unfused" });
                check_storage(&p, level == OptLevel::O1, &what);
                check_routes(&p, &what);
                // Fewer elements than a buffer per value wherever some value
                // dies early (BatchNorm's outputs, unless fused away).
                let (shared, one_each) = (p.buffers.iter().sum::<usize>(), p.acts.iter().sum::<usize>());
                assert!(shared < one_each || (fused && shared == one_each), "{what}: {shared} vs {one_each}");
            }
        }
    }
}

/// Backward's order gives each gradient its first dx by a write and every
/// later one by an add, and only an added dx from a backward takes the
/// dx scratch.
fn check_routes(p: &Plan, what: &str) {
    let mut seen = vec![false; p.acts.len()];
    for l in p.layers.iter().rev() {
        if l.needs.grad == Grad::Alias {
            continue;
        }
        for (&s, &r) in l.srcs.iter().zip(&l.routes) {
            let want = match (s, seen[s]) {
                (0, _) => Route::None,
                (_, true) => Route::Add,
                (_, false) => Route::Write,
            };
            assert_eq!(r, want, "{what}: {} reading {s}", l.name);
            seen[s] |= s > 0;
        }
    }
    let added = p.layers.iter().any(|l| l.needs.grad == Grad::Backward && l.routes.contains(&Route::Add));
    assert_eq!(p.dx_scratch, added, "{what}");
}

#[test]
fn a_residual_adds_its_second_dx() {
    let path = crate::testing::repo_root().join("configs/resnet20_fashion_o2.toml");
    let layers = crate::config::model::resolve(&crate::config::load(&path, &[]).unwrap().model).unwrap();
    let p = Plan::new(&Model::new(&layers, 1).unwrap(), 2).unwrap();
    // A block's input is read by its first conv and by the add (or the
    // shortcut); backward reaches the add first, so the conv's dx is added.
    let adds = p.layers.iter().filter(|l| l.needs.grad == Grad::Backward && l.routes == [Route::Add]).count();
    assert!(adds >= 9, "{adds} convs add their dx");
    assert!(p.dx_scratch);
    // Each block's first BatchNorm + ReLU and the stem's; each block's end,
    // headed by the shortcut's BatchNorm where there is one (it runs last).
    let count = |f: fn(&DeviceOp) -> bool| p.layers.iter().filter(|l| f(&l.op)).count();
    assert_eq!(count(|op| matches!(op, DeviceOp::BnRelu(_))), 10);
    assert_eq!(count(|op| matches!(op, DeviceOp::BnAddRelu(_))), 9);
    assert_eq!(count(|op| matches!(op, DeviceOp::Add(_) | DeviceOp::Relu(_))), 0);
}

#[test]
fn o1_wraps_conv_and_linear_with_its_f16_scratch_first() {
    let mut model = Model::new(&mnist_layers(), 1).unwrap();
    cast_model(&mut model, &Policy::for_level(OptLevel::O1));
    let p = unfused_plan(&model, 4);
    let conv2 = &p.layers[4];
    assert!(conv2.o1 && !conv2.needs.reads_input);
    // Weight, bias, their gradients, then one batch of output, dy and dx;
    // then its own im2col and swapped dy, in f16.
    let (w, b, x, y) = (32 * 16 * 25, 32, 4 * 16 * 14 * 14, 4 * 32 * 14 * 14);
    assert_eq!(&conv2.needs.scratch.f16[..9], &[w, b, w, b, y, y, x, 4 * 400 * 196, 4 * 32 * 196]);
    assert!(!p.layers[1].o1, "BatchNorm stays f32");
}
