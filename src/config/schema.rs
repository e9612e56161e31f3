//! The config schema: one struct per `[section]`, PyTorch names and defaults.
//!
//! Every struct denies unknown keys so a typo is an error, not a silently
//! ignored setting. Defaults that depend on other values (run.name, run.out_dir,
//! data.eval_batch_size, optimizer.weight_decay) are filled in by `load` before
//! deserialization, so the fields themselves are plain values.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::layers::LayerConfig;

/// The whole resolved config. Build it with [`super::load`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub run: RunConfig,
    pub model: ModelConfig,
    pub data: DataConfig,
    pub optimizer: OptimizerConfig,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    #[serde(default)]
    pub train: TrainConfig,
    #[serde(default)]
    pub amp: AmpConfig,
    #[serde(default)]
    pub parallel: ParallelConfig,
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    #[serde(default)]
    pub logging: LoggingConfig,
    #[serde(default)]
    pub expect: Expect,
    /// The file the config was loaded from, so later errors can name it.
    #[serde(skip)]
    pub config_path: PathBuf,
}

/// The `[section]` names of [`Config`], as `DDPTRAIN_<SECTION>__<KEY>` variables spell them.
pub const SECTIONS: [&str; 11] = [
    "run",
    "model",
    "data",
    "optimizer",
    "scheduler",
    "train",
    "amp",
    "parallel",
    "checkpoint",
    "logging",
    "expect",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Defaults to the config file's stem.
    pub name: String,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub device: Device,
    /// Defaults to `runs/<name>`.
    pub out_dir: PathBuf,
    /// Remove the previous run's files from `out_dir` first and train from
    /// step 0 (Hugging Face's `overwrite_output_dir`); without it a run into
    /// an out_dir holding a run it would not continue is refused.
    #[serde(default)]
    pub overwrite: bool,
    /// Refuse the run when its memory estimate (per process, on the host and
    /// on the GPU) is above this many GiB; without it, the machine's total
    /// memory (and the GPU's) is the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_gb: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CUDA when a GPU is visible, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Per-sample input shape: `[C, H, W]` for images, `[block_size]` for text.
    pub input_shape: Vec<usize>,
    pub layers: Vec<LayerConfig>,
    /// Blocks defined once and used by name in `layers` (`config::blocks`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub blocks: super::blocks::Blocks,
    /// Start from these weights (safetensors, PyTorch state_dict names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    #[serde(default)]
    pub dataset: DatasetKind,
    #[serde(default = "default_data_path")]
    pub path: PathBuf,
    /// Samples per rank per step (like DataLoader's batch_size under DDP).
    pub batch_size: usize,
    /// Defaults to `batch_size`.
    pub eval_batch_size: usize,
    #[serde(default = "yes")]
    pub shuffle: bool,
    #[serde(default)]
    pub drop_last: bool,
    #[serde(default = "default_mean", serialize_with = "short_f32::vec")]
    pub mean: Vec<f32>,
    #[serde(default = "default_std", serialize_with = "short_f32::vec")]
    pub std: Vec<f32>,
    /// Batches prepared ahead by the loader thread.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
    #[serde(default = "default_num_classes")]
    pub num_classes: usize,
    #[serde(default = "default_synthetic_train_size")]
    pub synthetic_train_size: usize,
    #[serde(default = "default_synthetic_test_size")]
    pub synthetic_test_size: usize,
    /// How `dataset = "npz"` stores `x`: `[N, C, H, W]` or `[N, H, W, C]`.
    #[serde(default, skip_serializing_if = "Layout::is_nchw")]
    pub layout: Layout,
    /// torchvision's `RandomCrop`, on training samples only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_crop: Option<RandomCrop>,
    /// torchvision's `RandomHorizontalFlip(p)`, on training samples only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_horizontal_flip: Option<f64>,
    /// `dataset = "text"`: `"bytes"` (default) or `"chars"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<crate::data::text::VocabKind>,
    /// `dataset = "text"`: the share of the tokens, at the end, held out
    /// for validation (default 0.1, as nanoGPT's prepare.py).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_fraction: Option<f64>,
}

