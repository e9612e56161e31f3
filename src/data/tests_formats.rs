//! CIFAR binary files, .npz arrays and Fashion-MNIST: what they decode to,
//! and every broken file named with what is wrong.

use super::cifar::{self, Cifar};
use super::idx::{write_images, write_labels};
use super::*;
use std::io::Write;
use tempfile::TempDir;

fn err_text(r: Result<Dataset>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

const PIXELS: usize = 3072;

/// One CIFAR record: `labels` then pixels that encode (seed, position).
fn record(labels: &[u8], seed: u8) -> Vec<u8> {
    let mut r = labels.to_vec();
    r.extend((0..PIXELS).map(|k| (k as u8).wrapping_mul(3).wrapping_add(seed)));
    r
}

fn cifar10_dir(train: &[(&str, &[u8])], test: &[u8]) -> TempDir {
    let dir = TempDir::new().unwrap();
    for (name, labels) in train {
        let bytes: Vec<u8> = labels.iter().flat_map(|&l| record(&[l], l)).collect();
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let bytes: Vec<u8> = test.iter().flat_map(|&l| record(&[l], l)).collect();
    std::fs::write(dir.path().join("test_batch.bin"), bytes).unwrap();
    dir
}

#[test]
fn cifar10_reads_every_batch_in_numeric_order_channel_planar() {
    let dir = cifar10_dir(
        &[("data_batch_10.bin", &[9]), ("data_batch_2.bin", &[4, 5]), ("data_batch_1.bin", &[0, 1])],
        &[7, 3],
    );
    // Not batches: ignored.
    std::fs::write(dir.path().join("batches.meta.txt"), "cat\n").unwrap();
    std::fs::write(dir.path().join("data_batch_x.bin"), "junk").unwrap();
    let norm = Normalize::identity(3);
    let train = cifar::load(dir.path(), Cifar::Ten, Split::Train, &norm).unwrap();
    assert_eq!(train.labels, vec![0, 1, 4, 5, 9], "data_batch_1, _2, _10");
    assert_eq!((train.chw(), train.num_classes), (Some([3, 32, 32]), 10));
    // Record bytes are the [3, 32, 32] image as stored: red plane first.
    let want: Vec<f32> = record(&[4], 4)[1..].iter().map(|&p| f32::from(p) / 255.0).collect();
    assert_eq!(train.sample(2), &want[..]);
    let test = cifar::load(dir.path(), Cifar::Ten, Split::Test, &norm).unwrap();
    assert_eq!(test.labels, vec![7, 3]);

    // Per-channel statistics: the green plane uses mean[1] and std[1].
    let n = Normalize { mean: vec![0.0, 0.5, 0.0], std: vec![1.0, 0.25, 1.0] };
    let ds = cifar::load(dir.path(), Cifar::Ten, Split::Test, &n).unwrap();
    let g = record(&[7], 7)[1 + 1024];
    assert_eq!(ds.sample(0)[1024], (f32::from(g) / 255.0 - 0.5) / 0.25);
}

#[test]
fn cifar100_uses_the_fine_label() {
    let dir = TempDir::new().unwrap();
    let bytes: Vec<u8> = [record(&[19, 57], 1), record(&[0, 99], 2)].concat();
    std::fs::write(dir.path().join("train.bin"), &bytes).unwrap();
    std::fs::write(dir.path().join("test.bin"), &bytes[..3074]).unwrap();
    let ds = cifar::load(dir.path(), Cifar::Hundred, Split::Train, &Normalize::identity(3)).unwrap();
    assert_eq!((ds.labels.clone(), ds.num_classes), (vec![57, 99], 100));
    assert_eq!(ds.sample(1)[0], 2.0 / 255.0);
    assert_eq!(
        cifar::load(dir.path(), Cifar::Hundred, Split::Test, &Normalize::identity(3)).unwrap().len(),
        1
    );
}

#[test]
fn truncated_and_empty_cifar_files_are_refused() {
    let dir = cifar10_dir(&[("data_batch_1.bin", &[1, 2])], &[1]);
    let path = dir.path().join("data_batch_1.bin");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..6000]).unwrap();
    let msg = err_text(cifar::load(dir.path(), Cifar::Ten, Split::Train, &Normalize::identity(3)));
    assert!(msg.starts_with(&format!("data error in {}: ", path.display())), "{msg}");
    assert!(
        msg.ends_with(
            "truncated: 6000 bytes is 1 whole 3073-byte CIFAR-10 records and 2927 bytes over; fetch the file again"
        ),
        "{msg}"
    );
    std::fs::write(&path, b"").unwrap();
    let msg = err_text(cifar::load(dir.path(), Cifar::Ten, Split::Train, &Normalize::identity(3)));
    assert!(msg.ends_with("data_batch_1.bin: empty file: no CIFAR-10 records"), "{msg}");
    // A CIFAR-10 file read as CIFAR-100: records of the wrong length.
    let hundred = TempDir::new().unwrap();
    std::fs::write(hundred.path().join("test.bin"), record(&[3], 0).repeat(2)).unwrap();
    let msg = err_text(cifar::load(hundred.path(), Cifar::Hundred, Split::Test, &Normalize::identity(3)));
    assert!(msg.contains("6146 bytes is 1 whole 3074-byte CIFAR-100 records and 3072 bytes over"), "{msg}");
    std::fs::write(hundred.path().join("test.bin"), b"").unwrap();
    let msg = err_text(cifar::load(hundred.path(), Cifar::Hundred, Split::Test, &Normalize::identity(3)));
    assert!(msg.ends_with("test.bin: empty file: no CIFAR-100 records"), "{msg}");
}

