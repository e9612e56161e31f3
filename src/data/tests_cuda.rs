//! gather_batch against the CPU loader's batch assembly.

use super::*;
use crate::data::{synthetic, Loader, Split};
use std::sync::Arc;

#[test]
fn gather_batch_matches_the_loader_including_a_partial_last_batch() {
    let Some(gpu) = crate::cuda::test_gpu("gather_batch_matches_the_loader_including_a_partial_last_batch")
    else {
        return;
    };
    let ds = Arc::new(synthetic(7, Split::Train, 23, [3, 5, 7], 4));
    let dev = DeviceDataset::upload(&gpu, &ds).unwrap();
    let order: Vec<usize> = (0..23).map(|i| (i * 7 + 3) % 23).collect();
    let idx = DeviceIndices::upload(&gpu, &dev, &order, 0).unwrap();
    let batch = 6;
    let loader = Loader::new(ds.clone(), order.clone(), batch, false, 0);
    for (k, want) in loader.enumerate() {
        let n = want.labels.len();
        let mut x = crate::cuda::testing::poisoned::<f32>(&gpu, n * dev.sample_len());
        let mut y = gpu.stream().clone_htod(&vec![u32::MAX; n]).unwrap();
        gather_batch(&gpu, &dev, &idx, k * batch, n, &mut x.as_view_mut(), &mut y.as_view_mut()).unwrap();
        let got_x: Vec<f32> = gpu.stream().clone_dtoh(&x).unwrap();
        let got_y: Vec<u32> = gpu.stream().clone_dtoh(&y).unwrap();
        assert_eq!(got_x, want.images.as_f32().unwrap(), "batch {k} images");
        assert_eq!(got_y, want.labels, "batch {k} labels");
    }
}

#[test]
fn gather_batch_refuses_rows_past_the_pass_and_bad_indices() {
    let Some(gpu) = crate::cuda::test_gpu("gather_batch_refuses_rows_past_the_pass_and_bad_indices") else {
        return;
    };
    let ds = synthetic(7, Split::Train, 5, [1, 2, 2], 3);
    let dev = DeviceDataset::upload(&gpu, &ds).unwrap();
    let err = DeviceIndices::upload(&gpu, &dev, &[0, 5], 0).err().unwrap().to_string();
    assert!(err.contains("index 5 is out of range for 5 samples"), "{err}");
    let idx = DeviceIndices::upload(&gpu, &dev, &[0, 1, 2], 0).unwrap();
    let mut x = gpu.stream().alloc_zeros::<f32>(8).unwrap();
    let mut y = gpu.stream().alloc_zeros::<u32>(2).unwrap();
    let err = gather_batch(&gpu, &dev, &idx, 2, 2, &mut x.as_view_mut(), &mut y.as_view_mut())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("rows 2..4 past the 3 indices"), "{err}");
}

