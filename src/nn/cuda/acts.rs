//! The activation buffers of one step, addressed by value: values whose
//! lives do not overlap share a buffer ([`super::plan::Plan::storage`]),
//! and a layer's output never shares one with its inputs.

use super::layer::internal;
use super::params::DevBuf;
use crate::error::Result;

pub(super) struct Acts<'a> {
    pub bufs: &'a mut [DevBuf],
    /// The buffer of each value.
    pub storage: &'a [usize],
}

impl Acts<'_> {
    /// The buffer holding `value`.
    pub fn get(&self, value: usize) -> &DevBuf {
        &self.bufs[self.storage[value]]
    }

    pub fn get_mut(&mut self, value: usize) -> &mut DevBuf {
        &mut self.bufs[self.storage[value]]
    }

    /// The buffers of `reads` and, writable, of `write`.
    pub fn reads_write(&mut self, reads: &[usize], write: usize) -> Result<(Vec<&DevBuf>, &mut DevBuf)> {
        let rs: Vec<usize> = reads.iter().map(|&v| self.storage[v]).collect();
        let (ins, mut out) = reads_and_writes(self.bufs, &rs, &[self.storage[write]])?;
        Ok((ins, out.remove(0)))
    }
}

/// `bufs[r]` for each `r` of `reads` and, writable, `bufs[w]` for each `w`
/// of `writes`, in order. The plan gives a layer's outputs (or dx) other
/// buffers than its inputs (or dy); one shared is the device-plan error
/// this returns.
pub(super) fn reads_and_writes<'g>(
    bufs: &'g mut [DevBuf],
    reads: &[usize],
    writes: &[usize],
) -> Result<(Vec<&'g DevBuf>, Vec<&'g mut DevBuf>)> {
    let mut r: Vec<Option<&'g DevBuf>> = vec![None; reads.len()];
    let mut w: Vec<Option<&'g mut DevBuf>> = writes.iter().map(|_| None).collect();
    for (j, b) in bufs.iter_mut().enumerate() {
        let read = reads.contains(&j);
        match writes.iter().position(|&s| s == j) {
            Some(k) if !read && !writes[k + 1..].contains(&j) => w[k] = Some(b),
            Some(_) => break,
            None if read => {
                let b = &*b;
                for (slot, _) in r.iter_mut().zip(reads).filter(|(_, &v)| v == j) {
                    *slot = Some(b);
                }
            }
            None => {}
        }
    }
    match (r.into_iter().collect::<Option<Vec<_>>>(), w.into_iter().collect::<Option<Vec<_>>>()) {
        (Some(r), Some(w)) => Ok((r, w)),
        _ => {
            Err(internal(format!("buffers {reads:?} read and {writes:?} written: one is shared or missing")))
        }
    }
}
