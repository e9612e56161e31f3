//! The tests that start jobs with `mpirun` (see the parent file's doc).

use super::*;
use ddptrain::nn::StateEntry;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::process::{Child, Output};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const LAUNCHER_VARS: [&str; 10] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
];

/// `mpirun -np <np>` as root on this one machine, its ranks on the CPU with
/// one rayon thread each (this runs on a 2-core machine); `None` (skipped)
/// without `mpirun`, which under CI=true fails the test instead.
fn mpirun(np: usize) -> Option<Command> {
    let found = Command::new("mpirun").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !found.is_ok_and(|s| s.success()) {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "mpirun not found, and CI=true forbids skipping the MPI backend's tests: install openmpi-bin \
             (scripts/test.sh does)"
        );
        println!("skipped: mpirun not found");
        return None;
    }
    let mut c = Command::new("mpirun");
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.env(HIDE_GPUS.0, HIDE_GPUS.1).env("RAYON_NUM_THREADS", "1").stdin(Stdio::null());
    c.args(["--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", &np.to_string()]);
    Some(c)
}

fn out_text(o: &Output) -> String {
    text(o)
}

fn checksums(out: &str) -> Vec<String> {
    out.lines().filter_map(|l| l.split_once("ok checksum ").map(|(_, c)| c.trim().to_string())).collect()
}

#[test]
fn collectives_agree_across_ranks_and_with_tcp() {
    let bin = ddptrain_bin();
    for (np, dtype) in [(3, "f32"), (2, "f16"), (2, "f32")] {
        let Some(mut c) = mpirun(np) else { return };
        let args = ["dist-selftest", "--dtype", dtype, "--iters", "2", "--numel", "40001"];
        let o = c.arg(&bin).args(args).args(["--backend", "mpi"]).output().unwrap();
        let t = out_text(&o);
        assert!(o.status.success(), "{t}");
        let joined = format!("joined world {np} (OpenMpi launcher, mpi backend)");
        assert_eq!(t.matches(&joined).count(), np, "{t}");
        let sums = checksums(&t);
        assert!(sums.len() == np && sums.iter().all(|s| *s == sums[0]), "{np} ranks {dtype}: {sums:?}");
        if np == 2 {
            // Two addends: each element's sum has one rounding on any transport.
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut l = Command::new(&bin);
            l.env_remove("WORLD_SIZE").env_remove("RANK").env(HIDE_GPUS.0, HIDE_GPUS.1);
            l.args(["launch", "--nproc-per-node", "2", "--master-port", &port.to_string(), "--"]).args(args);
            let o = l.output().unwrap();
            let tcp = checksums(&out_text(&o));
            assert!(tcp.len() == 2 && tcp[0] == sums[0], "{dtype}: mpi {sums:?}, tcp {tcp:?}");
        }
    }
}

#[test]
fn ranks_with_different_configs_are_refused_naming_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = small_config(dir.path());
    let Some(mut c) = mpirun(1) else { return };
    let bin = ddptrain_bin();
    let rank = |lr: &str| {
        vec![
            bin.display().to_string(),
            "--config".into(),
            cfg.display().to_string(),
            "--set".into(),
            "parallel.backend=mpi".into(),
            "--set".into(),
            format!("optimizer.lr={lr}"),
            "--set".into(),
            format!("run.out_dir={}", dir.path().join("out").display()),
        ]
    };
    // MPMD: one rank with each learning rate.
    c.args(rank("0.05")).args([":", "-np", "1"]).args(rank("0.1"));
    let o = c.output().unwrap();
    let t = out_text(&o);
    // Both ranks fail alike; the first to exit makes mpirun end the other,
    // which may not have printed its report yet.
    assert_eq!(o.status.code(), Some(2), "{t}");
    let line = t.lines().find(|l| l.contains("config differs")).unwrap_or_else(|| panic!("no report:\n{t}"));
    assert!(line.contains("config differs: rank 0 has fingerprint "), "{line}");
    assert!(line.contains("optimizer.lr"), "{line}");
    assert!(!dir.path().join("out").exists(), "a refused job wrote its out_dir");
}

