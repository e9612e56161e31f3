//! The job `launch`'s torchrun flags describe: how many ranks on this node
//! (`--nproc-per-node N|auto|gpu|cpu`), how many nodes (`--nnodes N`, or
//! `MIN:MAX` with no room to resize: elastic membership is refused), and
//! where rank 0's rendezvous listens (`--master-addr`/`--master-port`,
//! `--rdzv-endpoint`, or `--standalone`'s free local port).

use super::LaunchArgs;
use crate::error::{Error, Result};

/// torchrun's port for an `--rdzv-endpoint` that names none (its c10d default).
const RDZV_DEFAULT_PORT: u16 = 29400;

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Job {
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub master_addr: String,
    pub master_port: u16,
}

fn bad(key: &str, msg: impl Into<String>) -> Error {
    Error::config("the command line", key, msg.into())
}

impl Job {
    pub fn of(a: &LaunchArgs) -> Result<Job> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Job::with(a, cores, crate::cuda::device_count)
    }

    /// [`Job::of`] on a machine of `cores` cores and `gpus()` visible GPUs.
    fn with(a: &LaunchArgs, cores: usize, gpus: impl Fn() -> usize) -> Result<Job> {
        let nproc_per_node = nproc_per_node(&a.nproc_per_node, cores, gpus)?;
        let mut nnodes = nnodes(&a.nnodes)?;
        let (mut master_addr, mut master_port) = (a.master_addr.clone(), a.master_port);
        if !matches!(a.rdzv_backend.as_str(), "static" | "c10d") {
            return Err(bad(
                "--rdzv-backend",
                format!(
                    "{:?} is not one launch has: `c10d` and `static` both rendezvous at rank 0's --master-addr and --master-port",
                    a.rdzv_backend
                ),
            ));
        }
        if let Some(e) = &a.rdzv_endpoint {
            (master_addr, master_port) = endpoint(e)?;
        }
        if a.standalone {
            if nnodes != 1 {
                return Err(bad("--standalone", format!("is one node, but --nnodes is {nnodes}")));
            }
            if a.rdzv_endpoint.is_some() {
                return Err(bad("--standalone", "picks its own local endpoint: leave out --rdzv-endpoint"));
            }
            nnodes = 1;
            master_addr = "127.0.0.1".into();
            master_port = free_port()?;
        }
        if a.node_rank >= nnodes {
            return Err(bad("--node-rank", format!("{} is not below --nnodes {nnodes}", a.node_rank)));
        }
        if !(a.monitor_interval > 0.0 && a.monitor_interval.is_finite()) {
            return Err(bad(
                "--monitor-interval",
                format!("{} is not a positive number of seconds", a.monitor_interval),
            ));
        }
        Ok(Job { nproc_per_node, nnodes, master_addr, master_port })
    }
}

fn nproc_per_node(v: &str, cores: usize, gpus: impl Fn() -> usize) -> Result<usize> {
    let key = "--nproc-per-node";
    let n = match v {
        "cpu" => cores,
        "gpu" => match gpus() {
            0 => return Err(bad(key, "gpu: no CUDA device is visible (use a number, `cpu` or `auto`)")),
            n => n,
        },
        "auto" => match gpus() {
            0 => cores,
            n => n,
        },
        _ => v.parse::<usize>().map_err(|_| {
            bad(key, format!("{v:?} is neither a number of ranks nor `auto`, `gpu` or `cpu`"))
        })?,
    };
    if n == 0 {
        return Err(bad(key, "must be at least 1"));
    }
    Ok(n)
}

fn nnodes(v: &str) -> Result<usize> {
    let key = "--nnodes";
    let num =
        |s: &str| {
            s.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                bad(key, format!("{v:?} is not a number of nodes (N, or MIN:MAX) of at least 1"))
            })
        };
    match v.split_once(':') {
        None => num(v),
        Some((lo, hi)) => {
            let (lo, hi) = (num(lo)?, num(hi)?);
            if lo == hi {
                Ok(lo)
            } else {
                Err(bad(
                    key,
                    format!(
                        "{v}: nodes joining or leaving a running job (elastic membership) is not supported; \
                         give a fixed --nnodes (restarts keep the job's size: --max-restarts)"
                    ),
                ))
            }
        }
    }
}

