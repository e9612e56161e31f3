//! GPU tests of the device reducer: kernels/ddp.cu bit for bit against the
//! CPU reducer's arithmetic, and whole steps over the seed ConvNet's
//! parameters compared with the CPU [`Reducer`] on the same gradients, at
//! world size 1 and 2 (two ranks in threads sharing one GPU over TCP), plus
//! NCCL at world size 1. Without a GPU they print "skipped".

use super::{scale, DeviceComm, DeviceReducer};
use crate::amp::{cast_model, Policy};
use crate::config::OptLevel;
use crate::cuda::testing::{poisoned, upload};
use crate::cuda::Gpu;
use crate::dist::reducer::{Reducer, ReducerOptions};
use crate::dist::rendezvous::{join, serve, RendezvousOpts};
use crate::dist::{Communicator, LocalCommunicator, TcpCommunicator};
use crate::nn::cuda::params::{DeviceParams, ParamSlot};
use crate::nn::Model;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::{DType, Tensor};
use half::f16;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

fn opts(predivide: f64, fp32: bool) -> ReducerOptions {
    // Small caps: the seed model splits into several buckets per dtype.
    ReducerOptions {
        first_bucket_mb: 0.01,
        bucket_cap_mb: 0.02,
        gradient_predivide_factor: predivide,
        allreduce_fp32: fp32,
    }
}

/// Values over several binades, some near the f16 maximum and some tiny.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut v: Vec<f32> = rand_vec_f32(n, seed).iter().map(|x| x * 3.0).collect();
    for (i, x) in v.iter_mut().enumerate() {
        match i % 7 {
            0 => *x *= 20000.0,
            1 => *x *= 1e-5,
            _ => {}
        }
    }
    v
}

#[test]
fn ddp_scale_is_the_cpu_reducers_multiply_bit_for_bit() {
    let Some(gpu) = crate::cuda::test_gpu("ddp_scale_is_the_cpu_reducers_multiply_bit_for_bit") else {
        return;
    };
    // A stream of its own, as the reducer's communication stream.
    let s = gpu.ctx().new_stream().unwrap();
    for n in [1, 37, 1001, 70_001] {
        for k in [0.5f32, 1.0 / 3.0, 2.0 / 3.0, 3.0] {
            let host = values(n, n as u64);
            let mut x = upload::<f32>(&gpu, &host);
            // Uploaded on the compute stream: s must wait for it (an event, as the reducer's hand-off).
            s.join(gpu.stream()).unwrap();
            scale::scale(&gpu, &s, &mut x, k).unwrap();
            let got: Vec<f32> = s.clone_dtoh(&x).unwrap();
            for (i, (&h, g)) in host.iter().zip(&got).enumerate() {
                assert_eq!(g.to_bits(), (h * k).to_bits(), "f32 n={n} k={k} [{i}]: {h} * {k} gave {g}");
            }
            let h16: Vec<f16> = host.iter().map(|&v| f16::from_f32(v)).collect();
            let mut x = s.clone_htod(&h16).unwrap();
            scale::scale(&gpu, &s, &mut x, k).unwrap();
            let got: Vec<f16> = s.clone_dtoh(&x).unwrap();
            for (i, (&h, g)) in h16.iter().zip(&got).enumerate() {
                let want = f16::from_f32(h.to_f32() * k);
                assert_eq!(g.to_bits(), want.to_bits(), "f16 n={n} k={k} [{i}]: {h} * {k} gave {g}");
            }
        }
    }
}