impl DataConfig {
    /// Whether any training-time augmentation is configured.
    pub fn augments(&self) -> bool {
        self.random_crop.is_some() || self.random_horizontal_flip.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    #[default]
    Mnist,
    /// torchvision's `FashionMNIST`: the IDX files of scripts/fetch-fashion-mnist.sh.
    #[serde(rename = "fashion_mnist")]
    FashionMnist,
    Cifar10,
    Cifar100,
    /// `train.npz` / `test.npz` with arrays `x` and `y`.
    Npz,
    Synthetic,
    /// A UTF-8 text file, or the `*.txt` files under a directory, as tokens (`data::text`).
    Text,
}

impl DatasetKind {
    /// The dataset's default `data.path`.
    pub fn default_path(self) -> &'static str {
        match self {
            DatasetKind::Mnist | DatasetKind::Synthetic => "data/mnist",
            DatasetKind::FashionMnist => "data/fashion-mnist",
            DatasetKind::Cifar10 => "data/cifar10",
            DatasetKind::Cifar100 => "data/cifar100",
            DatasetKind::Npz => "data/npz",
            DatasetKind::Text => "data/sotu",
        }
    }

    /// The usual `transforms.Normalize` statistics of the dataset, when it
    /// has fixed channels.
    pub fn default_normalize(self) -> Option<(&'static [f32], &'static [f32])> {
        match self {
            DatasetKind::Mnist | DatasetKind::Synthetic => Some((&[0.1307], &[0.3081])),
            DatasetKind::FashionMnist => Some((&[0.2860], &[0.3530])),
            DatasetKind::Cifar10 => Some((&[0.4914, 0.4822, 0.4465], &[0.2470, 0.2435, 0.2616])),
            DatasetKind::Cifar100 => Some((&[0.5071, 0.4865, 0.4409], &[0.2673, 0.2564, 0.2762])),
            DatasetKind::Npz | DatasetKind::Text => None,
        }
    }

    /// The dataset's class count, when it is fixed.
    pub fn classes(self) -> Option<usize> {
        match self {
            DatasetKind::Mnist | DatasetKind::FashionMnist | DatasetKind::Cifar10 => Some(10),
            DatasetKind::Cifar100 => Some(100),
            DatasetKind::Npz | DatasetKind::Synthetic | DatasetKind::Text => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    #[default]
    Nchw,
    Nhwc,
}

impl Layout {
    fn is_nchw(&self) -> bool {
        *self == Layout::Nchw
    }
}

/// `transforms.RandomCrop(size, padding=padding, fill=fill)` (constant padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomCrop {
    /// The square crop's side.
    pub size: usize,
    /// Pixels added on each side before cropping.
    #[serde(default)]
    pub padding: usize,
    /// The padding's raw pixel value 0..=255, as for a uint8 image.
    #[serde(default)]
    pub fill: u8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    #[serde(default)]
    pub name: OptimizerName,
    pub lr: f64,
    #[serde(default)]
    pub momentum: f64,
    #[serde(default)]
    pub dampening: f64,
    #[serde(default)]
    pub nesterov: bool,
    /// Defaults to 0.0 for sgd/adam and 0.01 for adamw, as in PyTorch.
    pub weight_decay: f64,
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    #[serde(default = "default_adam_eps")]
    pub eps: f64,
    /// Weight decay applies to parameters of at least this many dimensions
    /// (nanoGPT's groups: 2, so matmul and embedding weights decay, biases
    /// and layernorm weights do not). Default 2 for `dataset = "text"`, 0
    /// (every parameter, as `model.parameters()`) otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay_min_dim: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    #[default]
    Sgd,
    Adam,
    #[serde(rename = "adamw")]
    AdamW,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    #[serde(default)]
    pub name: SchedulerName,
    /// Linear warmup from 0 to lr over this many optimizer steps.
    #[serde(default)]
    pub warmup_steps: u64,
    /// Optimizer steps between decays (StepLR's step_size, counted in steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size: Option<u64>,
    #[serde(default = "default_gamma")]
    pub gamma: f64,
    /// Cosine floor; cosine decays over the steps left after warmup.
    #[serde(default)]
    pub eta_min: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            name: SchedulerName::default(),
            warmup_steps: 0,
            step_size: None,
            gamma: default_gamma(),
            eta_min: 0.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerName {
    #[default]
    Constant,
    Step,
    Cosine,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Training stops at whichever of `epochs` / `max_steps` comes first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// torch.nn.utils.clip_grad_norm_ max_norm (L2), applied after unscaling.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "short_f32::option")]
    pub grad_clip_norm: Option<f32>,
    #[serde(default = "default_one")]
    pub grad_accum_steps: u64,
    /// Text: the validation loss every this many optimizer steps (and at
    /// the end; nanoGPT's `eval_interval`); `None` evaluates after each epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<u64>,
    /// Text: batches of `data.eval_batch_size` windows the validation loss
    /// is the mean over (nanoGPT's `eval_iters`, default 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_iters: Option<u64>,
}

impl TrainConfig {
    /// nanoGPT's `eval_iters` default.
    pub fn eval_iters(&self) -> u64 {
        self.eval_iters.unwrap_or(200)
    }
}

impl DataConfig {
    pub fn val_fraction(&self) -> f64 {
        self.val_fraction.unwrap_or(0.1)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmpConfig {
    #[serde(default)]
    pub opt_level: OptLevel,
    /// apex overrides of the opt level's table; `None` keeps the table's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_batchnorm_fp32: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_weights: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScale>,
    /// Dynamic loss scaler settings (torch GradScaler / apex names); `None`
    /// keeps the default. Only meaningful when loss_scale resolves to "dynamic".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_scale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_interval: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_loss_scale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loss_scale: Option<f64>,
    /// fp32 GEMMs on the GPU may use TF32 tensor cores (PyTorch's
    /// `torch.backends.cuda.matmul.allow_tf32`); off by default, so O0 is
    /// plain fp32. Left out of the resolved config while false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_tf32: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OptLevel {
    #[default]
    O0,
    O1,
    O2,
    O3,
}

impl std::fmt::Display for OptLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            OptLevel::O0 => "O0",
            OptLevel::O1 => "O1",
            OptLevel::O2 => "O2",
            OptLevel::O3 => "O3",
        })
    }
}

