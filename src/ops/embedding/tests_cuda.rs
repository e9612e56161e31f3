//! GPU parity: kernels/embedding.cu against the CPU twin
//! (src/ops/embedding/cpu.rs). The gather copies, and the scatter-add adds
//! each gradient element's rows in the CPU's order, so y and weight.grad
//! must be identical, bit for bit, in both dtypes.

use super::{backward, forward, Lookup, Table};
use crate::cuda::testing::{assert_identical, download, poisoned, rounded, upload};
use crate::cuda::{DeviceFloat, Gpu};
use crate::ops::embedding::cpu;
use crate::ops::testing::rand_vec_f32;
use half::f16;

/// `ids` (None: positions of sequences of `t`) into `table`, forward and backward.
fn check<T: DeviceFloat>(gpu: &Gpu, table: Table, ids: Option<&[usize]>, rows_t: (usize, usize), seed: u64) {
    let Table { num_embeddings: v, dim: c } = table;
    let (rows, t) = rows_t;
    let what = format!("embedding {} {table:?} rows={rows} positions={}", T::SUFFIX, ids.is_none());
    let cpu_ids: Vec<usize> = match ids {
        Some(ids) => ids.to_vec(),
        None => (0..rows).map(|i| i % t).collect(),
    };
    let w = rounded::<T>(&rand_vec_f32(v * c, seed));
    let mut y_cpu = vec![0f32; rows * c];
    cpu::forward(c, &cpu_ids, &w, &mut y_cpu);
    let ids_f: Vec<f32> = cpu_ids.iter().map(|&i| i as f32).collect();
    let idd = upload::<f32>(gpu, &ids_f);
    let idv = idd.as_view();
    let lookup = if ids.is_some() { Lookup::Tokens(&idv) } else { Lookup::Positions { rows, t } };
    let wd = upload::<T>(gpu, &w);
    let mut yd = poisoned::<T>(gpu, rows * c);
    forward(gpu, lookup, &wd.as_view(), table, &mut yd.as_view_mut()).unwrap();
    assert_identical(&format!("{what}: y"), &download(gpu, &yd), &y_cpu);

    // The gradient already holds values (`+=`); dy's rows are summed in f32.
    let dy = rounded::<T>(&rand_vec_f32(rows * c, seed + 1));
    let dw0 = rounded::<T>(&rand_vec_f32(v * c, seed + 2));
    let mut dw_cpu = dw0.clone();
    cpu::backward(c, &cpu_ids, &dy, &mut dw_cpu);
    let dyd = upload::<T>(gpu, &dy);
    let mut dwd = upload::<T>(gpu, &dw0);
    backward(gpu, lookup, &dyd.as_view(), table, &mut dwd.as_view_mut()).unwrap();
    assert_identical(&format!("{what}: weight.grad"), &download(gpu, &dwd), &rounded::<T>(&dw_cpu));
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    // The baby GPT's wte (98 chars, 128 wide) over [12, 64] tokens drawn with
    // repeats, and its wpe over the same batch.
    let table = Table { num_embeddings: 98, dim: 128 };
    let tokens: Vec<usize> = (0..12 * 64).map(|i| (i * 37 + i / 5) % 98 % 40).collect();
    check::<T>(gpu, table, Some(&tokens), (tokens.len(), 0), seed);
    check::<T>(gpu, Table { num_embeddings: 64, dim: 128 }, None, (12 * 64, 64), seed + 3);
    // A table longer than the sequence (rows past t get nothing), one
    // column, one token, and an id repeated many times.
    check::<T>(gpu, Table { num_embeddings: 9, dim: 3 }, None, (5 * 7, 7), seed + 6);
    check::<T>(gpu, Table { num_embeddings: 5, dim: 1 }, Some(&[4, 0, 4, 2, 4]), (5, 0), seed + 9);
    check::<T>(gpu, Table { num_embeddings: 300, dim: 5 }, Some(&[299]), (1, 0), seed + 12);
    check::<T>(gpu, Table { num_embeddings: 3, dim: 7 }, Some(&[1; 200]), (200, 0), seed + 15);
    // Backward reads the ids 256 at a time: two whole tiles and a part, with
    // 333 gradient elements, so the second block's last threads own none
    // and only help load the tiles.
    let ids: Vec<usize> = (0..513).map(|i| (i * 5 + i / 7) % 37).collect();
    check::<T>(gpu, Table { num_embeddings: 37, dim: 9 }, Some(&ids), (ids.len(), 0), seed + 18);
    // Every width and every token count 1..64, ids with repeats.
    for k in 1..=64 {
        let ids: Vec<usize> = (0..k).map(|i| (i * 7 + k) % 11).collect();
        check::<T>(gpu, Table { num_embeddings: 11, dim: k }, Some(&ids), (k, 0), seed + 100 + k as u64);
        check::<T>(gpu, Table { num_embeddings: 64, dim: 3 }, None, (2 * k, k), seed + 200 + k as u64);
    }
}

#[test]
fn embedding_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("embedding_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 700);
}

#[test]
fn embedding_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("embedding_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 800);
}

#[test]
fn embedding_bad_ids_give_nan_rows_and_no_gradient() {
    let Some(gpu) = crate::cuda::test_gpu("embedding_bad_ids_give_nan_rows_and_no_gradient") else { return };
    let table = Table { num_embeddings: 4, dim: 2 };
    let ids = upload::<f32>(&gpu, &[1.0, 4.0, 1.5, -1.0, 3.0]);
    let idv = ids.as_view();
    let w = upload::<f32>(&gpu, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let mut y = poisoned::<f32>(&gpu, 10);
    forward(&gpu, Lookup::Tokens(&idv), &w.as_view(), table, &mut y.as_view_mut()).unwrap();
    let y = download(&gpu, &y);
    assert_eq!(&y[..2], &[2.0, 3.0]);
    assert!(y[2..8].iter().all(|v| v.is_nan()), "{y:?}");
    assert_eq!(&y[8..], &[6.0, 7.0]);
    let dy = upload::<f32>(&gpu, &[1.0; 10]);
    let mut dw = upload::<f32>(&gpu, &[0.0; 8]);
    backward(&gpu, Lookup::Tokens(&idv), &dy.as_view(), table, &mut dw.as_view_mut()).unwrap();
    assert_eq!(download(&gpu, &dw), vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
    let e = forward(&gpu, Lookup::Positions { rows: 10, t: 5 }, &w.as_view(), table, &mut dw.as_view_mut())
        .unwrap_err()
        .to_string();
    assert!(e.contains("10 rows of sequences of 5 positions do not fit a table of 4 rows"), "{e}");
}
