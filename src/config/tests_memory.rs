//! The memory estimate and the refusal of runs that cannot fit.

use super::memory::{bytes, check_fits, estimate, Limit, Machine, Target};
use super::tests_load::{load_text, mnist_path, MINIMAL};
use super::*;

const GIB: u128 = 1 << 30;

fn cpu() -> Machine {
    Machine {
        target: Target::Cpu,
        threads: 2,
        train_samples: 8000,
        test_samples: 2000,
        sample_numel: Some(784),
        world_size: 1,
    }
}

fn limit(b: u128) -> Limit {
    Limit { bytes: b, source: "MemTotal in /proc/meminfo".into() }
}

/// Loads MINIMAL with `sets`, estimates it on `m` and holds it to `limit_bytes`.
fn refusal(sets: &[&str], m: &Machine, limit_bytes: u128) -> (String, String) {
    let cfg = load_text(MINIMAL, sets, &[]).0.unwrap();
    let layers = cfg.resolve_model().unwrap();
    let est = estimate(&cfg, &layers, m).unwrap();
    match check_fits(&cfg, &est, &limit(limit_bytes), 1, None) {
        Err(crate::Error::Config { file, key, msg }) => {
            assert!(file.ends_with("exp.toml"), "{file}");
            (key, msg)
        }
        other => panic!("expected a refusal, got {other:?} for {est}"),
    }
}

#[test]
fn the_seed_config_estimate_counts_each_part() {
    let cfg = load_with_env(&mnist_path(), &[], &[]).unwrap();
    let layers = cfg.resolve_model().unwrap();
    let est = estimate(&cfg, &layers, &cpu()).unwrap();
    let part = |what: &str| est.host.iter().find(|p| p.what == what).map_or(0, |p| p.bytes);
    // 29034 fp32 parameters and gradients, SGD momentum.
    assert_eq!(part("parameters+grads"), 29034 * 8);
    assert_eq!(part("masters+optimizer"), 29034 * 4);
    // 10000 samples of 1x28x28 f32 and a u32 label.
    assert_eq!(part("dataset"), 10000 * (784 * 4 + 4));
    // Measured peak resident memory of this config (40 steps and an evaluation): 56.7 MiB.
    let total = est.host_total();
    assert!((57 * (1 << 20) / 2..2 * 57 * (1 << 20)).contains(&total), "{est}");
    assert!(est.device.is_none());
    assert!(est.to_string().starts_with("memory estimate: "), "{est}");
    // O2 keeps fp32 masters beside f16 weights (BatchNorm stays fp32).
    let o2 = load_with_env(&mnist_path(), &["amp.opt_level=\"O2\"".into()], &[]).unwrap();
    let e2 = estimate(&o2, &layers, &cpu()).unwrap();
    let masters = e2.host.iter().find(|p| p.what == "masters+optimizer").unwrap().bytes;
    assert_eq!(masters, 29034 * 8);
}

#[test]
fn a_huge_input_is_refused_naming_the_largest_layer() {
    let sets = [
        "model.input_shape=[1, 100000, 100000]",
        r#"model.layers=[{type="conv2d", out_channels=8, kernel_size=3}, {type="flatten"}, {type="linear", out_features=10}]"#,
    ];
    let (key, msg) = refusal(&sets, &cpu(), 24 * GIB);
    assert_eq!(key, "model.layers[2]");
    assert!(msg.contains("the run needs an estimated") && msg.contains("TiB of host memory"), "{msg}");
    assert!(msg.contains("but 24.0 GiB are available (MemTotal in /proc/meminfo)"), "{msg}");
    assert!(msg.contains("the largest layer is 2 (Linear(in_features=79996800032"), "{msg}");
}

#[test]
fn huge_channels_and_padding_are_refused() {
    let conv = |extra: &str| {
        format!(
            r#"model.layers=[{{type="conv2d", kernel_size=3, {extra}}}, {{type="flatten"}}, {{type="linear", out_features=10}}]"#
        )
    };
    // 2^40 channels of 2x2: the linear layer after them (2^42 x 10 weights) is the largest.
    let (key, msg) = refusal(&[&conv("out_channels=1099511627776")], &cpu(), 24 * GIB);
    assert_eq!(key, "model.layers[2]");
    assert!(
        msg.contains("the largest layer is 2 (Linear(in_features=4398046511104, out_features=10"),
        "{msg}"
    );
    let (key, msg) = refusal(&[&conv("out_channels=4, padding=1000000")], &cpu(), 24 * GIB);
    assert!(key == "model.layers[0]" || key == "model.layers[2]", "{key}");
    assert!(msg.contains("PiB of host memory"), "{msg}");
}

