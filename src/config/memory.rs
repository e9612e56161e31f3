//! The memory a run needs, estimated from the config before anything is
//! allocated, and the refusal of a run that cannot fit (a config error naming
//! the largest layer, the figures and the limit) instead of an abort from the
//! allocator halfway through building the model.
//!
//! Per process, in bytes, as u128 with checked arithmetic: a config of valid
//! but absurd sizes gives an absurd figure, never an overflow.
//!
//! What is counted, following what the CPU loop and the GPU loop allocate:
//! parameters and their gradients in the opt level's dtypes, fp32 master
//! weights when kept, the optimizer's state (SGD's momentum buffer, Adam's
//! two moments, fp32), the activations saved for backward at
//! `data.batch_size` plus the gradient flowing back, the kernels' scratch
//! (the largest layer's: a conv's im2col per CPU thread, the whole batch's
//! on the GPU; attention's per-head blocks, its `[N, H, T, T]` workspace on
//! the GPU), one evaluation
//! batch, the loader's prefetched batches, the dataset (on the host, and on
//! the GPU path its device copy too), a checkpoint's serialized copy and the
//! process itself.

use std::fmt;

use super::model::ResolvedLayer;
use super::schema::{Config, DatasetKind, Device, OptimizerName};
use crate::error::{Error, Result};
use crate::nn::layers::{AmpClass, MemoryArgs};
use crate::tensor::DType;

/// What a process holds besides the model and the data: the binary, its
/// libraries, thread stacks and the allocator's arenas (measured: `ddptrain
/// check` peaks at 7 MiB of resident memory).
const PROCESS_BYTES: u128 = 16 << 20;

/// One named share of an estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub what: &'static str,
    pub bytes: u128,
    /// The config key that sets this part's size, when it is not the model's layers.
    pub key: Option<&'static str>,
}

fn part(what: &'static str, bytes: u128) -> Part {
    Part { what, bytes, key: None }
}

/// A layer's own share (its parameters and their state, its saved
/// activations and scratch), to name the largest one in a refusal.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerShare {
    pub key: String,
    pub name: String,
    pub repr: String,
    pub bytes: u128,
}

/// The estimate of one process's memory: on the host, and on the GPU when
/// the run trains there.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub host: Vec<Part>,
    pub device: Option<Vec<Part>>,
    pub largest_layer: Option<LayerShare>,
}

impl Estimate {
    pub fn host_total(&self) -> u128 {
        self.host.iter().map(|p| p.bytes).fold(0, u128::saturating_add)
    }
    pub fn device_total(&self) -> Option<u128> {
        self.device.as_ref().map(|d| d.iter().map(|p| p.bytes).fold(0, u128::saturating_add))
    }
}

/// `memory estimate: 57.3 MiB host (parameters 113.4 KiB, ...)`, and a
/// second line for the device when there is one.
impl fmt::Display for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let line = |parts: &[Part]| {
            parts
                .iter()
                .filter(|p| p.bytes > 0)
                .map(|p| format!("{} {}", p.what, bytes(p.bytes)))
                .collect::<Vec<_>>()
        };
        write!(f, "memory estimate: {} host ({})", bytes(self.host_total()), line(&self.host).join(", "))?;
        if let (Some(d), Some(total)) = (&self.device, self.device_total()) {
            write!(f, "\nmemory estimate: {} device ({})", bytes(total), line(d).join(", "))?;
        }
        Ok(())
    }
}

/// `1.5 GiB`, `312.0 KiB`, `17 B`.
pub fn bytes(n: u128) -> String {
    const UNITS: [&str; 7] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Sums and products that cannot overflow silently: `None` is a size past
/// 2^128 bytes, which the caller reports as a config error on its key.
pub(crate) fn mul(xs: &[u128]) -> Option<u128> {
    xs.iter().try_fold(1u128, |a, &b| a.checked_mul(b))
}

fn size_err(file: &str, key: &str) -> Error {
    Error::config(file, key, "the memory this needs does not fit in 128 bits: make it smaller")
}

/// Bytes per element of `dt`.
fn width(dt: DType) -> u128 {
    match dt {
        DType::F16 => 2,
        _ => 4,
    }
}

/// Where the run trains, for the estimate: the CPU, or a GPU of this many
/// bytes shared by this many local ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    Cpu,
    Gpu { total_bytes: u64, ranks_per_gpu: u64 },
}

/// What the estimate needs to know that the config does not say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Machine {
    pub target: Target,
    /// Threads the CPU ops fork into (each conv task has its own scratch).
    pub threads: u64,
    /// Samples in the train and test splits (MNIST: from the files' headers).
    pub train_samples: u64,
    pub test_samples: u64,
    /// Values per sample when the files say (MNIST's header); else `model.input_shape`'s.
    pub sample_numel: Option<u64>,
    pub world_size: u64,
}

