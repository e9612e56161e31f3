//! Weights files: safetensors with PyTorch `state_dict()` names, so a PyTorch
//! user can `load_state_dict(load_file(path), strict=True)` and back; and the
//! fsync helpers the checkpoint writer needs for its durability guarantee.

use super::disk;
use crate::error::{Error, Result};
use crate::nn::{StateEntry, StateValue};
use safetensors::{tensor::TensorView, Dtype, SafeTensors};
use std::path::Path;

pub(crate) fn ckpt_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), msg: msg.into() }
}

/// Reads every tensor of a safetensors file as a [`StateEntry`]. Floating
/// tensors (f32, f16, bf16, f64) become f32; integer scalars stay integers.
pub fn load_safetensors(path: &Path) -> Result<Vec<StateEntry>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::io(format!("cannot read weights file {}", path.display()), e))?;
    parse_safetensors(&bytes, path)
}

/// [`load_safetensors`] of bytes already read; `path` names them in errors.
pub fn parse_safetensors(bytes: &[u8], path: &Path) -> Result<Vec<StateEntry>> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| ckpt_err(path, format!("not a valid safetensors file: {e}")))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let data = view.data();
        let value = match view.dtype() {
            Dtype::F32 => StateValue::F32(
                data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            ),
            Dtype::F16 => StateValue::F32(
                data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            ),
            Dtype::BF16 => StateValue::F32(
                data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            ),
            Dtype::F64 => StateValue::F32(
                data.chunks_exact(8)
                    .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
                    .collect(),
            ),
            Dtype::I64 if data.len() == 8 => StateValue::I64(i64::from_le_bytes([
                data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7],
            ])),
            other => return Err(ckpt_err(path, format!("tensor `{name}` has unsupported dtype {other:?}"))),
        };
        out.push(StateEntry { name, shape, value });
    }
    Ok(out)
}

/// Writes entries as a safetensors file (f32 tensors, i64 scalars), through a
/// temporary file renamed into place so a reader never sees a partial file.
pub fn save_safetensors(path: &Path, entries: &[StateEntry]) -> Result<()> {
    write_atomic(path, &entries_to_bytes(entries, path)?)
}

/// Writes `data` beside `path` and renames it into place, so a reader
/// never sees half a file; a write that fails (a full disk) removes its
/// temporary file and leaves an earlier `path` as it was.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let name = path.file_name().unwrap_or_default().to_os_string();
    let mut tmp_name = name.clone();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let needed = data.len() as u64;
    disk::put(&tmp, &name.to_string_lossy(), data, false)
        .map_err(|e| disk::write_failed(path, needed, &e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("cannot rename {} into place", tmp.display()), e)
    })
}

/// The safetensors encoding of `entries` (f32 tensors, i64 scalars); `path`
/// names the destination in errors.
pub fn entries_to_bytes(entries: &[StateEntry], path: &Path) -> Result<Vec<u8>> {
    let bytes: Vec<(String, Vec<u8>, Dtype, Vec<usize>)> = entries
        .iter()
        .map(|e| match &e.value {
            StateValue::F32(v) => (
                e.name.clone(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Dtype::F32,
                e.shape.clone(),
            ),
            StateValue::I64(v) => (e.name.clone(), v.to_le_bytes().to_vec(), Dtype::I64, e.shape.clone()),
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(n, b, d, s)| TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ckpt_err(path, format!("cannot encode tensors: {e}")))?;
    safetensors::serialize(views, None).map_err(|e| ckpt_err(path, format!("cannot encode tensors: {e}")))
}

/// Writes `data` to `path` and fsyncs it, so a rename that follows cannot
/// publish a file whose contents are still only in the page cache; a write
/// that fails removes what it wrote.
pub(crate) fn write_synced(path: &Path, data: &[u8]) -> Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    disk::put(path, &name, data, true).map_err(|e| disk::write_failed(path, data.len() as u64, &e))
}
