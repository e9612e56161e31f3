//! The training run: set up from a validated [`Config`] (data, model, DDP,
//! the step plan, apex's amp.initialize, resume), then one loop for every
//! device ([`run`]) over the device's [`engine::Engine`]: [`cpu::CpuEngine`]
//! or [`cuda::CudaEngine`].

mod active_wait;
mod cpu;
pub mod cuda;
mod ddp;
mod dry_run;
pub mod engine;
mod eval;
pub mod expect;
mod records;
mod run;
pub mod stop;
pub mod trace;

pub use ddp::Ddp;
pub use dry_run::dry_run;
pub use eval::{evaluate, evaluate_shard, EvalResult};
pub use trace::RunOptions;

use crate::amp;
use crate::config::{self, Config};
use crate::data::{self, Dataset, DistributedSampler, Normalize, Split};
use crate::error::{Error, Result};
use crate::nn::Model;
use crate::optim::{LrSchedule, Optimizer, OptimizerKind, ScheduleKind};
use std::path::PathBuf;
use std::sync::Arc;

/// What `summary.json` holds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub name: String,
    /// Mean training loss over the last logging interval (at most `logging.every_steps` steps).
    pub final_loss: f64,
    pub test_accuracy: Option<f64>,
    pub test_loss: Option<f64>,
    /// `dataset = "text"`: the last validation loss (mean nats per token
    /// over `train.eval_iters` batches) and its exponential.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// The step of the evaluation those figures come from (a run stopped
    /// by a signal reports its last one, which may be steps back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_step: Option<u64>,
    /// Training images (text: windows) per second over all ranks, counting training steps only (not evaluation).
    pub images_per_s: f64,
    /// `dataset = "text"`: `images_per_s` times `block_size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// DDP only: mean share of gradient all-reduce time hidden behind backward.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allreduce_hidden_fraction: Option<f64>,
    pub steps: u64,
    /// Full passes over the training set (a run that stops inside an epoch
    /// does not count it).
    pub epochs: u64,
    /// Wall time over every segment of the run (each resumed one's up to
    /// the checkpoint it resumed from: what a killed run redid is not counted twice).
    pub wall_s: f64,
    /// A resumed run: the step its last segment resumed after, and that
    /// segment's own figures (`images_per_s` and `wall_s` are the whole run's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from_step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_segment: Option<records::Segment>,
    pub opt_level: String,
    pub world_size: usize,
    pub device: String,
    pub num_params: usize,
    pub weights: PathBuf,
    /// Checkpoint directories this process wrote and `keep_last` kept.
    pub checkpoints: Vec<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<PathBuf>,
    /// Why `--check-trace` stopped the run, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_divergence: Option<String>,
    /// The loss scale at the end of the run (1 without loss scaling).
    pub loss_scale: f32,
    /// Optimizer steps skipped because the gradients overflowed.
    pub overflow_steps: u64,
    /// The first optimizer step's training loss (mean over ranks), to set
    /// against `final_loss`; `loss_decreased` says whether training made
    /// progress (the bar O3 is held to).
    pub initial_loss: f64,
    pub loss_decreased: bool,
    /// The signal that stopped the run after optimizer step `steps`, with a
    /// checkpoint of that step to resume from; absent when the run completed.
    /// No evaluation ran on the way out: `test_accuracy` and `test_loss` are
    /// the last epoch's, if one ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<stop::StopSignal>,
    /// Each `[expect]` gate's verdict; the binary exits 3 when one failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<expect::Verdict>,
    /// This process's rank: rank 0 reports the run (`done:`, the gates'
    /// verdicts) for the job, as it writes its files.
    #[serde(skip)]
    pub rank: usize,
    /// The `train.log` the closing lines go to: rank 0's, when this process
    /// trained (a finished run run again writes nothing).
    #[serde(skip)]
    pub log: Option<PathBuf>,
}

/// Everything loaded and checked before anything is written to `out_dir`.
pub struct Prepared {
    pub model: Model,
    pub train_ds: Arc<Dataset>,
    pub test_ds: Arc<Dataset>,
}

/// The device `run.device` picks for this rank (`LOCAL_RANK` among the
/// visible GPUs), with the one warning line of an "auto" fallback.
fn select_device(cfg: &Config) -> Result<crate::cuda::select::Device> {
    let local_rank = crate::dist::DistEnv::from_process(&cfg.parallel)?.local_rank;
    let name = match cfg.run.device {
        config::Device::Auto => "auto",
        config::Device::Cpu => "cpu",
        config::Device::Cuda => "cuda",
    };
    let (device, warning) = crate::cuda::select::select_device(name, local_rank)?;
    if let Some(w) = warning {
        crate::errln!("{w}");
    }
    Ok(device)
}