#[test]
fn cifar_labels_out_of_range_are_refused() {
    let dir = cifar10_dir(&[("data_batch_1.bin", &[1, 10, 2])], &[1]);
    let msg = err_text(cifar::load(dir.path(), Cifar::Ten, Split::Train, &Normalize::identity(3)));
    assert!(msg.contains("data_batch_1.bin"), "{msg}");
    assert!(msg.ends_with(
        "label 10 of record 1 is out of range: CIFAR-10 labels are 0..=9 (is this a CIFAR-10 file?)"
    ));
    let d = TempDir::new().unwrap();
    std::fs::write(d.path().join("train.bin"), record(&[2, 100], 0)).unwrap();
    let msg = err_text(cifar::load(d.path(), Cifar::Hundred, Split::Train, &Normalize::identity(3)));
    assert!(
        msg.contains("train.bin: label 100 of record 0 is out of range: CIFAR-100 labels are 0..=99"),
        "{msg}"
    );
}

#[test]
fn missing_cifar_files_say_how_to_get_them() {
    let empty = TempDir::new().unwrap();
    let msg = err_text(cifar::load(empty.path(), Cifar::Ten, Split::Train, &Normalize::identity(3)));
    assert!(msg.contains("data_batch_1.bin: missing: no data_batch_<n>.bin in"), "{msg}");
    assert!(msg.contains("cifar-10-binary.tar.gz") && msg.contains("scripts/fetch-catsdogs.sh"), "{msg}");
    let msg = err_text(cifar::load(empty.path(), Cifar::Ten, Split::Test, &Normalize::identity(3)));
    assert!(msg.contains("test_batch.bin: missing: no test_batch.bin in"), "{msg}");
    let msg = err_text(cifar::load(empty.path(), Cifar::Hundred, Split::Train, &Normalize::identity(3)));
    assert!(msg.contains("train.bin: missing") && msg.contains("cifar-100-binary.tar.gz"), "{msg}");
    let gone = empty.path().join("nope");
    let msg = err_text(cifar::load(&gone, Cifar::Ten, Split::Train, &Normalize::identity(3)));
    assert!(msg.contains("nope: cannot read the CIFAR-10 directory"), "{msg}");
    // One mean for three channels.
    let dir = cifar10_dir(&[("data_batch_1.bin", &[1])], &[1]);
    let msg = err_text(cifar::load(dir.path(), Cifar::Ten, Split::Train, &Normalize::mnist()));
    assert!(msg.contains("1 mean and 1 std values but the images have 3 channel(s)"), "{msg}");
}

/// A .npy file (format 1.0) of `descr` (numpy's dtype string), `shape`, and raw `data`.
fn npy(descr: &str, shape: &[usize], data: &[u8], fortran: bool) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if shape.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let order = if fortran { "True" } else { "False" };
    npy_with_header(&format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}"), data)
}