/// apex's `loss_scale`: "dynamic" or a fixed number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    Dynamic,
    Static(f64),
}

impl Serialize for LossScale {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LossScale::Dynamic => s.serialize_str("dynamic"),
            LossScale::Static(v) => s.serialize_f64(*v),
        }
    }
}

impl<'de> Deserialize<'de> for LossScale {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = LossScale;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"dynamic\" or a positive number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LossScale, E> {
                match v {
                    "dynamic" => Ok(LossScale::Dynamic),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<LossScale, E> {
                Ok(LossScale::Static(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<LossScale, E> {
                Ok(LossScale::Static(v as f64))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<LossScale, E> {
                Ok(LossScale::Static(v as f64))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    #[serde(default)]
    pub backend: Backend,
    /// Rendezvous address when MASTER_ADDR is not set (a launcher's MASTER_ADDR wins, as with torchrun).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_port: Option<u16>,
    /// Every collective and rendezvous wait gives up after this long.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
    #[serde(default = "default_bucket_cap_mb")]
    pub bucket_cap_mb: f64,
    #[serde(default = "default_first_bucket_mb")]
    pub first_bucket_mb: f64,
    #[serde(default)]
    pub sync_batchnorm: bool,
    #[serde(default = "yes")]
    pub broadcast_buffers: bool,
    #[serde(default = "default_one_f64")]
    pub gradient_predivide_factor: f64,
    #[serde(default)]
    pub allreduce_fp32: bool,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            backend: Backend::default(),
            master_addr: None,
            master_port: None,
            timeout_s: default_timeout_s(),
            bucket_cap_mb: default_bucket_cap_mb(),
            first_bucket_mb: default_first_bucket_mb(),
            sync_batchnorm: false,
            broadcast_buffers: true,
            gradient_predivide_factor: 1.0,
            allreduce_fp32: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// NCCL on CUDA devices, TCP on the CPU.
    #[default]
    Auto,
    Nccl,
    Tcp,
    /// The collectives of the MPI library `mpirun` belongs to (cargo feature `mpi`; src/dist/mpi.rs).
    Mpi,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// 0 = off.
    #[serde(default)]
    pub every_steps: u64,
    /// 0 = off.
    #[serde(default)]
    pub every_epochs: u64,
    /// Minutes of wall time between timed saves, as rank 0's clock measures
    /// them since the run's start or its last save (0 = off): on by default,
    /// so a killed run loses at most this much.
    #[serde(default = "default_every_minutes")]
    pub every_minutes: f64,
    #[serde(default = "default_keep_last")]
    pub keep_last: usize,
    #[serde(default)]
    pub resume: Resume,
    /// Whether a resume may change settings that alter what the run computed
    /// so far (the model's data, optimizer, batch, world size, seed, ...).
    #[serde(default)]
    pub resume_changes: ResumeChanges,
}

impl CheckpointConfig {
    /// Whether the run saves checkpoints of its own accord (a signal's stop saves regardless).
    pub fn periodic(&self) -> bool {
        self.every_steps > 0 || self.every_epochs > 0 || self.every_minutes > 0.0
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            every_steps: 0,
            every_epochs: 0,
            every_minutes: default_every_minutes(),
            keep_last: default_keep_last(),
            resume: Resume::default(),
            resume_changes: ResumeChanges::default(),
        }
    }
}

/// `"refuse"`: a resume with settings that change the math so far is
/// refused, naming them; `"allow"`: it goes on with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResumeChanges {
    #[default]
    Refuse,
    Allow,
}

/// `"auto"` resumes from `<out_dir>/ckpt/latest` when it exists, `"never"`
/// starts fresh, anything else is a checkpoint directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Resume {
    #[default]
    Auto,
    Never,
    Path(PathBuf),
}

impl Serialize for Resume {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Resume::Auto => s.serialize_str("auto"),
            Resume::Never => s.serialize_str("never"),
            Resume::Path(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Resume {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "auto" => Resume::Auto,
            "never" => Resume::Never,
            _ => Resume::Path(PathBuf::from(s)),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    #[serde(default = "default_log_every")]
    pub every_steps: u64,
    #[serde(default)]
    pub progress: ProgressSetting,
    #[serde(default = "yes")]
    pub tensorboard: bool,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            every_steps: default_log_every(),
            progress: ProgressSetting::default(),
            tensorboard: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressSetting {
    /// A progress bar when stderr is a terminal.
    #[default]
    Auto,
    Always,
    Never,
}

/// Gates checked at the end of training; a miss makes the run exit non-zero.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Fraction in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_test_accuracy: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_final_loss: Option<f64>,
    /// `dataset = "text"`: the largest final validation loss (nats per token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_val_loss: Option<f64>,
    /// Most optimizer steps the dynamic loss scaler may skip on overflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_overflow_steps: Option<u64>,
}

/// Writes f32 values by their shortest decimal form (0.1307, not
/// 0.1307000070810318, which is what widening to f64 would print).
pub(crate) mod short_f32 {
    use serde::Serializer;

    fn widen(v: f32) -> f64 {
        // The shortest round-trip text of an f32 always parses as an f64.
        v.to_string().parse().unwrap_or(v as f64)
    }
    pub(crate) fn one<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(widen(*v))
    }
    pub(crate) fn vec<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| widen(*x)))
    }
    pub(crate) fn option<S: Serializer>(v: &Option<f32>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.serialize_some(&widen(*x)),
            None => s.serialize_none(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_one() -> u64 {
    1
}
fn default_one_f64() -> f64 {
    1.0
}
fn default_data_path() -> PathBuf {
    PathBuf::from("data/mnist")
}
pub(crate) fn default_mean() -> Vec<f32> {
    vec![0.1307]
}
pub(crate) fn default_std() -> Vec<f32> {
    vec![0.3081]
}
fn default_prefetch() -> usize {
    4
}
fn default_num_classes() -> usize {
    10
}
fn default_synthetic_train_size() -> usize {
    8000
}
fn default_synthetic_test_size() -> usize {
    2000
}
pub(crate) fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}
pub(crate) fn default_adam_eps() -> f64 {
    1e-8
}
fn default_gamma() -> f64 {
    0.1
}
fn default_timeout_s() -> u64 {
    300
}
fn default_bucket_cap_mb() -> f64 {
    25.0
}
fn default_first_bucket_mb() -> f64 {
    1.0
}
fn default_every_minutes() -> f64 {
    10.0
}
fn default_keep_last() -> usize {
    3
}
fn default_log_every() -> u64 {
    50
}
