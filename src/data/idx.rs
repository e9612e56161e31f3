//! IDX files (the format MNIST ships in): a big-endian header — magic
//! `0x0000 08 NN` (unsigned bytes, NN dimensions), then NN u32 sizes — and the
//! raw bytes. Files may be gzip-compressed; compression is detected from the
//! content, so `x.gz` and a gzip file without the suffix both read.

use crate::error::{Error, Result};
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

pub const LABELS_MAGIC: u32 = 0x0000_0801;
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_HEADER: usize = 8;
const IMAGES_HEADER: usize = 16;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The images of one IDX3 file, pixels as stored (`[count, rows, cols]`).
#[derive(Debug, Clone)]
pub struct IdxImages {
    pub path: PathBuf,
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    pub pixels: Vec<u8>,
}

/// The labels of one IDX1 file.
#[derive(Debug, Clone)]
pub struct IdxLabels {
    pub path: PathBuf,
    pub labels: Vec<u8>,
}

/// `dir/name` if it exists, else `dir/name.gz`; a missing file is an error that
/// says how to get MNIST.
pub fn find(dir: &Path, name: &str) -> Result<PathBuf> {
    find_with(dir, name, "run scripts/fetch-mnist.sh to download MNIST there")
}

/// `find`, with `fetch` saying how to get the data a missing file belongs to.
pub fn find_with(dir: &Path, name: &str, fetch: &str) -> Result<PathBuf> {
    let raw = dir.join(name);
    if raw.is_file() {
        return Ok(raw);
    }
    let gz = dir.join(format!("{name}.gz"));
    if gz.is_file() {
        return Ok(gz);
    }
    Err(Error::data(
        raw,
        format!(
            "missing: neither {name} nor {name}.gz exists in {}; {fetch}, or set `data.path` to a \
             directory that holds the IDX files",
            dir.display()
        ),
    ))
}

/// Whole file contents, decompressed if the file is gzip. Returns the bytes and
/// whether they were compressed (for error messages about lengths).
fn read_bytes(path: &Path) -> Result<(Vec<u8>, bool)> {
    let bytes = std::fs::read(path).map_err(|e| Error::data(path, format!("cannot read: {e}")))?;
    if !bytes.starts_with(&GZIP_MAGIC) {
        return Ok((bytes, false));
    }
    let mut out = Vec::new();
    MultiGzDecoder::new(bytes.as_slice())
        .read_to_end(&mut out)
        .map_err(|e| Error::data(path, format!("corrupt gzip data: {e}")))?;
    Ok((out, true))
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Checks the magic first, so a file of the wrong kind is named as such even
/// when it is also shorter than the expected header.
fn check_magic(path: &Path, bytes: &[u8], want: u32) -> Result<()> {
    if bytes.len() < 4 {
        return Ok(()); // too short to tell: the header-length check reports it
    }
    let got = be_u32(bytes, 0);
    if got == want {
        return Ok(());
    }
    let what = |m: u32| match m {
        IMAGES_MAGIC => "IDX images",
        LABELS_MAGIC => "IDX labels",
        _ => "not an IDX unsigned-byte file",
    };
    Err(Error::data(
        path,
        format!("wrong magic number {got:#010x} ({}): expected {want:#010x} ({})", what(got), what(want)),
    ))
}

fn file_desc(compressed: bool) -> &'static str {
    if compressed {
        "the decompressed file"
    } else {
        "the file"
    }
}

/// Checks the actual length against the header's; `what` describes the
/// header's claim, e.g. "8000 images of 28x28".
fn check_len(path: &Path, compressed: bool, what: &str, expected: Option<u64>, actual: usize) -> Result<()> {
    let desc = file_desc(compressed);
    let Some(expected) = expected else {
        return Err(Error::data(path, format!("header says {what}, which is too large to be real")));
    };
    if expected == actual as u64 {
        return Ok(());
    }
    let problem = if (actual as u64) < expected { "truncated" } else { "trailing data" };
    Err(Error::data(
        path,
        format!("{problem}: header says {what} ({expected} bytes) but {desc} has {actual} bytes"),
    ))
}

fn check_header_len(path: &Path, compressed: bool, kind: &str, header: usize, len: usize) -> Result<()> {
    if len < header {
        return Err(Error::data(
            path,
            format!(
                "truncated: {} has {len} bytes, less than the {header}-byte IDX {kind} header",
                file_desc(compressed)
            ),
        ));
    }
    Ok(())
}

pub fn read_images(path: &Path) -> Result<IdxImages> {
    let (mut bytes, gz) = read_bytes(path)?;
    let (count, rows, cols) = images_header(path, &bytes, bytes.len(), gz)?;
    bytes.drain(..IMAGES_HEADER);
    Ok(IdxImages { path: path.to_path_buf(), count, rows, cols, pixels: bytes })
}

