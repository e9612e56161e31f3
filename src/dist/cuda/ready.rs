//! Which gradient buckets may start their all-reduce, as backward marks
//! parameters ready: the bookkeeping of PyTorch's `Reducer::mark_variable_ready`
//! and `mark_bucket_ready`, without any device work, so it is testable on
//! its own and the device reducer only executes what it decides.
//!
//! Buckets are launched strictly in bucket order (PyTorch's `next_bucket_`):
//! a bucket whose gradients are all ready waits for the buckets before it.
//! NCCL needs every rank to issue its collectives in one order, and bucket
//! order is the one order every rank agrees on.

use crate::error::{Error, Result};
use std::ops::Range;

#[derive(Debug, Clone)]
pub struct ReadyTracker {
    names: Vec<String>,
    /// The bucket of each parameter (registration order).
    bucket_of: Vec<usize>,
    /// Parameters per bucket, and how many of them are still to be marked this step.
    size: Vec<usize>,
    pending: Vec<usize>,
    marked: Vec<bool>,
    /// Buckets `0..next` have been launched this step.
    next: usize,
}

impl ReadyTracker {
    /// `names` of the parameters in registration order; `buckets[b]` the
    /// parameters of bucket `b`. Every parameter must be in exactly one bucket.
    pub fn new(names: Vec<String>, buckets: &[Vec<usize>]) -> Result<Self> {
        let n = names.len();
        let mut bucket_of = vec![usize::MAX; n];
        for (b, members) in buckets.iter().enumerate() {
            if members.is_empty() {
                return Err(internal(format!("gradient bucket {b} holds no parameter")));
            }
            for &i in members {
                let slot = bucket_of
                    .get_mut(i)
                    .ok_or_else(|| internal(format!("gradient bucket {b} names parameter {i} of {n}")))?;
                if *slot != usize::MAX {
                    return Err(internal(format!(
                        "parameter {} is in gradient buckets {} and {b}",
                        names[i], *slot
                    )));
                }
                *slot = b;
            }
        }
        if let Some(i) = bucket_of.iter().position(|&b| b == usize::MAX) {
            return Err(internal(format!("parameter {} is in no gradient bucket", names[i])));
        }
        let size: Vec<usize> = buckets.iter().map(Vec::len).collect();
        Ok(ReadyTracker { names, bucket_of, pending: size.clone(), size, marked: vec![false; n], next: 0 })
    }

    /// Buckets launched so far this step (`0..launched()`).
    pub fn launched(&self) -> usize {
        self.next
    }

    /// Marks `ready` (registration indices) and returns the buckets that may
    /// be launched now, in order. Checks the whole list before changing
    /// anything, so a refused call leaves the step as it was.
    pub fn mark(&mut self, ready: &[usize]) -> Result<Range<usize>> {
        for (k, &i) in ready.iter().enumerate() {
            let name = self.names.get(i).ok_or_else(|| {
                Error::Training(format!(
                    "DDP: parameter index {i} marked ready, but the model has {} parameters",
                    self.names.len()
                ))
            })?;
            if self.marked[i] || ready[..k].contains(&i) {
                return Err(Error::Training(format!(
                    "DDP: parameter {name} was marked ready twice in one step (PyTorch: \"Expected to \
                     mark a variable ready only once\"); a parameter used twice in the forward must \
                     have its gradient accumulated before it is marked ready"
                )));
            }
        }
        for &i in ready {
            self.marked[i] = true;
            self.pending[self.bucket_of[i]] -= 1;
        }
        let start = self.next;
        while self.next < self.size.len() && self.pending[self.next] == 0 {
            self.next += 1;
        }
        Ok(start..self.next)
    }

    /// The end of a synchronizing backward: every bucket must have been
    /// launched. Resets for the next step either way.
    pub fn finish(&mut self) -> Result<()> {
        let missing: Vec<&str> =
            (0..self.names.len()).filter(|&i| !self.marked[i]).map(|i| self.names[i].as_str()).collect();
        let result = if missing.is_empty() {
            Ok(())
        } else {
            let waiting: Vec<String> = (self.next..self.size.len()).map(|b| b.to_string()).collect();
            Err(Error::Training(format!(
                "DDP: expected to have finished reduction in the prior iteration before starting a new \
                 one: parameters {} received no gradient this step, so gradient buckets {} were never \
                 reduced; every parameter must take part in producing the loss",
                missing.join(", "),
                waiting.join(", ")
            )))
        };
        self.reset();
        result
    }

