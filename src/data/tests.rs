use super::idx::{self, read_images, read_labels, write_images, write_labels};
use super::*;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;

const SIDE: usize = 28;
const PIX: usize = SIDE * SIDE;

/// `n` 28x28 images whose pixels encode (sample, position), and labels i % 10.
fn fake_mnist(n: usize) -> (Vec<u8>, Vec<u8>) {
    let pixels = (0..n * PIX).map(|k| ((k / PIX) * 7 + k % PIX) as u8).collect();
    let labels = (0..n).map(|i| (i % 10) as u8).collect();
    (pixels, labels)
}

/// A directory holding one MNIST split; `suffix` is "" or ".gz".
fn write_split(dir: &Path, prefix: &str, pixels: &[u8], labels: &[u8], suffix: &str) {
    write_images(&dir.join(format!("{prefix}-images-idx3-ubyte{suffix}")), SIDE, SIDE, pixels).unwrap();
    write_labels(&dir.join(format!("{prefix}-labels-idx1-ubyte{suffix}")), labels).unwrap();
}

fn err_text(r: Result<Dataset>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn raw_bytes(header: &[u32], body_len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = header.iter().flat_map(|v| v.to_be_bytes()).collect();
    b.resize(b.len() + body_len, 0);
    b
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

#[test]
fn idx_round_trip_raw_and_gz() {
    let (pixels, labels) = fake_mnist(13);
    for suffix in ["", ".gz"] {
        let dir = TempDir::new().unwrap();
        write_split(dir.path(), "train", &pixels, &labels, suffix);
        let img_path = idx::find(dir.path(), "train-images-idx3-ubyte").unwrap();
        assert!(img_path.to_string_lossy().ends_with(&format!("idx3-ubyte{suffix}")));
        let imgs = read_images(&img_path).unwrap();
        assert_eq!((imgs.count, imgs.rows, imgs.cols), (13, 28, 28));
        assert_eq!(imgs.pixels, pixels);
        let labs = read_labels(&idx::find(dir.path(), "train-labels-idx1-ubyte").unwrap()).unwrap();
        assert_eq!(labs.labels, labels);
        if suffix == ".gz" {
            // Really compressed, not a raw file with a .gz name.
            assert_eq!(&std::fs::read(&img_path).unwrap()[..2], &[0x1f, 0x8b]);
        }
    }
}

#[test]
fn load_mnist_reads_raw_and_gz_alike_and_prefers_raw() {
    let (pixels, labels) = fake_mnist(20);
    let (dr, dg) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    write_split(dr.path(), "t10k", &pixels, &labels, "");
    write_split(dg.path(), "t10k", &pixels, &labels, ".gz");
    let norm = Normalize::mnist();
    let a = load_mnist(dr.path(), Split::Test, &norm).unwrap();
    let b = load_mnist(dg.path(), Split::Test, &norm).unwrap();
    assert_eq!(a.images, b.images);
    assert_eq!(a.labels, b.labels);
    assert_eq!((a.len(), a.chw(), a.num_classes), (20, Some([1, 28, 28]), 10));
    assert_eq!(a.labels, labels.iter().map(|&l| l as u32).collect::<Vec<_>>());
    assert_eq!(a.images.len(), 20 * PIX);
    // Test split only: the train files are missing.
    assert!(load_mnist(dr.path(), Split::Train, &norm).is_err());

    // With both present the raw file wins: a broken .gz twin is never opened.
    std::fs::write(dr.path().join("t10k-images-idx3-ubyte.gz"), b"garbage").unwrap();
    assert_eq!(load_mnist(dr.path(), Split::Test, &norm).unwrap().images, a.images);
}

#[test]
fn normalization_values() {
    let dir = TempDir::new().unwrap();
    let mut pixels = vec![0u8; 2 * PIX];
    pixels[1] = 255;
    pixels[2] = 128;
    pixels[PIX] = 51;
    write_split(dir.path(), "train", &pixels, &[3, 7], "");
    let ds = load_mnist(dir.path(), Split::Train, &Normalize::mnist()).unwrap();
    let f = |p: f32| (p / 255.0 - 0.1307) / 0.3081;
    assert_eq!(ds.images[0], f(0.0));
    assert_eq!(ds.images[1], f(255.0));
    assert_eq!(ds.images[2], f(128.0));
    assert_eq!(ds.sample(1)[0], f(51.0));
    approx::assert_relative_eq!(ds.images[0], -0.424_212_9, epsilon = 1e-6);
    approx::assert_relative_eq!(ds.images[1], 2.821_487_3, epsilon = 1e-6);
    approx::assert_relative_eq!(ds.sample(1)[0], (0.2 - 0.1307) / 0.3081, epsilon = 1e-6);

    let plain = load_mnist(dir.path(), Split::Train, &Normalize::identity(1)).unwrap();
    assert_eq!(&plain.images[..3], &[0.0, 1.0, 128.0 / 255.0]);

    // Per channel: channel 1 of a 2-channel image uses mean[1], std[1].
    let n = Normalize { mean: vec![0.5, 0.0], std: vec![0.5, 2.0] };
    assert_eq!(n.apply(&[255, 0, 255, 0], 2), vec![1.0, -1.0, 0.5, 0.0]);
}

#[test]
fn bad_normalization_is_refused_with_the_keys_to_fix() {
    let dir = TempDir::new().unwrap();
    let (pixels, labels) = fake_mnist(2);
    write_split(dir.path(), "train", &pixels, &labels, "");
    let three = Normalize { mean: vec![0.5; 3], std: vec![0.5; 3] };
    let msg = err_text(load_mnist(dir.path(), Split::Train, &three));
    assert!(msg.contains("3 mean and 3 std values but the images have 1 channel"), "{msg}");
    assert!(msg.contains("`data.mean` and `data.std`"), "{msg}");
    let zero = Normalize { mean: vec![0.5], std: vec![0.0] };
    let msg = err_text(load_mnist(dir.path(), Split::Train, &zero));
    assert!(msg.contains("std 0 must be finite and > 0"), "{msg}");
    let nan = Normalize { mean: vec![f32::NAN], std: vec![1.0] };
    let msg = err_text(load_mnist(dir.path(), Split::Train, &nan));
    assert!(msg.contains("mean NaN is not finite"), "{msg}");
}

#[test]
fn missing_file_names_it_and_suggests_the_fetch_script() {
    let dir = TempDir::new().unwrap();
    let msg = err_text(load_mnist(dir.path(), Split::Train, &Normalize::mnist()));
    assert!(msg.starts_with("data error in "), "{msg}");
    assert!(msg.contains("train-images-idx3-ubyte.gz exists in"), "{msg}");
    assert!(msg.contains("scripts/fetch-mnist.sh"), "{msg}");
    assert!(msg.contains("`data.path`"), "{msg}");

    // Images there, labels not: the message is about the labels file.
    let (pixels, _) = fake_mnist(2);
    write_images(&dir.path().join("t10k-images-idx3-ubyte"), SIDE, SIDE, &pixels).unwrap();
    let msg = err_text(load_mnist(dir.path(), Split::Test, &Normalize::mnist()));
    assert!(msg.contains("t10k-labels-idx1-ubyte"), "{msg}");
    assert!(msg.contains("missing"), "{msg}");
}

/// Writes `bytes` as the train images (labels valid for `n` images) and
/// returns the load error.
fn load_with_images(bytes: &[u8], name: &str, n: usize) -> (String, PathBuf) {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join(name), bytes).unwrap();
    write_labels(&dir.path().join("train-labels-idx1-ubyte"), &vec![1; n]).unwrap();
    let msg = err_text(load_mnist(dir.path(), Split::Train, &Normalize::mnist()));
    (msg, dir.path().join(name))
}

#[test]
fn truncated_images_say_how_much_is_missing() {
    let bytes = raw_bytes(&[0x803, 8000, 28, 28], 1000 - 16);
    let (msg, path) = load_with_images(&bytes, "train-images-idx3-ubyte", 8000);
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.ends_with(
            "truncated: header says 8000 images of 28x28 (6272016 bytes) but the file has 1000 bytes"
        ),
        "{msg}"
    );
    let (msg, _) = load_with_images(&gz(&bytes), "train-images-idx3-ubyte.gz", 8000);
    assert!(msg.contains("ubyte.gz"), "{msg}");
    assert!(msg.ends_with("but the decompressed file has 1000 bytes"), "{msg}");
}

