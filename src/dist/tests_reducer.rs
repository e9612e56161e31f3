//! The reducer on two real TCP ranks running the seed ConvNet's backward:
//! gradients come back averaged, buckets follow PyTorch's assignment, and the
//! first buckets' all-reduces demonstrably start while backward is still running.

use super::reducer::{assign_buckets, Reducer};
use super::rendezvous::{join, serve, RendezvousOpts};
use super::{Communicator, TcpCommunicator};
use crate::nn::Model;
use crate::tensor::Tensor;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

fn pair() -> Vec<TcpCommunicator> {
    let o = RendezvousOpts { fingerprint: "fp".into(), job_token: None, timeout: Duration::from_secs(10) };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let o2 = o.clone();
    let h0 = std::thread::spawn(move || TcpCommunicator::connect(serve(l, 2, &o2)?, o2.timeout));
    let h1 = std::thread::spawn(move || TcpCommunicator::connect(join(&ep, 1, 2, &o)?, o.timeout));
    vec![h0.join().unwrap().unwrap(), h1.join().unwrap().unwrap()]
}

fn seed_model() -> Model {
    let cfg = crate::config::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/mnist_o0.toml"),
        &[],
    )
    .unwrap();
    Model::new(&cfg.resolve_model().unwrap(), 3).unwrap()
}

#[test]
fn buckets_follow_reverse_registration_order_and_caps() {
    // 4-byte elements; caps 40 bytes (first) and 80 bytes.
    let b = assign_buckets(&[5, 5, 10, 3, 20], 4, 40, 80);
    let params: Vec<Vec<usize>> = b.iter().map(|b| b.params.clone()).collect();
    assert_eq!(params, vec![vec![4], vec![3, 2, 1, 0]]);
    let b = assign_buckets(&[30, 1, 1, 1], 4, 8, 8);
    assert_eq!(b.iter().map(|b| b.params.clone()).collect::<Vec<_>>(), vec![vec![3, 2], vec![1, 0]]);
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
                    let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
                    // Tiny caps: one bucket per parameter, launched as each layer finishes.
                    let mut reducer = Reducer::new(comm, &sizes, 1e-6, 1e-6, 1.0);
                    let n = 16;
                    let x: Vec<f32> =
                        (0..n * 784).map(|i| ((i * 31 + rank * 7) % 97) as f32 / 97.0 - 0.5).collect();
                    let labels: Vec<u32> = (0..n as u32).map(|i| (i + rank as u32) % 10).collect();
                    let (logits, saved) =
                        model.forward_train(Tensor::from_vec(&[n, 1, 28, 28], x).unwrap()).unwrap();
                    let out = crate::ops::cross_entropy::forward_backward(&logits, &labels, 1.0).unwrap();
                    model
                        .backward_hooked(saved, out.dlogits, &mut |i, g| reducer.mark_ready(i, g.as_f32()?))
                        .unwrap();
                    let local: Vec<Vec<f32>> =
                        model.params().iter().map(|p| p.grad.as_f32().unwrap().to_vec()).collect();
                    let mut params = model.params_mut();
                    let mut grads: Vec<&mut [f32]> =
                        params.iter_mut().map(|p| p.grad.as_f32_mut().unwrap()).collect();
                    reducer.finish(&mut grads).unwrap();
                    let averaged: Vec<Vec<f32>> = grads.iter().map(|g| g.to_vec()).collect();
                    let o = reducer.last_overlap();
                    (local, averaged, o.started_during_backward(), o.buckets.len())
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
    // fc's buckets are launched as soon as fc's backward is done, before the
    // two conv blocks' backward (milliseconds of work) even begins.
    assert!(*early0 >= 2, "only {early0} of {buckets} all-reduces started before backward ended");
}