#[test]
fn widen_and_narrow_scale_round_once_as_the_cpu_reducer() {
    let Some(gpu) = crate::cuda::test_gpu("widen_and_narrow_scale_round_once_as_the_cpu_reducer") else {
        return;
    };
    let s = gpu.ctx().new_stream().unwrap();
    for n in [1, 37, 70_001] {
        let host = values(n, 100 + n as u64);
        let h16: Vec<f16> = host.iter().map(|&v| f16::from_f32(v)).collect();
        let src = s.clone_htod(&h16).unwrap();
        let mut wide = poisoned::<f32>(&gpu, n);
        s.join(gpu.stream()).unwrap();
        scale::widen_scale(&gpu, &s, &src, &mut wide, 0.5).unwrap();
        let got: Vec<f32> = s.clone_dtoh(&wide).unwrap();
        for (i, (h, g)) in h16.iter().zip(&got).enumerate() {
            assert_eq!(g.to_bits(), (h.to_f32() * 0.5).to_bits(), "widen n={n} [{i}]");
        }
        // Back with a factor that overflows the largest values: inf, as half gives.
        let src = upload::<f32>(&gpu, &host);
        let mut narrow = poisoned::<f16>(&gpu, n);
        s.join(gpu.stream()).unwrap();
        scale::narrow_scale(&gpu, &s, &src, &mut narrow, 3.5).unwrap();
        let got: Vec<f16> = s.clone_dtoh(&narrow).unwrap();
        for (i, (&h, g)) in host.iter().zip(&got).enumerate() {
            assert_eq!(g.to_bits(), f16::from_f32(h * 3.5).to_bits(), "narrow n={n} [{i}]: {h}");
        }
    }
    let src = s.alloc_zeros::<f16>(10).unwrap();
    let mut dst = s.alloc_zeros::<f32>(9).unwrap();
    let e = scale::widen_scale(&gpu, &s, &src, &mut dst, 1.0).unwrap_err().to_string();
    assert!(e.contains("ddp_widen_scale_f16: dst holds 9 elements, expected 10"), "{e}");
}

#[test]
fn ddp_fill_writes_exactly_its_view() {
    let Some(gpu) = crate::cuda::test_gpu("ddp_fill_writes_exactly_its_view") else { return };
    let s = gpu.ctx().new_stream().unwrap();
    let mut x = upload::<f16>(&gpu, &[2.0; 13]);
    s.join(gpu.stream()).unwrap();
    scale::fill(&gpu, &s, &mut x.slice_mut(0..1), f32::INFINITY).unwrap();
    let got: Vec<f16> = s.clone_dtoh(&x).unwrap();
    assert_eq!(got[0], f16::INFINITY);
    assert!(got[1..].iter().all(|&v| v == f16::from_f32(2.0)), "{got:?}");
    let mut y = poisoned::<f32>(&gpu, 1003);
    s.join(gpu.stream()).unwrap();
    scale::fill(&gpu, &s, &mut y, -1.5).unwrap();
    assert!(s.clone_dtoh(&y).unwrap().iter().all(|&v| v == -1.5));
}

/// The seed ConvNet at `level` (O2: f16 conv/linear, f32 BatchNorm), with
/// rank-specific random gradients, and its device copy.
fn model_and_params(gpu: &Gpu, level: OptLevel, seed: u64, o: &ReducerOptions) -> (Model, DeviceParams) {
    let cfg = crate::config::load(&crate::testing::repo_root().join("configs/mnist_o0.toml"), &[]).unwrap();
    let mut model = Model::new(&cfg.resolve_model().unwrap(), seed).unwrap();
    cast_model(&mut model, &Policy::for_level(level));
    for (k, p) in model.params_mut().into_iter().enumerate() {
        let g = values(p.grad.numel(), seed * 1000 + k as u64);
        p.grad.copy_from_f32(&g).unwrap();
    }
    let (first, cap) = super::bucket_bytes(o);
    let mut params = DeviceParams::new(gpu, &model, first, cap).unwrap();
    params.upload_grads(gpu, &model).unwrap();
    (model, params)
}

/// Marks every parameter ready as backward would (last layer first, a
/// layer's weight and bias together) and finishes the step.
fn device_step(gpu: &Gpu, r: &mut DeviceReducer, params: &mut DeviceParams) {
    let order: Vec<usize> = (0..params.slots.len()).rev().collect();
    for layer in order.chunks(2) {
        r.mark_ready(gpu, params, layer).unwrap();
    }
    r.finish(gpu, params).unwrap();
}

/// The CPU reducer's result for `model`'s gradients (left in `model`).
fn cpu_step(comm: Arc<dyn Communicator>, model: &mut Model, o: &ReducerOptions) -> Vec<Vec<f32>> {
    let sizes: Vec<(usize, DType)> =
        model.params().iter().map(|p| (p.grad.numel(), p.grad.dtype())).collect();
    let mut r = Reducer::new(comm, &sizes, o);
    let mut params = model.params_mut();
    for i in (0..params.len()).rev() {
        r.mark_ready(i, &params[i].grad).unwrap();
    }
    let mut grads: Vec<&mut Tensor> = params.iter_mut().map(|p| &mut p.grad).collect();
    r.finish(&mut grads).unwrap();
    grads.iter().map(|g| g.to_f32_vec()).collect()
}