#[test]
fn trailing_data_and_short_header_are_refused() {
    let (msg, _) =
        load_with_images(&raw_bytes(&[0x803, 2, 28, 28], 2 * PIX + 5), "train-images-idx3-ubyte", 2);
    assert!(
        msg.ends_with(
            "trailing data: header says 2 images of 28x28 (1584 bytes) but the file has 1589 bytes"
        ),
        "{msg}"
    );
    let (msg, _) = load_with_images(&[0, 0, 8], "train-images-idx3-ubyte", 2);
    assert!(
        msg.ends_with("truncated: the file has 3 bytes, less than the 16-byte IDX image header"),
        "{msg}"
    );
    // A header whose byte count does not fit 64 bits: named, not multiplied into a panic.
    let m = u32::MAX;
    let (msg, _) = load_with_images(&raw_bytes(&[0x803, m, m, m], 0), "train-images-idx3-ubyte", 2);
    assert!(
        msg.ends_with(&format!("header says {m} images of {m}x{m}, which is too large to be real")),
        "{msg}"
    );
}

#[test]
fn truncated_labels_are_refused() {
    let dir = TempDir::new().unwrap();
    let (pixels, _) = fake_mnist(3);
    write_images(&dir.path().join("train-images-idx3-ubyte"), SIDE, SIDE, &pixels).unwrap();
    std::fs::write(dir.path().join("train-labels-idx1-ubyte"), raw_bytes(&[0x801, 3], 1)).unwrap();
    let msg = err_text(load_mnist(dir.path(), Split::Train, &Normalize::mnist()));
    assert!(msg.contains("train-labels-idx1-ubyte"), "{msg}");
    assert!(msg.ends_with("truncated: header says 3 labels (11 bytes) but the file has 9 bytes"), "{msg}");
}

