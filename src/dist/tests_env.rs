use super::env::{DistEnv, Launcher};
use crate::config::ParallelConfig;
use std::collections::HashMap;

fn vars(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn parse(kv: &[(&str, &str)]) -> crate::Result<DistEnv> {
    DistEnv::from_vars(&vars(kv), &ParallelConfig::default())
}

fn err(kv: &[(&str, &str)]) -> String {
    parse(kv).unwrap_err().to_string()
}

#[test]
fn no_launcher_is_a_single_process() {
    let e = parse(&[("PATH", "/bin")]).unwrap();
    assert_eq!(e, DistEnv::single());
    assert_eq!(e.master_endpoint(), "127.0.0.1:29500");
}

#[test]
fn torchrun_variables() {
    let e = parse(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.1.2.3"),
        ("MASTER_PORT", "1234"),
    ])
    .unwrap();
    assert_eq!((e.rank, e.world_size, e.local_rank, e.local_world_size), (5, 8, 1, 4));
    assert_eq!(e.launcher, Launcher::Torchrun);
    assert_eq!(e.master_endpoint(), "10.1.2.3:1234");
    // Hand-set RANK/WORLD_SIZE without local information: one node.
    let e = parse(&[("RANK", "2"), ("WORLD_SIZE", "3")]).unwrap();
    assert_eq!((e.local_rank, e.local_world_size), (2, 3));
}

#[test]
fn open_mpi_variables() {
    let e = parse(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ])
    .unwrap();
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.local_world_size, e.launcher),
        (3, 4, 1, 2, Launcher::OpenMpi)
    );
}

#[test]
fn pmi_variables_with_and_without_hydra_locals() {
    let e = parse(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")]).unwrap();
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.local_world_size, e.launcher),
        (1, 2, 1, 2, Launcher::Pmi)
    );
    let e =
        parse(&[("PMI_RANK", "3"), ("PMI_SIZE", "4"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2")])
            .unwrap();
    assert_eq!((e.local_rank, e.local_world_size), (1, 2));
}

#[test]
fn slurm_variables() {
    let e = parse(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NTASKS_PER_NODE", "4"),
    ])
    .unwrap();
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.local_world_size, e.launcher),
        (5, 8, 1, 4, Launcher::Slurm)
    );
    let e = parse(&[
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "6"),
        ("SLURM_LOCALID", "2"),
        ("SLURM_TASKS_PER_NODE", "3(x2)"),
    ])
    .unwrap();
    assert_eq!((e.local_rank, e.local_world_size), (2, 3));
}

#[test]
fn torchrun_wins_over_mpi_and_slurm() {
    let e = parse(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("SLURM_PROCID", "0"),
    ])
    .unwrap();
    assert_eq!((e.rank, e.world_size, e.launcher), (1, 2, Launcher::Torchrun));
}

#[test]
fn inconsistent_values_name_the_variable() {
    let m = err(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
    assert!(m.contains("`RANK`") && m.contains("rank 2 is not below WORLD_SIZE=2"), "{m}");
    let m = err(&[("RANK", "0"), ("WORLD_SIZE", "two")]);
    assert!(m.contains("`WORLD_SIZE`") && m.contains("`two` is not a non-negative integer"), "{m}");
    let m = err(&[("RANK", "0")]);
    assert!(m.contains("`WORLD_SIZE`") && m.contains("is not set"), "{m}");
    let m = err(&[("RANK", "0"), ("WORLD_SIZE", "0")]);
    assert!(m.contains("`WORLD_SIZE`") && m.contains("at least 1"), "{m}");
    let m = err(&[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")]);
    assert!(m.contains("`OMPI_COMM_WORLD_RANK`"), "{m}");
    let m = err(&[("PMI_RANK", "-1"), ("PMI_SIZE", "4")]);
    assert!(m.contains("`PMI_RANK`"), "{m}");
    let m = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "x")]);
    assert!(m.contains("`SLURM_LOCALID`"), "{m}");
    let m = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")]);
    assert!(m.contains("`LOCAL_RANK`") && m.contains("local rank 2 is not below"), "{m}");
    let m = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "3")]);
    assert!(m.contains("local world size 3 must be between 1 and WORLD_SIZE=2"), "{m}");
    let m = err(&[("MASTER_PORT", "70000")]);
    assert!(m.contains("`MASTER_PORT`") && m.contains("`70000` is not a TCP port"), "{m}");
    let m = err(&[("MASTER_PORT", "0")]);
    assert!(m.contains("`MASTER_PORT`"), "{m}");
}

#[test]
fn master_address_environment_wins_over_config_which_wins_over_default() {
    let par = ParallelConfig {
        master_addr: Some("10.0.0.9".into()),
        master_port: Some(4000),
        ..ParallelConfig::default()
    };
    let e = DistEnv::from_vars(&vars(&[]), &par).unwrap();
    assert_eq!(e.master_endpoint(), "10.0.0.9:4000");
    let e = DistEnv::from_vars(&vars(&[("MASTER_ADDR", "node7"), ("MASTER_PORT", "5000")]), &par).unwrap();
    assert_eq!(e.master_endpoint(), "node7:5000");
    let e = DistEnv::from_vars(&vars(&[("MASTER_ADDR", "::1")]), &ParallelConfig::default()).unwrap();
    assert_eq!(e.master_endpoint(), "[::1]:29500");
    let empty = ParallelConfig { master_addr: Some(" ".into()), ..ParallelConfig::default() };
    let m = DistEnv::from_vars(&vars(&[]), &empty).unwrap_err().to_string();
    assert!(m.contains("parallel.master_addr"), "{m}");
}

#[test]
fn job_token_is_read() {
    assert_eq!(parse(&[("DDPTRAIN_JOB_TOKEN", "s3cret")]).unwrap().job_token.as_deref(), Some("s3cret"));
    assert_eq!(parse(&[("DDPTRAIN_JOB_TOKEN", "")]).unwrap().job_token, None);
}

/// Both builds' refusals of `parallel.backend = "mpi"`, whichever way these
/// tests were built (CI builds them with the feature; tests/mpi_backend.rs
/// also runs the binary of each build).
#[test]
fn the_mpi_backend_is_refused_without_the_feature_or_outside_mpirun() {
    use super::check_backend_in;
    use crate::config::Backend;
    let open_mpi = parse(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap();
    let torchrun = parse(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")]).unwrap();
    let alone = parse(&[]).unwrap();
    for env in [&open_mpi, &torchrun, &alone] {
        let m = check_backend_in(Backend::Mpi, env, false).unwrap_err().to_string();
        assert!(m.contains("`parallel.backend`"), "{m}");
        assert!(
            m.contains("\"mpi\" needs a ddptrain built with the `mpi` feature (`cargo build --release --features mpi`"),
            "{m}"
        );
        assert!(check_backend_in(Backend::Tcp, env, false).is_ok());
    }
    assert!(check_backend_in(Backend::Mpi, &open_mpi, true).is_ok());
    let m = check_backend_in(Backend::Mpi, &alone, true).unwrap_err().to_string();
    assert!(
        m.contains("this process was not started by an MPI launcher: run it under `mpirun -np N ddptrain"),
        "{m}"
    );
    let m = check_backend_in(Backend::Mpi, &torchrun, true).unwrap_err().to_string();
    assert!(m.contains("started by Torchrun's variables (no OMPI_COMM_WORLD_RANK or PMI_RANK)"), "{m}");
}
