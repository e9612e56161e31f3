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
    fn buffer_of(&self, value: usize) -> Result<usize> {
        self.storage
            .get(value)
            .copied()
            .filter(|&b| b < self.bufs.len())
            .ok_or_else(|| internal(format!("activation {value} has no buffer")))
    }

    /// The buffer holding `value`.
    pub fn get(&self, value: usize) -> Result<&DevBuf> {
        let b = self.buffer_of(value)?;
        Ok(&self.bufs[b])
    }

    pub fn get_mut(&mut self, value: usize) -> Result<&mut DevBuf> {
        let b = self.buffer_of(value)?;
        Ok(&mut self.bufs[b])
    }

    /// The buffers of `reads` and, writable, of `write`, which must be
    /// another buffer than each of theirs.
    pub fn reads_write(&mut self, reads: &[usize], write: usize) -> Result<(Vec<&DevBuf>, &mut DevBuf)> {
        let w = self.buffer_of(write)?;
        let rs = reads.iter().map(|&v| self.buffer_of(v)).collect::<Result<Vec<usize>>>()?;
        if rs.contains(&w) {
            return Err(internal(format!("activations {reads:?} and {write} share buffer {w}")));
        }
        let (lo, rest) = self.bufs.split_at_mut(w);
        let (out, hi) = rest.split_at_mut(1);
        let (lo, hi): (&[DevBuf], &[DevBuf]) = (lo, hi);
        let ins = rs.iter().map(|&r| if r < w { &lo[r] } else { &hi[r - w - 1] }).collect();
        Ok((ins, &mut out[0]))
    }
}

/// `bufs[read]` and, writable, `bufs[w]` for each `w` of `writes`, in
/// order: `None` when two of them are one buffer or one is out of range.
pub(super) fn read_and_writes<'g>(
    bufs: &'g mut [DevBuf],
    read: usize,
    writes: &[usize],
) -> Option<(&'g DevBuf, Vec<&'g mut DevBuf>)> {
    let mut r = None;
    let mut w: Vec<Option<&'g mut DevBuf>> = writes.iter().map(|_| None).collect();
    for (j, b) in bufs.iter_mut().enumerate() {
        if j == read {
            r = Some(&*b);
        } else if let Some(k) = writes.iter().position(|&s| s == j) {
            w[k] = Some(b);
        }
    }
    Some((r?, w.into_iter().collect::<Option<Vec<_>>>()?))
}
