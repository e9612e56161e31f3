//! The checks a run makes before it allocates anything: the device
//! `run.device` asks for is there, and the memory estimate
//! ([`super::memory`]) fits the machine and `run.max_memory_gb`.

use std::io::Read;
use std::path::Path;

use super::memory::{self, Estimate, Limit, Machine, Target};
use super::schema::{Config, DatasetKind, Device};
use crate::data::Split;
use crate::error::{Error, Result};

/// Checks `cfg` against this machine; returns the estimate `ddptrain check` prints.
pub fn preflight(cfg: &Config) -> Result<Estimate> {
    let file = cfg.config_path.display().to_string();
    let layers = cfg.resolve_model()?;
    // Training reports a broken launcher environment itself; here one process is assumed.
    let dist =
        crate::dist::DistEnv::from_process(&cfg.parallel).unwrap_or_else(|_| crate::dist::DistEnv::single());
    let visible = if cfg.run.device == Device::Cpu { 0 } else { crate::cuda::device_count() };
    if cfg.run.device == Device::Cuda && visible == 0 {
        return Err(Error::config(
            file,
            "run.device",
            "run.device = \"cuda\" but no CUDA device is visible: libcuda could not be loaded or reports no device \
             (check the NVIDIA driver, LD_LIBRARY_PATH and CUDA_VISIBLE_DEVICES); set run.device = \"cpu\" \
             or \"auto\" to train on the CPU",
        ));
    }
    let local_world = dist.local_world_size.max(1) as u64;
    let gpu_total = if memory::wants_gpu(cfg, visible) {
        // A device whose size cannot be read is not compared against.
        crate::cuda::total_memory(dist.local_rank % visible).ok()
    } else {
        None
    };
    let target = match (memory::wants_gpu(cfg, visible), gpu_total) {
        (true, total) => Target::Gpu {
            total_bytes: total.unwrap_or(u64::MAX),
            ranks_per_gpu: local_world.div_ceil(visible.max(1) as u64),
        },
        (false, _) => Target::Cpu,
    };
    let (train_samples, test_samples, sample_numel) = sample_counts(cfg);
    // The loop plans epochs x steps per epoch optimizer steps, and a step
    // takes at least one sample: bounding epochs x samples bounds the plan.
    if let Some(e) = cfg.train.epochs {
        if e.checked_mul(train_samples.max(1)).is_none() {
            return Err(Error::config(
                file,
                "train.epochs",
                format!("{e} epochs of {train_samples} samples is more steps than fit in 64 bits; use train.max_steps"),
            ));
        }
    }
    let machine = Machine {
        target,
        threads: rayon::current_num_threads() as u64,
        train_samples,
        test_samples,
        sample_numel,
        world_size: dist.world_size as u64,
    };
    let est = memory::estimate(cfg, &layers, &machine)?;
    let user = memory::user_limit(cfg);
    let host = match host_memory() {
        Some(b) => Some(memory::tighter(
            Limit { bytes: b, source: "MemTotal in /proc/meminfo".into() },
            user.clone(),
        )),
        None => user.clone(),
    };
    let device = match target {
        Target::Gpu { total_bytes, ranks_per_gpu } if gpu_total.is_some() => Some((
            memory::tighter(
                Limit { bytes: total_bytes.into(), source: "the GPU's total memory".into() },
                user,
            ),
            ranks_per_gpu,
        )),
        Target::Gpu { ranks_per_gpu, .. } => user.map(|u| (u, ranks_per_gpu)),
        Target::Cpu => None,
    };
    if let Some(host) = &host {
        memory::check_fits(cfg, &est, host, local_world, device.as_ref().map(|(l, n)| (l, *n)))?;
    }
    Ok(est)
}

/// The machine's memory: MemTotal, not MemAvailable. A run is refused when
/// it cannot fit the machine at all; what other processes hold at this
/// moment changes from one second to the next and would make the refusal flap.
fn host_memory() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Samples in the train and test splits and, where the files say, the
/// values per image: the synthetic sizes, the IDX headers, the CIFAR files'
/// sizes, the .npz arrays' headers (0 samples when a file cannot be read:
/// loading it reports that with its own message).
fn sample_counts(cfg: &Config) -> (u64, u64, Option<u64>) {
    let d = &cfg.data;
    match d.dataset {
        DatasetKind::Synthetic => (d.synthetic_train_size as u64, d.synthetic_test_size as u64, None),
        DatasetKind::Mnist | DatasetKind::FashionMnist => {
            let header = |prefix: &str| {
                crate::data::idx::find(&d.path, &format!("{prefix}-images-idx3-ubyte"))
                    .ok()
                    .and_then(|p| idx_header(&p))
            };
            let (train, test) = (header("train"), header("t10k"));
            let numel = train.or(test).map(|(_, n)| n);
            (train.map_or(0, |(c, _)| c), test.map_or(0, |(c, _)| c), numel)
        }
        DatasetKind::Cifar10 | DatasetKind::Cifar100 => {
            use crate::data::cifar::{self, Cifar};
            let kind = if d.dataset == DatasetKind::Cifar10 { Cifar::Ten } else { Cifar::Hundred };
            let count = |split| {
                let files = cifar::files(&d.path, kind, split).unwrap_or_default();
                let bytes: u64 =
                    files.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
                bytes / kind.record() as u64
            };
            let numel = cifar::CIFAR_SHAPE.iter().product::<usize>() as u64;
            (count(Split::Train), count(Split::Test), Some(numel))
        }
        // The text's bytes (its tokens, at most as many), counted as train samples.
        DatasetKind::Text => (text_bytes(&d.path), 0, None),
        DatasetKind::Npz => {
            let header = |split| npz_x_shape(&crate::data::npz::file(&d.path, split));
            let (train, test) = (header(Split::Train), header(Split::Test));
            let numel = train.as_ref().or(test.as_ref()).map(|s| s.iter().skip(1).product());
            (train.map_or(0, |s| s[0]), test.map_or(0, |s| s[0]), numel)
        }
    }
}

/// The size of a text file, or of the `*.txt` files under a directory (0
/// when unreadable: loading reports that).
fn text_bytes(path: &Path) -> u64 {
    crate::data::text::files(path)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// The shape of `x` in an .npz archive, read from its header only.
fn npz_x_shape(path: &Path) -> Option<Vec<u64>> {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).ok()?).ok()?;
    let npy = npyz::NpyFile::new(zip.by_name("x.npy").ok()?).ok()?;
    let shape = npy.shape().to_vec();
    let numel = shape.iter().skip(1).try_fold(1u64, |a, &d| a.checked_mul(d))?;
    (!shape.is_empty() && numel > 0).then_some(shape)
}

/// The image count and rows x cols of an IDX3 file (raw or gzip).
fn idx_header(path: &Path) -> Option<(u64, u64)> {
    let mut head = [0u8; 16];
    let mut f = std::fs::File::open(path).ok()?;
    f.read_exact(&mut head[..2]).ok()?;
    let f = std::fs::File::open(path).ok()?;
    if head[..2] == [0x1f, 0x8b] {
        flate2::read::MultiGzDecoder::new(f).read_exact(&mut head).ok()?;
    } else {
        std::io::BufReader::new(f).read_exact(&mut head).ok()?;
    }
    let at = |i: usize| u64::from(u32::from_be_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]));
    Some((at(4), at(8) * at(12)))
}
