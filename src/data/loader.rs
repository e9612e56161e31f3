//! Batches assembled on a background thread and handed over through a bounded
//! channel, so the training step finds the next batch ready (like a DataLoader
//! with one worker and `prefetch_factor` batches in flight).

use super::augment::EpochAugment;
use super::Dataset;
use crate::tensor::Tensor;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One batch: `images` is `[B, C, H, W]` and `labels` has `B` entries; for
/// text, `images` is `[B, T]` token ids and `labels` the `B * T` targets.
#[derive(Debug, Clone)]
pub struct Batch {
    pub images: Tensor,
    pub labels: Vec<u32>,
}

/// Iterates the batches of one pass over `indices`.
///
/// Dropping it early (e.g. when training stops mid-epoch) closes the channel,
/// which wakes the thread if it is blocked on a full channel; drop then joins it.
pub struct Loader {
    rx: Option<Receiver<Batch>>,
    handle: Option<JoinHandle<()>>,
    /// Set only when no thread could be started: batches are then built in
    /// `next`, on the caller's thread.
    inline: Option<Work>,
    num_batches: usize,
    yielded: usize,
}

#[derive(Clone)]
struct Work {
    ds: Arc<Dataset>,
    indices: Arc<Vec<usize>>,
    batch_size: usize,
    augment: Option<EpochAugment>,
    /// The epoch the batches belong to (it keys text windows' offsets).
    epoch: u64,
}

impl Work {
    fn batch(&self, k: usize) -> Batch {
        let end = ((k + 1) * self.batch_size).min(self.indices.len());
        let idx = &self.indices[k * self.batch_size..end];
        match &self.ds.text {
            Some(t) => text_batch(t, self.epoch, idx),
            None => build(&self.ds, idx, self.augment.as_ref()),
        }
    }
}

impl Loader {
    /// Batches of `batch_size` samples of `ds`, in the order of `indices`; the
    /// last, smaller batch is dropped iff `drop_last`. Up to `prefetch` batches
    /// wait ready in the channel (0: each batch is handed over as it is built).
    ///
    /// Panics if `batch_size` is 0 or an index is out of range: both are bugs in
    /// the caller (the config refuses batch size 0; samplers give valid indices).
    pub fn new(
        ds: Arc<Dataset>,
        indices: Vec<usize>,
        batch_size: usize,
        drop_last: bool,
        prefetch: usize,
    ) -> Self {
        Self::with_thread(ds, indices, batch_size, drop_last, prefetch, None, true)
    }

    /// `new` for training batches: each sample transformed by `augment`
    /// (its draws depend on the epoch and the sample, not on the batch).
    pub fn augmented(
        ds: Arc<Dataset>,
        indices: Vec<usize>,
        batch_size: usize,
        drop_last: bool,
        prefetch: usize,
        augment: Option<EpochAugment>,
    ) -> Self {
        Self::with_thread(ds, indices, batch_size, drop_last, prefetch, augment, true)
    }

    /// The training batches of `epoch`: augmented when `augment` is set,
    /// and for text, windows drawn for that epoch.
    pub fn training(
        ds: Arc<Dataset>,
        indices: Vec<usize>,
        (batch_size, drop_last, prefetch): (usize, bool, usize),
        epoch: u64,
        augment: Option<Arc<super::Augment>>,
    ) -> Self {
        let augment = augment.map(|augment| EpochAugment { augment, epoch });
        Self::start(Self::work(ds, indices, batch_size, augment, epoch), drop_last, prefetch, true)
    }

    /// `new`, or with `threaded = false` the fallback used when no thread can
    /// be spawned (so tests can reach it).
    pub(crate) fn with_thread(
        ds: Arc<Dataset>,
        indices: Vec<usize>,
        batch_size: usize,
        drop_last: bool,
        prefetch: usize,
        augment: Option<EpochAugment>,
        threaded: bool,
    ) -> Self {
        let epoch = augment.as_ref().map_or(0, |a| a.epoch);
        Self::start(Self::work(ds, indices, batch_size, augment, epoch), drop_last, prefetch, threaded)
    }

