//! A small GPT (tests/common/gpt.toml: nanoGPT's module tree, tied lm_head,
//! AdamW with nanoGPT's decay groups, grad clipping) trained end to end
//! through `train` on the device and on the CPU, from the same seed and
//! windows, at every opt level. Skipped without a GPU (a failure under `CI=true`).

use super::tests_cuda::{max_rel_diff, weights_and_steps};
use crate::config::Config;
use std::path::Path;

/// 2 layers, 2 heads, width 16, block 8, over the distinct characters of
/// the text (the model's vocabulary is exactly the corpus's).
/// `p` is every dropout's probability: attention's, the residual ones and
/// the embeddings'.
fn cfg(text: &Path, device: &str, opt_level: &str, p: &str, out: &Path) -> Config {
    let body = std::fs::read_to_string(text).unwrap();
    let mut chars: Vec<char> = body.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    let fill = [
        ("{VOCAB}", "chars".to_owned()),
        ("{C3}", "48".to_owned()),
        ("{C4}", "64".to_owned()),
        ("{C}", "16".to_owned()),
        ("{T}", "8".to_owned()),
        ("{H}", "2".to_owned()),
        ("{L}", "2".to_owned()),
        ("{V}", chars.len().to_string()),
        ("{P}", p.to_owned()),
        ("dropout_p = 0.0", format!("dropout_p = {p}")),
        ("p = 0.0", format!("p = {p}")),
    ];
    let toml = fill
        .iter()
        .fold(include_str!("../../../tests/common/gpt.toml").to_owned(), |t, (k, v)| t.replace(k, v));
    let dir = out.join(format!("{device}_{opt_level}_{p}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpt.toml");
    std::fs::write(&path, toml).unwrap();
    let mut sets = vec![
        format!("data.path={}", text.display()),
        "train.max_steps=3".to_owned(),
        "logging.every_steps=1".to_owned(),
        format!("run.device={device}"),
        format!("amp.opt_level={opt_level}"),
        format!("run.out_dir={}", dir.join("run").display()),
    ];
    // Adam moves a weight by about lr * g / (|g| + eps): with eps = 1e-8 a
    // gradient that cancels to within f16 rounding of zero moves it by a
    // whole lr, in the direction of whichever side of zero the rounding
    // left it on, so one such element measures a sign, not the numerics
    // (configs/gpt_sotu_o2.toml's model at lr 0.01 after 3 steps, device
    // against CPU: AdamW at O2 0.40 of a tensor's scale in 1 to 6 of its
    // elements, SGD at O2 1.7e-4, AdamW at O0 3e-3; this model at O3:
    // 2.7e-2). With eps = 1e-3, above these gradients, the update is
    // proportional to the gradient and its rounding moves a weight by at
    // most lr / eps times the gradient's own rounding.
    if opt_level != "O0" {
        sets.push("optimizer.eps=1e-3".to_owned());
    }
    crate::config::load(&path, &sets).unwrap()
}

struct Run {
    weights: Vec<(String, Vec<f32>)>,
    summary: crate::train::Summary,
    /// The loss of each logged step.
    losses: Vec<f64>,
}

fn run(text: &Path, device: &str, opt_level: &str, p: &str, out: &Path) -> Run {
    let summary = crate::train::train(&cfg(text, device, opt_level, p, out)).unwrap();
    let (weights, steps) = weights_and_steps(&summary);
    let losses = steps.iter().map(|v| v["loss"].as_f64().unwrap()).collect();
    Run { weights, summary, losses }
}

/// A few sentences, repeated with variations: enough windows of 9 for
/// three batches of 4 and a validation split.
fn corpus(dir: &Path) -> std::path::PathBuf {
    let mut text = String::new();
    for i in 0..40 {
        text.push_str(&format!(
            "The state of the union is strong, said speaker {i}. We hold these truths.\n"
        ));
    }
    let path = dir.join("input.txt");
    std::fs::write(&path, text).unwrap();
    path
}

/// The device's run against the CPU's at `opt_level` with dropout `p`
/// (skipped without a GPU): weights within `weight_tol` of each tensor's
/// scale, every step's loss and the validation loss within `loss_tol`
/// relative.
fn parity(test: &str, opt_level: &str, p: &str, weight_tol: f32, loss_tol: f64) {
    if crate::cuda::test_gpu(test).is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let text = corpus(tmp.path());
    let cpu = run(&text, "cpu", opt_level, p, tmp.path());
    let gpu = run(&text, "cuda", opt_level, p, tmp.path());
    assert!(gpu.summary.device.starts_with("cuda:"), "{}", gpu.summary.device);
    assert_eq!((gpu.summary.steps, cpu.summary.steps), (3, 3));
    assert_eq!(gpu.losses.len(), 3, "{opt_level}: a logged loss per step");
    assert_eq!(gpu.summary.overflow_steps, cpu.summary.overflow_steps, "{opt_level}: skipped steps");
    // Every parameter, the tied lm_head.weight under both its names.
    assert_eq!(
        gpu.weights.len(),
        16,
        "{opt_level}: {:?}",
        gpu.weights.iter().map(|w| &w.0).collect::<Vec<_>>()
    );
    let (d, name) = max_rel_diff(&gpu.weights, &cpu.weights, 0.0);
    let dl = gpu.losses.iter().zip(&cpu.losses).map(|(g, c)| (g - c).abs() / c.abs()).fold(0.0, f64::max);
    let (gv, cv) = (gpu.summary.val_loss.unwrap(), cpu.summary.val_loss.unwrap());
    println!(
        "GPT {opt_level} dropout {p} 3 steps: max relative weight difference {d:.3e} (in {name}); losses cpu {:?} gpu {:?} (max relative {dl:.3e}); val loss cpu {cv} gpu {gv}",
        cpu.losses, gpu.losses
    );
    let dl = dl.max((gv - cv).abs() / cv);
    assert!(d < weight_tol, "{opt_level}: weights differ by {d:e} (relative) in {name}");
    assert!(dl < loss_tol, "{opt_level}: losses differ by {dl:e} (relative)");
}

/// fp32 on both: the GEMMs' summation orders (linear and attention) are
/// the only difference (every other kernel adds in the CPU's order).
/// Measured: 5.3e-7 of a tensor's largest weight after three AdamW steps
/// (h.1.mlp.c_fc.weight), losses 3.5e-8 relative.
#[test]
fn a_gpt_trains_three_o0_steps_on_the_gpu_like_the_cpu() {
    parity("a_gpt_trains_three_o0_steps_on_the_gpu_like_the_cpu", "O0", "0.0", 1e-5, 1e-5);
}

/// O2: f16 weights (LayerNorm's too, run on f32 copies) and activations,
/// f32 masters, dynamic loss scale. Both sides store every activation,
/// weight and gradient in f16, so where the GEMMs' summation orders differ
/// in the last f32 bit, a value rounds one f16 ulp (2^-11 relative) the
/// other way, and that difference travels through the next layers and the
/// three updates. Measured: 3.5e-4 of a tensor's largest weight (in
/// transformer.wpe.weight, under one f16 ulp of it), losses 5.4e-6
/// relative. Bounds: 4 f16 ulps of each tensor's scale (2^-9) for the
/// weights; for the losses (f32 sums over f16 logits whose roundings
/// average out) one f16 ulp, 2^-11.
#[test]
fn a_gpt_trains_three_o2_steps_on_the_gpu_tracking_the_cpu() {
    parity("a_gpt_trains_three_o2_steps_on_the_gpu_tracking_the_cpu", "O2", "0.0", 1.0 / 512.0, 1.0 / 2048.0);
}

/// O1: f32 weights and activations, the linears (lm_head too, on wte's
/// weight) computing in f16 per call. Each GEMM output is rounded to f16 on
/// both sides, which hides most summation-order differences (measured: the
/// same weights, losses within 3.0e-8), but one that straddles a rounding
/// boundary moves an output by an f16 ulp: O2's bounds.
#[test]
fn a_gpt_trains_three_o1_steps_on_the_gpu_tracking_the_cpu() {
    parity("a_gpt_trains_three_o1_steps_on_the_gpu_tracking_the_cpu", "O1", "0.0", 1.0 / 512.0, 1.0 / 2048.0);
}

/// O3: f16 weights without masters (each update rounded to f16), loss
/// scale 1: O2's bounds, an update's rounding being one f16 ulp. Measured:
/// 4.5e-4 (h.1.mlp.c_proj.weight), losses 9.3e-6.
#[test]
fn a_gpt_trains_three_o3_steps_on_the_gpu_tracking_the_cpu() {
    parity("a_gpt_trains_three_o3_steps_on_the_gpu_tracking_the_cpu", "O3", "0.0", 1.0 / 512.0, 1.0 / 2048.0);
}

/// Dropout 0.1 everywhere nanoGPT has it (attention's softmax, the
/// residual branches, the embeddings): the device draws each mask from the
/// CPU's Philox counters, so O0 keeps O0's bounds. Measured: 1.4e-6 of a
/// tensor's largest weight (h.0.attn.c_attn.weight), losses 3.4e-8.
#[test]
fn a_gpt_with_dropout_trains_three_o0_steps_on_the_gpu_like_the_cpu() {
    parity("a_gpt_with_dropout_trains_three_o0_steps_on_the_gpu_like_the_cpu", "O0", "0.1", 1e-5, 1e-5);
}

/// The same at O2, with O2's bounds. Measured: 2.5e-4 (lm_head.weight),
/// losses 2.2e-5.
#[test]
fn a_gpt_with_dropout_trains_three_o2_steps_on_the_gpu_tracking_the_cpu() {
    let test = "a_gpt_with_dropout_trains_three_o2_steps_on_the_gpu_tracking_the_cpu";
    parity(test, "O2", "0.1", 1.0 / 512.0, 1.0 / 2048.0);
}
