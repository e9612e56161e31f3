//! Who am I, and where is rank 0: the process's place in the job, read from
//! whichever launcher started it.
//!
//! Families are tried in this order, and the first one whose rank variable is
//! set wins: torchrun / `ddptrain launch` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`), Open MPI (`OMPI_COMM_WORLD_*`), MPICH / Intel MPI
//! (`PMI_RANK`, `PMI_SIZE`, local rank from `MPI_LOCALRANKID` /
//! `MPI_LOCALNRANKS` when hydra sets them), SLURM (`SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_LOCALID`). None of them means a single process.
//!
//! The rendezvous address: `MASTER_ADDR` / `MASTER_PORT` from the environment
//! win over `[parallel] master_addr` / `master_port`, which win over the
//! defaults 127.0.0.1:29500. That is what torchrun users expect: the launcher's
//! command line is the most specific statement of where this job meets, while
//! the config file is shared by every run of the model.

use crate::config::ParallelConfig;
use crate::error::{Error, Result};
use std::collections::HashMap;

pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// The shared secret rank 0 demands from every joining rank when it is set.
pub const JOB_TOKEN_VAR: &str = "DDPTRAIN_JOB_TOKEN";

/// The launcher family the rank was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `torchrun`, `ddptrain launch`, or variables set by hand.
    Torchrun,
    OpenMpi,
    /// MPICH, Intel MPI, or anything else speaking PMI.
    Pmi,
    Slurm,
    /// No launcher variables: a single process.
    None,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub job_token: Option<String>,
    pub launcher: Launcher,
}

impl DistEnv {
    /// A single process: rank 0 of 1.
    pub fn single() -> DistEnv {
        DistEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: DEFAULT_MASTER_ADDR.to_string(),
            master_port: DEFAULT_MASTER_PORT,
            job_token: None,
            launcher: Launcher::None,
        }
    }

    /// Reads the process environment (see [`DistEnv::from_vars`]).
    pub fn from_process(par: &ParallelConfig) -> Result<DistEnv> {
        let vars: HashMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        DistEnv::from_vars(&vars, par)
    }

    /// Reads an explicit variable map, so tests need not touch the process environment.
    pub fn from_vars(vars: &HashMap<String, String>, par: &ParallelConfig) -> Result<DistEnv> {
        let get = |k: &str| vars.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let num = |k: &str| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| env_err(k, format!("`{v}` is not a non-negative integer"))),
            }
        };
        // Both of a family's rank and size must be there; one without the other is a broken launcher.
        let need = |k: &str| -> Result<usize> {
            num(k)?
                .ok_or_else(|| env_err(k, "is not set, but other variables of its launcher are".to_string()))
        };

        let (launcher, rank, world, local_rank, local_world, rank_var, world_var, local_var);
        if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
            launcher = Launcher::Torchrun;
            (rank_var, world_var, local_var) = ("RANK", "WORLD_SIZE", "LOCAL_RANK");
            rank = need("RANK")?;
            world = need("WORLD_SIZE")?;
            local_rank = num("LOCAL_RANK")?;
            local_world = num("LOCAL_WORLD_SIZE")?;
        } else if get("OMPI_COMM_WORLD_RANK").is_some() {
            launcher = Launcher::OpenMpi;
            (rank_var, world_var, local_var) =
                ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK");
            rank = need(rank_var)?;
            world = need(world_var)?;
            local_rank = num(local_var)?;
            local_world = num("OMPI_COMM_WORLD_LOCAL_SIZE")?;
        } else if get("PMI_RANK").is_some() {
            launcher = Launcher::Pmi;
            (rank_var, world_var, local_var) = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID");
            rank = need(rank_var)?;
            world = need(world_var)?;
            local_rank = num(local_var)?;
            local_world = num("MPI_LOCALNRANKS")?;
        } else if get("SLURM_PROCID").is_some() {
            launcher = Launcher::Slurm;
            (rank_var, world_var, local_var) = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
            rank = need(rank_var)?;
            world = need(world_var)?;
            local_rank = num(local_var)?;
            // SLURM_NTASKS_PER_NODE is a plain count only when the user asked for one;
            // SLURM_TASKS_PER_NODE looks like `4(x2),3`, whose first entry is this layout's local size.
            local_world = match num("SLURM_NTASKS_PER_NODE") {
                Ok(Some(n)) => Some(n),
                _ => get("SLURM_TASKS_PER_NODE")
                    .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|v| v.parse().ok()),
            };
        } else {
            launcher = Launcher::None;
            (rank_var, world_var, local_var) = ("", "", "");
            (rank, world, local_rank, local_world) = (0, 1, None, None);
        }

        if world == 0 {
            return Err(env_err(world_var, "must be at least 1".into()));
        }
        if rank >= world {
            return Err(env_err(rank_var, format!("rank {rank} is not below {world_var}={world}")));
        }
        // Without local information the job is taken to be on one node, which is
        // what every launcher that omits it (PMI without hydra, hand-set RANK) means in practice.
        let local_world = local_world.unwrap_or(world);
        let local_rank = local_rank.unwrap_or(rank % local_world.max(1));
        if local_world == 0 || local_world > world {
            return Err(env_err(
                local_var,
                format!("local world size {local_world} must be between 1 and {world_var}={world}"),
            ));
        }
        if local_rank >= local_world {
            return Err(env_err(
                local_var,
                format!("local rank {local_rank} is not below the local world size {local_world}"),
            ));
        }

        let master_addr = match get("MASTER_ADDR") {
            Some(a) => a.to_string(),
            None => par.master_addr.clone().unwrap_or_else(|| DEFAULT_MASTER_ADDR.to_string()),
        };
        if master_addr.trim().is_empty() {
            return Err(Error::config("[parallel]", "parallel.master_addr", "must not be empty"));
        }
        let master_port = match get("MASTER_PORT") {
            Some(p) => match p.parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => return Err(env_err("MASTER_PORT", format!("`{p}` is not a TCP port (1-65535)"))),
            },
            None => par.master_port.unwrap_or(DEFAULT_MASTER_PORT),
        };
        if master_port == 0 {
            return Err(Error::config("[parallel]", "parallel.master_port", "must be a TCP port (1-65535)"));
        }
        let job_token = vars.get(JOB_TOKEN_VAR).filter(|t| !t.is_empty()).cloned();
        Ok(DistEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            master_addr,
            master_port,
            job_token,
            launcher,
        })
    }

    /// `host:port` of rank 0's rendezvous store.
    pub fn master_endpoint(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

fn env_err(var: &str, msg: String) -> Error {
    Error::config("the environment", var, msg)
}
