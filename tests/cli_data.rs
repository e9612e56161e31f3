//! The data formats through the binary: a CIFAR-10 directory and an .npz
//! pair train (with augmentation), broken files stop the run before it
//! writes anything, with exit 1 and a message naming the file.

mod common;
use common::*;

use std::io::Write;
use std::path::Path;

/// A small conv net on `[C, 32, 32]` inputs; `data` is the [data] table's body.
fn config(dir: &Path, channels: usize, data: &str) -> std::path::PathBuf {
    let body = format!(
        r#"[run]
seed = 3
device = "cpu"
out_dir = "{out}"

[model]
input_shape = [{channels}, 32, 32]
layers = [
  {{ type = "conv2d", out_channels = 4, kernel_size = 3, stride = 2, padding = 1 }},
  {{ type = "relu" }},
  {{ type = "flatten" }},
  {{ type = "linear", out_features = 10 }},
]

[data]
batch_size = 4
{data}

[optimizer]
lr = 0.01

[train]
max_steps = 3

[logging]
progress = "never"
tensorboard = false
"#,
        out = dir.join("out").display()
    );
    write(dir, "data.toml", &body)
}

/// CIFAR-10 records with labels `labels` (pixels from the label and position).
fn cifar_records(labels: &[u8]) -> Vec<u8> {
    labels
        .iter()
        .flat_map(|&l| {
            std::iter::once(l).chain((0..3072).map(move |k| (k as u8).wrapping_add(l.wrapping_mul(40))))
        })
        .collect()
}

fn cifar_dir(dir: &Path) -> std::path::PathBuf {
    let d = dir.join("cifar");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("data_batch_1.bin"), cifar_records(&[0, 1, 2, 3, 4, 5, 6, 7])).unwrap();
    std::fs::write(d.join("data_batch_2.bin"), cifar_records(&[8, 9, 3, 5])).unwrap();
    std::fs::write(d.join("test_batch.bin"), cifar_records(&[3, 5, 1, 0])).unwrap();
    d
}

fn cifar_data(path: &Path) -> String {
    format!(
        "dataset = \"cifar10\"\npath = \"{}\"\nrandom_crop = {{ size = 32, padding = 4 }}\nrandom_horizontal_flip = 0.5\n",
        path.display()
    )
}

fn run(cfg: &Path, sets: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["--config", cfg.to_str().unwrap()];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = ddptrain(&args, cfg.parent().unwrap());
    (o.status.code(), text(&o))
}

#[test]
fn cifar10_trains_with_augmentation_and_prefetch_does_not_change_the_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let data = cifar_dir(tmp.path());
    let cfg = config(tmp.path(), 3, &cifar_data(&data));
    let mut weights = Vec::new();
    for (k, prefetch) in ["data.prefetch=0", "data.prefetch=4"].iter().enumerate() {
        let out = tmp.path().join(format!("out{k}"));
        let out_set = format!("run.out_dir=\"{}\"", out.display());
        let (code, t) = run(&cfg, &[prefetch, &out_set]);
        assert_eq!(code, Some(0), "{t}");
        let summary = std::fs::read_to_string(out.join("summary.json")).unwrap();
        assert!(summary.contains("\"test_accuracy\""), "{summary}");
        weights.push(std::fs::read(out.join("model.safetensors")).unwrap());
    }
    assert_eq!(weights[0], weights[1], "the loader's prefetch depth changed the augmented batches");
}

#[test]
fn a_truncated_cifar_file_stops_the_run_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = cifar_dir(tmp.path());
    let f = data.join("data_batch_2.bin");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    let cfg = config(tmp.path(), 3, &cifar_data(&data));
    let (code, t) = run(&cfg, &[]);
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains(&format!("data error in {}: truncated: 12192 bytes is 3 whole 3073-byte", f.display())),
        "{t}"
    );
    assert!(!tmp.path().join("out").exists(), "a data error wrote out_dir");
    // The model must take CIFAR's shape.
    std::fs::write(&f, &bytes).unwrap();
    let cfg = config(
        tmp.path(),
        1,
        &format!("dataset = \"cifar10\"\npath = \"{}\"\nmean = [0.5]\nstd = [0.5]", data.display()),
    );
    let (code, t) = run(&cfg, &[]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("data.toml") && t.contains("`model.input_shape`"), "{t}");
    assert!(t.contains("is [1, 32, 32] but CIFAR images are [3, 32, 32]"), "{t}");
}

