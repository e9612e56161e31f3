//! The training run: set up from a validated [`Config`], then the step loop
//! (forward, loss, backward, optimizer step), evaluation after each epoch,
//! metrics, and the summary the `[expect]` gates judge.

mod ddp;
mod eval;
pub mod expect;
pub mod gpu;
pub mod trace;

pub use ddp::Ddp;
pub use eval::{evaluate, evaluate_shard, EvalResult};
pub use trace::RunOptions;

use crate::amp;
use crate::config::{self, Config};
use crate::data::{self, Dataset, DistributedSampler, Loader, Normalize, Split};
use crate::error::{Error, Result};
use crate::metrics::{self, MetricsWriter, Progress, ProgressMode};
use crate::nn::Model;
use crate::ops;
use crate::optim::{LrSchedule, Optimizer, OptimizerKind, ScheduleKind};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What `summary.json` holds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub name: String,
    /// Mean training loss over the last logging interval (at most `logging.every_steps` steps).
    pub final_loss: f64,
    pub test_accuracy: Option<f64>,
    pub test_loss: Option<f64>,
    /// Training images per second over all ranks, counting training steps only (not evaluation).
    pub images_per_s: f64,
    /// DDP only: mean share of gradient all-reduce time hidden behind backward.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allreduce_hidden_fraction: Option<f64>,
    pub steps: u64,
    pub epochs: u64,
    pub wall_s: f64,
    pub opt_level: String,
    pub world_size: usize,
    pub device: String,
    pub num_params: usize,
    pub weights: PathBuf,
    /// Checkpoint directories this process wrote.
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
    /// Mean training loss over the first logging interval, to set against
    /// `final_loss`; `loss_decreased` says whether training made progress
    /// (the bar O3 is held to).
    pub initial_loss: f64,
    pub loss_decreased: bool,
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
        eprintln!("{w}");
    }
    Ok(device)
}

pub fn load_datasets(cfg: &Config) -> Result<(Arc<Dataset>, Arc<Dataset>)> {
    let d = &cfg.data;
    let [c, h, w] = cfg.model.input_shape;
    let load = |split: Split| -> Result<Dataset> {
        match d.dataset {
            config::DatasetKind::Mnist => {
                let norm = Normalize { mean: d.mean.clone(), std: d.std.clone() };
                data::load_mnist(&d.path, split, &norm)
            }
            config::DatasetKind::Synthetic => {
                let n = if split == Split::Train { d.synthetic_train_size } else { d.synthetic_test_size };
                Ok(data::synthetic(cfg.run.seed, split, n, [c, h, w], d.num_classes))
            }
        }
    };
    let train = load(Split::Train)?;
    let test = load(Split::Test)?;
    for (ds, split) in [(&train, "train"), (&test, "test")] {
        if ds.sample_shape != [c, h, w] {
            return Err(Error::config(
                cfg.config_path.display().to_string(),
                "model.input_shape",
                format!("is {:?} but the {split} images are {:?}", [c, h, w], ds.sample_shape),
            ));
        }
    }
    Ok((Arc::new(train), Arc::new(test)))
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
    let plan = RunPlan::new(cfg, train_ds.len(), ddp.world_size(), ddp.rank())?;
    let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
    let mut optimizer = Optimizer::new(optimizer_config(&cfg.optimizer), &sizes)?;
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
    // apex's amp.initialize: cast the model, set up masters and the loss scaler.
    let policy = amp::Policy::resolve(&cfg.amp)?;
    let mut amp = amp::Amp::new(policy, amp::LossScaler::from_config(&cfg.amp)?, &mut model);
    // After the cast, so the checkpoint's masters replace the ones the cast made.
    let resumed = ckpt.resume(&mut model, &mut optimizer, &mut amp, ddp.communicator())?;
    Ok(Started { model, train_ds, test_ds, ddp, plan, optimizer, ckpt, amp, resumed })
}

pub fn train(cfg: &Config) -> Result<Summary> {
    train_with(cfg, &RunOptions::default())
}