#[test]
fn gather_batch_augmented_matches_the_augmenting_loader() {
    let Some(gpu) = crate::cuda::test_gpu("gather_batch_augmented_matches_the_augmenting_loader") else {
        return;
    };
    use crate::data::{Augment, Crop, EpochAugment, Normalize};
    let ds = Arc::new(synthetic(3, Split::Train, 23, [3, 6, 6], 4));
    let norm = Normalize { mean: vec![0.4, 0.5, 0.6], std: vec![0.2, 0.25, 0.3] };
    let dev = DeviceDataset::upload(&gpu, &ds).unwrap();
    let order: Vec<usize> = (0..23).map(|i| (i * 5 + 2) % 23).collect();
    for crop in [Some(Crop::new(6, 3, 200, &norm)), None] {
        let a = Augment { seed: 17, crop, flip: Some(0.5) };
        let aug = DeviceAugment::upload(&gpu, &a, 3).unwrap();
        let idx = DeviceIndices::upload_augmented(&gpu, &dev, &order, &a, 4).unwrap();
        let ep = Some(EpochAugment { augment: Arc::new(a), epoch: 4 });
        let batch = 5;
        for (k, want) in Loader::augmented(ds.clone(), order.clone(), batch, false, 0, ep).enumerate() {
            let n = want.labels.len();
            let mut x = crate::cuda::testing::poisoned::<f32>(&gpu, n * dev.sample_len());
            let mut y = gpu.stream().clone_htod(&vec![u32::MAX; n]).unwrap();
            let (xv, yv) = (&mut x.as_view_mut(), &mut y.as_view_mut());
            gather_batch_augmented(&gpu, &dev, &idx, &aug, k * batch, n, xv, yv).unwrap();
            let got_x: Vec<f32> = gpu.stream().clone_dtoh(&x).unwrap();
            let got_y: Vec<u32> = gpu.stream().clone_dtoh(&y).unwrap();
            assert_eq!(got_x, want.images.as_f32().unwrap(), "batch {k} images");
            assert_eq!(got_y, want.labels, "batch {k} labels");
        }
    }
    // A pass uploaded without draws cannot be gathered augmented.
    let plain = DeviceIndices::upload(&gpu, &dev, &order, 0).unwrap();
    let aug = DeviceAugment::upload(&gpu, &Augment { seed: 0, crop: None, flip: Some(1.0) }, 3).unwrap();
    let mut x = gpu.stream().alloc_zeros::<f32>(108).unwrap();
    let mut y = gpu.stream().alloc_zeros::<u32>(1).unwrap();
    let err =
        gather_batch_augmented(&gpu, &dev, &plain, &aug, 0, 1, &mut x.as_view_mut(), &mut y.as_view_mut())
            .err()
            .unwrap()
            .to_string();
    assert!(err.contains("uploaded without augmentation draws"), "{err}");
}

/// Text: each pass's windows cut out of the stream on the device, as the
/// training loader draws them for that epoch (a partial last batch too).
#[test]
fn gather_text_matches_the_loaders_windows() {
    let Some(gpu) = crate::cuda::test_gpu("gather_text_matches_the_loaders_windows") else {
        return;
    };
    use crate::data::text::{Vocab, Windows};
    let tokens: Vec<u32> = (0..97u32).map(|i| (i * 37 + 11) % 256).collect();
    let windows = Windows {
        tokens: Arc::new(tokens),
        vocab: Arc::new(Vocab::Bytes),
        block_size: 6,
        count: 13,
        seed: 9,
        split: Split::Train,
    };
    let ds = Arc::new(Dataset {
        images: Vec::new(),
        labels: Vec::new(),
        sample_shape: vec![6],
        num_classes: 256,
        text: Some(windows),
    });
    let dev = DeviceDataset::upload(&gpu, &ds).unwrap();
    assert_eq!((dev.len(), dev.sample_len(), dev.labels_per_sample()), (13, 6, 6));
    let order: Vec<usize> = (0..13).map(|i| (i * 5 + 1) % 13).collect();
    for epoch in [0, 3] {
        let idx = DeviceIndices::upload(&gpu, &dev, &order, epoch).unwrap();
        let batch = 4;
        let loader = Loader::training(ds.clone(), order.clone(), (batch, false, 0), epoch, None);
        for (k, want) in loader.enumerate() {
            let n = want.labels.len() / 6;
            let mut x = crate::cuda::testing::poisoned::<f32>(&gpu, n * 6);
            let mut y = gpu.stream().clone_htod(&vec![u32::MAX; n * 6]).unwrap();
            gather_batch(&gpu, &dev, &idx, k * batch, n, &mut x.as_view_mut(), &mut y.as_view_mut()).unwrap();
            let got_x: Vec<f32> = gpu.stream().clone_dtoh(&x).unwrap();
            let got_y: Vec<u32> = gpu.stream().clone_dtoh(&y).unwrap();
            assert_eq!(got_x, want.images.as_f32().unwrap(), "epoch {epoch} batch {k} ids");
            assert_eq!(got_y, want.labels, "epoch {epoch} batch {k} targets");
        }
    }
}