const COMMON: &str = r#"
[run]
seed = 7
[data]
dataset = "synthetic"
synthetic_train_size = 1200
synthetic_test_size = 120
batch_size = 120
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
weight_decay = 5e-4
[train]
max_steps = 3
[logging]
progress = "never"
every_steps = 1
tensorboard = false
[parallel]
sync_batchnorm = true
timeout_s = 60
"#;

/// The seed ConvNet with SyncBatchNorm on the synthetic set, at `opt_level`.
fn train_config(dir: &Path, opt_level: &str) -> std::path::PathBuf {
    let seed = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
    let model = &seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()];
    write(
        dir,
        &format!("{opt_level}.toml"),
        &format!("{model}\n{COMMON}\n[amp]\nopt_level = \"{opt_level}\"\n"),
    )
}

#[derive(Clone, Copy, Debug)]
enum How {
    One,
    Launch(usize),
    Mpirun(usize),
}

/// Trains `cfg` with the global batch of 120 split over the ranks; the final
/// weights, the summary and the output. `None`: no mpirun (skipped).
fn train(
    dir: &Path,
    cfg: &Path,
    how: How,
    env: &[(&str, &str)],
) -> Option<(Vec<StateEntry>, serde_json::Value, String)> {
    let out = dir.join(format!("{how:?}-{}", env.len()));
    let bin = ddptrain_bin();
    let (mut c, world) = match how {
        How::One => (Command::new(&bin), 1),
        How::Launch(w) => {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut c = Command::new(&bin);
            c.args(["launch", "--nproc-per-node", &w.to_string(), "--master-port", &port.to_string(), "--"]);
            (c, w)
        }
        How::Mpirun(w) => {
            let mut c = mpirun(w)?;
            c.arg(&bin);
            (c, w)
        }
    };
    for v in ["RANK", "WORLD_SIZE"] {
        c.env_remove(v);
    }
    c.env(HIDE_GPUS.0, HIDE_GPUS.1).envs(env.iter().copied());
    c.arg("--config").arg(cfg);
    c.args(["--set", &format!("run.out_dir={}", out.display())]);
    c.args(["--set", &format!("data.batch_size={}", 120 / world)]);
    if let How::Mpirun(_) = how {
        c.args(["--set", "parallel.backend=mpi"]);
    }
    let o = c.current_dir(dir).output().unwrap();
    let t = out_text(&o);
    assert_eq!(o.status.code(), Some(0), "{how:?}:\n{t}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["world_size"], world, "{summary}");
    let w = ddptrain::checkpoint::load_safetensors(&out.join("model.safetensors")).unwrap();
    Some((w, summary, t))
}

#[test]
fn o0_two_and_three_ranks_equal_one_rank_and_the_tcp_backend() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = train_config(dir.path(), "O0");
    let Some((mpi2, _, _)) = train(dir.path(), &cfg, How::Mpirun(2), &[]) else { return };
    let (one, _, _) = train(dir.path(), &cfg, How::One, &[]).unwrap();
    let (mpi3, _, _) = train(dir.path(), &cfg, How::Mpirun(3), &[]).unwrap();
    let (tcp2, _, _) = train(dir.path(), &cfg, How::Launch(2), &[]).unwrap();
    let (tcp3, _, _) = train(dir.path(), &cfg, How::Launch(3), &[]).unwrap();
    let (d2, d3) = (max_abs_diff(&one, &mpi2), max_abs_diff(&one, &mpi3));
    let (t2, t3) = (max_abs_diff(&tcp2, &mpi2), max_abs_diff(&tcp3, &mpi3));
    println!(
        "max |dw| of mpi: 2 ranks vs one {d2:.3e}, 3 vs one {d3:.3e}; vs tcp: 2 ranks {t2:.3e}, 3 {t3:.3e}"
    );
    // Random labels make this training chaotic: rounding-level differences grow
    // to about 1e-5 by step 3 (as in tests/ddp.rs), so compare there.
    assert!(d2 < 1e-5 && d3 < 1e-5 && t2 < 1e-5 && t3 < 1e-5, "{d2:e} {d3:e} {t2:e} {t3:e}");
}

