//! The GPU trainer against the CPU trainer (the reference), end to end
//! through `train`: the seed ConvNet of configs/mnist_o0.toml (its optimizer
//! and warmup schedule) on synthetic digits, 20 steps from the same seed and
//! data order, at every opt level. Skipped without a GPU (a failure under
//! `CI=true`); scripts/gpu-check.sh runs them on one.

use crate::config::Config;
use crate::nn::StateValue;
use std::path::Path;

fn cfg(device: &str, opt_level: &str, out: &Path) -> Config {
    let sets: Vec<String> = [
        "data.dataset=synthetic",
        "data.synthetic_train_size=2000",
        "data.synthetic_test_size=300",
        "train.max_steps=20",
        "logging.every_steps=1",
        "logging.progress=never",
        "logging.tensorboard=false",
        // O1 and O2 start far too high, so the first steps overflow and back off.
        "amp.init_scale=16777216",
        // Not the seed's 42: there the runs part at step 2 on a max-pool tie.
        // layer2's conv output (BatchNorm's input) for sample 1, channel 18
        // holds, at (7, 12) and (7, 13), -0.76215219 and -0.76215202
        // (0xbf431c68, 0xbf431c65) on the CPU but -0.76215208 twice
        // (0xbf431c66) on the GPU: the GEMMs' summation orders, 3 ulps. Both
        // are positive after BatchNorm and the largest of their 2x2 window,
        // so the CPU's max-pool picks (7, 13) and the GPU's the first of the
        // tie, (7, 12): that window's gradient lands one pixel apart, and
        // after step 2 layer2.0.weight[18] differs by 4.7e-7 (9e-6 of its
        // scale) against <= 4e-9 in its other 31 output channels, and
        // layer1.0.weight (downstream in the backward) by 1.2e-6; ~1e-3 of
        // the scale by step 20.
        // It would measure that tie, not the numerics. With the CPU's
        // Winograd convolution seeds 1-6 met such ties too (3e-3 to 2e-2 of
        // layer1.1.bias's scale at step 20; seed 5 also with the direct
        // kernels), and with BatchNorm's paired pooling rows seeds 7-9,
        // 11-15 and 17. The F(4x4, 5x5) Winograd convolution (about twice
        // F(2x2, 5x5)'s rounding error, ~2e-6 of the scale) met ties at
        // every seed from 10 to 45 (7e-4 to 3e-2) but 14 (1.06e-5, one late
        // tie in layer1.0.weight) and 39 (4.5e-6): about 3.5 tie flips per
        // run, so any change to a sum order on either side can pick the
        // seed again.
        "run.seed=39",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        format!("run.device={device}"),
        format!("amp.opt_level={opt_level}"),
        format!("run.out_dir={}", out.join(format!("{device}_{opt_level}")).display()),
    ])
    .filter(|s| matches!(opt_level, "O1" | "O2") || !s.starts_with("amp.init_scale"))
    .collect();
    let seed = crate::testing::repo_root().join("configs/mnist_o0.toml");
    crate::config::load(&seed, &sets).unwrap()
}

struct Run {
    /// fp32 state_dict by name (the safetensors order is not the model's).
    weights: Vec<(String, Vec<f32>)>,
    summary: crate::train::Summary,
    /// (step, overflow_steps, loss_scale) of every logged step.
    scaler: Vec<(u64, u64, f64)>,
}

/// A finished run's f32 weights by name and its logged training steps.
pub(super) fn weights_and_steps(summary: &crate::train::Summary) -> (Named, Vec<serde_json::Value>) {
    let mut weights: Named = crate::checkpoint::load_safetensors(&summary.weights)
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.value {
            StateValue::F32(v) => Some((e.name, v)),
            _ => None,
        })
        .collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    let metrics = std::fs::read_to_string(summary.weights.with_file_name("metrics.jsonl")).unwrap();
    let steps = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .collect();
    (weights, steps)
}

fn run(device: &str, opt_level: &str, out: &Path) -> Run {
    let summary = crate::train::train(&cfg(device, opt_level, out)).unwrap();
    let (weights, steps) = weights_and_steps(&summary);
    let scaler = steps
        .into_iter()
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["overflow_steps"].as_u64().unwrap(),
                v["loss_scale"].as_f64().unwrap(),
            )
        })
        .collect();
    Run { weights, summary, scaler }
}