/// The train and validation windows of `dataset = "text"`: the training
/// split's samples per epoch are its tokens over `block_size` (an epoch
/// reads about as many tokens as the split holds), the validation split's
/// `train.eval_iters` batches of `data.eval_batch_size`.
fn load_text(cfg: &Config) -> Result<(Arc<Dataset>, Arc<Dataset>)> {
    let d = &cfg.data;
    let block_size = cfg.model.input_shape.first().copied().unwrap_or(0);
    let corpus = data::text::load(&d.path, d.vocab.unwrap_or_default(), d.val_fraction(), block_size)?;
    let eval_windows = usize::try_from(cfg.train.eval_iters())
        .ok()
        .and_then(|n| n.checked_mul(d.eval_batch_size))
        .ok_or_else(|| {
            Error::config(
                cfg.config_path.display().to_string(),
                "train.eval_iters",
                "times data.eval_batch_size overflows",
            )
        })?;
    let split = |tokens: &Arc<Vec<u32>>, count: usize, split: Split| Dataset {
        images: Vec::new(),
        labels: Vec::new(),
        sample_shape: vec![block_size],
        num_classes: corpus.vocab.size(),
        text: Some(data::text::Windows {
            tokens: Arc::clone(tokens),
            vocab: Arc::clone(&corpus.vocab),
            block_size,
            count,
            seed: cfg.run.seed,
            split,
        }),
    };
    let per_epoch = (corpus.train.len() / block_size.max(1)).max(1);
    let train = split(&corpus.train, per_epoch, Split::Train);
    let val = split(&corpus.val, eval_windows, Split::Test);
    Ok((Arc::new(train), Arc::new(val)))
}

/// The model's logits must cover the text's vocabulary (more is allowed, as
/// nanoGPT pads GPT-2's to 50304).
fn check_vocab(cfg: &Config, resolved: &[config::model::ResolvedLayer], ds: &Dataset) -> Result<()> {
    let Some(text) = &ds.text else { return Ok(()) };
    let Some(last) = resolved.last() else { return Ok(()) };
    let logits = last.out_shape.last().copied().unwrap_or(0);
    let need = text.vocab.size();
    if logits < need {
        return Err(Error::config(
            cfg.config_path.display().to_string(),
            format!("{}.out_features", last.key),
            format!(
                "the model outputs {logits} logits but the text in {} has {need} distinct tokens (data.vocab = \"{}\"); set the vocabulary size to at least {need}",
                cfg.data.path.display(),
                cfg.data.vocab.unwrap_or_default().name()
            ),
        ));
    }
    Ok(())
}

pub fn load_datasets(cfg: &Config) -> Result<(Arc<Dataset>, Arc<Dataset>)> {
    let d = &cfg.data;
    if d.dataset == config::DatasetKind::Text {
        return load_text(cfg);
    }
    let [c, h, w] = cfg.model.input_shape[..] else {
        return Err(Error::internal("validation let through an image input_shape that is not [C, H, W]"));
    };
    let norm = Normalize::broadcast(&d.mean, &d.std, c);
    let load = |split: Split| -> Result<Dataset> {
        use config::DatasetKind as K;
        match d.dataset {
            K::Mnist => data::load_idx(data::IdxSet::Mnist, &d.path, split, &norm),
            K::FashionMnist => data::load_idx(data::IdxSet::FashionMnist, &d.path, split, &norm),
            K::Cifar10 => data::cifar::load(&d.path, data::cifar::Cifar::Ten, split, &norm),
            K::Cifar100 => data::cifar::load(&d.path, data::cifar::Cifar::Hundred, split, &norm),
            K::Npz => {
                let nhwc = d.layout == config::Layout::Nhwc;
                data::npz::load(&d.path, split, &norm, nhwc, d.num_classes)
            }
            K::Text => Err(Error::internal("text is loaded by load_text")),
            K::Synthetic => {
                let n = if split == Split::Train { d.synthetic_train_size } else { d.synthetic_test_size };
                Ok(data::synthetic(cfg.run.seed, split, n, [c, h, w], d.num_classes))
            }
        }
    };
    let train = load(Split::Train)?;
    let test = load(Split::Test)?;
    for (ds, split) in [(&train, Split::Train), (&test, Split::Test)] {
        check_split(cfg, split, &ds.sample_shape, ds.labels.iter().max().copied())?;
    }
    Ok((Arc::new(train), Arc::new(test)))
}