#[test]
fn max_memory_gb_and_the_dataset_are_limits_too() {
    let cfg = load_text(MINIMAL, &["run.max_memory_gb=0.001"], &[]).0.unwrap();
    let est = estimate(&cfg, &cfg.resolve_model().unwrap(), &cpu()).unwrap();
    let user = memory::user_limit(&cfg).unwrap();
    assert_eq!(user.bytes, 1073741);
    let e = check_fits(&cfg, &est, &memory::tighter(limit(24 * GIB), Some(user)), 1, None).unwrap_err();
    assert!(e.to_string().contains("are available (run.max_memory_gb = 0.001)"), "{e}");
    // Synthetic data large enough to dominate names its size key.
    let m = Machine { train_samples: 1 << 40, sample_numel: None, ..cpu() };
    let sets = ["data.dataset=\"synthetic\"", "data.synthetic_train_size=1099511627776"];
    let (key, msg) = refusal(&sets, &m, 24 * GIB);
    assert_eq!(key, "data.synthetic_train_size");
    // 2^40 samples of 1x4x4 f32 and a u32 label.
    assert!(msg.contains("dataset takes 68.0 TiB"), "{msg}");
    // Four local ranks share the host.
    let cfg = load_text(MINIMAL, &[], &[]).0.unwrap();
    let est = estimate(&cfg, &cfg.resolve_model().unwrap(), &cpu()).unwrap();
    let one = est.host_total();
    assert!(check_fits(&cfg, &est, &limit(one), 1, None).is_ok());
    let e = check_fits(&cfg, &est, &limit(one), 4, None).unwrap_err().to_string();
    assert!(e.contains(" x 4 processes of host memory"), "{e}");
}

#[test]
fn the_gpu_path_counts_device_memory() {
    let cfg = load_with_env(&mnist_path(), &[], &[]).unwrap();
    let layers = cfg.resolve_model().unwrap();
    let m = Machine { target: Target::Gpu { total_bytes: 80 << 30, ranks_per_gpu: 1 }, ..cpu() };
    let est = estimate(&cfg, &layers, &m).unwrap();
    let dev = est.device.as_ref().unwrap();
    assert!(dev.iter().any(|p| p.what == "dataset" && p.bytes == 10000 * (784 * 4 + 4)));
    assert!(est.to_string().contains("\nmemory estimate: "), "{est}");
    let e = check_fits(&cfg, &est, &limit(24 * GIB), 1, Some((&limit(1 << 20), 1))).unwrap_err().to_string();
    assert!(e.contains("of device memory but 1.0 MiB are available"), "{e}");
    // The batch's im2col columns make layer2.0 (30.7 MiB) larger than the dataset (29.9 MiB).
    assert!(e.contains("`model.layers[1].layers[0]`: "), "{e}");
    assert!(e.contains("the largest layer is layer2.0 (Conv2d(16, 32"), "{e}");
}

#[test]
fn byte_counts_read_as_binary_units() {
    assert_eq!(bytes(17), "17 B");
    assert_eq!(bytes(1536), "1.5 KiB");
    assert_eq!(bytes(3 << 30), "3.0 GiB");
    assert_eq!(bytes(u128::MAX), format!("{:.1} ZiB", u128::MAX as f64 / 2f64.powi(70)));
}

#[test]
fn max_memory_gb_must_be_positive() {
    let (_, key, msg) = tests_load::config_err(load_text(MINIMAL, &["run.max_memory_gb=0"], &[]).0);
    assert_eq!(key, "run.max_memory_gb");
    assert_eq!(msg, "must be a positive number of GiB, got 0");
}