#[test]
fn o2_ranks_skip_the_steps_one_rank_skips_and_an_overflow_on_one_rank_skips_it_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = train_config(dir.path(), "O2");
    let Some((_, s2, _)) = train(dir.path(), &cfg, How::Mpirun(2), &[]) else { return };
    let (_, s1, _) = train(dir.path(), &cfg, How::One, &[]).unwrap();
    let (_, s3, _) = train(dir.path(), &cfg, How::Mpirun(3), &[]).unwrap();
    let key = |s: &serde_json::Value| (s["overflow_steps"].clone(), s["loss_scale"].clone());
    assert_eq!(key(&s2), key(&s1), "{s2}\n{s1}");
    assert_eq!(key(&s3), key(&s1), "{s3}\n{s1}");
    // An inf in rank 1's gradient at step 2 reaches both ranks through the f16 sum.
    let (_, s, t) = train(dir.path(), &cfg, How::Mpirun(2), &[("DDPTRAIN_INJECT_GRAD_INF", "1:2")]).unwrap();
    for r in 0..2 {
        // Rank 0 reports on stdout, the others on stderr.
        let rank = format!("[1,{r}]<");
        let skipped = t.lines().any(|l| l.starts_with(&rank) && l.contains(":step 2: gradient overflow"));
        assert!(skipped, "rank {r} did not skip step 2:\n{t}");
    }
    assert_eq!(t.matches("gradient overflow").count(), 2, "{t}");
    assert_eq!(s["overflow_steps"].as_u64(), Some(1), "{s}");
}

/// `mpirun` in flight, its output lines arriving on `lines`.
struct Running {
    child: Child,
    lines: Receiver<String>,
    seen: String,
}

impl Running {
    fn start(mut c: Command) -> Running {
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (tx, lines) = channel();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for r in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
        }
        Running { child, lines, seen: String::new() }
    }

    /// Waits (at most `limit`) until `n` lines have contained `what`.
    fn wait_for(&mut self, what: &str, n: usize, limit: Duration) {
        let until = Instant::now() + limit;
        while self.seen.matches(what).count() < n {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push_str(&(l + "\n")),
                Err(_) => panic!("not {n} lines with {what:?} within {limit:?}:\n{}", self.seen),
            }
        }
    }

    /// Waits (at most `limit`) for the exit; its code and all output.
    fn finish(mut self, limit: Duration) -> (Option<i32>, String, Duration) {
        let t = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                panic!("mpirun still running after {limit:?}:\n{}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = t.elapsed();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push_str(&(l + "\n"));
        }
        (status.code(), self.seen, took)
    }
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) with a pid this test read from its own job's output.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Three selftest ranks all-reducing in a loop with `timeout_s`; the pid of rank 2.
fn looping_job(timeout_s: &str) -> Option<(Running, i32)> {
    let mut c = mpirun(3)?;
    c.arg(ddptrain_bin()).args([
        "dist-selftest",
        "--backend",
        "mpi",
        "--iters",
        "100000",
        "--sleep-ms",
        "20",
    ]);
    c.args(["--timeout-s", timeout_s, "--numel", "30000"]);
    let mut r = Running::start(c);
    r.wait_for(" ok\n", 9, Duration::from_secs(60));
    let line = r.seen.lines().find(|l| l.contains("selftest rank 2: joined")).unwrap_or_default().to_string();
    let pid = line.rsplit("pid ").next().and_then(|p| p.trim().parse::<i32>().ok());
    Some((r, pid.unwrap_or_else(|| panic!("no pid in {line:?}"))))
}

#[test]
fn a_rank_killed_with_sigkill_ends_the_job_non_zero() {
    let Some((r, pid)) = looping_job("60") else { return };
    assert!(signal(pid, libc::SIGKILL));
    let (code, t, took) = r.finish(Duration::from_secs(30));
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}:\n{t}");
    // Well before the collectives' timeout: MPI noticed the death, not ddptrain's clock.
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{t}");
}

#[test]
fn a_stopped_rank_past_the_timeout_aborts_the_job_naming_the_operation() {
    let Some((r, pid)) = looping_job("3") else { return };
    assert!(signal(pid, libc::SIGSTOP));
    let (code, t, took) = r.finish(Duration::from_secs(40));
    // The stopped rank is MPI_Abort's to kill; continue it in case it is not.
    signal(pid, libc::SIGCONT);
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}:\n{t}");
    let line =
        t.lines().find(|l| l.contains("aborting the job (MPI_Abort)")).unwrap_or_else(|| panic!("{t}"));
    assert!(line.contains(": no progress for 3s (parallel.timeout_s)"), "{line}");
    assert!(
        ["all_reduce #", "broadcast #", "all_gather #", "barrier #"].iter().any(|op| line.contains(op)),
        "{line}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{t}");
}