/// A split's images against `model.input_shape`, its largest label against
/// `data.num_classes`.
fn check_split(cfg: &Config, split: Split, sample_shape: &[usize], max_label: Option<u32>) -> Result<()> {
    let d = &cfg.data;
    let file = cfg.config_path.display().to_string();
    let split = if split == Split::Train { "train" } else { "test" };
    if sample_shape != cfg.model.input_shape {
        return Err(Error::config(
            file,
            "model.input_shape",
            format!(
                "is {:?} but the {split} images in {} are {sample_shape:?}",
                cfg.model.input_shape,
                d.path.display(),
            ),
        ));
    }
    // The model has data.num_classes logits: a larger label has no logit to score.
    if let Some(top) = max_label.filter(|&top| top as usize >= d.num_classes) {
        return Err(Error::config(
            file,
            "data.num_classes",
            format!(
                "is {} but the {split} labels in {} go up to {top}; set it to at least {}",
                d.num_classes,
                d.path.display(),
                u64::from(top) + 1
            ),
        ));
    }
    Ok(())
}

/// The run's training-time transforms, `None` when the config has none.
pub fn augmentation(cfg: &Config) -> Option<Arc<data::Augment>> {
    let d = &cfg.data;
    if !d.augments() {
        return None;
    }
    let channels = cfg.model.input_shape.first().copied().unwrap_or(1);
    let norm = Normalize::broadcast(&d.mean, &d.std, channels);
    Some(Arc::new(data::Augment {
        seed: cfg.run.seed,
        crop: d.random_crop.map(|c| data::Crop::new(c.size, c.padding, c.fill, &norm)),
        flip: d.random_horizontal_flip,
    }))
}

/// Builds the model and loads the data; fails before writing anything.
pub fn prepare(cfg: &Config) -> Result<Prepared> {
    config::preflight(cfg)?;
    let resolved = config::model::resolve(&cfg.model)?;
    let mut model = Model::new(&resolved, cfg.run.seed)?;
    if let Some(path) = &cfg.model.init_from {
        let entries = crate::checkpoint::load_safetensors(path)?;
        model.load_state_dict(entries, path)?;
    }
    let (train_ds, test_ds) = load_datasets(cfg)?;
    check_vocab(cfg, &resolved, &train_ds)?;
    Ok(Prepared { model, train_ds, test_ds })
}

/// A run set up and, when a checkpoint says so, resumed: what the CPU and
/// the GPU loops share before their first step.
pub(crate) struct Started {
    pub model: Model,
    pub train_ds: Arc<Dataset>,
    pub test_ds: Arc<Dataset>,
    pub ddp: Ddp,
    pub plan: RunPlan,
    pub optimizer: Optimizer,
    pub ckpt: crate::checkpoint::Checkpointer,
    pub amp: amp::Amp,
    pub resumed: Option<crate::checkpoint::TrainProgress>,
}

