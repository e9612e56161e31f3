//! [`Buf`]: a tensor's host elements, shared by its clones and copied on
//! the first write to a shared one (PyTorch's tensors share storage the same
//! way, through the autograd graph's saved tensors).
//!
//! A graph value read twice (a residual block's input, by its shortcut and
//! its first conv), a value a layer keeps for its backward (ReLU's output)
//! and the gradient an add hands each operand were whole copies: 51 MB a
//! ResNet-20 step at batch 128 and O2, for data nobody wrote again.

use super::par_copy;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// Elements of a host tensor: cloning shares them, writing through
/// [`DerefMut`] to shared ones first makes this clone's own copy (on every
/// core when large), so a write is never seen through another clone.
#[derive(Debug)]
pub struct Buf<T>(Arc<Vec<T>>);

impl<T> Clone for Buf<T> {
    /// Another handle on the same elements, without copying them.
    fn clone(&self) -> Self {
        Buf(Arc::clone(&self.0))
    }
}

impl<T> From<Vec<T>> for Buf<T> {
    fn from(v: Vec<T>) -> Self {
        Buf(Arc::new(v))
    }
}

impl<T: Copy + Send + Sync> Buf<T> {
    /// The elements as a vector: moved out when this is the only handle,
    /// copied otherwise.
    pub fn into_vec(self) -> Vec<T> {
        Arc::try_unwrap(self.0).unwrap_or_else(|shared| par_copy(&shared))
    }
}

impl<T> Buf<T> {
    /// Whether another clone shares these elements (tests).
    #[cfg(test)]
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

impl<'a, T> IntoIterator for &'a Buf<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Copy + Send + Sync> DerefMut for Buf<T> {
    /// The elements for writing, copied first if another clone shares them.
    fn deref_mut(&mut self) -> &mut [T] {
        if Arc::get_mut(&mut self.0).is_none() {
            self.0 = Arc::new(par_copy(&self.0));
        }
        // A fresh copy has no other handle, and no handle is made while
        // `self` is borrowed mutably, so this finds it unshared.
        match Arc::get_mut(&mut self.0) {
            Some(v) => v,
            None => unreachable!("a buffer copied for writing has no other handle"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clones share until one is written; the write makes that clone's own
    /// copy and the others keep the old elements.
    #[test]
    fn clones_share_until_written() {
        let a = Buf::from(vec![1.0f32, 2.0, 3.0]);
        let mut b = a.clone();
        assert!(a.is_shared() && std::ptr::eq(a.as_ptr(), b.as_ptr()));
        b[1] = 7.0;
        assert_eq!((&a[..], &b[..]), (&[1.0, 2.0, 3.0][..], &[1.0, 7.0, 3.0][..]));
        assert!(!a.is_shared() && !b.is_shared());
        // The only handle is written in place, and moves its vector out.
        let p = b.as_ptr();
        b[0] = 5.0;
        assert_eq!(b.as_ptr(), p);
        let v = b.into_vec();
        assert_eq!(v.as_ptr(), p);
        // A shared one is copied out, a large one on the pool too.
        let big = Buf::from((0..100_000).map(|i| i as f32).collect::<Vec<_>>());
        let keep = big.clone();
        let v = big.into_vec();
        assert!(!keep.is_shared());
        assert_eq!(&v[..], &keep[..]);
        assert_ne!(v.as_ptr(), keep.as_ptr());
    }
}