/// [`train`] with the options of one invocation (traces, test hooks).
pub fn train_with(cfg: &Config, opts: &RunOptions) -> Result<Summary> {
    match select_device(cfg)? {
        crate::cuda::select::Device::Cuda(gpu) => gpu::train(cfg, opts, gpu),
        crate::cuda::select::Device::Cpu => {
            // The CPU loop runs on a worker of the pool its ops fork into, so
            // every op starts at once on this thread while the other workers
            // wake up to steal. Forked from outside the pool, each op first
            // waits for a sleeping worker, dozens of times a step (in a VM a
            // wake-up can take longer than MNIST's conv1). A pool per run
            // keeps in-process ranks from queueing behind each other's loops.
            match rayon::ThreadPoolBuilder::new().num_threads(rayon::current_num_threads()).build() {
                Ok(pool) => pool.install(|| train_cpu(cfg, opts)),
                Err(_) => train_cpu(cfg, opts),
            }
        }
    }
}

fn train_cpu(cfg: &Config, opts: &RunOptions) -> Result<Summary> {
    let device = "cpu";
    let Started { mut model, train_ds, test_ds, mut ddp, plan, mut optimizer, mut ckpt, mut amp, resumed } =
        start(cfg, opts)?;
    let RunPlan { sampler, accum, steps_per_epoch, total_steps, schedule } = plan;
    let d = &cfg.data;
    let mut tracer = trace::Tracer::new(opts)?;
    let mut trace_divergence: Option<String> = None;

    let out_dir = cfg.run.out_dir.clone();
    let primary = ddp.is_primary();
    let mut metrics_out = if primary {
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| Error::io(format!("cannot create {}", out_dir.display()), e))?;
        crate::checkpoint::open_metrics(cfg, &out_dir, resumed.as_ref())?
    } else {
        MetricsWriter::disabled()
    };
    let progress = progress_for(cfg, primary, total_steps);
    progress.println(&header_line(
        cfg,
        model.num_params(),
        (train_ds.len(), test_ds.len()),
        ddp.world_size(),
        (total_steps, steps_per_epoch),
        device,
    ));

    let wall = Instant::now();
    let mut train_time = 0.0f64;
    let mut train_images = 0usize;
    let mut step = 0u64;
    let mut epoch = 0u64;
    let (mut window_loss, mut window_n) = (0.0f64, 0u64);
    let mut final_loss = f64::NAN;
    let mut last_eval: Option<EvalResult> = None;
    let log_every = cfg.logging.every_steps.max(1);
    let mut window_start = Instant::now();
    let mut window_images = 0usize;
    let mut grad_norm: Option<f32> = None;
    let mut initial_loss = f64::NAN;
    let mut step_loss = 0.0f64;
    // Batches of the current epoch a resumed checkpoint already consumed.
    let mut resume_at: Option<usize> = None;
    if let Some(p) = &resumed {
        (step, epoch, step_loss, window_loss, window_n, window_images) =
            (p.step, p.epoch, p.step_loss, p.window_loss, p.window_n, p.window_images);
        (final_loss, last_eval, grad_norm) = (p.final_loss, p.last_eval.map(Into::into), p.grad_norm);
        (train_images, train_time, resume_at) = (p.train_images, p.train_time_s, Some(p.batches_in_epoch));
        progress.set_step(step, "resumed");
    }
    macro_rules! train_progress {
        ($batches_in_epoch:expr) => {
            crate::checkpoint::TrainProgress {
                step,
                epoch,
                batches_in_epoch: $batches_in_epoch,
                step_loss,
                window_loss,
                window_n,
                window_images,
                final_loss,
                last_eval: last_eval.map(Into::into),
                grad_norm,
                train_images,
                train_time_s: train_time,
            }
        };
    }

    'train: while step < total_steps {
        let skip = resume_at.take().unwrap_or(0);
        let indices = crate::checkpoint::skip_batches(sampler.indices(epoch), skip, d.batch_size);
        let loader = Loader::new(train_ds.clone(), indices, d.batch_size, d.drop_last, d.prefetch);
        let mut micro = skip;
        let mut t0 = Instant::now();
        for batch in loader {
            let n = batch.labels.len();
            ddp.sync_buffers(&mut model)?;
            let (logits, saved) = model.forward_train(batch.images)?;
            let out = ops::cross_entropy::forward_backward(
                &logits,
                &batch.labels,
                amp.loss_scale() / accum as f32,
            )?;
            if !out.loss.is_finite() {
                return Err(Error::Training(format!(
                    "loss is {} at step {} (epoch {epoch}); lower optimizer.lr or set train.grad_clip_norm",
                    out.loss,
                    step + 1
                )));
            }
            ddp.backward(&mut model, saved, out.dlogits, (micro + 1).is_multiple_of(accum))?;
            window_loss += out.loss as f64 / accum as f64;
            step_loss += out.loss as f64 / accum as f64;
            train_images += n;
            window_images += n;
            micro += 1;
            if !micro.is_multiple_of(accum) {
                continue;
            }
            // A skipped step leaves the schedule where it was (only applied steps count).
            let lr = schedule.lr_at(step - amp.scaler.state().overflow_steps);
            let outcome = amp.step(&mut model, &mut optimizer, lr, cfg.train.grad_clip_norm, step + 1)?;
            if !outcome.skipped {
                grad_norm = Some(outcome.grad_norm);
            }
            if outcome.skipped {
                let msg = format!(
                    "step {}: gradient overflow (inf/NaN) at loss scale {}, first in {}; step skipped, loss scale -> {}",
                    step + 1,
                    outcome.loss_scale,
                    outcome.overflow.describe(3),
                    amp.loss_scale()
                );
                // Like apex, every rank reports the skip it decided on.
                if primary {
                    progress.println(&msg);
                } else {
                    eprintln!("{msg}");
                }
            }
            model.zero_grad()?;
            step += 1;
            window_n += 1;
            train_time += t0.elapsed().as_secs_f64();
            if let Some(t) = &mut tracer {
                trace_divergence =
                    t.after_update(step, step_loss, outcome.grad_norm, outcome.loss_scale, &model)?;
            }
            step_loss = 0.0;

            if step.is_multiple_of(log_every) || step == total_steps {
                let loss = ddp.mean(window_loss / window_n as f64)?;
                let ips = window_images as f64 / window_start.elapsed().as_secs_f64().max(1e-9);
                final_loss = loss;
                if initial_loss.is_nan() {
                    initial_loss = loss;
                }
                let mut rec = json!({"kind": "train", "step": step, "epoch": epoch, "loss": loss, "lr": lr, "images_per_s": ips,
                    "loss_scale": amp.loss_scale(), "overflow_steps": amp.scaler.state().overflow_steps});
                if let Some(g) = grad_norm {
                    rec["grad_norm"] = json!(g);
                }
                metrics_out.write(&rec)?;
                let line = format!("step {step:>6}/{total_steps} | epoch {epoch} | loss {loss:.4} | lr {lr:.5} | {ips:.0} images/s");
                progress.set_step(step, &format!("loss {loss:.4}"));
                if progress_is_plain(cfg) || step.is_multiple_of(log_every * 10) || step == total_steps {
                    progress.println(&line);
                }
                (window_loss, window_n, window_images) = (0.0, 0, 0);
                window_start = Instant::now();
            }
            if trace_divergence.is_some() {
                break 'train;
            }
            ckpt.after_step(
                &model,
                &optimizer,
                &amp,
                &train_progress!(micro),
                &mut metrics_out,
                ddp.communicator(),
            )?;
            if step >= total_steps {
                break;
            }
            t0 = Instant::now();
        }
        epoch += 1;
        ddp.sync_buffers(&mut model)?;
        let local =
            evaluate_shard(&model, &test_ds, ddp.rank(), ddp.world_size(), d.eval_batch_size, d.prefetch)?;
        let ev = ddp.reduce_eval(local)?;
        metrics_out.write(&json!({"kind": "eval", "step": step, "epoch": epoch, "test_accuracy": ev.accuracy, "test_loss": ev.loss, "correct": ev.correct, "total": ev.total}))?;
        progress.println(&format!(
            "epoch {epoch} | step {step} | test accuracy {:.4} ({}/{}) | test loss {:.4}",
            ev.accuracy, ev.correct, ev.total, ev.loss
        ));
        last_eval = Some(ev);
        window_start = Instant::now();
        ckpt.after_epoch(
            &model,
            &optimizer,
            &amp,
            &train_progress!(0),
            &mut metrics_out,
            ddp.communicator(),
        )?;
    }
    progress.finish();
    if let (None, Some(t)) = (&trace_divergence, &tracer) {
        trace_divergence = t.finish(step);
    }
    if trace_divergence.is_none() {
        ckpt.finish(&model, &optimizer, &amp, &train_progress!(0), &mut metrics_out, ddp.communicator())?;
    }

    let weights = out_dir.join("model.safetensors");
    if primary {
        crate::checkpoint::save_safetensors(&weights, &amp.state_dict(&model)?)?;
    }
    let summary = Summary {
        name: cfg.run.name.clone(),
        final_loss,
        test_accuracy: last_eval.map(|e| e.accuracy),
        test_loss: last_eval.map(|e| e.loss),
        // Every rank trains equal batches: the job's throughput is world x this rank's.
        images_per_s: (train_images * ddp.world_size()) as f64 / train_time.max(1e-9),
        allreduce_hidden_fraction: ddp.allreduce_hidden_fraction(),
        steps: step,
        epochs: epoch,
        wall_s: wall.elapsed().as_secs_f64(),
        opt_level: cfg.amp.opt_level.to_string(),
        world_size: ddp.world_size(),
        device: device.to_string(),
        num_params: model.num_params(),
        weights,
        checkpoints: ckpt.written().to_vec(),
        resumed_from: ckpt.resumed_from().map(PathBuf::from),
        trace_divergence,
        loss_scale: amp.loss_scale(),
        overflow_steps: amp.scaler.state().overflow_steps,
        initial_loss,
        loss_decreased: final_loss < initial_loss,
    };
    if primary {
        metrics::write_json(&out_dir.join("summary.json"), &summary)?;
    }
    ddp.report_replica_state(&amp.state_dict(&model)?, amp.loss_scale(), amp.scaler.state().overflow_steps);
    // No rank leaves while another may still need it for a collective.
    ddp.barrier("end of training")?;
    Ok(summary)
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
        let by_epochs = cfg.train.epochs.map(|e| e * steps_per_epoch);
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

