//! The distributed layer through the real binary: several `ddptrain` processes on
//! loopback, started by hand (torchrun's variables), by `ddptrain launch`, and by
//! Open MPI's `mpirun`. Each test uses its own free port and short timeouts.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ddptrain");
const LAUNCHER_VARS: [&str; 16] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "DDPTRAIN_JOB_TOKEN",
    "OMP_NUM_THREADS",
    "RAYON_NUM_THREADS",
];

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn ddptrain() -> Command {
    let mut c = Command::new(BIN);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    // These tests check the CPU trainer's processes, even where a (possibly
    // emulated) GPU is visible.
    c.env("CUDA_VISIBLE_DEVICES", "");
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn rank(r: usize, world: usize, port: u16, args: &[&str]) -> Command {
    let mut c = ddptrain();
    c.arg("dist-selftest").args(args);
    c.env("RANK", r.to_string()).env("WORLD_SIZE", world.to_string()).env("MASTER_PORT", port.to_string());
    c
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn checksum(stdout: &str) -> &str {
    let i = stdout.find("ok checksum ").unwrap_or_else(|| panic!("no checksum in: {stdout}"));
    &stdout[i + 12..i + 28]
}

/// Collects a child's stdout lines as they come, so a test can wait for one.
fn tail(child: &mut Child) -> Arc<Mutex<String>> {
    let seen = Arc::new(Mutex::new(String::new()));
    let (out, s) = (child.stdout.take().unwrap(), seen.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            s.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    seen
}

fn wait_for(seen: &Arc<Mutex<String>>, what: &str, within: Duration) {
    let t = Instant::now();
    while !seen.lock().unwrap().contains(what) {
        assert!(t.elapsed() < within, "never saw `{what}` in: {}", seen.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    child.stderr.take().unwrap().read_to_string(&mut s).unwrap();
    s
}

#[test]
fn three_processes_rendezvous_and_agree_bitwise() {
    for (world, dtype) in [(3, "f32"), (2, "f16")] {
        let port = free_port();
        let kids: Vec<Child> = (0..world)
            .map(|r| {
                rank(r, world, port, &["--dtype", dtype, "--iters", "2", "--numel", "40001"]).spawn().unwrap()
            })
            .collect();
        let outs: Vec<Output> = kids.into_iter().map(|k| k.wait_with_output().unwrap()).collect();
        for o in &outs {
            assert!(o.status.success(), "{:?}", text(o));
        }
        let sums: Vec<String> = outs.iter().map(|o| checksum(&text(o).0).to_string()).collect();
        assert!(sums.iter().all(|s| *s == sums[0]), "{sums:?}");
    }
}

#[test]
fn a_killed_rank_makes_the_others_fail_naming_it() {
    let port = free_port();
    let mut kids: Vec<Child> = (0..3)
        .map(|r| {
            rank(
                r,
                3,
                port,
                &["--iters", "100000", "--sleep-ms", "20", "--timeout-s", "3", "--numel", "30000"],
            )
            .spawn()
            .unwrap()
        })
        .collect();
    let seen: Vec<_> = kids.iter_mut().map(tail).collect();
    for s in &seen {
        wait_for(s, "iter 2 ok", Duration::from_secs(20));
    }
    kids[2].kill().unwrap();
    kids[2].wait().unwrap();
    let t = Instant::now();
    for k in kids.iter_mut().take(2) {
        let err = stderr_of(k);
        let status = k.wait().unwrap();
        assert!(!status.success());
        assert!(err.contains("rank 2 lost during "), "{err}");
    }
    assert!(t.elapsed() < Duration::from_secs(3 + 3), "took {:?}", t.elapsed());
}

#[test]
fn config_mismatch_is_refused_on_both_sides() {
    let port = free_port();
    let a = rank(0, 2, port, &["--fingerprint", "aaa111"]).spawn().unwrap();
    let b = rank(1, 2, port, &["--fingerprint", "bbb222"]).spawn().unwrap();
    for o in [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()] {
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("config differs: rank 0 has fingerprint aaa111, rank 1")
                && err.contains("has bbb222"),
            "{err}"
        );
    }
}

#[test]
fn a_rank_without_the_job_token_is_turned_away() {
    let port = free_port();
    let a = rank(0, 2, port, &["--timeout-s", "2"]).env("DDPTRAIN_JOB_TOKEN", "s3cret").spawn().unwrap();
    let b = rank(1, 2, port, &["--timeout-s", "5"]).spawn().unwrap();
    let (ob, oa) = (b.wait_with_output().unwrap(), a.wait_with_output().unwrap());
    let (eb, ea) = (text(&ob).1, text(&oa).1);
    assert!(!ob.status.success() && eb.contains("rank 0 refused rank 1: it presented no job token"), "{eb}");
    assert!(!oa.status.success() && ea.contains("refused a connection from 127.0.0.1:"), "{ea}");
    assert!(ea.contains("ranks [1] of WORLD_SIZE=2 did not join within 2s"), "{ea}");
}

#[test]
fn junk_on_the_master_port_neither_crashes_nor_hangs_rank_zero() {
    let port = free_port();
    let a = rank(0, 2, port, &["--timeout-s", "10"]).spawn().unwrap();
    let t = Instant::now();
    let mut junk = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if t.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    junk.write_all(&[0xff; 64]).unwrap();
    // Rank 0 closes the junk connection once it has turned it away (and said
    // so): wait for that before rank 1 exists. Otherwise, on a loaded machine,
    // the job could form before the junk's handshake thread reports, and the
    // rendezvous ends without reading its report.
    junk.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let closed = junk.read(&mut [0u8; 1]);
    assert!(
        !matches!(&closed, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut),
        "rank 0 held the junk connection for 10 s: {closed:?}"
    );
    // A silent one is held open while the real rank joins.
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let b = rank(1, 2, port, &[]).spawn().unwrap();
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(oa.status.success() && ob.status.success(), "{:?} {:?}", text(&oa), text(&ob));
    let ea = text(&oa).1;
    assert!(
        ea.contains("ignored a connection from 127.0.0.1:") && ea.contains("more than the 1048576 allowed"),
        "{ea}"
    );
    assert_eq!(checksum(&text(&oa).0), checksum(&text(&ob).0));
}

#[test]
fn a_flood_of_junk_on_the_master_port_logs_a_few_lines_and_the_job_still_forms() {
    let port = free_port();
    let mut a = rank(0, 2, port, &["--timeout-s", "60"]).spawn().unwrap();
    // Read as it comes, as `launch` does, so a long log cannot block rank 0 on a full pipe.
    let mut err0 = a.stderr.take().unwrap();
    let err0 = std::thread::spawn(move || {
        let mut s = String::new();
        err0.read_to_string(&mut s).unwrap();
        s
    });
    let t = Instant::now();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut first = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if t.elapsed() < Duration::from_secs(20) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    drop(first.write_all(b"junk"));
    // 1,000 strangers of three kinds: random bytes, an immediate close, and half
    // a handshake (a frame promising 100 bytes, then its first 4), 200 of them held open.
    let mut held = Vec::new();
    for i in 0..1000 {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("rank 0 stopped taking connections at junk connection {i}: {e}"));
        match i % 3 {
            0 => drop(s.write_all(&rand::random::<[u8; 64]>())),
            1 => {}
            _ => {
                drop(s.write_all(b"\0\0\0\x64DDPT"));
                if held.len() < 200 {
                    held.push(s);
                }
            }
        }
    }
    assert!(t.elapsed() < Duration::from_secs(40), "the flood took {:?}", t.elapsed());
    let b = rank(1, 2, port, &[]).spawn().unwrap();
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(oa.status.success() && ob.status.success(), "{:?} {:?}", text(&oa), text(&ob));
    assert_eq!(checksum(&text(&oa).0), checksum(&text(&ob).0));
    let ea = err0.join().unwrap();
    let lines: Vec<&str> = ea.lines().filter(|l| l.contains("rendezvous (rank 0)")).collect();
    assert!(lines.len() <= 5, "{} lines about strangers:\n{ea}", lines.len());
    assert!(lines[0].contains("ignored a connection from 127.0.0.1:"), "{ea}");
    let summary = lines.last().unwrap();
    let n: u64 = summary
        .split("... ")
        .nth(1)
        .and_then(|r| r.strip_suffix(" more junk connections ignored"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary line: {ea}"));
    // Strangers are counted, not just dropped (the held ones are still pending,
    // and a few may still be in flight when the real rank gets in).
    assert!(n >= 500, "{summary}");
    drop(held);
}

fn launch(args: &[&str]) -> Command {
    let mut c = ddptrain();
    c.arg("launch").args(args);
    c
}

/// The environment `launch` with `flags` gives each rank, as the ranks print it.
fn print_env(flags: &[&str]) -> String {
    let o = launch(&[flags, &["--", "dist-selftest", "--print-env"]].concat()).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    out
}

#[test]
fn launch_sets_the_torchrun_environment_and_prefixes_output() {
    let port = free_port().to_string();
    let out =
        print_env(&["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-port", &port]);
    let cores = std::thread::available_parallelism().unwrap().get();
    let threads = (cores / 2).max(1);
    for (g, l) in [(2, 0), (3, 1)] {
        for kv in [
            format!("RANK={g}"),
            format!("LOCAL_RANK={l}"),
            "WORLD_SIZE=4".into(),
            "LOCAL_WORLD_SIZE=2".into(),
            "GROUP_RANK=1".into(),
            "MASTER_ADDR=127.0.0.1".into(),
            format!("MASTER_PORT={port}"),
            format!("OMP_NUM_THREADS={threads}"),
            format!("RAYON_NUM_THREADS={threads}"),
        ] {
            assert!(
                out.lines().any(|line| line == format!("[rank {g}] {kv}")),
                "missing `[rank {g}] {kv}` in:\n{out}"
            );
        }
    }
    assert!(!out.contains("[rank 0]"));
}

/// torchrun's single-node spelling: `--standalone` picks a free local
/// rendezvous, `--rdzv-id` reaches the ranks; elastic `--nnodes` is refused.
#[test]
fn launch_standalone_forms_the_job_and_elastic_sizes_are_refused() {
    let out = print_env(&["--standalone", "--nproc-per-node", "2", "--rdzv-id", "job7"]);
    for r in 0..2 {
        for kv in ["WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "TORCHELASTIC_RUN_ID=job7"] {
            assert!(
                out.lines().any(|l| l == format!("[rank {r}] {kv}")),
                "missing `[rank {r}] {kv}` in:\n{out}"
            );
        }
    }
    let port = |r: usize| {
        out.lines().find_map(|l| l.strip_prefix(&format!("[rank {r}] MASTER_PORT="))).map(str::to_owned)
    };
    assert!(port(0).is_some() && port(0) == port(1) && port(0).as_deref() != Some("29500"), "{out}");
    let o = launch(&["--nnodes", "1:2", "--", "dist-selftest"]).output().unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("1:2: nodes joining or leaving a running job (elastic membership) is not supported"),
        "{err}"
    );
}

#[test]
fn launch_runs_three_ranks_that_agree() {
    let port = free_port().to_string();
    let o =
        launch(&["--nproc-per-node", "3", "--master-port", &port, "--", "dist-selftest", "--numel", "30001"])
            .output()
            .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let sums: Vec<&str> = (0..3)
        .map(|r| {
            let line =
                out.lines().find(|l| l.starts_with(&format!("[rank {r}] selftest rank {r}/3: ok"))).unwrap();
            checksum(line)
        })
        .collect();
    assert!(sums.iter().all(|s| *s == sums[0]), "{sums:?}");
}

#[test]
fn launch_stops_the_others_when_a_rank_fails() {
    let port = free_port().to_string();
    let t = Instant::now();
    let args = [
        "--nproc-per-node",
        "3",
        "--master-port",
        &port,
        "--stop-grace-s",
        "2",
        "--max-restarts",
        "2",
        "--",
        "dist-selftest",
        "--fail-rank",
        "1",
        "--exit-code",
        "3",
        "--hang-s",
        "60",
    ];
    let o = launch(&args).output().unwrap();
    let (out, err) = text(&o);
    assert!(t.elapsed() < Duration::from_secs(20), "the other ranks were not stopped: {:?}", t.elapsed());
    // The rank's own code (3: a failed gate), which is not restarted.
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert_eq!(out.matches("[rank 1] selftest rank 1: failing with exit code 3").count(), 1, "{out}");
    assert!(!err.contains("restart 1 of 2"), "{err}");
    assert!(
        err.contains("error: launch: rank 1 failed with exit code 3 (a failed gate); not restarted"),
        "{err}"
    );
}

#[test]
fn launch_restarts_all_ranks_up_to_max_restarts() {
    let port = free_port().to_string();
    let args = [
        "--nproc-per-node",
        "2",
        "--master-port",
        &port,
        "--max-restarts",
        "2",
        "--stop-grace-s",
        "2",
        "--",
        "dist-selftest",
        "--fail-rank",
        "0",
        "--exit-code",
        "4",
        "--hang-s",
        "60",
    ];
    let o = launch(&args).output().unwrap();
    let (out, err) = text(&o);
    assert_eq!(out.matches("[rank 0] selftest rank 0: failing with exit code 4").count(), 3, "{out}");
    assert!(err.contains("restart 1 of 2") && err.contains("restart 2 of 2"), "{err}");
    assert!(err.contains("error: launch: rank 0 failed with exit code 4 after 2 restarts"), "{err}");
    assert_eq!(o.status.code(), Some(4));
}

#[test]
fn launch_forwards_sigterm_and_leaves_no_ranks_behind() {
    let port = free_port().to_string();
    let mut l = launch(&[
        "--nproc-per-node",
        "2",
        "--master-port",
        &port,
        "--",
        "dist-selftest",
        "--fail-rank",
        "9",
        "--hang-s",
        "60",
    ])
    .spawn()
    .unwrap();
    let seen = tail(&mut l);
    wait_for(&seen, "[rank 0] selftest rank 0: waiting", Duration::from_secs(20));
    wait_for(&seen, "[rank 1] selftest rank 1: waiting", Duration::from_secs(20));
    let t = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(l.id() as i32, libc::SIGTERM) };
    let err = stderr_of(&mut l);
    let status = l.wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 15), "{err}");
    let pids: Vec<&str> =
        err.lines().filter_map(|x| x.split("pid ").nth(1)).map(|p| p.trim_end_matches(')')).collect();
    assert_eq!(pids.len(), 2, "{err}");
    for p in pids {
        assert!(!std::path::Path::new(&format!("/proc/{p}")).exists(), "rank pid {p} still exists");
    }
}

#[test]
fn launch_refuses_impossible_layouts() {
    let o = launch(&["--nnodes", "2", "--node-rank", "2", "--", "dist-selftest"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("`--node-rank`: 2 is not below --nnodes 2"), "{}", text(&o).1);
    let o = launch(&["--nproc-per-node", "0", "--", "dist-selftest"]).output().unwrap();
    assert!(text(&o).1.contains("`--nproc-per-node`: must be at least 1"), "{}", text(&o).1);
}

#[test]
fn mpirun_launches_ranks_that_rendezvous_and_all_reduce() {
    let found = Command::new("mpirun").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !found.is_ok_and(|s| s.success()) {
        println!("skipped: mpirun not found");
        return;
    }
    let port = free_port().to_string();
    let mut c = Command::new("mpirun");
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.env("CUDA_VISIBLE_DEVICES", "");
    let o = c
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            "-x",
            "MASTER_ADDR",
            "-x",
            "MASTER_PORT",
        ])
        .args([BIN, "dist-selftest", "--timeout-s", "20"])
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.matches("joined world 2 (OpenMpi launcher, tcp backend)").count(), 2, "{out}");
    let sums: Vec<&str> = out.lines().filter(|l| l.contains("ok checksum")).map(checksum).collect();
    assert!(sums.len() == 2 && sums[0] == sums[1], "{out}");
}
