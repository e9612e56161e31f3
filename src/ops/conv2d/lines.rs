//! Float buffers that start on a 64-byte cache line, for the AVX-512
//! kernels: a 16-float load or store that straddles two lines costs two
//! accesses. At malloc's 16-byte alignment every one of them does, and the
//! Winograd input transform ran 1.4x as long.

use std::ops::{Deref, DerefMut};

/// Floats per cache line (one AVX-512 vector).
const LINE: usize = 16;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; LINE]);

/// `len` floats from the start of a cache line.
#[derive(Default)]
pub(super) struct Lines {
    lines: Vec<Line>,
    len: usize,
}

impl Lines {
    /// `len` zeros.
    pub(super) fn zeroed(len: usize) -> Self {
        Lines { lines: vec![Line([0.0; LINE]); len.div_ceil(LINE)], len }
    }

    /// `len` floats that `fill` writes through the pointer it is given,
    /// without zero-filling them first (the last line's floats past `len`
    /// are zero).
    ///
    /// # Safety
    /// `fill` writes every one of the `len` floats from the pointer on.
    pub(super) unsafe fn written_by(len: usize, fill: impl FnOnce(*mut f32)) -> Self {
        let n = len.div_ceil(LINE);
        let mut lines: Vec<Line> = Vec::with_capacity(n);
        let base = lines.spare_capacity_mut().as_mut_ptr().cast::<f32>();
        if n > 0 {
            // SAFETY: line n - 1 lies in the capacity just reserved.
            unsafe { base.add((n - 1) * LINE).write_bytes(0, LINE) };
        }
        fill(base);
        // SAFETY: the caller's contract: `fill` wrote floats 0..len, and the
        // last line's rest is zero, so all n lines are initialized.
        unsafe { lines.set_len(n) };
        Lines { lines, len }
    }

    /// Makes room for at least `len` floats: the contents are kept and new
    /// floats are zero.
    pub(super) fn grow(&mut self, len: usize) {
        if len > self.len {
            self.lines.resize(len.div_ceil(LINE), Line([0.0; LINE]));
            self.len = len;
        }
    }

    /// The floats cut into consecutive pieces of the lengths `lens`, each
    /// starting on a cache line (so its length is rounded up to whole
    /// lines). Panics when they do not fit.
    pub(super) fn split<const N: usize>(&mut self, lens: [usize; N]) -> [&mut [f32]; N] {
        let mut rest: &mut [f32] = self;
        std::array::from_fn(|i| {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(lens[i].next_multiple_of(LINE));
            rest = b;
            &mut a[..lens[i]]
        })
    }

    /// Floats [`Lines::split`] needs for pieces of the lengths `lens`.
    pub(super) fn split_len(lens: &[usize]) -> usize {
        lens.iter().map(|n| n.next_multiple_of(LINE)).sum()
    }
}

impl Deref for Lines {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` with size 64 equal
        // to its alignment (no padding), so the lines are `16 * lines.len()`
        // initialized, contiguous floats, and `len` never exceeds that.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl DerefMut for Lines {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_start_on_cache_lines_and_keep_their_lengths() {
        let mut buf = Lines::zeroed(3);
        assert_eq!(&*buf, &[0.0; 3]);
        buf[2] = 7.0;
        let lens = [5, 40, 16, 0, 3];
        buf.grow(Lines::split_len(&lens));
        assert_eq!(Lines::split_len(&lens), 96, "5, 40, 16, 0, 3 floats take 1, 3, 1, 0, 1 lines");
        assert_eq!(buf[2], 7.0, "grow keeps the contents");
        let parts = buf.split(lens);
        for (p, n) in parts.iter().zip(lens) {
            assert_eq!(p.len(), n);
            assert_eq!(p.as_ptr() as usize % 64, 0);
        }
        assert_eq!(parts[0][2], 7.0);
    }
}