/// The progress bar on rank 0 (as `logging.progress` says), silent elsewhere.
fn progress_for(cfg: &Config, primary: bool, total_steps: u64) -> Progress {
    if !primary {
        return Progress::silent();
    }
    Progress::new(
        match cfg.logging.progress {
            config::ProgressSetting::Auto => ProgressMode::Auto,
            config::ProgressSetting::Always => ProgressMode::Always,
            config::ProgressSetting::Never => ProgressMode::Never,
        },
        total_steps,
    )
}

/// The run's first line: what is trained, on what, for how long.
fn header_line(
    cfg: &Config,
    num_params: usize,
    (train_len, test_len): (usize, usize),
    world: usize,
    (total_steps, steps_per_epoch): (u64, u64),
    device: &str,
) -> String {
    format!(
        "ddptrain: {} | {num_params} params | {train_len} train / {test_len} test samples | world size {world} x batch {} | {total_steps} steps ({steps_per_epoch} per epoch) | device {device} | opt_level {}",
        cfg.run.name, cfg.data.batch_size, cfg.amp.opt_level
    )
}

/// Without a bar every log line is printed; with one, every tenth (the bar shows the rest).
fn progress_is_plain(cfg: &Config) -> bool {
    match cfg.logging.progress {
        config::ProgressSetting::Never => true,
        config::ProgressSetting::Always => false,
        config::ProgressSetting::Auto => !std::io::IsTerminal::is_terminal(&std::io::stderr()),
    }
}
