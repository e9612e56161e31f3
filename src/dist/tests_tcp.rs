use super::rendezvous::{join, serve, RendezvousOpts};
use super::tcp::RING_MIN_BYTES;
use super::{Buffer, Communicator, ReduceOp, TcpCommunicator};
use half::f16;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A connected job of `world` ranks on loopback, in rank order.
pub(super) fn group(world: usize, timeout_ms: u64) -> Vec<TcpCommunicator> {
    let o = RendezvousOpts {
        fingerprint: "fp".into(),
        config: serde_json::Value::Null,
        job_token: Some("tok".into()),
        timeout: Duration::from_millis(timeout_ms),
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let mut hs = Vec::new();
    {
        let o = o.clone();
        hs.push(std::thread::spawn(move || TcpCommunicator::connect(serve(l, world, &o)?, o.timeout)));
    }
    for r in 1..world {
        let (o, ep) = (o.clone(), ep.clone());
        hs.push(std::thread::spawn(move || TcpCommunicator::connect(join(&ep, r, world, &o)?, o.timeout)));
    }
    hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
}

/// Runs `f` on every rank at once; results in rank order.
pub(super) fn on_all<T: Send>(comms: &[TcpCommunicator], f: impl Fn(&TcpCommunicator) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn x(r: usize, i: usize) -> f32 {
    ((r * 7919 + i * 104_729) % 1000) as f32 / 997.0 - 0.5
}

fn input(r: usize, n: usize, f16_: bool) -> Buffer {
    let v: Vec<f32> = (0..n).map(|i| x(r, i)).collect();
    if f16_ {
        Buffer::F16(v.into_iter().map(f16::from_f32).collect())
    } else {
        Buffer::F32(v)
    }
}

fn bits(b: &Buffer) -> Vec<u32> {
    match b {
        Buffer::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        Buffer::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
    }
}

#[test]
fn all_reduce_small_and_ring_f32_f16_sum_avg_bitwise_equal_across_ranks() {
    for world in [2, 3] {
        let comms = group(world, 5000);
        let f32_ring = RING_MIN_BYTES / 4 + 1;
        let f16_ring = RING_MIN_BYTES / 2 + 2;
        let cases = [
            (0, false),
            (1, false),
            (2, false),
            (7, true),
            (1000, false),
            (f32_ring, false),
            (100_001, false),
            (f16_ring, true),
            (1001, true),
        ];
        for (n, half) in cases {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let outs = on_all(&comms, |c| c.all_reduce(input(c.rank(), n, half), op, "t").unwrap());
                for o in &outs {
                    assert_eq!(bits(o), bits(&outs[0]), "world {world} n {n} half {half}: ranks disagree");
                    assert_eq!((o.len(), o.dtype()), (n, input(0, 0, half).dtype()));
                }
                let got = outs[0].to_f32();
                for (i, g) in got.iter().enumerate() {
                    let sum: f64 = (0..world).map(|r| f64::from(input(r, n, half).to_f32()[i])).sum();
                    let want = if op == ReduceOp::Avg { sum / world as f64 } else { sum };
                    let tol = if half { 2e-3 * want.abs().max(1.0) } else { 1e-5 };
                    assert!(
                        (f64::from(*g) - want).abs() <= tol,
                        "world {world} n {n} half {half} {op:?} [{i}]: {g} vs {want}"
                    );
                    if i > 300 {
                        break;
                    }
                }
            }
        }
    }
}

#[test]
fn f16_all_reduce_rounds_to_f16_at_every_hop_like_nccl() {
    // Each hop adds in f32 and rounds to f16. 2048 + 1 = 2049 is a tie between
    // f16 neighbours 2048 and 2050 and rounds to even (2048), so where the 2048
    // comes first the 1s are lost; where both 1s are added first, 2 + 2048 = 2050.
    let comms = group(3, 5000);
    let val = |r: usize| if r == 0 { 2048.0f32 } else { 1.0 };
    let chain = |order: &mut dyn Iterator<Item = usize>| {
        order.fold(None, |acc: Option<f32>, r| {
            Some(acc.map_or(val(r), |a| f16::from_f32(a + val(r)).to_f32()))
        })
    };
    for n in [5, RING_MIN_BYTES] {
        let outs = on_all(&comms, |c| {
            c.all_reduce(Buffer::F16(vec![f16::from_f32(val(c.rank())); n]), ReduceOp::Sum, "t").unwrap()
        });
        let got = outs[0].to_f32();
        for (i, g) in got.iter().enumerate() {
            // Small buffers sum in rank order; the ring sums chunk c starting at rank c.
            let start = if n * 2 > RING_MIN_BYTES {
                (i * 3 / n..3).find(|&c| i < (c + 1) * n / 3).unwrap()
            } else {
                0
            };
            let want = chain(&mut (0..3).map(|k| (start + k) % 3)).unwrap();
            assert_eq!(*g, want, "n {n} [{i}]");
        }
        assert!(got.contains(&2048.0), "n {n}: the tie rounded to even somewhere");
        if n > 5 {
            assert!(got.contains(&2050.0), "ring: chunk 1 adds both 1s first");
        }
        for o in &outs {
            assert_eq!(bits(o), bits(&outs[0]));
        }
    }
}

#[test]
fn broadcast_all_gather_and_barrier() {
    let comms = group(3, 5000);
    for half in [false, true] {
        for n in [0, 5, 50_001] {
            for root in 0..3 {
                let outs = on_all(&comms, |c| c.broadcast(input(c.rank(), n, half), root, "b").unwrap());
                assert!(outs.iter().all(|o| *o == input(root, n, half)), "root {root} n {n}");
            }
            let outs = on_all(&comms, |c| c.all_gather(input(c.rank(), n, half), "g").unwrap());
            let want: Vec<f32> = (0..3).flat_map(|r| input(r, n, half).to_f32()).collect();
            assert!(outs.iter().all(|o| o.to_f32() == want && o.dtype() == input(0, 0, half).dtype()));
        }
    }
    let m = comms[0].broadcast(Buffer::F32(vec![1.0]), 3, "b").unwrap_err().to_string();
    assert!(m.contains("broadcast root 3 is not a rank of a world of 3"), "{m}");
    // The barrier holds everyone until the last rank arrives.
    let waited = on_all(&comms, |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let t = Instant::now();
        c.barrier("sync").unwrap();
        t.elapsed()
    });
    assert!(waited[0] >= Duration::from_millis(250) && waited[1] >= Duration::from_millis(250), "{waited:?}");
}