/// Every parameter's `.grad` as the device holds it.
fn device_grads(gpu: &Gpu, params: &DeviceParams) -> Vec<Vec<f32>> {
    let g = |s: &ParamSlot| params.buckets[s.bucket].grads.read_f32(gpu, s.bucket_offset, s.numel).unwrap();
    params.slots.iter().map(g).collect()
}

/// Every parameter's value as the device holds it.
fn device_values(gpu: &Gpu, params: &DeviceParams) -> Vec<Vec<f32>> {
    let v = |s: &ParamSlot| params.groups[s.group].values.read_f32(gpu, s.offset, s.numel).unwrap();
    params.slots.iter().map(v).collect()
}

fn assert_bitwise(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    for (p, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{what}: param {p} [{i}]: device {a}, CPU reducer {b}");
        }
    }
}

const CASES: [(OptLevel, f64, bool); 5] = [
    (OptLevel::O0, 1.0, false),
    (OptLevel::O0, 2.0, false),
    (OptLevel::O2, 1.0, false),
    (OptLevel::O2, 2.0, false),
    (OptLevel::O2, 2.0, true),
];

#[test]
fn tcp_world_one_is_the_cpu_reducer_and_keeps_gradients_without_predivision() {
    let Some(gpu) =
        crate::cuda::test_gpu("tcp_world_one_is_the_cpu_reducer_and_keeps_gradients_without_predivision")
    else {
        return;
    };
    for (level, predivide, fp32) in CASES {
        let what = format!("{level} predivide {predivide} fp32 {fp32}");
        let o = opts(predivide, fp32);
        let (mut model, mut params) = model_and_params(&gpu, level, 3, &o);
        assert!(params.buckets.len() >= 3, "{what}: {} buckets", params.buckets.len());
        let local: Vec<Vec<f32>> = model.params().iter().map(|p| p.grad.to_f32_vec()).collect();
        let mut r =
            DeviceReducer::new(&gpu, DeviceComm::Tcp(Arc::new(LocalCommunicator)), &params, &o).unwrap();
        assert_eq!(r.last_hidden_fraction().unwrap(), None, "{what}: no step yet");
        // Two steps: the second runs on the reset state and the other set of events.
        for step in 0..2 {
            params.upload_grads(&gpu, &model).unwrap();
            device_step(&gpu, &mut r, &mut params);
            let got = device_grads(&gpu, &params);
            if predivide == 1.0 {
                assert_bitwise(&format!("{what} step {step}: unchanged"), &got, &local);
            }
            let f = r.last_hidden_fraction().unwrap().unwrap();
            assert!((0.0..=1.0).contains(&f), "{what}: hidden fraction {f}");
            if step == 1 {
                let want = cpu_step(Arc::new(LocalCommunicator), &mut model, &o);
                assert_bitwise(&what, &got, &want);
            }
        }
    }
}

/// Runs `f(rank, comm)` on both ranks of a fresh TCP pair at once.
fn on_pair<T: Send>(f: impl Fn(usize, Arc<dyn Communicator>) -> T + Sync) -> Vec<T> {
    let o = RendezvousOpts {
        fingerprint: "fp".into(),
        config: serde_json::Value::Null,
        job_token: None,
        timeout: Duration::from_secs(30),
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let o2 = o.clone();
    let h0 = std::thread::spawn(move || TcpCommunicator::connect(serve(l, 2, &o2)?, o2.timeout));
    let h1 = std::thread::spawn(move || TcpCommunicator::connect(join(&ep, 1, 2, &o)?, o.timeout));
    let comms: Vec<Arc<dyn Communicator>> =
        [h0, h1].into_iter().map(|h| Arc::new(h.join().unwrap().unwrap()) as Arc<dyn Communicator>).collect();
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c.clone()))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn tcp_two_ranks_sharing_one_gpu_match_the_cpu_reducer() {
    if crate::cuda::test_gpu("tcp_two_ranks_sharing_one_gpu_match_the_cpu_reducer").is_none() {
        return;
    }
    for (level, predivide, fp32) in CASES {
        let what = format!("{level} predivide {predivide} fp32 {fp32}");
        let o = opts(predivide, fp32);
        let out = on_pair(|rank, comm| {
            let gpu = Gpu::new(0).unwrap();
            let (mut model, mut params) = model_and_params(&gpu, level, 10 + rank as u64, &o);
            let mut r = DeviceReducer::new(&gpu, DeviceComm::Tcp(comm.clone()), &params, &o).unwrap();
            assert_eq!(r.world_size(), 2);
            device_step(&gpu, &mut r, &mut params);
            let got = device_grads(&gpu, &params);
            // Then the CPU reducer over the same pair, on the same gradients.
            let want = cpu_step(comm, &mut model, &o);
            assert_bitwise(&format!("{what} rank {rank}"), &got, &want);
            got
        });
        assert_bitwise(&format!("{what}: ranks agree"), &out[0], &out[1]);
    }
}

