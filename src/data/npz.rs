//! Users' own arrays: `train.npz` and `test.npz` in `data.path`, each as
//! `numpy.savez(path, x=images, y=labels)` (or `savez_compressed`) writes it.
//!
//! `x` is uint8 or float32, `[N, C, H, W]` (or `[N, H, W, C]` with
//! `data.layout = "nhwc"`), C order; `y` holds N integer labels in
//! `0..data.num_classes`. uint8 pixels are scaled by 1/255 as `ToTensor`
//! does, float32 values are taken as they are; both are then normalized with
//! `data.mean` / `data.std`.

use super::{Dataset, Normalize, Split};
use crate::error::{Error, Result};
use npyz::{DType, Endianness, NpyFile, Order, TypeChar};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The file of one split.
pub fn file(dir: &Path, split: Split) -> PathBuf {
    dir.join(match split {
        Split::Train => "train.npz",
        Split::Test => "test.npz",
    })
}

/// One array's header and raw bytes.
struct Array {
    shape: Vec<u64>,
    ty: npyz::TypeStr,
    bytes: Vec<u8>,
}

/// The element types `x` and `y` may have.
#[derive(Clone, Copy)]
enum Elem {
    U8,
    F32 { big: bool },
    Int { bytes: usize, signed: bool, big: bool },
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::U8 => 1,
            Elem::F32 { .. } => 4,
            Elem::Int { bytes, .. } => bytes,
        }
    }
}

/// The images and labels of `file(dir, split)`, normalized with `norm`.
pub fn load(dir: &Path, split: Split, norm: &Normalize, nhwc: bool, num_classes: usize) -> Result<Dataset> {
    let path = file(dir, split);
    let err = |msg: String| Error::data(&path, msg);
    let f = std::fs::File::open(&path).map_err(|e| {
        err(format!(
            "cannot open: {e}; `data.path` must hold train.npz and test.npz, each written by \
             numpy.savez(path, x=images, y=labels)"
        ))
    })?;
    let mut zip =
        zip::ZipArchive::new(f).map_err(|e| err(format!("not a readable .npz (zip) archive: {e}")))?;
    let x = read_array(&mut zip, "x", &path)?;
    let y = read_array(&mut zip, "y", &path)?;

    let xe = match elem(&x.ty) {
        Some(e @ (Elem::U8 | Elem::F32 { .. })) => e,
        _ => {
            return Err(err(format!(
                "array `x` has dtype {}; images must be uint8 or float32 (x.astype(numpy.float32))",
                x.ty
            )))
        }
    };
    if x.shape.len() != 4 {
        let want = if nhwc { "[N, H, W, C] (data.layout = \"nhwc\")" } else { "[N, C, H, W]" };
        return Err(err(format!("array `x` has shape {:?}; images must be {want}", x.shape)));
    }
    let dims: Vec<usize> = x.shape.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
    let (n, [c, h, w]) =
        if nhwc { (dims[0], [dims[3], dims[1], dims[2]]) } else { (dims[0], [dims[1], dims[2], dims[3]]) };
    if c == 0 || h == 0 || w == 0 {
        return Err(err(format!("array `x` has shape {:?}: empty images", x.shape)));
    }
    let (ybytes, signed, big) = match elem(&y.ty) {
        Some(Elem::Int { bytes, signed, big }) => (bytes, signed, big),
        Some(Elem::U8) => (1, false, false),
        _ => {
            return Err(err(format!(
                "array `y` has dtype {}; labels must be integers (y.astype(numpy.int64))",
                y.ty
            )))
        }
    };
    if y.shape.len() != 1 {
        return Err(err(format!("array `y` has shape {:?}; labels must be one per image, [N]", y.shape)));
    }
    if y.shape[0] != x.shape[0] {
        return Err(err(format!(
            "count mismatch: `x` holds {} images but `y` {} labels",
            x.shape[0], y.shape[0]
        )));
    }
    check_bytes(&path, "x", &x, xe)?;
    check_bytes(&path, "y", &y, Elem::Int { bytes: ybytes, signed, big })?;
    // Channels last read as channels first (or the reverse) shows as a channel
    // count the model does not take while the other layout's fits: say so.
    let other = if nhwc { dims[1] } else { dims[3] };
    let channels = norm.mean.len();
    if c != channels && other == channels {
        let (looks, fix) = if nhwc {
            ("[N, C, H, W]", "leave `data.layout` out (or \"nchw\")")
        } else {
            ("[N, H, W, C]", "set `data.layout = \"nhwc\"`")
        };
        return Err(err(format!(
            "array `x` has shape {:?}: {c} channel(s) of {h}x{w} in this layout, but the model takes \
             {channels} (model.input_shape[0]); the images look like {looks}: {fix}",
            x.shape
        )));
    }
    norm.check(&path, c)?;

    let mut labels = Vec::with_capacity(n);
    for (i, v) in y.bytes.chunks_exact(ybytes).map(|b| int(b, signed, big)).enumerate() {
        match u32::try_from(v) {
            Ok(l) if (l as usize) < num_classes => labels.push(l),
            _ => {
                return Err(err(format!(
                    "label {v} at index {i} is out of range: labels must be in 0..={} \
                     (data.num_classes = {num_classes})",
                    num_classes.saturating_sub(1)
                )))
            }
        }
    }
    let plane = h * w;
    let images = match xe {
        Elem::U8 => {
            let bytes = if nhwc { to_nchw(&x.bytes, [n, c, h, w]) } else { x.bytes };
            norm.apply(&bytes, plane)
        }
        _ => {
            let big = matches!(xe, Elem::F32 { big: true });
            let mut v: Vec<f32> = x
                .bytes
                .chunks_exact(4)
                .map(|b| {
                    let b = [b[0], b[1], b[2], b[3]];
                    if big {
                        f32::from_be_bytes(b)
                    } else {
                        f32::from_le_bytes(b)
                    }
                })
                .collect();
            if let Some(i) = v.iter().position(|v| !v.is_finite()) {
                return Err(err(format!(
                    "array `x` holds {} at flat index {i}; images must be finite",
                    v[i]
                )));
            }
            if nhwc {
                v = to_nchw(&v, [n, c, h, w]);
            }
            for (k, chunk) in v.chunks_mut(plane).enumerate() {
                let ch = k % c;
                chunk.iter_mut().for_each(|p| *p = (*p - norm.mean[ch]) / norm.std[ch]);
            }
            v
        }
    };
    Ok(Dataset::images(images, labels, [c, h, w], num_classes))
}