#[test]
fn async_all_reduce_completes_while_the_caller_computes() {
    let comms = group(2, 10_000);
    let runs = on_all(&comms, |c| {
        let h = c.all_reduce_async(
            Buffer::F32(vec![c.rank() as f32 + 1.0; 2_000_000]),
            ReduceOp::Sum,
            "bucket 0",
        );
        let t0 = Instant::now();
        let (mut spins, mut acc) = (0u64, 0f64);
        // The caller never waits: the result can only arrive if the communication thread did the work.
        while !h.is_completed() {
            acc += (spins as f64).sqrt();
            spins += 1;
            assert!(t0.elapsed() < Duration::from_secs(30), "all_reduce never completed in the background");
        }
        let compute_end = Instant::now();
        let timing = h.timing();
        let out = h.wait().unwrap().into_f32().unwrap();
        (spins, acc, timing, compute_end, out)
    });
    for (spins, _, timing, compute_end, out) in runs {
        assert!(spins > 0);
        assert!(timing.started.unwrap() < compute_end && timing.finished.unwrap() <= compute_end);
        assert!(out.iter().all(|&v| v == 3.0));
    }
}

#[test]
fn operations_complete_in_issue_order() {
    let comms = group(3, 5000);
    on_all(&comms, |c| {
        let a = c.all_reduce_async(Buffer::F32(vec![1.0; 200_000]), ReduceOp::Avg, "a");
        let b = c.all_gather_async(Buffer::F16(vec![f16::from_f32(c.rank() as f32)]), "b");
        let z = c.barrier_async("c");
        z.wait().unwrap();
        let (ta, tb) = (a.timing(), b.timing());
        assert!(ta.finished.unwrap() <= tb.started.unwrap());
        assert_eq!(b.wait().unwrap().to_f32(), vec![0.0, 1.0, 2.0]);
        assert!(a.wait().unwrap().to_f32().iter().all(|&v| v == 1.0));
    });
}

#[test]
fn mismatched_collectives_are_errors_on_every_rank() {
    let comms = group(2, 3000);
    let errs = on_all(&comms, |c| {
        let n = if c.rank() == 0 { 10 } else { 12 };
        c.all_reduce(Buffer::F32(vec![1.0; n]), ReduceOp::Sum, "grads").unwrap_err().to_string()
    });
    for (r, m) in errs.iter().enumerate() {
        let other = 1 - r;
        assert!(
            m.contains(&format!("rank {other} is out of step with rank {r} in all_reduce #1 (grads)")),
            "{m}"
        );
        assert!(m.contains("every rank must issue the same collectives"), "{m}");
    }
    let comms = group(2, 3000);
    let errs = on_all(&comms, |c| {
        let b = Buffer::F32(vec![1.0; 4]);
        if c.rank() == 0 { c.all_gather(b, "") } else { c.all_reduce(b, ReduceOp::Sum, "") }
            .unwrap_err()
            .to_string()
    });
    assert!(errs[1].contains("it sent all_gather #1"), "{}", errs[1]);
    assert!(errs[0].contains("it sent all_reduce #1"), "{}", errs[0]);
}

#[test]
fn a_lost_peer_fails_the_others_naming_it() {
    let mut comms = group(3, 5000);
    on_all(&comms, |c| c.barrier("").unwrap());
    drop(comms.pop());
    let t = Instant::now();
    let errs = on_all(&comms, |c| {
        c.all_reduce(Buffer::F32(vec![1.0; 50_000]), ReduceOp::Sum, "bucket 3").unwrap_err().to_string()
    });
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    for m in &errs {
        assert!(m.contains("rank 2 lost during all_reduce #2 (bucket 3)"), "{m}");
    }
    // The communicator stays failed, and says why.
    let m = comms[0].barrier("after").unwrap_err().to_string();
    assert!(
        m.contains("barrier #3 (after) not run, an earlier collective failed") && m.contains("rank 2 lost"),
        "{m}"
    );
}

#[test]
fn a_silent_peer_times_out_naming_it() {
    let comms = group(2, 500);
    let t = Instant::now();
    let errs = on_all(&comms, |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        // Rank 1 may still complete #1 from what rank 0 sent before giving up; its next op fails.
        let first = c.all_reduce(Buffer::F32(vec![1.0; 8]), ReduceOp::Sum, "grads");
        first.and_then(|_| c.barrier("next")).unwrap_err().to_string()
    });
    assert!(t.elapsed() < Duration::from_secs(4));
    assert!(
        errs[0]
            .contains("rank 1 lost during all_reduce #1 (grads): no progress for 0.5s (parallel.timeout_s)"),
        "{}",
        errs[0]
    );
    assert!(errs[1].contains("rank 0 aborted") || errs[1].contains("rank 0 lost"), "{}", errs[1]);
    assert!(
        errs[1].contains("rank 1 lost during all_reduce #1 (grads)") || errs[1].contains("rank 0 lost"),
        "{}",
        errs[1]
    );
}
