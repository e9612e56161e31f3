//! NCCL reduction ops as plain integers. `ncclRedOpCreatePreMulSum` returns
//! ops numbered past cudarc's `ncclRedOp_t` enum (`ncclNumOps + k`); held in
//! that Rust enum they would be undefined behaviour (the compiler may assume
//! only its listed values), so they stay `u32` here and reach ncclAllReduce
//! and ncclRedOpDestroy through entry points declared with a `u32` op.

use cudarc::nccl::{result::NcclError, sys};
use std::ffi::c_void;

type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    u32,
    sys::ncclComm_t,
    sys::cudaStream_t,
) -> u32;
type DestroyFn = unsafe extern "C" fn(u32, sys::ncclComm_t) -> u32;

/// `ncclSum`, the one built-in op used here.
pub(super) const SUM: u32 = sys::ncclRedOp_t::ncclSum as u32;

/// libnccl's entry points that take an op, with the op as `u32`.
#[derive(Clone, Copy)]
pub(super) struct RawOps {
    all_reduce: AllReduceFn,
    destroy: DestroyFn,
}

/// A raw `ncclResult_t`: Ok for ncclSuccess, else the status (codes cudarc's
/// enum does not know become ncclInternalError rather than an invalid enum).
fn status(rc: u32) -> Result<(), NcclError> {
    use sys::ncclResult_t::*;
    let r = match rc {
        0 => return Ok(()),
        1 => ncclUnhandledCudaError,
        2 => ncclSystemError,
        4 => ncclInvalidArgument,
        5 => ncclInvalidUsage,
        6 => ncclRemoteError,
        7 => ncclInProgress,
        _ => ncclInternalError,
    };
    Err(NcclError(r))
}

impl RawOps {
    /// Looks the entry points up in the libnccl cudarc loaded (call after `require_nccl`).
    pub(super) fn load() -> Result<RawOps, String> {
        // SAFETY: the symbols are NCCL's, with these C signatures (an enum
        // argument is passed as its underlying 32-bit integer).
        unsafe {
            let lib = sys::culib();
            let all_reduce = *lib.get::<AllReduceFn>(b"ncclAllReduce\0").map_err(|e| e.to_string())?;
            let destroy = *lib.get::<DestroyFn>(b"ncclRedOpDestroy\0").map_err(|e| e.to_string())?;
            Ok(RawOps { all_reduce, destroy })
        }
    }

    /// `ncclRedOpCreatePreMulSum`, the op returned as `u32`.
    ///
    /// # Safety
    /// `comm` is a live communicator; `scalar` points to one `datatype` value.
    pub(super) unsafe fn create_pre_mul_sum(
        scalar: *mut c_void,
        datatype: sys::ncclDataType_t,
        comm: sys::ncclComm_t,
    ) -> Result<u32, NcclError> {
        let mut op: u32 = SUM;
        // NCCL writes an int through the pointer; Rust never reads it as the enum.
        cudarc::nccl::result::reduce_op_create_pre_mul_sum(
            (&mut op as *mut u32).cast(),
            scalar,
            datatype,
            sys::ncclScalarResidence_t::ncclScalarHostImmediate,
            comm,
        )?;
        Ok(op)
    }

    /// `ncclAllReduce` in place.
    ///
    /// # Safety
    /// `buf` holds `n` elements of `datatype` on the communicator's device,
    /// `op` is a built-in op or one created on `comm`, `stream` is live.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn all_reduce(
        &self,
        buf: *mut c_void,
        n: usize,
        datatype: sys::ncclDataType_t,
        op: u32,
        comm: sys::ncclComm_t,
        stream: sys::cudaStream_t,
    ) -> Result<(), NcclError> {
        status((self.all_reduce)(buf, buf, n, datatype, op, comm, stream))
    }

    /// `ncclRedOpDestroy`.
    ///
    /// # Safety
    /// `op` was created on the live `comm` and is destroyed once.
    pub(super) unsafe fn destroy(&self, op: u32, comm: sys::ncclComm_t) -> Result<(), NcclError> {
        status((self.destroy)(op, comm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_statuses_never_become_invalid_enum_values() {
        assert!(status(0).is_ok());
        assert_eq!(status(6).unwrap_err().0, sys::ncclResult_t::ncclRemoteError);
        assert_eq!(status(4).unwrap_err().0, sys::ncclResult_t::ncclInvalidArgument);
        assert_eq!(status(1234).unwrap_err().0, sys::ncclResult_t::ncclInternalError);
    }
}