#[test]
fn an_inf_injected_on_one_rank_reaches_every_rank() {
    if crate::cuda::test_gpu("an_inf_injected_on_one_rank_reaches_every_rank").is_none() {
        return;
    }
    for fp32 in [false, true] {
        let o = opts(2.0, fp32);
        let out = on_pair(|rank, comm| {
            let gpu = Gpu::new(0).unwrap();
            let (_, mut params) = model_and_params(&gpu, OptLevel::O2, 20 + rank as u64, &o);
            let mut r = DeviceReducer::new(&gpu, DeviceComm::Tcp(comm), &params, &o).unwrap();
            if rank == 1 {
                r.inject_inf_next();
            }
            device_step(&gpu, &mut r, &mut params);
            let first = &params.buckets[0];
            let b0 = first.grads.read_f32(&gpu, 0, first.layout.numel).unwrap();
            let rest: Vec<Vec<f32>> = params.buckets[1..]
                .iter()
                .map(|b| b.grads.read_f32(&gpu, 0, b.layout.numel).unwrap())
                .collect();
            (b0, rest)
        });
        for (rank, (b0, rest)) in out.iter().enumerate() {
            assert!(b0[0].is_infinite(), "fp32 {fp32} rank {rank}: first element {}", b0[0]);
            assert!(
                b0[1..].iter().chain(rest.iter().flatten()).all(|v| v.is_finite()),
                "fp32 {fp32} rank {rank}"
            );
        }
    }
}

#[test]
fn tcp_collectives_for_the_trainer_sum_and_broadcast() {
    if crate::cuda::test_gpu("tcp_collectives_for_the_trainer_sum_and_broadcast").is_none() {
        return;
    }
    let o = opts(1.0, false);
    let out = on_pair(|rank, comm| {
        let gpu = Gpu::new(0).unwrap();
        let (model, mut params) = model_and_params(&gpu, OptLevel::O2, 30 + rank as u64, &o);
        let mut r = DeviceReducer::new(&gpu, DeviceComm::Tcp(comm), &params, &o).unwrap();
        let k = rank as f32 + 1.0;
        let mut x = upload::<f32>(&gpu, &[k, 2.0 * k, -k]);
        r.all_reduce_sum_f32(&gpu, &mut x.as_view_mut(), "eval totals").unwrap();
        let mut y = upload::<f32>(&gpu, &[k; 5]);
        r.broadcast_f32(&gpu, &mut y.slice_mut(1..4), "running_mean").unwrap();
        let mut z = upload::<f16>(&gpu, &[k; 3]);
        r.broadcast_f16(&gpu, &mut z.as_view_mut(), "running_var").unwrap();
        r.broadcast_from_rank0(&gpu, &mut params).unwrap();
        let values = device_values(&gpu, &params);
        let own: Vec<Vec<f32>> = model.params().iter().map(|p| p.value.to_f32_vec()).collect();
        let s = gpu.stream();
        (s.clone_dtoh(&x).unwrap(), s.clone_dtoh(&y).unwrap(), s.clone_dtoh(&z).unwrap(), values, own)
    });
    for (rank, (x, y, z, values, _)) in out.iter().enumerate() {
        assert_eq!(x, &vec![3.0, 6.0, -3.0], "rank {rank}: the sum over ranks");
        let k = rank as f32 + 1.0;
        assert_eq!(y, &vec![k, 1.0, 1.0, 1.0, k], "rank {rank}: rank 0's values, only in the view");
        assert_eq!(z, &vec![f16::ONE; 3], "rank {rank}");
        assert_eq!(values, &out[0].4, "rank {rank} holds rank 0's parameters");
    }
    assert_ne!(out[0].4, out[1].4, "the ranks started from different parameters");
}

