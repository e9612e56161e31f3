//! The machine's own f32 FMA peak, for `scripts/bench.sh`: each of THREADS
//! threads runs independent chains of 16-wide (AVX-512) or 8-wide (AVX2)
//! fused multiply-adds from registers for about a second; prints GFLOP/s
//! (one FMA = 2 FLOP) and the vector width used.
//!
//!   cargo run --release --example fma_peak -- 2

use std::time::{Duration, Instant};

/// Independent accumulators per thread: enough to cover FMA latency times
/// the number of FMA pipes on current x86 cores (4 cycles x 2 pipes).
const CHAINS: usize = 12;
/// FMAs per chain between clock reads.
const ROUNDS: u64 = 1 << 16;

fn main() {
    let threads: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: fma_peak [THREADS > 0]");
            std::process::exit(2);
        }
    };
    let (lanes, label) = widest();
    if lanes == 0 {
        eprintln!("fma_peak: this CPU has neither AVX-512F nor AVX2+FMA");
        std::process::exit(1);
    }
    let run_for = Duration::from_millis(1000);
    let start = Instant::now();
    let counts: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(move || spin(lanes, run_for))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let fmas: u64 = counts.iter().sum();
    let flops = fmas as f64 * CHAINS as f64 * lanes as f64 * 2.0;
    println!("{:.1} GFLOP/s {label} x {threads} threads", flops / secs / 1e9);
}

/// Vector width in f32 lanes and its name, or 0 without FMA vectors.
fn widest() -> (usize, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return (16, "avx512");
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return (8, "avx2");
        }
    }
    (0, "none")
}

/// FMA rounds done (per chain) in about `run_for`.
fn spin(lanes: usize, run_for: Duration) -> u64 {
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < run_for {
        // SAFETY: `widest` checked the CPU has the features each kernel needs.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            if lanes == 16 {
                chains_avx512(ROUNDS);
            } else {
                chains_avx2(ROUNDS);
            }
        }
        rounds += ROUNDS;
    }
    rounds
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512(rounds: u64) {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    // Keeps the chains from being optimized away.
    std::hint::black_box(acc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2(rounds: u64) {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    std::hint::black_box(acc);
}