/// Loads, joins the job, plans the steps, applies apex's amp.initialize and
/// resumes from a checkpoint when there is one.
pub(crate) fn start(cfg: &Config, opts: &RunOptions) -> Result<Started> {
    let Prepared { mut model, train_ds, test_ds } = prepare(cfg)?;
    let ddp = Ddp::init(cfg, &mut model)?;
    // Each rank draws its own dropout masks (rng::Draws).
    model.draws.rank = ddp.rank() as u64;
    let plan = RunPlan::new(cfg, train_ds.len(), ddp.world_size(), ddp.rank())?;
    let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
    let min_dim = cfg.optimizer.weight_decay_min_dim.unwrap_or(match cfg.data.dataset {
        config::DatasetKind::Text => 2,
        _ => 0,
    });
    let decay: Vec<bool> = model.params().iter().map(|p| p.value.shape().len() >= min_dim).collect();
    let mut optimizer = Optimizer::new(optimizer_config(&cfg.optimizer), &sizes)?.with_decay_mask(&decay)?;
    let shape = crate::checkpoint::RunShape {
        world_size: ddp.world_size(),
        rank: ddp.rank(),
        steps_per_epoch: plan.steps_per_epoch,
        total_steps: plan.total_steps,
        train_samples: train_ds.len(),
        schedule: plan.schedule.clone(),
    };
    let mut ckpt = crate::checkpoint::Checkpointer::new(cfg, shape)
        .with_test_hooks(opts.save_pause, opts.halt_after_steps);
    // A text run's vocabulary goes with its weights, so evaluation and
    // generation decode as training encoded.
    if let Some(text) = &train_ds.text {
        ckpt = ckpt.with_file(data::text::VOCAB_FILE, text.vocab.to_json()?, true);
    }
    let resolved =
        format!("# The resolved config of the run that wrote this folder.\n{}", cfg.to_toml_string());
    ckpt = ckpt.with_file(config::CONFIG_FILE, resolved.into_bytes(), false);
    // apex's amp.initialize: cast the model, set up masters and the loss scaler.
    let policy = amp::Policy::resolve(&cfg.amp)?;
    let mut amp = amp::Amp::new(policy, amp::LossScaler::from_config(&cfg.amp)?, &mut model);
    // One run per out_dir: rank 0 claims it after every config check (a config
    // error writes nothing) and before the resume reads or anything writes:
    // it locks it, and refuses another run's files there unless the resume
    // continues them or run.overwrite removes them first.
    ckpt.claim(ddp.communicator())?;
    // After the cast, so the checkpoint's masters replace the ones the cast made.
    let resumed = ckpt.resume(&mut model, &mut optimizer, &mut amp, ddp.communicator())?;
    let mut plan = plan;
    if let (Some(r), Some(p)) = (ckpt.reshard(), resumed.as_ref()) {
        plan.reshard(cfg, p, r)?;
        ckpt.set_plan(plan.total_steps, plan.schedule.clone());
    }
    Ok(Started { model, train_ds, test_ds, ddp, plan, optimizer, ckpt, amp, resumed })
}

/// What an engine takes over from a started run.
struct EngineParts {
    model: Model,
    optimizer: Optimizer,
    amp: amp::Amp,
    train_ds: Arc<Dataset>,
    test_ds: Arc<Dataset>,
}

impl Started {
    /// The engine's share of the run and the loop's.
    fn split(self) -> (EngineParts, run::Setup) {
        let Started { model, train_ds, test_ds, ddp, plan, optimizer, ckpt, amp, resumed } = self;
        let setup = run::Setup {
            ddp,
            plan,
            ckpt,
            resumed,
            samples: (train_ds.len(), test_ds.len()),
            num_params: model.num_params(),
        };
        (EngineParts { model, optimizer, amp, train_ds, test_ds }, setup)
    }
}

pub fn train(cfg: &Config) -> Result<Summary> {
    train_with(cfg, &RunOptions::default())
}

/// [`train`] with the options of one invocation (traces, test hooks).
pub fn train_with(cfg: &Config, opts: &RunOptions) -> Result<Summary> {
    // Before the device is chosen: "cuda" without a GPU names the file and key.
    config::preflight(cfg)?;
    match select_device(cfg)? {
        crate::cuda::select::Device::Cuda(gpu) => {
            let (s, setup) = start(cfg, opts)?.split();
            let mut engine = cuda::CudaEngine::new(
                cfg,
                gpu,
                s.model,
                s.optimizer,
                s.amp,
                (&s.train_ds, &s.test_ds),
                &setup.ddp,
                setup.plan.accum,
                setup.resumed.is_some(),
            )?;
            run::run(cfg, opts, setup, &mut engine)
        }
        crate::cuda::select::Device::Cpu => {
            let train_cpu = || -> Result<Summary> {
                let (s, setup) = start(cfg, opts)?.split();
                let mut engine = cpu::CpuEngine::new(
                    cfg,
                    s.model,
                    s.optimizer,
                    s.amp,
                    s.train_ds,
                    s.test_ds,
                    setup.plan.accum,
                );
                run::run(cfg, opts, setup, &mut engine)
            };
            // The CPU loop runs on a worker of the pool its ops fork into, so
            // every op starts at once on this thread while the other workers
            // wake up to steal. Forked from outside the pool, each op first
            // waits for a sleeping worker, dozens of times a step (in a VM a
            // wake-up can take longer than MNIST's conv1). A pool per run
            // keeps in-process ranks from queueing behind each other's loops.
            match rayon::ThreadPoolBuilder::new().num_threads(rayon::current_num_threads()).build() {
                Ok(pool) => pool.install(train_cpu),
                Err(_) => train_cpu(),
            }
        }
    }
}

/// What the data and the config make of a run: the sampler, the steps and
/// the learning-rate schedule (the same on every device).
pub struct RunPlan {
    pub sampler: DistributedSampler,
    pub accum: usize,
    pub steps_per_epoch: u64,
    pub total_steps: u64,
    pub schedule: LrSchedule,
}