/// `HOST:PORT`, `HOST` (torchrun's default port) or `[IPv6]:PORT`.
fn endpoint(e: &str) -> Result<(String, u16)> {
    let key = "--rdzv-endpoint";
    let (host, port) = match e.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && (!h.contains(':') || h.starts_with('[')) => {
            let port = p.parse::<u16>().map_err(|_| bad(key, format!("{e:?}: {p:?} is not a port")))?;
            (h, port)
        }
        _ => (e, RDZV_DEFAULT_PORT),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad(key, format!("{e:?} names no host (HOST:PORT)")));
    }
    Ok((host.to_owned(), port))
}

/// A port nothing listens on now, as torchrun's standalone rendezvous picks one.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| Error::io("launch --standalone: cannot find a free local port", e))?;
    l.local_addr().map(|a| a.port()).map_err(|e| Error::io("launch --standalone: cannot read its port", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: LaunchArgs,
    }

    fn job(flags: &[&str], gpus: usize) -> Result<Job> {
        let args = std::iter::once("launch").chain(flags.iter().copied()).chain(["--", "--config", "x"]);
        Job::with(&Cli::parse_from(args).a, 8, || gpus)
    }

    fn msg(flags: &[&str], gpus: usize) -> String {
        job(flags, gpus).unwrap_err().to_string()
    }

    #[test]
    fn rank_counts_follow_torchruns_words() {
        assert_eq!(job(&["--nproc-per-node", "3"], 0).unwrap().nproc_per_node, 3);
        assert_eq!(job(&["--nproc-per-node", "cpu"], 2).unwrap().nproc_per_node, 8);
        assert_eq!(job(&["--nproc-per-node", "gpu"], 2).unwrap().nproc_per_node, 2);
        assert_eq!(job(&["--nproc_per_node", "auto"], 4).unwrap().nproc_per_node, 4);
        assert_eq!(job(&["--nproc-per-node", "auto"], 0).unwrap().nproc_per_node, 8);
        assert!(msg(&["--nproc-per-node", "gpu"], 0).contains("gpu: no CUDA device is visible"));
        assert!(
            msg(&["--nproc-per-node", "two"], 0).contains("\"two\" is neither a number of ranks nor `auto`")
        );
        assert!(msg(&["--nproc-per-node", "0"], 0).contains("--nproc-per-node`: must be at least 1"));
    }

    #[test]
    fn a_fixed_node_count_is_honoured_and_resizing_refused() {
        assert_eq!(job(&["--nnodes", "2"], 0).unwrap().nnodes, 2);
        assert_eq!(job(&["--nnodes", "2:2"], 0).unwrap().nnodes, 2);
        assert!(msg(&["--nnodes", "1:2"], 0).contains("1:2: nodes joining or leaving a running job"));
        assert!(msg(&["--nnodes", "0"], 0).contains("is not a number of nodes"));
        assert!(msg(&["--nnodes", "2", "--node-rank", "2"], 0).contains("2 is not below --nnodes 2"));
    }

    #[test]
    fn the_rendezvous_is_the_endpoint_or_a_free_local_port() {
        let j = job(&["--rdzv-endpoint", "node7:1234", "--rdzv-backend", "c10d", "--rdzv-id", "job1"], 0)
            .unwrap();
        assert_eq!((j.master_addr.as_str(), j.master_port), ("node7", 1234));
        let j = job(&["--rdzv_endpoint", "node7"], 0).unwrap();
        assert_eq!((j.master_addr.as_str(), j.master_port), ("node7", RDZV_DEFAULT_PORT));
        let j = job(&["--rdzv-endpoint", "[::1]:99"], 0).unwrap();
        assert_eq!((j.master_addr.as_str(), j.master_port), ("::1", 99));
        assert!(msg(&["--rdzv-endpoint", "node7:x"], 0).contains("\"x\" is not a port"));
        assert!(msg(&["--rdzv-backend", "etcd"], 0).contains("\"etcd\" is not one launch has"));
        let j = job(&["--standalone", "--nproc-per-node", "2"], 0).unwrap();
        assert_eq!((j.nnodes, j.master_addr.as_str()), (1, "127.0.0.1"));
        assert!(j.master_port > 0);
        assert!(msg(&["--standalone", "--nnodes", "2"], 0).contains("is one node, but --nnodes is 2"));
        assert!(msg(&["--monitor-interval", "0"], 0).contains("0 is not a positive number of seconds"));
    }
}
