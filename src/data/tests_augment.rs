//! RandomCrop and RandomHorizontalFlip: torchvision's semantics, and draws
//! that depend only on (seed, epoch, sample).

use super::augment::Draw;
use super::*;
use std::collections::HashMap;
use std::sync::Arc;

fn crop(size: usize, padding: usize, fill: u8, norm: &Normalize) -> Option<Crop> {
    Some(Crop::new(size, padding, fill, norm))
}

#[test]
fn crop_and_flip_of_a_known_image_match_the_hand_computed_ones() {
    // One 3x3 channel holding 1..=9, padded with fill 0: (0 / 255 - 0.5) / 0.5 = -1.
    let norm = Normalize { mean: vec![0.5], std: vec![0.5] };
    let a = Augment { seed: 0, crop: crop(3, 1, 0, &norm), flip: None };
    let img: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    let f = -1.0;
    // Padded 5x5 image, crop at row 0, column 2: the pad row, then rows 0-1
    // of columns 1-2 and the right pad column.
    let mut out = Vec::new();
    a.apply(&img, [1, 3, 3], Draw { top: 0, left: 2, flip: false }, &mut out);
    assert_eq!(out, vec![f, f, f, 2.0, 3.0, f, 5.0, 6.0, f]);
    out.clear();
    a.apply(&img, [1, 3, 3], Draw { top: 0, left: 2, flip: true }, &mut out);
    assert_eq!(out, vec![f, f, f, f, 3.0, 2.0, f, 6.0, 5.0], "the crop mirrored left-right");
    // The centre draw (padding, padding) is the identity.
    out.clear();
    a.apply(&img, [1, 3, 3], Draw { top: 1, left: 1, flip: false }, &mut out);
    assert_eq!(out, img);
    // fill is a raw pixel value, normalized per channel like the image.
    let rgb = Normalize { mean: vec![0.5, 0.0, 1.0], std: vec![0.5, 1.0, 2.0] };
    assert_eq!(Crop::new(4, 2, 255, &rgb).fill, vec![1.0, 1.0, 0.0]);
    // Channels are cropped alike, each padded with its own fill.
    let a = Augment { seed: 0, crop: crop(2, 1, 255, &rgb), flip: None };
    let two: Vec<f32> = vec![10.0, 20.0, 30.0, 40.0, 11.0, 21.0, 31.0, 41.0, 12.0, 22.0, 32.0, 42.0];
    let mut out = Vec::new();
    a.apply(&two, [3, 2, 2], Draw { top: 2, left: 0, flip: false }, &mut out);
    assert_eq!(out, vec![1.0, 30.0, 1.0, 1.0, 1.0, 31.0, 1.0, 1.0, 0.0, 32.0, 0.0, 0.0]);
}

#[test]
fn draws_cover_every_offset_and_flip_follows_p() {
    let norm = Normalize::identity(1);
    let a = Augment { seed: 3, crop: crop(28, 4, 0, &norm), flip: Some(0.5) };
    let mut tops = [0usize; 9];
    let mut lefts = [0usize; 9];
    let mut flips = 0;
    for i in 0..4000 {
        let d = a.draw(2, 4000, i, [1, 28, 28]);
        tops[d.top] += 1;
        lefts[d.left] += 1;
        flips += usize::from(d.flip);
    }
    // Offsets 0..=8, each about a ninth (444) of the draws.
    assert!(tops.iter().chain(&lefts).all(|&n| (330..560).contains(&n)), "{tops:?} {lefts:?}");
    assert!((1850..2150).contains(&flips), "{flips} flips of 4000 at p = 0.5");
    for (p, want) in [(0.0, 0), (1.0, 4000)] {
        let a = Augment { seed: 3, crop: None, flip: Some(p) };
        let n = (0..4000).filter(|&i| a.draw(0, 4000, i, [1, 28, 28]).flip).count();
        assert_eq!(n, want, "p = {p}");
    }
    // No crop: the sample's own shape, untouched unless flipped.
    let a = Augment { seed: 3, crop: None, flip: Some(1.0) };
    assert_eq!(a.out_shape([1, 2, 3]), [1, 2, 3]);
    let mut out = Vec::new();
    a.apply(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1, 2, 3], a.draw(0, 1, 0, [1, 2, 3]), &mut out);
    assert_eq!(out, vec![3.0, 2.0, 1.0, 6.0, 5.0, 4.0]);
}

#[test]
fn a_sample_gets_the_same_crop_whatever_the_batch_size_rank_count_or_prefetch() {
    let ds = Arc::new(synthetic(5, Split::Train, 37, [2, 6, 6], 4));
    let norm = Normalize::identity(2);
    let augment = Arc::new(Augment { seed: 11, crop: crop(6, 2, 128, &norm), flip: Some(0.5) });
    // What each sample of epoch `e` becomes, computed one sample at a time.
    let expected = |e: u64| -> Vec<Vec<f32>> {
        (0..ds.len())
            .map(|i| {
                let mut out = Vec::new();
                let chw = ds.chw().unwrap();
                augment.apply(ds.sample(i), chw, augment.draw(e, ds.len(), i, chw), &mut out);
                out
            })
            .collect()
    };
    let (e3, e4) = (expected(3), expected(4));
    assert_ne!(e3, e4, "epochs draw afresh");
    assert!((0..ds.len()).any(|i| e3[i] != ds.sample(i)), "samples are transformed");
    for (batch, world, prefetch) in [(1, 1, 0), (4, 1, 2), (5, 2, 1), (37, 3, 4), (6, 4, 0)] {
        let mut seen: HashMap<usize, Vec<f32>> = HashMap::new();
        for rank in 0..world {
            let s = DistributedSampler {
                len: ds.len(),
                num_replicas: world,
                rank,
                shuffle: true,
                seed: 9,
                drop_last: false,
            };
            let order = s.indices(3);
            let ep = Some(EpochAugment { augment: Arc::clone(&augment), epoch: 3 });
            let loader = Loader::augmented(Arc::clone(&ds), order.clone(), batch, false, prefetch, ep);
            let rows: Vec<Vec<f32>> = loader
                .flat_map(|b| b.images.as_f32().unwrap().chunks(72).map(<[f32]>::to_vec).collect::<Vec<_>>())
                .collect();
            assert_eq!(rows.len(), order.len());
            for (i, row) in order.into_iter().zip(rows) {
                assert_eq!(row, e3[i], "sample {i}, batch {batch}, world {world}, rank {rank}");
                seen.insert(i, row);
            }
        }
        assert_eq!(seen.len(), ds.len(), "every sample visited");
    }
}
