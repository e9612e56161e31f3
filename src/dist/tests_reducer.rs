//! The reducer on two real TCP ranks running the seed ConvNet's backward:
//! gradients come back averaged, buckets follow PyTorch's assignment (one
//! dtype per bucket, caps in bytes of that dtype), f16 gradients reduce in f16
//! (or f32 with allreduce_fp32) with apex's predivision, an inf on one rank
//! reaches both, and the first buckets' all-reduces demonstrably start while
//! backward is still running.

use super::reducer::{assign_buckets, Reducer, ReducerOptions};
use super::rendezvous::{join, serve, RendezvousOpts};
use super::{Communicator, TcpCommunicator};
use crate::nn::Model;
use crate::tensor::{DType, Tensor};
use half::f16;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

const F32: DType = DType::F32;
const F16: DType = DType::F16;

fn opts(first_mb: f64, cap_mb: f64, predivide: f64, fp32: bool) -> ReducerOptions {
    ReducerOptions {
        first_bucket_mb: first_mb,
        bucket_cap_mb: cap_mb,
        gradient_predivide_factor: predivide,
        allreduce_fp32: fp32,
    }
}

/// Runs `f(rank, comm)` on both ranks of a fresh TCP pair at once.
fn on_pair<T: Send>(f: impl Fn(usize, Arc<dyn Communicator>) -> T + Sync) -> Vec<T> {
    let comms: Vec<Arc<dyn Communicator>> =
        pair().into_iter().map(|c| Arc::new(c) as Arc<dyn Communicator>).collect();
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c.clone()))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn pair() -> Vec<TcpCommunicator> {
    let o = RendezvousOpts {
        fingerprint: "fp".into(),
        config: serde_json::Value::Null,
        job_token: None,
        timeout: Duration::from_secs(10),
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let o2 = o.clone();
    let h0 = std::thread::spawn(move || TcpCommunicator::connect(serve(l, 2, &o2)?, o2.timeout));
    let h1 = std::thread::spawn(move || TcpCommunicator::connect(join(&ep, 1, 2, &o)?, o.timeout));
    vec![h0.join().unwrap().unwrap(), h1.join().unwrap().unwrap()]
}

fn seed_model() -> Model {
    let cfg = crate::config::load(&crate::testing::repo_root().join("configs/mnist_o0.toml"), &[]).unwrap();
    Model::new(&cfg.resolve_model().unwrap(), 3).unwrap()
}

#[test]
fn buckets_follow_reverse_registration_order_and_caps() {
    // f32 (4-byte) elements; caps 40 bytes (first) and 80 bytes.
    let f32s = |n: &[usize]| n.iter().map(|&n| (n, F32)).collect::<Vec<_>>();
    let b = assign_buckets(&f32s(&[5, 5, 10, 3, 20]), 40, 80);
    let params: Vec<Vec<usize>> = b.iter().map(|b| b.params.clone()).collect();
    assert_eq!(params, vec![vec![4], vec![3, 2, 1, 0]]);
    let b = assign_buckets(&f32s(&[30, 1, 1, 1]), 8, 8);
    assert_eq!(b.iter().map(|b| b.params.clone()).collect::<Vec<_>>(), vec![vec![3, 2], vec![1, 0]]);
}

#[test]
fn buckets_never_mix_dtypes_and_count_bytes_of_their_dtype() {
    // O2-like: f16 conv/linear params interleaved with f32 BatchNorm params.
    let p = [(10, F16), (10, F32), (10, F16), (10, F32), (100, F16)];
    let b = assign_buckets(&p, 40, 80);
    let got: Vec<(Vec<usize>, DType, usize)> =
        b.iter().map(|b| (b.params.clone(), b.dtype, b.numel)).collect();
    // Each dtype has its own open bucket and its own first cap: [4] (200 B) and
    // [3] (40 B) close at their first cap; the rest stay under 80 B. Buckets are
    // ordered by when their first gradient is ready.
    assert_eq!(got, vec![(vec![4], F16, 100), (vec![3], F32, 10), (vec![2, 0], F16, 20), (vec![1], F32, 10)]);
    for bucket in &b {
        assert!(bucket.params.iter().all(|&i| p[i].1 == bucket.dtype), "{bucket:?}");
    }
    // 20 elements are 80 bytes in f32 but 40 in f16: a 60-byte first cap closes after one f32 param.
    assert_eq!(assign_buckets(&[(20, F32), (20, F32)], 60, 1 << 20).len(), 2);
    assert_eq!(assign_buckets(&[(20, F16), (20, F16)], 60, 1 << 20).len(), 1);
}

fn f16_tensor(v: &[f32]) -> Tensor {
    Tensor::from_f16_vec(&[v.len()], v.iter().map(|&x| f16::from_f32(x)).collect()).unwrap()
}

fn grads_of(t: &[Tensor]) -> Vec<Vec<f32>> {
    t.iter().map(Tensor::to_f32_vec).collect()
}

/// Both ranks reduce `[f16 a, f32 b]` (rank r's values scaled by r + 1) and return the results.
fn reduce_two(o: ReducerOptions, a: &[f32], b: &[f32], inject_on: Option<usize>) -> Vec<Vec<Vec<f32>>> {
    on_pair(|rank, comm| {
        let k = (rank + 1) as f32;
        let mut g = vec![
            f16_tensor(&a.iter().map(|x| x * k).collect::<Vec<_>>()),
            Tensor::from_vec(&[b.len()], b.iter().map(|x| x * k).collect()).unwrap(),
        ];
        let mut r = Reducer::new(comm, &[(a.len(), F16), (b.len(), F32)], &o);
        assert_eq!(r.layouts().len(), 2, "one bucket per dtype");
        let want_dtypes =
            if o.allreduce_fp32 { [super::DType::F32; 2] } else { [super::DType::F32, super::DType::F16] };
        assert_eq!(r.reduce_dtypes(), want_dtypes);
        if inject_on == Some(rank) {
            r.inject_inf_next();
        }
        r.mark_ready(1, &g[1]).unwrap();
        r.mark_ready(0, &g[0]).unwrap();
        let mut refs: Vec<&mut Tensor> = g.iter_mut().collect();
        r.finish(&mut refs).unwrap();
        assert_eq!((g[0].dtype(), g[1].dtype()), (F16, F32), "gradients keep their dtypes");
        grads_of(&g)
    })
}

#[test]
fn f16_gradients_reduce_in_f16_with_apex_predivision_or_in_f32() {
    let a: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.013 + 0.001).collect();
    let b: Vec<f32> = (0..5).map(|i| i as f32 * 0.25 - 0.5).collect();
    let h = |x: f32| f16::from_f32(x).to_f32();
    for (o, name) in
        [(opts(25.0, 25.0, 2.0, false), "f16, predivide 2"), (opts(25.0, 25.0, 1.0, true), "fp32")]
    {
        let out = reduce_two(o, &a, &b, None);
        assert_eq!(out[0], out[1], "{name}: ranks agree bitwise");
        for (i, &x) in a.iter().enumerate() {
            let (x0, x1) = (h(x), h(x * 2.0));
            let want = if o.allreduce_fp32 {
                // Widened, summed and averaged in f32, rounded once on the way back.
                h((x0 + x1) * 0.5)
            } else {
                // apex: each rank's f16 grad * 1/2 in f16, f16 sum, then * 2/2.
                h(h(x0 * 0.5) + h(x1 * 0.5))
            };
            assert_eq!(out[0][0][i].to_bits(), want.to_bits(), "{name} [{i}]: {} vs {want}", out[0][0][i]);
        }
        for (i, &x) in b.iter().enumerate() {
            assert!((out[0][1][i] - 1.5 * x).abs() <= 1e-6, "{name} f32 [{i}]");
        }
    }
}

