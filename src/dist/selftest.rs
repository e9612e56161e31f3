//! `ddptrain dist-selftest` (hidden): exercises the environment, rendezvous and
//! collectives through the real binary, for the multi-process tests and for
//! checking a cluster's network before a long run.

use super::{Buffer, Communicator, DistEnv, ReduceOp, RendezvousOpts};
use crate::config::{Backend, ParallelConfig};
use crate::error::{Error, Result};
use half::f16;
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct SelftestArgs {
    /// Stands in for the config fingerprint ranks must agree on.
    #[arg(long, default_value = "selftest")]
    pub fingerprint: String,
    #[arg(long, default_value_t = 10)]
    pub timeout_s: u64,
    /// Elements of the large all-reduce (the ring path when big enough).
    #[arg(long, default_value_t = 100_003)]
    pub numel: usize,
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    pub dtype: String,
    #[arg(long, default_value_t = 1)]
    pub iters: u64,
    /// Pause after each iteration.
    #[arg(long, default_value_t = 0)]
    pub sleep_ms: u64,
    /// Print the launcher variables this process sees and exit.
    #[arg(long)]
    pub print_env: bool,
    /// This rank exits at once with --exit-code; the others wait --hang-s.
    #[arg(long)]
    pub fail_rank: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub exit_code: u8,
    #[arg(long, default_value_t = 60)]
    pub hang_s: u64,
    /// The transport, as `parallel.backend` names it.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "mpi"])]
    pub backend: String,
    /// After the checks, time this many all-reduces of each --bench-numel size
    /// (rank 0 prints the median and the throughput).
    #[arg(long, default_value_t = 0)]
    pub bench_iters: usize,
    #[arg(long, value_delimiter = ',', default_value = "100003")]
    pub bench_numel: Vec<usize>,
}

const ENV_VARS: [&str; 12] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "RAYON_NUM_THREADS",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
];

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Input of rank `r`, element `i`: not integers, so summation order shows in the bits.
fn value(r: usize, i: usize) -> f32 {
    ((r + 1) * (i % 13)) as f32 * 0.1 + 0.013 * r as f32
}

fn checksum(h: &mut u64, b: &Buffer) {
    let mut mix = |bits: u64| {
        *h ^= bits;
        *h = h.wrapping_mul(0x100_0000_01b3);
    };
    match b {
        Buffer::F32(v) => v.iter().for_each(|x| mix(u64::from(x.to_bits()))),
        Buffer::F16(v) => v.iter().for_each(|x| mix(u64::from(x.to_bits()))),
    }
}

pub fn run(args: &SelftestArgs) -> Result<u8> {
    if args.print_env {
        for k in ENV_VARS {
            say(format!("{k}={}", std::env::var(k).unwrap_or_default()));
        }
        return Ok(0);
    }
    let par = ParallelConfig { timeout_s: args.timeout_s, ..ParallelConfig::default() };
    let env = DistEnv::from_process(&par)?;
    let (r, w) = (env.rank, env.world_size);
    if let Some(f) = args.fail_rank {
        if f == r {
            say(format!("selftest rank {r}: failing with exit code {}", args.exit_code));
            return Ok(args.exit_code);
        }
        say(format!("selftest rank {r}: waiting {}s", args.hang_s));
        std::thread::sleep(Duration::from_secs(args.hang_s));
        return Ok(0);
    }
    let opts = RendezvousOpts {
        fingerprint: args.fingerprint.clone(),
        // No config: the fingerprint stands in for one, and a refusal names it.
        config: serde_json::Value::Null,
        job_token: env.job_token.clone(),
        timeout: Duration::from_secs(args.timeout_s.max(1)),
    };
    let backend = if args.backend == "mpi" { Backend::Mpi } else { Backend::Tcp };
    super::check_backend(backend, &env)?;
    let comm = super::connect(&env, &opts, backend)?;
    let comm = &*comm;
    say(format!(
        "selftest rank {r}: joined world {w} ({:?} launcher, {} backend), pid {}",
        env.launcher,
        args.backend,
        std::process::id()
    ));
    let make = |rank: usize, n: usize| -> Buffer {
        let v: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
        if args.dtype == "f16" {
            Buffer::F16(v.into_iter().map(f16::from_f32).collect())
        } else {
            Buffer::F32(v)
        }
    };
    let elem = |q: usize, i: usize| -> f32 {
        if args.dtype == "f16" {
            f16::from_f32(value(q, i)).to_f32()
        } else {
            value(q, i)
        }
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for it in 0..args.iters {
        for (n, label) in [(args.numel, "large"), (7, "small")] {
            let out = comm.all_reduce(make(r, n), ReduceOp::Sum, label)?;
            let got = out.to_f32();
            for (i, g) in got.iter().enumerate() {
                let want: f32 = (0..w).map(|q| elem(q, i)).sum();
                if (g - want).abs() > 1e-2 * want.abs().max(1.0) {
                    return Err(Error::Training(format!(
                        "all_reduce ({label}) element {i}: got {g}, want {want}"
                    )));
                }
                if i > 50 {
                    break;
                }
            }
            checksum(&mut h, &out);
        }
        let b = comm.broadcast(make(r, 5), w - 1, "selftest")?;
        if b != make(w - 1, 5) {
            return Err(Error::Training(format!("broadcast from rank {}: got {b:?}", w - 1)));
        }
        let g = comm.all_gather(make(r, 3), "selftest")?.to_f32();
        let want: Vec<f32> = (0..w).flat_map(|q| make(q, 3).to_f32()).collect();
        if g != want {
            return Err(Error::Training(format!("all_gather: got {g:?}, want {want:?}")));
        }
        comm.barrier("selftest")?;
        say(format!("selftest rank {r}: iter {it} ok"));
        if args.sleep_ms > 0 {
            std::thread::sleep(Duration::from_millis(args.sleep_ms));
        }
    }
    say(format!("selftest rank {r}/{w}: ok checksum {h:016x}"));
    for &n in &args.bench_numel {
        if args.bench_iters > 0 {
            bench(comm, make(r, n), args.bench_iters)?;
        }
    }
    Ok(0)
}

/// Times `iters` all-reduces of `buf` after one warm-up; rank 0 reports the
/// median and the algorithm bandwidth (bytes of the buffer per second), as
/// nccl-tests' `algbw` does.
fn bench(comm: &dyn Communicator, buf: Buffer, iters: usize) -> Result<()> {
    let bytes = buf.len() * buf.dtype().size();
    comm.all_reduce(buf.clone(), ReduceOp::Sum, "bench")?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        comm.all_reduce(buf.clone(), ReduceOp::Sum, "bench")?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let med = times[iters / 2];
    if comm.rank() == 0 {
        say(format!(
            "bench all_reduce {} x {}: {bytes} bytes, median {:.3} ms, {:.1} MB/s over {iters} runs",
            buf.len(),
            buf.dtype().name(),
            med * 1e3,
            bytes as f64 / med / 1e6
        ));
    }
    Ok(())
}