/// Estimates the memory of one process of the run `cfg` over `layers`.
pub fn estimate(cfg: &Config, layers: &[ResolvedLayer], m: &Machine) -> Result<Estimate> {
    let file = cfg.config_path.display().to_string();
    let policy = crate::amp::Policy::resolve(&cfg.amp)?;
    let model_dt = policy.cast_model_type.unwrap_or(DType::F32);
    let keep_bn_fp32 = policy.keep_batchnorm_fp32.unwrap_or(true);
    let masters = policy.master_weights.unwrap_or(false);
    let act = width(model_dt);
    let batch = cfg.data.batch_size as u128;
    let eval_batch = cfg.data.eval_batch_size as u128;
    let o = &cfg.optimizer;
    let state_per_param: u128 = match o.name {
        OptimizerName::Sgd if o.momentum > 0.0 => 1,
        OptimizerName::Sgd => 0,
        OptimizerName::Adam | OptimizerName::AdamW => 2,
    };
    let on_gpu = matches!(m.target, Target::Gpu { .. });
    let threads = (m.threads.max(1) as u128).min(batch.max(1));

    let (mut weights, mut fp32_params, mut largest_io, mut saved, mut scratch) =
        (0u128, 0u128, 0u128, 0u128, 0u128);
    let mut largest: Option<LayerShare> = None;
    for l in layers {
        let err = || size_err(&file, &l.key);
        let numel_in = mul(&l.in_shape.iter().map(|&d| d as u128).collect::<Vec<_>>()).ok_or_else(err)?;
        let numel_out = mul(&l.out_shape.iter().map(|&d| d as u128).collect::<Vec<_>>()).ok_or_else(err)?;
        let params = l.kind.num_params() as u128;
        let dt_bytes = match l.kind.amp_class() {
            AmpClass::BatchNorm if keep_bn_fp32 => 4,
            _ => width(model_dt),
        };
        // Value and gradient in the model's dtype; masters and optimizer state in fp32.
        let param_bytes = mul(&[params, 2 * dt_bytes]).ok_or_else(err)?;
        let fp32_state = u128::from(masters) + state_per_param;
        let state_bytes = mul(&[params, 4, fp32_state]).ok_or_else(err)?;
        let sizes =
            MemoryArgs { in_shape: &l.in_shape, out_shape: &l.out_shape, act, batch, threads, on_gpu };
        let saved_bytes = l.kind.saved_bytes(&sizes).and_then(|s| mul(&[s, batch])).ok_or_else(err)?;
        let io = numel_in.max(numel_out);
        let scratch_bytes = l.kind.scratch_bytes(&sizes).ok_or_else(err)?;
        let share = [param_bytes, state_bytes, saved_bytes, scratch_bytes]
            .iter()
            .try_fold(0u128, |a, &b| a.checked_add(b))
            .ok_or_else(err)?;
        weights = weights.checked_add(param_bytes).ok_or_else(err)?;
        fp32_params = fp32_params.checked_add(state_bytes).ok_or_else(err)?;
        saved = saved.checked_add(saved_bytes).ok_or_else(err)?;
        largest_io = largest_io.max(io);
        scratch = scratch.max(scratch_bytes);
        if largest.as_ref().is_none_or(|s| share > s.bytes) {
            largest = Some(LayerShare {
                key: l.key.clone(),
                name: l.name.clone(),
                repr: l.kind.to_string(),
                bytes: share,
            });
        }
    }
    let io_err = || size_err(&file, "data.batch_size");
    // The output being made and the gradient flowing back, next to what is saved.
    let live = mul(&[largest_io, batch, 4, 2]).ok_or_else(io_err)?;
    let activations = saved.checked_add(live).ok_or_else(io_err)?;
    let eval = mul(&[largest_io, eval_batch, 4, 2]).ok_or_else(|| size_err(&file, "data.eval_batch_size"))?;

    let mut dims: Vec<u128> = cfg.model.input_shape.iter().map(|&d| d as u128).collect();
    dims.push(4);
    let shape_bytes = mul(&dims).ok_or_else(|| size_err(&file, "model.input_shape"))?;
    let sample = match m.sample_numel {
        Some(n) if cfg.data.dataset != DatasetKind::Text => u128::from(n) * 4,
        _ => shape_bytes,
    };
    let data_key = match cfg.data.dataset {
        DatasetKind::Synthetic => "data.synthetic_train_size",
        DatasetKind::Mnist
        | DatasetKind::FashionMnist
        | DatasetKind::Cifar10
        | DatasetKind::Cifar100
        | DatasetKind::Npz
        | DatasetKind::Text => "data.path",
    };
    // Normalized f32 pixels and a u32 label per sample (MNIST also holds the
    // file's bytes while decoding); text (whose "samples" are its bytes) the
    // bytes read, the decoded string and a u32 per token.
    let samples = u128::from(m.train_samples) + u128::from(m.test_samples);
    let per_sample = if cfg.data.dataset == DatasetKind::Text { 9 } else { sample + 4 };
    let dataset = mul(&[samples, per_sample]).ok_or_else(|| size_err(&file, data_key))?;
    let prefetch = mul(&[cfg.data.prefetch as u128 + 2, batch, sample])
        .ok_or_else(|| size_err(&file, "data.prefetch"))?;
    let data = Part { what: "dataset", bytes: dataset, key: Some(data_key) };
    let prefetch_part = Part { what: "prefetch", bytes: prefetch, key: Some("data.prefetch") };
    let ckpt_on = cfg.checkpoint.periodic();
    // A save serializes the weights and the optimizer state once more; DDP's
    // buckets hold one more copy of the gradients.
    let checkpoint = if ckpt_on { weights / 2 + fp32_params } else { 0 };
    let buckets = if m.world_size > 1 { weights / 2 } else { 0 };

    let mut host = vec![part("process", PROCESS_BYTES), data.clone()];
    let model_parts = [
        part("parameters+grads", weights),
        part("masters+optimizer", fp32_params),
        part("activations", activations),
        part("scratch", scratch),
        Part { what: "eval batch", bytes: eval, key: Some("data.eval_batch_size") },
        part("ddp buckets", buckets),
    ];
    let device = if on_gpu {
        // The device holds the model and a copy of the dataset; the host
        // keeps its dataset, a staging batch and a copy of the weights for logging and saves.
        let mut d = model_parts.to_vec();
        d.push(data);
        host.push(part("weights copy", weights / 2 + fp32_params));
        host.push(prefetch_part);
        Some(d)
    } else {
        host.extend(model_parts);
        host.push(prefetch_part);
        host.push(part("checkpoint", checkpoint));
        None
    };
    Ok(Estimate { host, device, largest_layer: largest })
}