/// A .npy file (format 1.0) whose header is the dict `header`, then `data`.
fn npy_with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut header = header.to_string();
    let used = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - used % 64) % 64));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

fn write_npz(path: &Path, arrays: &[(&str, Vec<u8>)], deflate: bool) {
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let method = if deflate { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in arrays {
        z.start_file(format!("{name}.npy"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An archive's arrays: (name, .npy bytes).
type Arrays = Vec<(&'static str, Vec<u8>)>;

/// Two 3x2x2 images (NCHW bytes 0..24) and labels [1, 0].
fn good_arrays() -> Arrays {
    let x: Vec<u8> = (0..24).collect();
    vec![("x", npy("|u1", &[2, 3, 2, 2], &x, false)), ("y", npy("<i8", &[2], &i64s(&[1, 0]), false))]
}

fn npz_load(arrays: &[(&str, Vec<u8>)], nhwc: bool) -> (Result<Dataset>, TempDir) {
    let dir = TempDir::new().unwrap();
    write_npz(&dir.path().join("train.npz"), arrays, false);
    let channels = 3;
    (npz::load(dir.path(), Split::Train, &Normalize::identity(channels), nhwc, 10), dir)
}

fn npz_err(arrays: &[(&str, Vec<u8>)]) -> String {
    let (r, dir) = npz_load(arrays, false);
    let msg = err_text(r);
    let path = dir.path().join("train.npz");
    assert!(msg.starts_with(&format!("data error in {}: ", path.display())), "{msg}");
    msg
}

#[test]
fn npz_uint8_nchw_nhwc_and_compressed_read_alike() {
    let (ds, _d) = npz_load(&good_arrays(), false);
    let ds = ds.unwrap();
    assert_eq!((ds.len(), ds.chw(), ds.labels.clone()), (2, Some([3, 2, 2]), vec![1, 0]));
    let want: Vec<f32> = (0..24).map(|p| p as f32 / 255.0).collect();
    assert_eq!(ds.images, want, "uint8 scaled by 1/255 as ToTensor does");

    // The same images stored [N, H, W, C].
    let mut hwc = vec![0u8; 24];
    for (k, v) in hwc.iter_mut().enumerate() {
        let (n, p, c) = (k / 12, (k % 12) / 3, k % 3);
        *v = (n * 12 + c * 4 + p) as u8;
    }
    let arrays = vec![("x", npy("|u1", &[2, 2, 2, 3], &hwc, false)), good_arrays().remove(1)];
    assert_eq!(npz_load(&arrays, true).0.unwrap().images, want);

    let dir = TempDir::new().unwrap();
    write_npz(&dir.path().join("test.npz"), &good_arrays(), true);
    let ds = npz::load(dir.path(), Split::Test, &Normalize::identity(3), false, 10).unwrap();
    assert_eq!(ds.images, want, "np.savez_compressed");
}

#[test]
fn npz_float32_is_taken_as_is_then_normalized() {
    let x: Vec<u8> = [0.5f32, 2.0, -1.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let y: Vec<u8> = [3u8, 9].to_vec();
    let dir = TempDir::new().unwrap();
    write_npz(
        &dir.path().join("train.npz"),
        &[("x", npy("<f4", &[2, 1, 1, 2], &x, false)), ("y", npy("|u1", &[2], &y, false))],
        false,
    );
    let norm = Normalize { mean: vec![0.5], std: vec![2.0] };
    let ds = npz::load(dir.path(), Split::Train, &norm, false, 10).unwrap();
    assert_eq!(ds.images, vec![0.0, 0.75, -0.75, -0.25]);
    assert_eq!(ds.labels, vec![3, 9]);
    // Big-endian float32 and int32 labels read the same.
    let xb: Vec<u8> = [0.5f32, 2.0, -1.0, 0.0].iter().flat_map(|v| v.to_be_bytes()).collect();
    let yb: Vec<u8> = [3i32, 9].iter().flat_map(|v| v.to_be_bytes()).collect();
    write_npz(
        &dir.path().join("train.npz"),
        &[("x", npy(">f4", &[2, 1, 1, 2], &xb, false)), ("y", npy(">i4", &[2], &yb, false))],
        false,
    );
    let be = npz::load(dir.path(), Split::Train, &norm, false, 10).unwrap();
    assert_eq!((be.images, be.labels), (ds.images, ds.labels));
}

#[test]
fn npz_missing_or_unreadable_files_are_refused() {
    let dir = TempDir::new().unwrap();
    let msg = err_text(npz::load(dir.path(), Split::Test, &Normalize::identity(3), false, 10));
    assert!(msg.contains("test.npz: cannot open"), "{msg}");
    assert!(msg.contains("numpy.savez(path, x=images, y=labels)"), "{msg}");
    std::fs::write(dir.path().join("test.npz"), b"not a zip at all").unwrap();
    let msg = err_text(npz::load(dir.path(), Split::Test, &Normalize::identity(3), false, 10));
    assert!(msg.contains("test.npz: not a readable .npz (zip) archive"), "{msg}");
    // A whole archive cut short loses its central directory.
    write_npz(&dir.path().join("test.npz"), &good_arrays(), false);
    let bytes = std::fs::read(dir.path().join("test.npz")).unwrap();
    std::fs::write(dir.path().join("test.npz"), &bytes[..bytes.len() / 2]).unwrap();
    let msg = err_text(npz::load(dir.path(), Split::Test, &Normalize::identity(3), false, 10));
    assert!(msg.contains("not a readable .npz (zip) archive"), "{msg}");
}

#[test]
fn npz_bad_arrays_are_named_with_what_is_wrong() {
    let [x, y] = [good_arrays().remove(0), good_arrays().remove(1)];
    let cases: Vec<(Arrays, &str)> = vec![
        (vec![x.clone()], "has no array `y` (it holds x); save the images as x= and the labels as y="),
        (
            vec![("images", x.1.clone()), y.clone()],
            "has no array `x` (it holds images, y); save the images as x=",
        ),
        (
            vec![("x", npy("|u1", &[2, 12], &[0; 24], false)), y.clone()],
            "array `x` has shape [2, 12]; images must be [N, C, H, W]",
        ),
        (
            vec![("x", npy("<f8", &[2, 3, 2, 2], &[0; 192], false)), y.clone()],
            "array `x` has dtype <f8; images must be uint8 or float32 (x.astype(numpy.float32))",
        ),
        (
            vec![("x", npy("|u1", &[2, 3, 0, 2], &[], false)), y.clone()],
            "array `x` has shape [2, 3, 0, 2]: empty images",
        ),
        (
            vec![x.clone(), ("y", npy("<f4", &[2], &[0; 8], false))],
            "array `y` has dtype <f4; labels must be integers (y.astype(numpy.int64))",
        ),
        (
            vec![x.clone(), ("y", npy("<i8", &[2, 1], &i64s(&[1, 0]), false))],
            "array `y` has shape [2, 1]; labels must be one per image, [N]",
        ),
        (
            vec![x.clone(), ("y", npy("<i8", &[3], &i64s(&[1, 0, 2]), false))],
            "count mismatch: `x` holds 2 images but `y` 3 labels",
        ),
        (
            vec![x.clone(), ("y", npy("<i8", &[2], &i64s(&[0, -1]), false))],
            "label -1 at index 1 is out of range: labels must be in 0..=9 (data.num_classes = 10)",
        ),
        (
            vec![x.clone(), ("y", npy("<u8", &[2], &i64s(&[10, 0]), false))],
            "label 10 at index 0 is out of range: labels must be in 0..=9",
        ),
        (
            vec![("x", npy("|u1", &[2, 3, 2, 2], &[0; 20], false)), y.clone()],
            "array `x` is truncated: shape [2, 3, 2, 2] of |u1 needs 24 bytes but it holds 20",
        ),
        (
            vec![x.clone(), ("y", npy("<i8", &[2], &[0; 17], false))],
            "array `y` is trailing data: shape [2] of <i8 needs 16 bytes but it holds 17",
        ),
        (
            vec![("x", npy("|u1", &[2, 3, 2, 2], &[0; 24], true)), y.clone()],
            "array `x` is in Fortran order; save numpy.ascontiguousarray(x) instead",
        ),
        (vec![("x", b"\x93NUMPY junk".to_vec()), y.clone()], "array `x` is not a readable .npy"),
    ];
    for (arrays, want) in cases {
        let msg = npz_err(&arrays);
        assert!(msg.contains(want), "want {want:?} in:\n{msg}");
    }
    let nan: Vec<u8> = [f32::NAN, 0.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let msg = npz_err(&[
        ("x", npy("<f4", &[1, 3, 1, 1], &nan, false)),
        ("y", npy("<i8", &[1], &i64s(&[0]), false)),
    ]);
    assert!(msg.ends_with("array `x` holds NaN at flat index 0; images must be finite"), "{msg}");
    // Channels against data.mean: 3 channels, one mean.
    let dir = TempDir::new().unwrap();
    write_npz(&dir.path().join("train.npz"), &good_arrays(), false);
    let msg = err_text(npz::load(dir.path(), Split::Train, &Normalize::mnist(), false, 10));
    assert!(
        msg.contains("train.npz: normalization has 1 mean and 1 std values but the images have 3"),
        "{msg}"
    );
}

/// Channels-last images without `data.layout = "nhwc"` (and channels-first
/// ones with it) are named as such, not as a normalization count mismatch.
#[test]
fn images_in_the_other_layout_are_named_with_the_key_to_set() {
    let x: Vec<u8> = (0..2 * 4 * 4 * 3).map(|v| v as u8).collect();
    let y = npy("<i8", &[2], &i64s(&[1, 0]), false);
    let three = Normalize::broadcast(&[0.5], &[0.5], 3);
    let dir = TempDir::new().unwrap();
    write_npz(
        &dir.path().join("train.npz"),
        &[("x", npy("|u1", &[2, 4, 4, 3], &x, false)), ("y", y.clone())],
        false,
    );
    let msg = err_text(npz::load(dir.path(), Split::Train, &three, false, 10));
    assert!(
        msg.contains(
            "array `x` has shape [2, 4, 4, 3]: 4 channel(s) of 4x3 in this layout, but the model takes 3"
        ) && msg.contains("the images look like [N, H, W, C]: set `data.layout = \"nhwc\"`"),
        "{msg}"
    );
    write_npz(&dir.path().join("train.npz"), &[("x", npy("|u1", &[2, 3, 4, 4], &x, false)), ("y", y)], false);
    let msg = err_text(npz::load(dir.path(), Split::Train, &three, true, 10));
    assert!(msg.contains("the images look like [N, C, H, W]: leave `data.layout` out"), "{msg}");
    // Read in the right layout, the same bytes load.
    assert_eq!(npz::load(dir.path(), Split::Train, &three, false, 10).unwrap().sample_shape, vec![3, 4, 4]);
}

/// Headers no numpy array of images could have: a structured dtype, and a
/// shape whose byte count does not fit 64 bits (checked before any
/// allocation of that size is tried), whether or not the element count
/// itself passes 2^64.
#[test]
fn npz_structured_dtypes_and_impossible_shapes_are_refused() {
    let y = good_arrays().remove(1);
    let record = "{'descr': [('r', '|u1'), ('g', '|u1')], 'fortran_order': False, 'shape': (2,), }";
    let msg = npz_err(&[("x", npy_with_header(record, &[0; 4])), y.clone()]);
    assert!(msg.contains("array `x` has the structured dtype"), "{msg}");
    assert!(msg.ends_with("use a plain numeric array"), "{msg}");
    let huge = 1usize << 60;
    let labels = ("y", npy("<i8", &[huge], &i64s(&[1, 0]), false));
    let msg = npz_err(&[("x", npy("<f4", &[huge, 3, 2, 2], &[0; 96], false)), labels]);
    assert!(msg.ends_with(&format!("array `x` has shape [{huge}, 3, 2, 2], too large to be real")), "{msg}");
    // Past 2^64 elements (2^66): refused the same way, no overflow anywhere.
    let labels = ("y", npy("<i8", &[huge], &i64s(&[1, 0]), false));
    let msg = npz_err(&[("x", npy("<f4", &[huge, 16, 2, 2], &[0; 96], false)), labels]);
    assert!(msg.ends_with(&format!("array `x` has shape [{huge}, 16, 2, 2], too large to be real")), "{msg}");
    // The rank message names the layout the config asked for.
    let flat = [("x", npy("|u1", &[2, 12], &[0; 24], false)), y];
    let msg = err_text(npz_load(&flat, true).0);
    assert!(
        msg.ends_with("has shape [2, 12]; images must be [N, H, W, C] (data.layout = \"nhwc\")"),
        "{msg}"
    );
}

#[test]
fn fashion_mnist_reads_idx_files_and_names_its_fetch_script() {
    let dir = TempDir::new().unwrap();
    let norm = Normalize { mean: vec![0.2860], std: vec![0.3530] };
    let msg = err_text(load_idx(IdxSet::FashionMnist, dir.path(), Split::Train, &norm));
    assert!(msg.contains("scripts/fetch-fashion-mnist.sh"), "{msg}");
    write_images(&dir.path().join("t10k-images-idx3-ubyte.gz"), 28, 28, &[255; 2 * 784]).unwrap();
    write_labels(&dir.path().join("t10k-labels-idx1-ubyte.gz"), &[9, 0]).unwrap();
    let ds = load_idx(IdxSet::FashionMnist, dir.path(), Split::Test, &norm).unwrap();
    assert_eq!((ds.labels.clone(), ds.chw(), ds.num_classes), (vec![9, 0], Some([1, 28, 28]), 10));
    assert_eq!(ds.images[0], (1.0 - 0.2860) / 0.3530);
    write_labels(&dir.path().join("t10k-labels-idx1-ubyte.gz"), &[9, 10]).unwrap();
    let msg = err_text(load_idx(IdxSet::FashionMnist, dir.path(), Split::Test, &norm));
    assert!(msg.ends_with("label 10 at index 1 is out of range: Fashion-MNIST labels are 0..=9"), "{msg}");
}

/// The real files from the fetch scripts, when they have been fetched.
#[test]
fn real_fashion_mnist_and_catsdogs_if_fetched() {
    let root = crate::testing::repo_root().join("data");
    let fashion = root.join("fashion-mnist");
    if fashion.join("train-labels-idx1-ubyte.gz").exists() {
        let norm = Normalize { mean: vec![0.2860], std: vec![0.3530] };
        let train = load_idx(IdxSet::FashionMnist, &fashion, Split::Train, &norm).unwrap();
        let test = load_idx(IdxSet::FashionMnist, &fashion, Split::Test, &norm).unwrap();
        assert_eq!((train.len(), test.len()), (60000, 10000));
        let mut hist = [0usize; 10];
        train.labels.iter().for_each(|&l| hist[l as usize] += 1);
        assert_eq!(hist, [6000; 10]);
        // The usual statistics normalize the training set to about N(0, 1).
        let n = train.images.len() as f64;
        let mean = train.images.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = train.images.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "mean {mean} var {var}");
    } else {
        println!("note: {} absent (run scripts/fetch-fashion-mnist.sh); skipping", fashion.display());
    }
    let cats = root.join("catsdogs");
    if cats.join("test_batch.bin").exists() {
        let norm = Normalize::identity(3);
        let train = cifar::load(&cats, Cifar::Ten, Split::Train, &norm).unwrap();
        let test = cifar::load(&cats, Cifar::Ten, Split::Test, &norm).unwrap();
        assert_eq!((train.len(), test.len()), (1600, 400));
        for ds in [&train, &test] {
            let cats_n = ds.labels.iter().filter(|&&l| l == 3).count();
            assert!(ds.labels.iter().all(|&l| l == 3 || l == 5));
            assert_eq!(cats_n * 2, ds.len(), "half cats");
        }
        // Natural images: neighbouring pixels of a plane are close.
        let s = train.sample(0);
        let diff: f32 = s.windows(2).map(|w| (w[0] - w[1]).abs()).sum::<f32>() / s.len() as f32;
        assert!(diff < 0.1, "mean neighbour difference {diff}");
    } else {
        println!("note: {} absent (run scripts/fetch-catsdogs.sh); skipping", cats.display());
    }
}