#[test]
fn wrong_magic_is_refused() {
    // A label file where the images belong.
    let (msg, _) = load_with_images(&raw_bytes(&[0x801, 2], 2), "train-images-idx3-ubyte", 2);
    assert!(msg.contains("train-images-idx3-ubyte"), "{msg}");
    assert!(
        msg.contains("wrong magic number 0x00000801 (IDX labels): expected 0x00000803 (IDX images)"),
        "{msg}"
    );
    let (msg, _) =
        load_with_images(&raw_bytes(&[0xdead_beef, 2, 28, 28], 2 * PIX), "train-images-idx3-ubyte", 2);
    assert!(msg.contains("wrong magic number 0xdeadbeef (not an IDX unsigned-byte file)"), "{msg}");
}

#[test]
fn corrupt_gzip_is_refused() {
    let mut bytes = gz(&raw_bytes(&[0x803, 2, 28, 28], 2 * PIX));
    let n = bytes.len();
    bytes.truncate(n / 2);
    let (msg, _) = load_with_images(&bytes, "train-images-idx3-ubyte.gz", 2);
    assert!(msg.contains("train-images-idx3-ubyte.gz: corrupt gzip data"), "{msg}");
}

#[test]
fn non_28x28_images_are_refused() {
    let dir = TempDir::new().unwrap();
    write_images(&dir.path().join("train-images-idx3-ubyte"), 32, 32, &[0; 2 * 32 * 32]).unwrap();
    write_labels(&dir.path().join("train-labels-idx1-ubyte"), &[1, 2]).unwrap();
    let msg = err_text(load_mnist(dir.path(), Split::Train, &Normalize::mnist()));
    assert!(msg.ends_with("images are 32x32, but MNIST images are 28x28"), "{msg}");
    let (msg, _) = load_with_images(&raw_bytes(&[0x803, 2, 0, 28], 0), "train-images-idx3-ubyte", 2);
    assert!(msg.ends_with("header says images of 0x28: empty images"), "{msg}");
}

#[test]
fn image_label_count_mismatch_is_refused() {
    let dir = TempDir::new().unwrap();
    let (pixels, labels) = fake_mnist(5);
    write_images(&dir.path().join("train-images-idx3-ubyte"), SIDE, SIDE, &pixels).unwrap();
    write_labels(&dir.path().join("train-labels-idx1-ubyte"), &labels[..4]).unwrap();
    let msg = err_text(load_mnist(dir.path(), Split::Train, &Normalize::mnist()));
    assert!(msg.contains("train-labels-idx1-ubyte"), "{msg}");
    assert!(msg.ends_with("count mismatch: 4 labels but train-images-idx3-ubyte has 5 images"), "{msg}");
}