/// `[N, H, W, C]` values as `[N, C, H, W]` (`dims` is `[N, C, H, W]`).
fn to_nchw<T: Copy>(v: &[T], [n, c, h, w]: [usize; 4]) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for s in 0..n {
        let img = &v[s * h * w * c..(s + 1) * h * w * c];
        for ch in 0..c {
            out.extend((0..h * w).map(|p| img[p * c + ch]));
        }
    }
    out
}

fn elem(ty: &npyz::TypeStr) -> Option<Elem> {
    let big = ty.endianness() == Endianness::Big;
    match (ty.type_char(), ty.size_field()) {
        (TypeChar::Uint, 1) => Some(Elem::U8),
        (TypeChar::Float, 4) => Some(Elem::F32 { big }),
        (TypeChar::Int, b @ (1 | 2 | 4 | 8)) => Some(Elem::Int { bytes: b as usize, signed: true, big }),
        (TypeChar::Uint, b @ (2 | 4 | 8)) => Some(Elem::Int { bytes: b as usize, signed: false, big }),
        _ => None,
    }
}

/// An integer element of 1, 2, 4 or 8 bytes as i128, so every int64 and
/// uint64 label fits.
fn int(b: &[u8], signed: bool, big: bool) -> i128 {
    let bytes = b.len().min(8);
    let mut le = [0u8; 8];
    for (k, slot) in le.iter_mut().take(bytes).enumerate() {
        *slot = if big { b[bytes - 1 - k] } else { b[k] };
    }
    if signed && le[bytes - 1] & 0x80 != 0 {
        le[bytes..].iter_mut().for_each(|v| *v = 0xff);
    }
    if signed {
        i128::from(i64::from_le_bytes(le))
    } else {
        i128::from(u64::from_le_bytes(le))
    }
}

/// The data must be exactly what the header's shape and dtype say.
fn check_bytes(path: &Path, name: &str, a: &Array, e: Elem) -> Result<()> {
    let want = a
        .shape
        .iter()
        .try_fold(e.size() as u64, |acc, &d| acc.checked_mul(d))
        .filter(|&b| usize::try_from(b).is_ok());
    let Some(want) = want else {
        return Err(Error::data(
            path,
            format!("array `{name}` has shape {:?}, too large to be real", a.shape),
        ));
    };
    let got = a.bytes.len() as u64;
    if got != want {
        let problem = if got < want { "truncated" } else { "trailing data" };
        return Err(Error::data(
            path,
            format!(
                "array `{name}` is {problem}: shape {:?} of {} needs {want} bytes but it holds {got}",
                a.shape, a.ty
            ),
        ));
    }
    Ok(())
}

/// Reads `<name>.npy` from the archive: header, then at most one byte more
/// than the header promises (so a lying header cannot make us read forever).
fn read_array(zip: &mut zip::ZipArchive<std::fs::File>, name: &str, path: &Path) -> Result<Array> {
    let err = |msg: String| Error::data(path, msg);
    let file_name = format!("{name}.npy");
    if zip.index_for_name(&file_name).is_none() {
        let have: Vec<String> =
            zip.file_names().flatten().map(|n| n.strip_suffix(".npy").unwrap_or(&n).to_owned()).collect();
        return Err(err(format!(
            "has no array `{name}` (it holds {}); save the images as x= and the labels as y= \
             (numpy.savez(path, x=images, y=labels))",
            if have.is_empty() { "none".to_owned() } else { have.join(", ") }
        )));
    }
    let entry = zip.by_name(&file_name).map_err(|e| err(format!("cannot read array `{name}`: {e}")))?;
    let npy = NpyFile::new(entry).map_err(|e| err(format!("array `{name}` is not a readable .npy: {e}")))?;
    if npy.order() == Order::Fortran {
        return Err(err(format!(
            "array `{name}` is in Fortran order; save numpy.ascontiguousarray({name}) instead"
        )));
    }
    let shape = npy.shape().to_vec();
    let ty = match npy.dtype() {
        DType::Plain(t) => t,
        other => {
            return Err(err(format!(
                "array `{name}` has the structured dtype {}; use a plain numeric array",
                other.descr()
            )))
        }
    };
    let size = elem(&ty).map_or(1, Elem::size) as u64;
    let limit = shape.iter().try_fold(size, |a, &d| a.checked_mul(d)).unwrap_or(u64::MAX).saturating_add(1);
    let mut bytes = Vec::new();
    npy.into_inner()
        .take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| err(format!("array `{name}` cannot be read: {e}")))?;
    Ok(Array { shape, ty, bytes })
}