#[test]
fn nccl_at_world_one_leaves_every_buffer_as_is() {
    let Some(gpu) = crate::cuda::test_gpu("nccl_at_world_one_leaves_every_buffer_as_is") else { return };
    if !crate::cuda::nccl::is_available() {
        crate::cuda::skip_or_fail("nccl_at_world_one_leaves_every_buffer_as_is", "libnccl not found");
        return;
    }
    for (level, _, fp32) in CASES {
        let o = opts(1.0, fp32);
        let (model, mut params) = model_and_params(&gpu, level, 40, &o);
        let local: Vec<Vec<f32>> = model.params().iter().map(|p| p.grad.to_f32_vec()).collect();
        let comm = crate::cuda::nccl::NcclComm::new(
            &gpu,
            0,
            1,
            &LocalCommunicator,
            std::time::Duration::from_secs(30),
        )
        .unwrap();
        let mut r = DeviceReducer::new(&gpu, DeviceComm::Nccl(comm), &params, &o).unwrap();
        device_step(&gpu, &mut r, &mut params);
        assert_bitwise(&format!("{level} fp32 {fp32}"), &device_grads(&gpu, &params), &local);
        let f = r.last_hidden_fraction().unwrap().unwrap();
        assert!((0.0..=1.0).contains(&f), "hidden fraction {f}");
        let host = values(1001, 41);
        let mut x = upload::<f32>(&gpu, &host);
        r.all_reduce_sum_f32(&gpu, &mut x.as_view_mut(), "eval totals").unwrap();
        r.broadcast_f32(&gpu, &mut x.as_view_mut(), "running_mean").unwrap();
        assert_eq!(gpu.stream().clone_dtoh(&x).unwrap(), host);
        r.broadcast_from_rank0(&gpu, &mut params).unwrap();
        let own: Vec<Vec<f32>> = model.params().iter().map(|p| p.value.to_f32_vec()).collect();
        assert_eq!(device_values(&gpu, &params), own, "{level}: values unchanged");
    }
}

#[test]
fn marking_a_parameter_twice_or_never_is_an_error_naming_it() {
    let Some(gpu) = crate::cuda::test_gpu("marking_a_parameter_twice_or_never_is_an_error_naming_it") else {
        return;
    };
    let o = opts(1.0, false);
    let (model, mut params) = model_and_params(&gpu, OptLevel::O0, 50, &o);
    let names: Vec<String> = model.params().iter().map(|p| p.name.clone()).collect();
    let last = names.len() - 1;
    let mut r = DeviceReducer::new(&gpu, DeviceComm::Tcp(Arc::new(LocalCommunicator)), &params, &o).unwrap();
    r.mark_ready(&gpu, &mut params, &[last]).unwrap();
    let e = r.mark_ready(&gpu, &mut params, &[last]).unwrap_err().to_string();
    assert!(e.contains(&format!("parameter {} was marked ready twice in one step", names[last])), "{e}");
    // Everything but the first parameter: its bucket is never reduced.
    let rest: Vec<usize> = (1..last).rev().collect();
    r.mark_ready(&gpu, &mut params, &rest).unwrap();
    let e = r.finish(&gpu, &mut params).unwrap_err().to_string();
    assert!(e.contains("expected to have finished reduction in the prior iteration"), "{e}");
    assert!(e.contains(&format!("parameters {} received no gradient this step", names[0])), "{e}");
    assert_eq!(r.last_hidden_fraction().unwrap(), None, "a failed step has no timings");
    // The next step starts clean.
    device_step(&gpu, &mut r, &mut params);
}

#[test]
fn a_reducer_for_other_bucket_caps_is_refused() {
    let Some(gpu) = crate::cuda::test_gpu("a_reducer_for_other_bucket_caps_is_refused") else { return };
    let (_, params) = model_and_params(&gpu, OptLevel::O0, 60, &opts(1.0, false));
    let other = ReducerOptions { bucket_cap_mb: 25.0, ..opts(1.0, false) };
    let comm = DeviceComm::Tcp(Arc::new(LocalCommunicator));
    let e = DeviceReducer::new(&gpu, comm, &params, &other).err().unwrap().to_string();
    assert!(e.contains("are not those of first_bucket_mb = 0.01 and bucket_cap_mb = 25"), "{e}");
}
