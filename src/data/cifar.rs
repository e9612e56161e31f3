//! CIFAR-10 and CIFAR-100 in their "binary version" (the files torchvision's
//! `CIFAR10` reads from the Python pickles hold the same bytes): records of
//! label byte(s) then 3,072 pixel bytes, the 32x32 red plane, then green,
//! then blue, rows top to bottom.
//!
//! CIFAR-10 (1 label byte, 10 classes): every `data_batch_<n>.bin` in the
//! directory, in order of n (the full set has 1..=5; fewer is accepted, so
//! a subset such as scripts/fetch-catsdogs.sh's trains as it is), and
//! `test_batch.bin`. CIFAR-100 (a coarse then a fine label byte; the fine
//! label, 100 classes, is the one used, as torchvision's `CIFAR100` does):
//! `train.bin` and `test.bin`.

use super::{Dataset, Normalize, Split};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Every CIFAR image is `[3, 32, 32]`.
pub const CIFAR_SHAPE: [usize; 3] = [3, 32, 32];
const PIXELS: usize = 3 * 32 * 32;
const PLANE: usize = 32 * 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cifar {
    Ten,
    Hundred,
}

impl Cifar {
    pub fn name(self) -> &'static str {
        match self {
            Cifar::Ten => "CIFAR-10",
            Cifar::Hundred => "CIFAR-100",
        }
    }

    pub fn classes(self) -> usize {
        match self {
            Cifar::Ten => 10,
            Cifar::Hundred => 100,
        }
    }

    fn label_bytes(self) -> usize {
        match self {
            Cifar::Ten => 1,
            Cifar::Hundred => 2,
        }
    }

    /// Bytes per record: label byte(s) and pixels.
    pub fn record(self) -> usize {
        self.label_bytes() + PIXELS
    }

    fn how_to_get(self) -> &'static str {
        match self {
            Cifar::Ten => {
                "download CIFAR-10's binary version (cifar-10-binary.tar.gz) and set `data.path` to its \
                 cifar-10-batches-bin directory, or run scripts/fetch-catsdogs.sh for 2,000 of its \
                 images in data/catsdogs"
            }
            Cifar::Hundred => {
                "download CIFAR-100's binary version (cifar-100-binary.tar.gz) and set `data.path` to \
                 its cifar-100-binary directory"
            }
        }
    }
}

/// The files of one split in `dir`, in reading order; a missing file is an
/// error that names it and says how to get the data.
pub fn files(dir: &Path, kind: Cifar, split: Split) -> Result<Vec<PathBuf>> {
    let single = match (kind, split) {
        (Cifar::Ten, Split::Train) => None,
        (Cifar::Ten, Split::Test) => Some("test_batch.bin"),
        (Cifar::Hundred, Split::Train) => Some("train.bin"),
        (Cifar::Hundred, Split::Test) => Some("test.bin"),
    };
    if let Some(name) = single {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(vec![p]);
        }
        return Err(Error::data(
            p,
            format!("missing: no {name} in {}; {}", dir.display(), kind.how_to_get()),
        ));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Error::data(dir, format!("cannot read the {} directory: {e}; {}", kind.name(), kind.how_to_get()))
    })?;
    let mut batches: Vec<(u64, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let n = name
            .to_str()
            .and_then(|n| n.strip_prefix("data_batch_"))
            .and_then(|n| n.strip_suffix(".bin"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(n) = n {
            if entry.path().is_file() {
                batches.push((n, entry.path()));
            }
        }
    }
    if batches.is_empty() {
        return Err(Error::data(
            dir.join("data_batch_1.bin"),
            format!("missing: no data_batch_<n>.bin in {}; {}", dir.display(), kind.how_to_get()),
        ));
    }
    batches.sort();
    Ok(batches.into_iter().map(|(_, p)| p).collect())
}

/// Loads one split from `dir` (see the module doc for the files), normalized
/// with `norm` (three channels).
pub fn load(dir: &Path, kind: Cifar, split: Split, norm: &Normalize) -> Result<Dataset> {
    let paths = files(dir, kind, split)?;
    let first = paths.first().map_or_else(|| dir.to_path_buf(), Clone::clone);
    norm.check(&first, CIFAR_SHAPE[0])?;
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for path in &paths {
        read_file(path, kind, &mut pixels, &mut labels)?;
    }
    Ok(Dataset::images(norm.apply(&pixels, PLANE), labels, CIFAR_SHAPE, kind.classes()))
}

/// [`load`]'s checks of one split without reading the pixels (`ddptrain
/// check`): each file's size, and each record's label byte, read where it
/// stands.
pub fn inspect(dir: &Path, kind: Cifar, split: Split, norm: &Normalize) -> Result<super::Inspected> {
    use std::os::unix::fs::FileExt;
    let paths = files(dir, kind, split)?;
    let first = paths.first().map_or_else(|| dir.to_path_buf(), Clone::clone);
    norm.check(&first, CIFAR_SHAPE[0])?;
    let mut max_label = None;
    for path in &paths {
        let cannot = |e: std::io::Error| Error::data(path, format!("cannot read: {e}"));
        let f = std::fs::File::open(path).map_err(cannot)?;
        let len = f.metadata().map_err(cannot)?.len();
        let len = usize::try_from(len)
            .map_err(|_| Error::data(path, format!("{len} bytes do not fit in memory")))?;
        check_size(path, kind, len)?;
        let mut label = [0u8];
        for k in 0..len / kind.record() {
            let at = k * kind.record() + kind.label_bytes() - 1;
            f.read_exact_at(&mut label, at as u64).map_err(cannot)?;
            check_label(path, kind, k, label[0])?;
            max_label = max_label.max(Some(u32::from(label[0])));
        }
    }
    Ok(super::Inspected { sample_shape: CIFAR_SHAPE.to_vec(), max_label })
}

/// A file of `len` bytes holds whole records, at least one.
fn check_size(path: &Path, kind: Cifar, len: usize) -> Result<()> {
    let record = kind.record();
    if len == 0 {
        return Err(Error::data(path, format!("empty file: no {} records", kind.name())));
    }
    if !len.is_multiple_of(record) {
        return Err(Error::data(
            path,
            format!(
                "truncated: {len} bytes is {} whole {record}-byte {} records and {} bytes over; \
                 fetch the file again",
                len / record,
                kind.name(),
                len % record
            ),
        ));
    }
    Ok(())
}

/// Record `k`'s label is one of `kind`'s classes.
fn check_label(path: &Path, kind: Cifar, k: usize, label: u8) -> Result<()> {
    if usize::from(label) >= kind.classes() {
        return Err(Error::data(
            path,
            format!(
                "label {label} of record {k} is out of range: {} labels are 0..={} (is this a {} file?)",
                kind.name(),
                kind.classes() - 1,
                kind.name()
            ),
        ));
    }
    Ok(())
}

/// Appends the records of one file.
fn read_file(path: &Path, kind: Cifar, pixels: &mut Vec<u8>, labels: &mut Vec<u32>) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|e| Error::data(path, format!("cannot read: {e}")))?;
    let record = kind.record();
    check_size(path, kind, bytes.len())?;
    pixels.reserve(bytes.len() / record * PIXELS);
    for (k, rec) in bytes.chunks_exact(record).enumerate() {
        // CIFAR-100: coarse label first, then the fine one.
        let label = rec[kind.label_bytes() - 1];
        check_label(path, kind, k, label)?;
        labels.push(u32::from(label));
        pixels.extend_from_slice(&rec[kind.label_bytes()..]);
    }
    Ok(())
}