    fn reset(&mut self) {
        self.pending.clone_from(&self.size);
        self.marked.iter_mut().for_each(|m| *m = false);
        self.next = 0;
    }
}

fn internal(msg: String) -> Error {
    Error::internal(format!("DDP: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("p{i}")).collect()
    }

    /// Three buckets as the seed model's reverse order gives them: [4, 3], [2], [1, 0].
    fn tracker() -> ReadyTracker {
        ReadyTracker::new(names(5), &[vec![4, 3], vec![2], vec![1, 0]]).unwrap()
    }

    #[test]
    fn a_bucket_launches_when_its_last_parameter_is_marked() {
        let mut t = tracker();
        assert_eq!(t.mark(&[4]).unwrap(), 0..0);
        assert_eq!(t.mark(&[3]).unwrap(), 0..1);
        assert_eq!(t.mark(&[2, 1]).unwrap(), 1..2);
        assert_eq!(t.launched(), 2);
        assert_eq!(t.mark(&[0]).unwrap(), 2..3);
        t.finish().unwrap();
        // The next step starts from scratch.
        assert_eq!(t.launched(), 0);
        assert_eq!(t.mark(&[3, 4, 2]).unwrap(), 0..2);
    }

    #[test]
    fn a_complete_bucket_waits_for_the_buckets_before_it() {
        let mut t = tracker();
        // Bucket 2 completes first, but bucket 0 and 1 must go before it.
        assert_eq!(t.mark(&[0, 1]).unwrap(), 0..0);
        assert_eq!(t.mark(&[2]).unwrap(), 0..0);
        assert_eq!(t.mark(&[4, 3]).unwrap(), 0..3);
        t.finish().unwrap();
    }

    #[test]
    fn marking_a_parameter_twice_names_it_and_changes_nothing() {
        let mut t = tracker();
        t.mark(&[4]).unwrap();
        let e = t.mark(&[3, 4]).unwrap_err().to_string();
        assert!(e.contains("parameter p4 was marked ready twice in one step"), "{e}");
        // The refused call did not mark p3.
        assert_eq!(t.mark(&[3]).unwrap(), 0..1);
        let e = t.mark(&[2, 2]).unwrap_err().to_string();
        assert!(e.contains("parameter p2 was marked ready twice"), "{e}");
        let e = t.mark(&[7]).unwrap_err().to_string();
        assert!(e.contains("parameter index 7 marked ready, but the model has 5 parameters"), "{e}");
    }

    #[test]
    fn finishing_with_unmarked_parameters_names_them_and_resets() {
        let mut t = tracker();
        t.mark(&[4, 3, 2, 0]).unwrap();
        let e = t.finish().unwrap_err().to_string();
        assert!(e.contains("expected to have finished reduction in the prior iteration"), "{e}");
        assert!(e.contains("parameters p1 received no gradient this step"), "{e}");
        assert!(e.contains("gradient buckets 2 were never reduced"), "{e}");
        // Reset: a full step now succeeds.
        assert_eq!(t.mark(&[4, 3, 2, 1, 0]).unwrap(), 0..3);
        t.finish().unwrap();
        let e = t.finish().unwrap_err().to_string();
        assert!(e.contains("parameters p0, p1, p2, p3, p4 received no gradient"), "{e}");
        assert!(e.contains("gradient buckets 0, 1, 2 were never reduced"), "{e}");
    }

    #[test]
    fn every_parameter_must_be_in_exactly_one_bucket() {
        let e = ReadyTracker::new(names(3), &[vec![2, 1]]).unwrap_err().to_string();
        assert!(e.contains("parameter p0 is in no gradient bucket"), "{e}");
        let e = ReadyTracker::new(names(2), &[vec![1, 0], vec![0]]).unwrap_err().to_string();
        assert!(e.contains("parameter p0 is in gradient buckets 0 and 1"), "{e}");
        let e = ReadyTracker::new(names(2), &[vec![1, 5]]).unwrap_err().to_string();
        assert!(e.contains("gradient bucket 0 names parameter 5 of 2"), "{e}");
        let e = ReadyTracker::new(names(1), &[vec![0], vec![]]).unwrap_err().to_string();
        assert!(e.contains("gradient bucket 1 holds no parameter"), "{e}");
    }
}