/// [`read_images`]'s checks without keeping the pixels (`ddptrain check`):
/// (count, rows, cols). A raw file's length is its size on disk; a gzip
/// file is decompressed to count its bytes, but not kept.
pub fn read_images_header(path: &Path) -> Result<(usize, usize, usize)> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::data(path, format!("cannot read: {e}")))?;
    let cannot = |e: std::io::Error| Error::data(path, format!("cannot read: {e}"));
    let mut head = Vec::with_capacity(IMAGES_HEADER);
    (&mut f).take(IMAGES_HEADER as u64).read_to_end(&mut head).map_err(cannot)?;
    if !head.starts_with(&GZIP_MAGIC) {
        let len = f.metadata().map_err(cannot)?.len();
        let len = usize::try_from(len)
            .map_err(|_| Error::data(path, format!("{len} bytes do not fit in memory")))?;
        return images_header(path, &head, len, false);
    }
    f.seek(std::io::SeekFrom::Start(0)).map_err(cannot)?;
    let mut gz = MultiGzDecoder::new(std::io::BufReader::new(f));
    let mut head = Vec::with_capacity(IMAGES_HEADER);
    let corrupt = |e: std::io::Error| Error::data(path, format!("corrupt gzip data: {e}"));
    (&mut gz).take(IMAGES_HEADER as u64).read_to_end(&mut head).map_err(corrupt)?;
    let rest = std::io::copy(&mut gz, &mut std::io::sink()).map_err(corrupt)?;
    let len = usize::try_from(rest).ok().and_then(|r| r.checked_add(head.len()));
    let len = len.ok_or_else(|| Error::data(path, format!("{rest} bytes do not fit in memory")))?;
    images_header(path, &head, len, true)
}

/// (count, rows, cols) of an IDX3 file whose first bytes are `head` and
/// whose (decompressed) length is `len`, checked against each other.
fn images_header(path: &Path, head: &[u8], len: usize, gz: bool) -> Result<(usize, usize, usize)> {
    check_magic(path, head, IMAGES_MAGIC)?;
    check_header_len(path, gz, "image", IMAGES_HEADER, len)?;
    let (count, rows, cols) = (be_u32(head, 4), be_u32(head, 8), be_u32(head, 12));
    if rows == 0 || cols == 0 {
        return Err(Error::data(path, format!("header says images of {rows}x{cols}: empty images")));
    }
    let expected = (count as u64)
        .checked_mul(rows as u64)
        .and_then(|v| v.checked_mul(cols as u64))
        .and_then(|v| v.checked_add(IMAGES_HEADER as u64));
    check_len(path, gz, &format!("{count} images of {rows}x{cols}"), expected, len)?;
    Ok((count as usize, rows as usize, cols as usize))
}

pub fn read_labels(path: &Path) -> Result<IdxLabels> {
    let (mut bytes, gz) = read_bytes(path)?;
    check_magic(path, &bytes, LABELS_MAGIC)?;
    check_header_len(path, gz, "label", LABELS_HEADER, bytes.len())?;
    let count = be_u32(&bytes, 4);
    let expected = (count as u64).checked_add(LABELS_HEADER as u64);
    check_len(path, gz, &format!("{count} labels"), expected, bytes.len())?;
    bytes.drain(..LABELS_HEADER);
    Ok(IdxLabels { path: path.to_path_buf(), labels: bytes })
}

fn to_u32(path: &Path, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::data(path, format!("{what} {v} does not fit an IDX header")))
}

/// Writes `bytes` to `path`, gzip-compressed if the name ends in `.gz`.
fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    let gz = path.extension().is_some_and(|e| e == "gz");
    let data = if gz {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(bytes).and_then(|_| enc.finish()).map_err(|e| Error::io("gzip", e))?
    } else {
        bytes.to_vec()
    };
    std::fs::write(path, data).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Writes an IDX3 image file; `pixels` is `[count, rows, cols]` row-major.
pub fn write_images(path: &Path, rows: usize, cols: usize, pixels: &[u8]) -> Result<()> {
    let per = rows * cols;
    if per == 0 || !pixels.len().is_multiple_of(per) {
        return Err(Error::shape(format!("{} pixels are not whole {rows}x{cols} images", pixels.len())));
    }
    let mut out = Vec::with_capacity(IMAGES_HEADER + pixels.len());
    for v in [IMAGES_MAGIC, to_u32(path, "count", pixels.len() / per)?, to_u32(path, "rows", rows)?] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(&to_u32(path, "cols", cols)?.to_be_bytes());
    out.extend_from_slice(pixels);
    write_bytes(path, &out)
}

/// Writes an IDX1 label file.
pub fn write_labels(path: &Path, labels: &[u8]) -> Result<()> {
    let mut out = Vec::with_capacity(LABELS_HEADER + labels.len());
    out.extend_from_slice(&LABELS_MAGIC.to_be_bytes());
    out.extend_from_slice(&to_u32(path, "count", labels.len())?.to_be_bytes());
    out.extend_from_slice(labels);
    write_bytes(path, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_only_read_checks_what_the_whole_read_checks() {
        let dir = tempfile::tempdir().unwrap();
        let pixels: Vec<u8> = (0..3 * 4 * 5).map(|i| i as u8).collect();
        for name in ["raw", "packed.gz"] {
            let path = dir.path().join(name);
            write_images(&path, 4, 5, &pixels).unwrap();
            let whole = read_images(&path).unwrap();
            assert_eq!(read_images_header(&path).unwrap(), (whole.count, whole.rows, whole.cols), "{name}");
            assert_eq!((whole.count, whole.rows, whole.cols), (3, 4, 5));
        }
        // Cut short, raw and compressed, and too short for a header: the same refusals.
        let raw = dir.path().join("raw");
        let bytes = std::fs::read(&raw).unwrap();
        let gz = dir.path().join("short.gz");
        write_bytes(&gz, &bytes[..bytes.len() - 7]).unwrap();
        std::fs::write(&raw, &bytes[..bytes.len() - 7]).unwrap();
        let tiny = dir.path().join("tiny");
        std::fs::write(&tiny, &bytes[..10]).unwrap();
        for path in [raw, gz, tiny] {
            let whole = read_images(&path).unwrap_err().to_string();
            assert_eq!(read_images_header(&path).unwrap_err().to_string(), whole);
            assert!(whole.contains("truncated"), "{whole}");
        }
    }
}