#[test]
fn predivision_keeps_an_f16_sum_below_the_f16_maximum() {
    // Rank 0 holds 32000, rank 1 64000: the sum overflows f16 (max 65504);
    // halved first, 16000 + 32000 does not (all exact in f16).
    let a = [32000.0f32];
    let plain = reduce_two(opts(25.0, 25.0, 1.0, false), &a, &[0.0], None);
    assert!(plain[0][0][0].is_infinite() && plain[1][0][0].is_infinite(), "{plain:?}");
    let pre = reduce_two(opts(25.0, 25.0, 2.0, false), &a, &[0.0], None);
    assert_eq!(pre[0][0][0], 48000.0, "{pre:?}");
    let fp32 = reduce_two(opts(25.0, 25.0, 1.0, true), &a, &[0.0], None);
    assert_eq!(fp32[0][0][0], 48000.0, "{fp32:?}");
}

#[test]
fn an_inf_injected_on_one_rank_reaches_both() {
    let a = [0.5f32, 0.25];
    for fp32 in [false, true] {
        // Rank 1 poisons the first gradient marked ready (the f32 one, index 1).
        let out = reduce_two(opts(25.0, 25.0, 1.0, fp32), &a, &[1.0, 2.0], Some(1));
        assert_eq!(out[0], out[1]);
        assert!(out[0][1][0].is_infinite() && out[0][1][1] == 3.0, "{out:?}");
        assert_eq!(out[0][0], vec![0.75, 0.375], "other buckets are untouched");
    }
}

#[test]
fn a_gradient_of_another_dtype_than_its_bucket_is_an_error() {
    let out = on_pair(|_, comm| {
        let mut r = Reducer::new(comm, &[(2, F16)], &opts(25.0, 25.0, 1.0, false));
        r.mark_ready(0, &Tensor::zeros(&[2])).unwrap_err().to_string()
    });
    assert!(out[0].contains("parameter 0 has a F32 gradient but its bucket holds F16"), "{}", out[0]);
}

/// (local grads, averaged grads, buckets started during backward, buckets).
type RankResult = (Vec<Vec<f32>>, Vec<Vec<f32>>, usize, usize);