#[test]
fn dropout_saves_nothing_for_backward() {
    // Backward draws the mask again from its counters: a dropout adds no
    // saved activation (its output is the next layer's saved input).
    let seed = std::fs::read_to_string(mnist_path()).unwrap();
    let flatten = "[[model.layers]]\ntype = \"flatten\"";
    let with = seed.replacen(flatten, &format!("{flatten}\n\n[[model.layers]]\ntype = \"dropout\"\n"), 1);
    assert_ne!(with, seed);
    let parts = |text: &str| {
        let cfg = load_text(text, &[], &[]).0.unwrap();
        let layers = cfg.resolve_model().unwrap();
        let est = estimate(&cfg, &layers, &cpu()).unwrap();
        est.host.iter().map(|p| (p.what, p.bytes)).collect::<Vec<_>>()
    };
    let (a, b) = (parts(&seed), parts(&with));
    assert_eq!(a, b);
    let cfg = load_text(&with, &[], &[]).0.unwrap();
    let drop = cfg.resolve_model().unwrap().into_iter().find(|l| l.kind.type_name() == "dropout").unwrap();
    let m = crate::nn::layers::MemoryArgs {
        in_shape: &drop.in_shape,
        out_shape: &drop.out_shape,
        act: 4,
        batch: 100,
        threads: 2,
        on_gpu: true,
    };
    assert_eq!((drop.kind.saved_bytes(&m), drop.kind.scratch_bytes(&m)), (Some(0), Some(0)));
}

#[test]
fn preflight_counts_cifar_records_and_npz_headers() {
    let dir = tempfile::tempdir().unwrap();
    let rec = |n: usize| vec![1u8; n * 3073];
    std::fs::write(dir.path().join("data_batch_1.bin"), rec(2)).unwrap();
    std::fs::write(dir.path().join("data_batch_2.bin"), rec(1)).unwrap();
    std::fs::write(dir.path().join("test_batch.bin"), rec(2)).unwrap();
    let layers = "model.layers=[{type=\"flatten\"}, {type=\"linear\", out_features=10}]";
    let path = format!("data.path=\"{}\"", dir.path().display());
    let sets = ["data.dataset=cifar10", "model.input_shape=[3, 32, 32]", "run.device=cpu", layers, &path];
    let cfg = load_text(MINIMAL, &sets, &[]).0.unwrap();
    let part = |e: &memory::Estimate| e.host.iter().find(|p| p.what == "dataset").map_or(0, |p| p.bytes);
    assert_eq!(part(&preflight(&cfg).unwrap()), 5 * (3072 * 4 + 4));

    // .npz: N and the sample size from x's header, without reading the data.
    let npy = |n: usize| {
        let mut h = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({n}, 2, 3, 3), }}");
        h.push_str(&" ".repeat((64 - (11 + h.len()) % 64) % 64));
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend(vec![0u8; n * 18]);
        b
    };
    for (name, n) in [("train.npz", 4), ("test.npz", 3)] {
        let mut z = zip::ZipWriter::new(std::fs::File::create(dir.path().join(name)).unwrap());
        z.start_file("x.npy", zip::write::SimpleFileOptions::default()).unwrap();
        std::io::Write::write_all(&mut z, &npy(n)).unwrap();
        z.finish().unwrap();
    }
    let sets = ["data.dataset=npz", "model.input_shape=[2, 3, 3]", "run.device=cpu", layers, &path];
    let cfg = load_text(MINIMAL, &sets, &[]).0.unwrap();
    assert_eq!(part(&preflight(&cfg).unwrap()), 7 * (18 * 4 + 4));
}

/// The GPU config's attention workspace is the scratch on the device (64
/// windows x 6 heads x 256 x 256 in f16 at O2: 48 MiB, larger than any
/// layer's other scratch); on the CPU each task's per-head blocks.
#[test]
fn attention_scratch_is_counted_on_both_paths() {
    let path = crate::testing::repo_root().join("configs/gpt_sotu_gpu_o2.toml");
    let cfg = load_with_env(&path, &[], &[]).unwrap();
    let layers = cfg.resolve_model().unwrap();
    let m = Machine { target: Target::Gpu { total_bytes: 80 << 30, ranks_per_gpu: 1 }, ..cpu() };
    let est = estimate(&cfg, &layers, &m).unwrap();
    let scratch = |parts: &[super::memory::Part]| parts.iter().find(|p| p.what == "scratch").unwrap().bytes;
    assert_eq!(scratch(est.device.as_ref().unwrap()), 64 * 6 * 256 * 256 * 2);
    let est = estimate(&cfg, &layers, &cpu()).unwrap();
    // 2 tasks of 3 x 256 x 256 + 7 x 256 x 64 f32s.
    assert_eq!(scratch(&est.host), 2 * (3 * 256 * 256 + 7 * 256 * 64) * 4);
}