/// The largest difference over tensors of max|gpu - cpu| / max(max|cpu|,
/// `floor`): each tensor against its own scale, so BatchNorm's biases are not
/// judged against the conv weights, but no finer than `floor`.
pub(super) fn max_rel_diff(
    gpu: &[(String, Vec<f32>)],
    cpu: &[(String, Vec<f32>)],
    floor: f32,
) -> (f32, String) {
    assert_eq!(gpu.len(), cpu.len());
    let mut worst = (0f32, String::new());
    for ((na, va), (nb, vb)) in gpu.iter().zip(cpu) {
        assert_eq!(na, nb);
        let scale = vb.iter().fold(floor, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
        let d = va.iter().zip(vb).fold(0f32, |m, (x, y)| {
            assert!(x.is_finite(), "{na}: {x}");
            m.max((x - y).abs())
        }) / scale;
        if d > worst.0 {
            worst = (d, na.clone());
        }
    }
    worst
}

type Named = Vec<(String, Vec<f32>)>;

/// (parameters of both runs, BatchNorm running statistics of both runs).
fn split_buffers(gpu: &[(String, Vec<f32>)], cpu: &[(String, Vec<f32>)]) -> ((Named, Named), (Named, Named)) {
    let is_buffer = |n: &str| n.contains(".running_");
    let pick = |v: &[(String, Vec<f32>)], want: bool| -> Named {
        v.iter().filter(|(n, _)| is_buffer(n) == want).cloned().collect()
    };
    ((pick(gpu, false), pick(cpu, false)), (pick(gpu, true), pick(cpu, true)))
}

fn parity(opt_level: &str, weight_tol: f32, floor: f32) {
    let tmp = tempfile::tempdir().unwrap();
    let cpu = run("cpu", opt_level, tmp.path());
    let gpu = run("cuda", opt_level, tmp.path());
    assert!(gpu.summary.device.starts_with("cuda:"), "{}", gpu.summary.device);
    assert_eq!(gpu.summary.steps, 20);
    let (d, name) = max_rel_diff(&gpu.weights, &cpu.weights, floor);
    let (params, buffers) = split_buffers(&gpu.weights, &cpu.weights);
    let (dp, name_p) = max_rel_diff(&params.0, &params.1, floor);
    println!(
        "{opt_level} 20 steps: max relative weight difference {d:.3e} (in {name}); final loss cpu {} gpu {}; skipped {}",
        cpu.summary.final_loss, gpu.summary.final_loss, cpu.summary.overflow_steps
    );
    assert_eq!(gpu.scaler, cpu.scaler, "{opt_level}: skipped steps and loss scale, step by step");
    assert_eq!(gpu.summary.overflow_steps, cpu.summary.overflow_steps, "{opt_level}: skipped steps");
    assert_eq!(gpu.summary.loss_scale, cpu.summary.loss_scale, "{opt_level}: final loss scale");
    assert!(
        dp < weight_tol,
        "{opt_level}: GPU weights differ from the CPU's by {dp:e} (relative) in {name_p}"
    );
    if d >= weight_tol {
        // Only O3 keeps BatchNorm's running statistics in f16: each of the 20
        // momentum updates rounds to f16 on its own, and where the batch
        // statistics differ in their last f32 bits the two devices can round
        // one f16 ulp apart at every update.
        assert_eq!(opt_level, "O3", "{opt_level}: GPU buffers differ from the CPU's by {d:e} in {name}");
        let (db, name_b) = max_rel_diff(&buffers.0, &buffers.1, floor);
        assert!(db < 20.0 / 1024.0, "{opt_level}: f16 running statistics differ by {db:e} in {name_b}");
    }
    let dl = (gpu.summary.final_loss - cpu.summary.final_loss).abs();
    assert!(
        dl < 10.0 * weight_tol as f64,
        "{opt_level}: final loss {} vs {}",
        gpu.summary.final_loss,
        cpu.summary.final_loss
    );
}

/// A 20-step GPU run differs from the CPU's by rounding only: after one step
/// the weights agree to ~7e-7 of each tensor's scale (GEMM and reduction
/// summation orders), and with the seed's warmup that stays ~2.5e-6 after 20
/// steps. (A constant lr of 0.05 from step 1 makes this model's loss blow up
/// to 13 by step 5, which amplifies the same rounding to 2e-4.)
#[test]
fn twenty_o0_steps_on_the_gpu_match_the_cpu() {
    if crate::cuda::test_gpu("twenty_o0_steps_on_the_gpu_match_the_cpu").is_some() {
        parity("O0", 1e-5, 0.0);
    }
}

/// f16 tolerance: activations and f16 weights round to 11 bits (2^-11
/// relative), and where the GPU's and the CPU's sums differ in the last bit
/// before rounding, one rounds the other way: 8 f16 ulps of the tensor's
/// largest value, or of 1.0 for tensors smaller than that. (BatchNorm's
/// biases, ~3e-3 after 20 steps, are sums of f16 terms that cancel, so
/// their own scale would judge the cancellation: 2e-2 to 4e-2 of it.)
const F16_TOL: f32 = 8.0 / 1024.0;

#[test]
fn twenty_o1_steps_on_the_gpu_track_the_cpu() {
    if crate::cuda::test_gpu("twenty_o1_steps_on_the_gpu_track_the_cpu").is_some() {
        parity("O1", F16_TOL, 1.0);
    }
}

#[test]
fn twenty_o2_steps_on_the_gpu_track_the_cpu() {
    if crate::cuda::test_gpu("twenty_o2_steps_on_the_gpu_track_the_cpu").is_some() {
        parity("O2", F16_TOL, 1.0);
    }
}

#[test]
fn twenty_o3_steps_on_the_gpu_track_the_cpu() {
    if crate::cuda::test_gpu("twenty_o3_steps_on_the_gpu_track_the_cpu").is_some() {
        parity("O3", F16_TOL, 1.0);
    }
}