#[test]
fn label_out_of_range_is_refused() {
    let dir = TempDir::new().unwrap();
    let (pixels, _) = fake_mnist(4);
    write_split(dir.path(), "train", &pixels, &[0, 9, 10, 1], "");
    let msg = err_text(load_mnist(dir.path(), Split::Train, &Normalize::mnist()));
    assert!(msg.contains("train-labels-idx1-ubyte"), "{msg}");
    assert!(msg.ends_with("label 10 at index 2 is out of range: MNIST labels are 0..=9"), "{msg}");
}

#[test]
fn synthetic_is_seeded_and_well_formed() {
    let a = synthetic(7, Split::Train, 500, [1, 28, 28], 10);
    let b = synthetic(7, Split::Train, 500, [1, 28, 28], 10);
    assert_eq!((a.len(), a.chw(), a.num_classes), (500, Some([1, 28, 28]), 10));
    assert_eq!(a.images.len(), 500 * PIX);
    assert_eq!(a.images, b.images);
    assert_eq!(a.labels, b.labels);
    assert_ne!(a.images, synthetic(8, Split::Train, 500, [1, 28, 28], 10).images);
    assert_ne!(a.images, synthetic(7, Split::Test, 500, [1, 28, 28], 10).images);
    // The first samples do not depend on how many are drawn.
    let short = synthetic(7, Split::Train, 100, [1, 28, 28], 10);
    assert_eq!(short.images[..], a.images[..100 * PIX]);
    assert_eq!(short.labels[..], a.labels[..100]);
    // N(0, 1) pixels, every class drawn.
    let n = a.images.len() as f64;
    let mean = a.images.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = a.images.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "mean {mean} var {var}");
    assert!(a.labels.iter().all(|&l| l < 10));
    assert_eq!(a.labels.iter().collect::<HashSet<_>>().len(), 10);
    let three = synthetic(1, Split::Test, 40, [3, 4, 5], 3);
    assert_eq!((three.images.len(), three.sample_numel()), (40 * 60, 60));
    assert!(three.labels.iter().all(|&l| l < 3));
}

fn sampler(len: usize, w: usize, rank: usize, shuffle: bool, drop_last: bool) -> DistributedSampler {
    DistributedSampler { len, num_replicas: w, rank, shuffle, seed: 42, drop_last }
}

#[test]
fn sampler_single_replica_shuffle_is_a_permutation() {
    let s = sampler(1000, 1, 0, true, false);
    let idx = s.indices(0);
    assert_eq!(s.num_samples(), 1000);
    let mut sorted = idx.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
    assert_ne!(idx, sorted, "shuffled");
    assert_eq!(sampler(1000, 1, 0, false, false).indices(3), sorted, "shuffle=false keeps file order");
}

#[test]
fn sampler_is_deterministic_per_seed_and_epoch() {
    let s = sampler(100, 2, 1, true, false);
    assert_eq!(s.indices(5), s.indices(5));
    assert_ne!(s.indices(5), s.indices(6));
    let other_seed = DistributedSampler { seed: 43, ..s.clone() };
    assert_ne!(s.indices(5), other_seed.indices(5));
    // Ranks see the same epoch permutation: rank 0 and 1 interleave it.
    let r0 = sampler(100, 2, 0, true, false).indices(5);
    let whole = sampler(100, 1, 0, true, false).indices(5);
    let merged: Vec<usize> = r0.iter().zip(s.indices(5)).flat_map(|(&a, b)| [a, b]).collect();
    assert_eq!(merged, whole);
}

#[test]
fn sampler_ranks_partition_the_padded_set() {
    for w in [2, 3] {
        for len in [9, 10, 11, 12] {
            let whole = sampler(len, 1, 0, true, false).indices(2);
            let per_rank: Vec<Vec<usize>> =
                (0..w).map(|r| sampler(len, w, r, true, false).indices(2)).collect();
            let n = len.div_ceil(w);
            assert!(per_rank.iter().all(|v| v.len() == n), "len {len} W {w}: equal counts");
            assert_eq!(sampler(len, w, 0, true, false).num_samples(), n);
            // Padded set = the permutation followed by its first few entries.
            let mut padded = whole.clone();
            padded.extend_from_slice(&whole[..n * w - len]);
            for (r, v) in per_rank.iter().enumerate() {
                let expect: Vec<usize> = padded.iter().copied().skip(r).step_by(w).collect();
                assert_eq!(v, &expect, "len {len} W {w} rank {r}");
            }
            let seen: HashSet<usize> = per_rank.iter().flatten().copied().collect();
            assert_eq!(seen.len(), len, "every sample visited");
        }
    }
}

