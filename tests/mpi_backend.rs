//! `parallel.backend = "mpi"` through the real binary. Built without the `mpi`
//! feature, asking for it is a config error that says how to build it. Built
//! with it (scripts/test.sh runs this file so), under Open MPI's `mpirun`: the
//! collectives agree across ranks and with the tcp transport; 2 and 3 ranks
//! train the seed ConvNet (SyncBatchNorm) as one rank does with the same
//! global batch (O0 within 1e-5 after 3 steps, O2 the same skipped steps) and
//! as the tcp backend does; ranks with different configs are refused naming
//! the keys; a killed rank, a stopped one and SIGTERM to `mpirun` end the job
//! as documented. Without `mpirun` these tests skip, and under CI=true fail.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// A small config: the synthetic set and a few steps, so refusals come fast.
fn small_config(dir: &Path) -> std::path::PathBuf {
    let seed = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
    let model = &seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()];
    write(
        dir,
        "small.toml",
        &format!(
            "{model}\n[data]\ndataset = \"synthetic\"\nsynthetic_train_size = 240\nsynthetic_test_size = 40\n\
             batch_size = 40\n[optimizer]\nname = \"sgd\"\nlr = 0.05\n[train]\nmax_steps = 2\n[logging]\nprogress = \"never\"\ntensorboard = false\n"
        ),
    )
}

fn run_mpi_backend(dir: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let cfg = small_config(dir);
    let out = dir.join("out");
    let mut c = Command::new(ddptrain_bin());
    for v in ["RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"] {
        c.env_remove(v);
    }
    c.env(HIDE_GPUS.0, HIDE_GPUS.1).envs(env.iter().copied());
    c.arg("--config").arg(&cfg).args(["--set", &format!("run.out_dir={}", out.display())]);
    let o = c.args(["--set", "parallel.backend=mpi"]).current_dir(dir).output().unwrap();
    (o.status.code(), text(&o))
}

#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_feature_asking_for_mpi_says_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let (code, t) = run_mpi_backend(dir.path(), &[]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("`parallel.backend`"), "{t}");
    assert!(
        t.contains(
            "\"mpi\" needs a ddptrain built with the `mpi` feature (`cargo build --release --features mpi`"
        ),
        "{t}"
    );
    assert!(!dir.path().join("out").exists(), "a refused run wrote its out_dir");
    // The same under a launcher's variables: the build, not the launch, is what is missing.
    let (code, t) =
        run_mpi_backend(dir.path(), &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("needs a ddptrain built with the `mpi` feature"), "{t}");
}

#[cfg(feature = "mpi")]
#[test]
fn outside_an_mpi_launch_asking_for_mpi_says_to_use_mpirun() {
    let dir = tempfile::tempdir().unwrap();
    let (code, t) = run_mpi_backend(dir.path(), &[]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("`parallel.backend`"), "{t}");
    assert!(
        t.contains("this process was not started by an MPI launcher: run it under `mpirun -np N ddptrain"),
        "{t}"
    );
    let torchrun = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")];
    let (code, t) = run_mpi_backend(dir.path(), &torchrun);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("started by Torchrun's variables (no OMPI_COMM_WORLD_RANK or PMI_RANK)"), "{t}");
    // MPICH's variables, but Open MPI (this build's library) starts as a world of one.
    let (code, t) = run_mpi_backend(dir.path(), &[("PMI_RANK", "1"), ("PMI_SIZE", "2")]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("MPI says this is rank 0 of 1, but the launcher's variables say rank 1 of 2 (Pmi): start the job with the mpirun of the MPI library ddptrain was built against"), "{t}");
    assert!(!dir.path().join("out").exists(), "a refused run wrote its out_dir");
}

#[cfg(feature = "mpi")]
#[path = "mpi_backend/under_mpirun.rs"]
mod under_mpirun;