/// A stored .npz of `(name, .npy bytes)`.
fn npz(path: &Path, arrays: &[(&str, Vec<u8>)]) {
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in arrays {
        z.start_file(format!("{name}.npy"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    header.push_str(&" ".repeat((64 - (11 + header.len()) % 64) % 64));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

#[test]
fn npz_arrays_train_and_a_bad_label_stops_the_run_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("arrays");
    std::fs::create_dir_all(&d).unwrap();
    // NHWC uint8 images, int64 labels.
    let x: Vec<u8> = (0..8 * 32 * 32 * 2).map(|k| (k % 251) as u8).collect();
    let y: Vec<u8> = [0i64, 1, 2, 3, 4, 5, 6, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    let arrays = [("x", npy("|u1", "(8, 32, 32, 2)", &x)), ("y", npy("<i8", "(8,)", &y))];
    npz(&d.join("train.npz"), &arrays);
    npz(&d.join("test.npz"), &arrays);
    let data = format!("dataset = \"npz\"\npath = \"{}\"\nlayout = \"nhwc\"\n", d.display());
    let cfg = config(tmp.path(), 2, &data);
    let (code, t) = run(&cfg, &[]);
    assert_eq!(code, Some(0), "{t}");

    let bad: Vec<u8> = [0i64, 1, 2, 3, 4, 5, 6, 12].iter().flat_map(|v| v.to_le_bytes()).collect();
    npz(&d.join("test.npz"), &[arrays[0].clone(), ("y", npy("<i8", "(8,)", &bad))]);
    let out = tmp.path().join("out2");
    let (code, t) = run(&cfg, &[&format!("run.out_dir=\"{}\"", out.display())]);
    assert_eq!(code, Some(1), "{t}");
    let want = format!(
        "data error in {}: label 12 at index 7 is out of range: labels must be in 0..=9 (data.num_classes = 10)",
        d.join("test.npz").display()
    );
    assert!(t.contains(&want), "{t}");
    assert!(!out.exists(), "a data error wrote out_dir");
}

/// Files that load but do not fit the config are config errors (exit 2,
/// nothing written) naming the key: .npz images of another size than
/// `model.input_shape`, and cats (3) and dogs (5) read by a two-class model
/// with `data.num_classes = 2`, as a user of scripts/fetch-catsdogs.sh might write.
#[test]
fn images_of_another_shape_and_labels_past_num_classes_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("arrays");
    std::fs::create_dir_all(&d).unwrap();
    let x: Vec<u8> = (0..4 * 2 * 16 * 16).map(|k| (k % 251) as u8).collect();
    let y: Vec<u8> = [0i64, 1, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let arrays = [("x", npy("|u1", "(4, 2, 16, 16)", &x)), ("y", npy("<i8", "(4,)", &y))];
    npz(&d.join("train.npz"), &arrays);
    npz(&d.join("test.npz"), &arrays);
    let cfg = config(tmp.path(), 2, &format!("dataset = \"npz\"\npath = \"{}\"\n", d.display()));
    let (code, t) = run(&cfg, &[]);
    assert_eq!(code, Some(2), "{t}");
    let want = format!("is [2, 32, 32] but the train images in {} are [2, 16, 16]", d.display());
    assert!(t.contains("`model.input_shape`") && t.contains(&want), "{t}");
    assert!(!tmp.path().join("out").exists(), "a config error wrote out_dir");

    let cats_dogs = tmp.path().join("catsdogs");
    std::fs::create_dir_all(&cats_dogs).unwrap();
    std::fs::write(cats_dogs.join("data_batch_1.bin"), cifar_records(&[3, 5, 5, 3])).unwrap();
    std::fs::write(cats_dogs.join("test_batch.bin"), cifar_records(&[5, 3])).unwrap();
    let data = format!("dataset = \"cifar10\"\npath = \"{}\"\nnum_classes = 2\n", cats_dogs.display());
    let two = std::fs::read_to_string(config(tmp.path(), 3, &data)).unwrap();
    let cfg = write(tmp.path(), "data.toml", &two.replace("out_features = 10", "out_features = 2"));
    let (code, t) = run(&cfg, &[]);
    assert_eq!(code, Some(2), "{t}");
    let want =
        format!("is 2 but the train labels in {} go up to 5; set it to at least 6", cats_dogs.display());
    assert!(t.contains("`data.num_classes`") && t.contains(&want), "{t}");
    assert!(!tmp.path().join("out").exists(), "a config error wrote out_dir");
}