/// The limit an estimate is held to, and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub bytes: u128,
    pub source: String,
}

/// Refuses the run when the estimate does not fit: `procs` processes of this
/// run share the limit (local ranks on one host, or on one GPU).
pub fn check_fits(
    cfg: &Config,
    est: &Estimate,
    host: &Limit,
    host_procs: u64,
    device: Option<(&Limit, u64)>,
) -> Result<()> {
    let file = cfg.config_path.display().to_string();
    let mut sides = vec![("host", est.host_total(), host, host_procs)];
    if let (Some(total), Some((limit, procs))) = (est.device_total(), device) {
        sides.push(("device", total, limit, procs));
    }
    for (side, need, limit, procs) in sides {
        let all = need.saturating_mul(u128::from(procs.max(1)));
        if all <= limit.bytes {
            continue;
        }
        let ranks = if procs > 1 { format!(" x {procs} processes") } else { String::new() };
        let parts = if side == "host" { &est.host } else { est.device.as_deref().unwrap_or(&[]) };
        // The key to change: the largest layer's, unless a part sized by a
        // key of its own (the dataset, the prefetch, the eval batch) is larger.
        let keyed = parts.iter().filter(|p| p.key.is_some()).max_by_key(|p| p.bytes);
        let layer_bytes = est.largest_layer.as_ref().map_or(0, |l| l.bytes);
        let biggest = keyed.filter(|p| p.bytes > layer_bytes);
        let layer = est.largest_layer.as_ref().map_or(String::new(), |l| {
            format!("the largest layer is {} ({}): {}", l.name, l.repr, bytes(l.bytes))
        });
        let (key, why) = match (biggest.and_then(|p| p.key.map(|k| (k, p))), &est.largest_layer) {
            (Some((k, p)), _) => (k.to_owned(), format!("{} takes {}; {layer}", p.what, bytes(p.bytes))),
            (None, Some(l)) => (l.key.clone(), layer),
            (None, None) => ("model.layers".to_owned(), layer),
        };
        let list: Vec<String> =
            parts.iter().filter(|p| p.bytes > 0).map(|p| format!("{} {}", p.what, bytes(p.bytes))).collect();
        return Err(Error::config(
            file,
            key,
            format!(
                "the run needs an estimated {}{ranks} of {side} memory but {} are available ({}); {why} \
                 [{}]; make the model or data.batch_size smaller",
                bytes(need),
                bytes(limit.bytes),
                limit.source,
                list.join(", ")
            ),
        ));
    }
    Ok(())
}

/// `run.max_memory_gb` as a limit, when set (GB = 2^30 bytes, as `free -g`).
pub fn user_limit(cfg: &Config) -> Option<Limit> {
    let gb = cfg.run.max_memory_gb?;
    // Validation keeps it finite and positive; the cast saturates.
    let bytes = (gb * (1u64 << 30) as f64) as u128;
    Some(Limit { bytes, source: format!("run.max_memory_gb = {gb}") })
}

/// The smaller of two limits (an unset one loses).
pub fn tighter(a: Limit, b: Option<Limit>) -> Limit {
    match b {
        Some(b) if b.bytes < a.bytes => b,
        _ => a,
    }
}

/// Whether `run.device` puts this run on a GPU (device memory estimate).
pub fn wants_gpu(cfg: &Config, visible: usize) -> bool {
    match cfg.run.device {
        Device::Cpu => false,
        Device::Auto | Device::Cuda => visible > 0,
    }
}
