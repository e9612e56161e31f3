//! Embedding launchers for kernels/embedding.cu, the device twins of
//! `cpu.rs`: a gather forward and a scatter-add backward that adds each
//! gradient element's contributions in output-row order (no atomics), so
//! f32 results are the CPU's bits.

use crate::cuda::{as_i64, check_len, launch_1d, DeviceFloat, Gpu, TypedKernelFn};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

const FILE: &str = "embedding.cu";
static EMBEDDING_BACKWARD: TypedKernelFn = typed_kernel!(FILE, "embedding_backward");
static EMBEDDING_FORWARD: TypedKernelFn = typed_kernel!(FILE, "embedding_forward");

/// Which weight row each output row reads.
#[derive(Clone, Copy)]
pub enum Lookup<'a, 'b> {
    /// Row `ids[i]`: token ids as f32 values, one per output row.
    Tokens(&'a CudaView<'b, f32>),
    /// Row `i % t` for `rows` output rows (`[N, T]` flattened): the
    /// position table (`positions = true`).
    Positions { rows: usize, t: usize },
}

impl Lookup<'_, '_> {
    fn rows(&self) -> usize {
        match self {
            Lookup::Tokens(ids) => ids.len(),
            Lookup::Positions { rows, .. } => *rows,
        }
    }
}

/// `weight` is `[num_embeddings, dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    pub num_embeddings: usize,
    pub dim: usize,
}

/// The kernels' (ids pointer or null, rows, t) and the weight rows the
/// lookup can reach, after checking positions fit the table.
fn lookup_args(op: &str, lookup: Lookup<'_, '_>, table: Table) -> Result<(i64, i64, usize)> {
    let rows = as_i64(op, lookup.rows())?;
    match lookup {
        Lookup::Tokens(_) => Ok((rows, 1, table.num_embeddings)),
        Lookup::Positions { rows: n, t } => {
            if t == 0 || t > table.num_embeddings || n % t != 0 {
                return Err(Error::shape(format!(
                    "{op}: {n} rows of sequences of {t} positions do not fit a table of {} rows",
                    table.num_embeddings
                )));
            }
            Ok((rows, as_i64(op, t)?, t))
        }
    }
}

/// `y[i] = weight[row(i)]` (`y`: `[rows, dim]`, overwritten).
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    lookup: Lookup<'_, '_>,
    weight: &CudaView<'_, T>,
    table: Table,
    y: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    const OP: &str = "embedding forward";
    let (rows, t, _) = lookup_args(OP, lookup, table)?;
    check_len(OP, "weight", weight.len(), table.num_embeddings * table.dim)?;
    let len = lookup.rows() * table.dim;
    check_len(OP, "y", y.len(), len)?;
    if len == 0 {
        return Ok(());
    }
    let (v, dim) = (as_i64(OP, table.num_embeddings)?, as_i64(OP, table.dim)?);
    let stream = gpu.stream();
    let ids = match lookup {
        Lookup::Tokens(ids) => Some(ids.device_ptr(stream)),
        Lookup::Positions { .. } => None,
    };
    let ip = ids.as_ref().map_or(0, |p| p.0);
    let (wp, _w) = weight.device_ptr(stream);
    let (yp, _y) = y.device_ptr_mut(stream);
    let f = gpu.kernel(T::pick(&EMBEDDING_FORWARD))?;
    let mut b = f.launch_on(stream);
    b.arg(&ip).arg(&wp).arg(&yp).arg(&rows).arg(&v).arg(&dim).arg(&t);
    // SAFETY: ids hold `rows` values, weight [v, dim], y [rows, dim]
    // (checked); the kernel reads only rows it has checked against v, or
    // positions below t <= v.
    unsafe { b.launch(launch_1d(len)) }.map_err(|e| Error::cuda(OP, e))
}

/// `weight.grad[row(i)] += dy[i]` for every output row i, in order of i
/// (`dy`: `[rows, dim]`).
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    lookup: Lookup<'_, '_>,
    dy: &CudaView<'_, T>,
    table: Table,
    dweight: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    const OP: &str = "embedding backward";
    let (rows, t, used) = lookup_args(OP, lookup, table)?;
    check_len(OP, "dy", dy.len(), lookup.rows() * table.dim)?;
    check_len(OP, "weight.grad", dweight.len(), table.num_embeddings * table.dim)?;
    let threads = used * table.dim;
    if threads == 0 || lookup.rows() == 0 {
        return Ok(());
    }
    let (used64, dim) = (as_i64(OP, used)?, as_i64(OP, table.dim)?);
    let stream = gpu.stream();
    let ids = match lookup {
        Lookup::Tokens(ids) => Some(ids.device_ptr(stream)),
        Lookup::Positions { .. } => None,
    };
    let ip = ids.as_ref().map_or(0, |p| p.0);
    let (gp, _g) = dy.device_ptr(stream);
    let (dwp, _dw) = dweight.device_ptr_mut(stream);
    let f = gpu.kernel(T::pick(&EMBEDDING_BACKWARD))?;
    let mut b = f.launch_on(stream);
    b.arg(&ip).arg(&gp).arg(&dwp).arg(&rows).arg(&used64).arg(&dim).arg(&t);
    // SAFETY: as in forward; each thread owns one of the first `used` rows'
    // gradient elements, so no two threads write the same element.
    unsafe { b.launch(launch_1d(threads)) }.map_err(|e| Error::cuda(OP, e))
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