#[test]
fn two_ranks_average_gradients_and_overlap_backward() {
    let comms: Vec<Arc<dyn Communicator>> =
        pair().into_iter().map(|c| Arc::new(c) as Arc<dyn Communicator>).collect();
    let results: Vec<RankResult> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let comm = comm.clone();
                s.spawn(move || {
                    let mut model = seed_model();
                    let sizes: Vec<(usize, DType)> =
                        model.params().iter().map(|p| (p.value.numel(), p.grad.dtype())).collect();
                    // Tiny caps: one bucket per parameter, launched as each layer finishes.
                    let mut reducer = Reducer::new(comm, &sizes, &opts(1e-6, 1e-6, 1.0, false));
                    let n = 16;
                    let x: Vec<f32> =
                        (0..n * 784).map(|i| ((i * 31 + rank * 7) % 97) as f32 / 97.0 - 0.5).collect();
                    let labels: Vec<u32> = (0..n as u32).map(|i| (i + rank as u32) % 10).collect();
                    let (logits, saved) =
                        model.forward_train(Tensor::from_vec(&[n, 1, 28, 28], x).unwrap()).unwrap();
                    let out = crate::ops::cross_entropy::forward_backward(&logits, &labels, 1.0).unwrap();
                    model.backward_hooked(saved, out.dlogits, &mut |i, g| reducer.mark_ready(i, g)).unwrap();
                    let local: Vec<Vec<f32>> =
                        model.params().iter().map(|p| p.grad.as_f32().unwrap().to_vec()).collect();
                    let mut params = model.params_mut();
                    let mut grads: Vec<&mut Tensor> = params.iter_mut().map(|p| &mut p.grad).collect();
                    reducer.finish(&mut grads).unwrap();
                    let averaged: Vec<Vec<f32>> = grads.iter().map(|g| g.to_f32_vec()).collect();
                    let o = reducer.last_overlap();
                    (local, averaged, o.submitted_during_backward(), o.buckets.len())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (l0, a0, early0, buckets) = &results[0];
    let (l1, a1, _, _) = &results[1];
    assert_eq!(a0, a1, "every rank holds the same averaged gradients");
    for (p, ((g0, g1), avg)) in l0.iter().zip(l1).zip(a0).enumerate() {
        for ((x, y), a) in g0.iter().zip(g1).zip(avg) {
            assert!(((x + y) / 2.0 - a).abs() <= 1e-6 * (1.0 + a.abs()), "param {p}: ({x} + {y}) / 2 != {a}");
        }
    }
    assert_eq!(*buckets, 10, "one bucket per parameter");
    // fc's buckets are submitted as soon as fc's backward is done, before the
    // two conv blocks' backward even begins; every bucket but the last one
    // (conv1's bias, produced last) is in flight before backward ends. When
    // the communication thread runs them is the scheduler's business on a
    // shared machine, so the count is of submissions.
    assert_eq!(*early0, 10, "only {early0} of {buckets} all-reduces were submitted before backward ended");
}

#[test]
fn the_stop_and_save_vote_rides_the_last_bucket_unscaled_and_reaches_every_rank() {
    use crate::train::stop::{Agreed, StopSignal, Vote};
    // The last bucket is the f16 one (reduced in f16, or in f32 with
    // allreduce_fp32), predivided by 2: the votes must come back as cast, not scaled.
    for fp32 in [false, true] {
        let out = on_pair(|rank, comm| {
            let mut r = Reducer::new(comm, &[(2, F16), (1, F32)], &opts(25.0, 25.0, 2.0, fp32));
            let mut agreed = Vec::new();
            // Step 1: rank 1 caught SIGTERM; step 2: rank 0 caught SIGINT;
            // step 3: nobody; step 4: rank 0's clock calls for a save; step 5:
            // a save and rank 1's SIGINT together.
            for step in 1..=5 {
                let mine = match (step, rank) {
                    (1, 1) => Vote { stop: Some(StopSignal::Term), save: false },
                    (2, 0) => Vote { stop: Some(StopSignal::Int), save: false },
                    (4, 0) | (5, 0) => Vote { stop: None, save: true },
                    (5, 1) => Vote { stop: Some(StopSignal::Int), save: false },
                    _ => Vote::default(),
                };
                r.set_vote(mine.elements());
                let k = (rank + 1) as f32;
                let mut g = vec![f16_tensor(&[0.5 * k, 0.25 * k]), Tensor::from_vec(&[1], vec![k]).unwrap()];
                r.mark_ready(1, &g[1]).unwrap();
                r.mark_ready(0, &g[0]).unwrap();
                let mut refs: Vec<&mut Tensor> = g.iter_mut().collect();
                r.finish(&mut refs).unwrap();
                assert_eq!(
                    grads_of(&g),
                    vec![vec![0.75, 0.375], vec![1.5]],
                    "the vote leaves the gradients alone"
                );
                agreed.push(Agreed::from_sum(r.agreed_vote()));
            }
            agreed
        });
        let (term, int) = (Some(StopSignal::Term), Some(StopSignal::Int));
        assert_eq!(
            out[0],
            vec![
                Agreed { stop: term, save: false },
                Agreed { stop: int, save: false },
                Agreed::default(),
                Agreed { stop: None, save: true },
                Agreed { stop: int, save: true },
            ],
            "fp32 {fp32}"
        );
        assert_eq!(out[0], out[1]);
    }
}