/// Two ranks on `cfg` into `out` under mpirun, with Open MPI's grace between
/// the SIGTERM it sends the ranks and its SIGKILL raised from 1s to 5s.
fn two_ranks(cfg: &Path, out: &Path, extra: &[&str]) -> Option<Command> {
    let mut c = mpirun(2)?;
    c.args(["--mca", "odls_base_sigkill_timeout", "5"]).arg(ddptrain_bin()).arg("--config").arg(cfg);
    c.args(["--set", &format!("run.out_dir={}", out.display()), "--set", "parallel.backend=mpi"]).args(extra);
    Some(c)
}

/// The direct children of `pid`: the ranks mpirun started on this machine.
fn children(pid: u32) -> Vec<i32> {
    let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    list.split_whitespace().map(|p| p.parse().unwrap()).collect()
}

/// SIGTERM mid-run to mpirun (`to_ranks`: to each rank, as a scheduler
/// signalling every process of the job does): both ranks stop after the same
/// step, rank 0 checkpoints it, and resuming ends bit for bit as the
/// straight run. Returns mpirun's exit code.
fn sigterm_mid_run(to_ranks: bool) -> Option<Option<i32>> {
    let dir = tempfile::tempdir().unwrap();
    let cfg = stop_config(dir.path(), "cpu", 192, 16);
    let (a, b) = (dir.path().join("straight"), dir.path().join("stopped"));
    let (code, t, _) = Running::start(two_ranks(&cfg, &a, &[])?).finish(Duration::from_secs(120));
    assert_eq!(code, Some(0), "{t}");
    // Steps slow enough that mpirun's SIGTERM, 5s after its own, finds steps left.
    let mut r = Running::start(two_ranks(&cfg, &b, &["--debug-step-pause-ms", "700"])?);
    r.wait_for("<stdout>:step      2/16", 1, Duration::from_secs(60));
    let pid = r.child.id();
    if to_ranks {
        let ranks = children(pid);
        assert_eq!(ranks.len(), 2, "mpirun's children: {ranks:?}");
        ranks.iter().for_each(|&p| assert!(signal(p, libc::SIGTERM)));
    } else {
        assert!(signal(pid as i32, libc::SIGTERM));
    }
    let (code, t, _) = r.finish(Duration::from_secs(60));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(b.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["interrupted"], "SIGTERM", "{s}\n{t}");
    let stopped = s["steps"].as_u64().unwrap();
    assert!((2..16).contains(&stopped), "{s}");
    for rank in 0..2 {
        let line =
            format!("[1,{rank}]<stdout>:interrupted by SIGTERM after step {stopped}: checkpoint written");
        assert!(t.contains(&line), "no line {line:?}:\n{t}");
    }
    let latest = std::fs::read_link(b.join("ckpt/latest")).unwrap();
    assert_eq!(latest, Path::new(&format!("step_{stopped:08}")), "{t}");
    let (c2, t2, _) = Running::start(two_ranks(&cfg, &b, &[])?).finish(Duration::from_secs(120));
    assert_eq!(c2, Some(0), "{t2}");
    let weights = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(weights(&a) == weights(&b), "the resumed run's final weights differ from the straight run's");
    Some(code)
}

#[test]
fn sigterm_to_mpirun_stops_every_rank_after_the_same_checkpointed_step() {
    let Some(code) = sigterm_mid_run(false) else { return };
    // Open MPI 4's mpirun reports 1 for a job it was told to terminate,
    // whatever its ranks' exit codes (143 each, checked above).
    assert!(code.is_some_and(|c| c != 0), "mpirun exit {code:?}");
}

#[test]
fn sigterm_to_the_ranks_stops_them_after_the_same_step_and_mpirun_exits_143() {
    let Some(code) = sigterm_mid_run(true) else { return };
    assert_eq!(code, Some(143));
}