impl RunPlan {
    pub fn new(cfg: &Config, train_len: usize, world: usize, rank: usize) -> Result<RunPlan> {
        let d = &cfg.data;
        let sampler = DistributedSampler {
            len: train_len,
            num_replicas: world,
            rank,
            shuffle: d.shuffle,
            seed: cfg.run.seed,
            drop_last: d.drop_last,
        };
        let accum = cfg.train.grad_accum_steps.max(1) as usize;
        let n = sampler.num_samples();
        let batches_per_epoch = if d.drop_last { n / d.batch_size } else { n.div_ceil(d.batch_size) };
        let steps_per_epoch = (batches_per_epoch / accum) as u64;
        if steps_per_epoch == 0 {
            return Err(Error::config(
                cfg.config_path.display().to_string(),
                "data.batch_size",
                format!(
                    "{train_len} samples at batch_size {} x train.grad_accum_steps {accum} give no optimizer step per epoch",
                    d.batch_size
                ),
            ));
        }
        let by_epochs = match cfg.train.epochs {
            Some(e) => Some(e.checked_mul(steps_per_epoch).ok_or_else(|| {
                Error::config(
                    cfg.config_path.display().to_string(),
                    "train.epochs",
                    format!("{e} epochs of {steps_per_epoch} steps overflow the step count"),
                )
            })?),
            None => None,
        };
        let total_steps = match (by_epochs, cfg.train.max_steps) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => 0,
        };
        let schedule = lr_schedule(cfg, total_steps);
        schedule.validate()?;
        Ok(RunPlan { sampler, accum, steps_per_epoch, total_steps, schedule })
    }

    /// After a resume under another world size or batch (`r`): the run's
    /// length recounted from the checkpoint's step, as the rest of its epoch
    /// is dealt to this job and this job's epochs follow, and the schedule over it.
    pub fn reshard(
        &mut self,
        cfg: &Config,
        p: &crate::checkpoint::TrainProgress,
        r: crate::checkpoint::Reshard,
    ) -> Result<()> {
        let (bs, accum) = (cfg.data.batch_size.max(1), self.accum.max(1));
        let rest = self.sampler.indices_after(p.epoch, r.consumed).len();
        let batches = if cfg.data.drop_last { rest / bs } else { rest.div_ceil(bs) };
        // The epoch's micro-batches go on being numbered from the checkpoint's.
        let b = p.batches_in_epoch;
        let in_epoch = (b.saturating_add(batches) / accum - b / accum) as u64;
        let by_epochs = cfg.train.epochs.map(|e| match e.checked_sub(p.epoch + 1) {
            None => p.step,
            Some(later) => {
                p.step.saturating_add(in_epoch).saturating_add(later.saturating_mul(self.steps_per_epoch))
            }
        });
        self.total_steps = match (by_epochs, cfg.train.max_steps) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => 0,
        };
        self.schedule = lr_schedule(cfg, self.total_steps);
        self.schedule.validate()
    }
}

pub fn optimizer_config(o: &config::OptimizerConfig) -> crate::optim::OptimizerConfig {
    crate::optim::OptimizerConfig {
        kind: match o.name {
            config::OptimizerName::Sgd => OptimizerKind::Sgd,
            config::OptimizerName::Adam => OptimizerKind::Adam,
            config::OptimizerName::AdamW => OptimizerKind::AdamW,
        },
        lr: o.lr as f32,
        momentum: o.momentum as f32,
        dampening: o.dampening as f32,
        nesterov: o.nesterov,
        weight_decay: o.weight_decay as f32,
        betas: (o.betas[0] as f32, o.betas[1] as f32),
        eps: o.eps as f32,
    }
}

pub fn lr_schedule(cfg: &Config, total_steps: u64) -> LrSchedule {
    let s = &cfg.scheduler;
    LrSchedule {
        base_lr: cfg.optimizer.lr as f32,
        kind: match s.name {
            config::SchedulerName::Constant => ScheduleKind::Constant,
            // validate() guarantees step_size for the step schedule.
            config::SchedulerName::Step => {
                ScheduleKind::Step { step_size: s.step_size.unwrap_or(1).max(1), gamma: s.gamma as f32 }
            }
            config::SchedulerName::Cosine => ScheduleKind::Cosine { eta_min: s.eta_min as f32 },
        },
        warmup_steps: s.warmup_steps,
        total_steps,
    }
}