#[test]
fn sampler_padding_matches_torch_without_shuffle() {
    // torch: DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False)
    let r: Vec<Vec<usize>> = (0..3).map(|r| sampler(10, 3, r, false, false).indices(0)).collect();
    assert_eq!(r, vec![vec![0, 3, 6, 9], vec![1, 4, 7, 0], vec![2, 5, 8, 1]]);
    // Padding longer than the data repeats it more than once: [0,1,0,1,0].
    let r: Vec<Vec<usize>> = (0..5).map(|r| sampler(2, 5, r, false, false).indices(0)).collect();
    assert_eq!(r, vec![vec![0], vec![1], vec![0], vec![1], vec![0]]);
    assert!(sampler(10, 3, 3, false, false).indices(0).is_empty(), "rank out of range");
    assert_eq!(sampler(0, 2, 0, true, false).indices(0), Vec::<usize>::new());
}

#[test]
fn sampler_drop_last_cuts_the_tail() {
    // torch: num_samples = ceil((10 - 3) / 3) = 3; total 9; no duplicates.
    let s = sampler(10, 3, 0, false, true);
    assert_eq!((s.num_samples(), s.total_size()), (3, 9));
    let r: Vec<Vec<usize>> = (0..3).map(|r| sampler(10, 3, r, false, true).indices(0)).collect();
    assert_eq!(r, vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5, 8]]);
    let shuffled: Vec<usize> = (0..3).flat_map(|r| sampler(10, 3, r, true, true).indices(4)).collect();
    assert_eq!(shuffled.iter().collect::<HashSet<_>>().len(), 9, "no sample twice");
    // Divisible length: drop_last changes nothing.
    assert_eq!(sampler(12, 3, 1, true, true).indices(1), sampler(12, 3, 1, true, false).indices(1));
    assert_eq!(sampler(2, 5, 0, true, true).num_samples(), 0);
}

/// 10 samples of [1, 2, 2], sample i filled with i, label i % 3.
fn tiny_dataset() -> Arc<Dataset> {
    let images = (0..10).flat_map(|i| [i as f32; 4]).collect();
    Arc::new(Dataset::images(images, (0..10).map(|i| i % 3).collect(), [1, 2, 2], 3))
}

fn batches(loader: Loader) -> Vec<(Vec<usize>, Vec<f32>, Vec<u32>)> {
    loader.map(|b| (b.images.shape().to_vec(), b.images.as_f32().unwrap().to_vec(), b.labels)).collect()
}

#[test]
fn loader_batches_follow_indices_and_drop_last() {
    let ds = tiny_dataset();
    let order = vec![9, 2, 5, 0, 7, 1, 3];
    let l = Loader::new(Arc::clone(&ds), order.clone(), 3, false, 2);
    assert_eq!((l.num_batches(), l.len()), (3, 3));
    let got = batches(l);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].0, vec![3, 1, 2, 2]);
    assert_eq!(got[2].0, vec![1, 1, 2, 2], "partial last batch kept");
    let seen: Vec<f32> = got.iter().flat_map(|b| b.1.chunks(4).map(|s| s[0])).collect();
    assert_eq!(seen, order.iter().map(|&i| i as f32).collect::<Vec<_>>());
    let labels: Vec<u32> = got.iter().flat_map(|b| b.2.clone()).collect();
    assert_eq!(labels, order.iter().map(|&i| (i % 3) as u32).collect::<Vec<_>>());

    let l = Loader::new(Arc::clone(&ds), order.clone(), 3, true, 2);
    assert_eq!(l.num_batches(), 2);
    let got = batches(l);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|b| b.0 == vec![3, 1, 2, 2]));
    // Exact multiple: drop_last drops nothing; empty indices: no batches.
    assert_eq!(Loader::new(Arc::clone(&ds), order[..6].to_vec(), 3, true, 0).count(), 2);
    assert_eq!(Loader::new(ds, Vec::new(), 3, false, 1).count(), 0);
}

