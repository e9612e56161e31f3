//! The GPU trainer against the CPU trainer (the reference), end to end
//! through `train`. Skipped without a GPU; scripts/gpu-check.sh runs them.

use crate::config::tests_load::load_text;
use crate::nn::StateValue;

/// The seed ConvNet of configs/mnist_o0.toml on synthetic digits.
fn config_text() -> String {
    let seed = include_str!("../../../configs/mnist_o0.toml");
    let model = &seed[seed.find("[model]").unwrap_or(0)..seed.find("[data]").unwrap_or(seed.len())];
    format!("[run]\nseed = 3\n{model}\n{RUN}")
}

const RUN: &str = r#"
[data]
dataset = "synthetic"
synthetic_train_size = 2000
synthetic_test_size = 300
batch_size = 100
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
[train]
max_steps = 20
[logging]
progress = "never"
every_steps = 5
tensorboard = false
"#;

/// Trains the seed ConvNet for 20 steps on `device` and returns the final
/// weights (fp32 state_dict) and the summary.
fn run(
    device: &str,
    opt_level: &str,
    out: &std::path::Path,
) -> (Vec<(String, Vec<f32>)>, crate::train::Summary) {
    let dir = out.join(format!("{device}_{opt_level}"));
    let sets = [
        format!("run.device={device}"),
        format!("amp.opt_level=\"{opt_level}\""),
        format!("run.out_dir={}", dir.display()),
    ];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let cfg = load_text(&config_text(), &sets, &[]).0.unwrap();
    let summary = crate::train::train(&cfg).unwrap();
    let entries = crate::checkpoint::load_safetensors(&summary.weights).unwrap();
    let mut weights: Vec<(String, Vec<f32>)> = entries
        .into_iter()
        .filter_map(|e| match e.value {
            StateValue::F32(v) => Some((e.name, v)),
            _ => None,
        })
        .collect();
    // The file's tensor order is not the comparison's: match them by name.
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    (weights, summary)
}

/// max |a - b| over every tensor, and the largest |b| (the scale of the weights).
fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let (mut d, mut peak) = (0f32, 0f32);
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        for (x, y) in va.iter().zip(vb) {
            assert!(x.is_finite(), "{na}: {x}");
            d = d.max((x - y).abs());
            peak = peak.max(y.abs());
        }
    }
    (d, peak)
}

#[test]
fn twenty_o0_steps_on_the_gpu_match_the_cpu() {
    if crate::cuda::test_gpu("twenty_o0_steps_on_the_gpu_match_the_cpu").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (cpu, cpu_sum) = run("cpu", "O0", tmp.path());
    let (gpu, gpu_sum) = run("cuda", "O0", tmp.path());
    assert!(gpu_sum.device.starts_with("cuda:"), "{}", gpu_sum.device);
    let (d, peak) = max_diff(&gpu, &cpu);
    println!("O0 20 steps: max |w_gpu - w_cpu| = {d:.3e} (largest weight {peak:.3})");
    assert!(d < 1e-3 * peak.max(1.0), "GPU weights differ from the CPU's by {d:e}");
    let dl = (gpu_sum.final_loss - cpu_sum.final_loss).abs();
    assert!(
        dl < 1e-3 * cpu_sum.final_loss.abs().max(1.0),
        "final loss {} vs {}",
        gpu_sum.final_loss,
        cpu_sum.final_loss
    );
}

#[test]
fn twenty_o2_steps_on_the_gpu_track_the_cpu() {
    if crate::cuda::test_gpu("twenty_o2_steps_on_the_gpu_track_the_cpu").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (cpu, cpu_sum) = run("cpu", "O2", tmp.path());
    let (gpu, gpu_sum) = run("cuda", "O2", tmp.path());
    let (d, peak) = max_diff(&gpu, &cpu);
    println!("O2 20 steps: max |w_gpu - w_cpu| = {d:.3e} (largest weight {peak:.3})");
    // f16 activations round differently where cuBLAS sums in another order.
    assert!(d < 2e-2 * peak.max(1.0), "GPU weights differ from the CPU's by {d:e}");
    assert_eq!(gpu_sum.overflow_steps, cpu_sum.overflow_steps, "skipped steps");
    assert_eq!(gpu_sum.loss_scale, cpu_sum.loss_scale, "final loss scale");
}