    fn work(
        ds: Arc<Dataset>,
        indices: Vec<usize>,
        batch_size: usize,
        augment: Option<EpochAugment>,
        epoch: u64,
    ) -> Work {
        assert!(batch_size > 0, "Loader: batch_size must be at least 1");
        if let Some(&bad) = indices.iter().find(|&&i| i >= ds.len()) {
            panic!("Loader: index {bad} is out of range for a dataset of {} samples", ds.len());
        }
        Work { ds, indices: Arc::new(indices), batch_size, augment, epoch }
    }

    fn start(work: Work, drop_last: bool, prefetch: usize, threaded: bool) -> Self {
        let (n, batch_size) = (work.indices.len(), work.batch_size);
        let num_batches = if drop_last { n / batch_size } else { n.div_ceil(batch_size) };
        if !threaded {
            return Loader { rx: None, handle: None, inline: Some(work), num_batches, yielded: 0 };
        }
        let (tx, rx) = sync_channel(prefetch);
        let thread_work = work.clone();
        let spawned = std::thread::Builder::new()
            .name("ddptrain-loader".into())
            .spawn(move || produce(&thread_work, num_batches, &tx));
        match spawned {
            Ok(handle) => {
                Loader { rx: Some(rx), handle: Some(handle), inline: None, num_batches, yielded: 0 }
            }
            // No thread to be had (process limits): slower, but the run goes on.
            Err(_) => Loader { rx: None, handle: None, inline: Some(work), num_batches, yielded: 0 },
        }
    }

    /// Batches in this pass (including the partial last one unless dropped).
    pub fn num_batches(&self) -> usize {
        self.num_batches
    }
}

/// Text windows `idx` of `epoch`: `[B, T]` input ids and `B * T` targets.
fn text_batch(t: &super::text::Windows, epoch: u64, idx: &[usize]) -> Batch {
    let mut inputs = Vec::with_capacity(idx.len() * t.block_size);
    let mut targets = Vec::with_capacity(idx.len() * t.block_size);
    for &i in idx {
        t.push(epoch, i, &mut inputs, &mut targets);
    }
    let images = Tensor::from_vec(&[idx.len(), t.block_size], inputs)
        .expect("a text batch holds exactly B windows of block_size ids");
    Batch { images, labels: targets }
}

fn build(ds: &Dataset, idx: &[usize], augment: Option<&EpochAugment>) -> Batch {
    let chw = ds.chw().expect("an image dataset's samples are [C, H, W]");
    let shape = augment.map_or(chw, |a| a.augment.out_shape(chw));
    let per: usize = shape.iter().product();
    let mut images = Vec::with_capacity(idx.len() * per);
    let mut labels = Vec::with_capacity(idx.len());
    for &i in idx {
        match augment {
            Some(a) => {
                let d = a.augment.draw(a.epoch, ds.len(), i, chw);
                a.augment.apply(ds.sample(i), chw, d, &mut images);
            }
            None => images.extend_from_slice(ds.sample(i)),
        }
        labels.push(ds.labels[i]);
    }
    let [c, h, w] = shape;
    let images = Tensor::from_vec(&[idx.len(), c, h, w], images)
        .expect("a batch holds exactly B whole samples of the dataset's shape");
    Batch { images, labels }
}

fn produce(work: &Work, num_batches: usize, tx: &SyncSender<Batch>) {
    for k in 0..num_batches {
        if tx.send(work.batch(k)).is_err() {
            // The Loader was dropped: nobody wants the rest of the epoch.
            return;
        }
    }
}

impl Iterator for Loader {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        if let Some(work) = &self.inline {
            if self.yielded == self.num_batches {
                return None;
            }
            self.yielded += 1;
            return Some(work.batch(self.yielded - 1));
        }
        let batch = self.rx.as_ref()?.recv().ok();
        match batch {
            Some(b) => {
                self.yielded += 1;
                Some(b)
            }
            None => {
                // The thread is done (or died): surface a panic here rather
                // than end the epoch silently short.
                self.rx = None;
                if let Some(h) = self.handle.take() {
                    if let Err(panic) = h.join() {
                        std::panic::resume_unwind(panic);
                    }
                }
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.num_batches - self.yielded;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Loader {}

impl Drop for Loader {
    fn drop(&mut self) {
        // Receiver first, so a thread blocked in `send` returns, then join.
        self.rx = None;
        if let Some(h) = self.handle.take() {
            // A panic in the thread has nowhere to go while dropping.
            let _ = h.join();
        }
    }
}