#[test]
fn loader_without_thread_gives_the_same_batches() {
    let ds = tiny_dataset();
    let order = vec![4, 4, 8, 1, 0];
    let threaded = batches(Loader::with_thread(Arc::clone(&ds), order.clone(), 2, false, 1, None, true));
    let inline = batches(Loader::with_thread(ds, order, 2, false, 1, None, false));
    assert_eq!(threaded, inline);
    assert_eq!(inline.len(), 3);
}

#[test]
fn dropping_a_loader_mid_epoch_does_not_hang() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ds = Arc::new(synthetic(1, Split::Train, 2000, [1, 28, 28], 10));
        for prefetch in [0, 1, 4] {
            let mut l = Loader::new(Arc::clone(&ds), (0..2000).collect(), 10, false, prefetch);
            assert!(l.next().is_some());
            // Let the thread fill the channel and block on a send.
            std::thread::sleep(Duration::from_millis(50));
            drop(l);
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("dropping the loader hung");
}

#[test]
#[should_panic(expected = "index 10 is out of range for a dataset of 10 samples")]
fn loader_refuses_out_of_range_indices() {
    let _ = Loader::new(tiny_dataset(), vec![0, 10], 2, false, 1);
}

/// The real files from scripts/fetch-mnist.sh, when they have been fetched.
#[test]
fn real_mnist_if_fetched() {
    let dir = crate::testing::repo_root().join("data/mnist");
    if !dir.join("train-labels-idx1-ubyte").exists() && !dir.join("train-labels-idx1-ubyte.gz").exists() {
        println!("note: {} absent (run scripts/fetch-mnist.sh); skipping", dir.display());
        return;
    }
    let norm = Normalize::mnist();
    let train = load_mnist(&dir, Split::Train, &norm).unwrap();
    let test = load_mnist(&dir, Split::Test, &norm).unwrap();
    let counts = (train.len(), test.len());
    assert!(counts == (8000, 2000) || counts == (60000, 10000), "{counts:?}");
    for ds in [&train, &test] {
        assert_eq!(ds.images.len(), ds.len() * PIX);
        let mut hist = [0usize; 10];
        ds.labels.iter().for_each(|&l| hist[l as usize] += 1);
        // Every digit about a tenth of the split.
        assert!(hist.iter().all(|&h| h * 20 > ds.len() && h * 5 < ds.len()), "{hist:?}");
        // Mostly background, some full-ink pixels; roughly zero-mean after Normalize.
        let lo = (0.0 - 0.1307) / 0.3081;
        let bg = ds.images.iter().filter(|&&v| v == lo).count() as f64 / ds.images.len() as f64;
        assert!((0.7..0.9).contains(&bg), "background fraction {bg}");
        let mean = ds.images.iter().map(|&v| v as f64).sum::<f64>() / ds.images.len() as f64;
        assert!(mean.abs() < 0.1, "mean {mean}");
    }
}

#[test]
fn a_resharded_epoch_deals_the_rest_of_its_order_to_the_new_ranks() {
    // One rank visited 3 batches of 4 of epoch 2; three ranks take the rest.
    let whole = sampler(37, 1, 0, true, false).indices(2);
    let consumed = 12;
    let ranks: Vec<Vec<usize>> =
        (0..3).map(|r| sampler(37, 3, r, true, false).indices_after(2, consumed)).collect();
    assert!(ranks.iter().all(|r| r.len() == 9), "25 left, padded to 27: {ranks:?}");
    let mut dealt: Vec<usize> = (0..9).flat_map(|i| ranks.iter().map(move |r| r[i])).collect();
    assert_eq!(dealt[..25], whole[12..], "the rest of the epoch, in its order");
    assert_eq!(dealt[25..], whole[12..14], "padded from the rest's start");
    dealt.truncate(25);
    let cut: Vec<Vec<usize>> =
        (0..3).map(|r| sampler(37, 3, r, true, true).indices_after(2, consumed)).collect();
    assert!(cut.iter().all(|r| r.len() == 8), "drop_last cuts 25 to 24: {cut:?}");
    assert!(
        sampler(37, 3, 0, true, false).indices_after(2, 40).is_empty(),
        "a visited epoch has nothing left"
    );
    assert_eq!(sampler(37, 1, 0, true, false).indices_after(2, 0), whole);
}
