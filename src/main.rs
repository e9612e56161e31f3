//! The binary's edge: parse arguments, load the config, run, map errors to exit
//! codes (2: config or usage error, or an out_dir with another run's files
//! in it; nothing written; 3: an `[expect]` gate missed;
//! 130 / 143: stopped by SIGINT / SIGTERM after a checkpoint (src/train/stop.rs);
//! 1: anything else, including an out_dir another run is using: its config
//! is fine and the same command succeeds once that run ends).

use clap::{Args, Parser, Subcommand};
use ddptrain::error::{EXIT_CONFIG, EXIT_EXPECT, EXIT_FAILURE};
use ddptrain::{config, train, Error};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ddptrain",
    version,
    about = "Mixed-precision data-parallel trainer for networks described in TOML"
)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Args, Clone)]
struct TrainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Write one JSON line per optimizer step (loss, grad norm, loss scale, parameter digests).
    #[arg(long, value_name = "FILE")]
    record_trace: Option<PathBuf>,
    /// Compare the run with a recorded trace; stop and exit 3 at the first step that diverges.
    #[arg(long, value_name = "FILE")]
    check_trace: Option<PathBuf>,
    /// Relative tolerance of --check-trace (0 = bit for bit).
    #[arg(long, value_name = "TOL", default_value_t = 0.0)]
    trace_tolerance: f64,
    /// Test hook: fail right after this optimizer step, as a crash would.
    #[arg(long, hide = true)]
    halt_after_steps: Option<u64>,
    /// Test hook: pause this long inside every checkpoint save, between its files.
    #[arg(long, hide = true)]
    debug_save_pause_ms: Option<u64>,
    /// Test hook: pause this long after every optimizer step.
    #[arg(long, hide = true)]
    debug_step_pause_ms: Option<u64>,
    /// Test hook: no Winograd on the CPU (see `ops::conv2d::set_winograd`).
    #[arg(long, hide = true)]
    direct_convs: bool,
}

#[derive(Args, Clone)]
struct EvalArgs {
    /// The run's config (default: the config.toml the run wrote beside its weights).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a config value, as for training (for example amp.opt_level).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// A checkpoint directory (`.../ckpt/step_XXXXXXXX`, `.../ckpt/latest`), a run's `ckpt`
    /// folder or out_dir (its latest checkpoint, else its model.safetensors), or a model file.
    #[arg(long, required = true, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Print the result as one JSON object (exact values) instead of a line of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct SampleArgs {
    /// A text run's checkpoint directory, its `ckpt` folder or out_dir (its latest
    /// checkpoint, else its model.safetensors), or a model file.
    #[arg(long, required = true, value_name = "PATH")]
    checkpoint: PathBuf,
    /// The run's config (default: the config.toml the run wrote beside its weights).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a config value, as for training (for example amp.opt_level).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// The text to continue.
    #[arg(long, default_value = "\n", hide_default_value = true)]
    prompt: String,
    /// How many tokens to generate after the prompt.
    #[arg(long, default_value_t = 500)]
    tokens: usize,
    /// Divides the logits: below 1 more predictable text, above 1 more varied.
    #[arg(long, default_value_t = ddptrain::generate::DEFAULT_TEMPERATURE)]
    temperature: f64,
    /// Draw only from the K most likely tokens at each step, or "all".
    #[arg(long, default_value = "200", value_parser = parse_top_k)]
    top_k: TopK,
    /// The seed of the draws: the same seed gives the same text.
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// How many samples to print, separated by a line of dashes.
    #[arg(long, default_value_t = 1)]
    num_samples: usize,
}

/// `--top-k`: a count, or every token.
#[derive(Clone, Copy)]
struct TopK(Option<usize>);

fn parse_top_k(s: &str) -> Result<TopK, String> {
    if s == "all" {
        return Ok(TopK(None));
    }
    match s.parse::<usize>() {
        Ok(0) | Err(_) => Err(format!("`{s}` is not a count of tokens of at least 1, or \"all\"")),
        Ok(k) => Ok(TopK(Some(k))),
    }
}

#[derive(Args, Clone)]
struct CheckArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Print only the resolved model as one JSON document (nodes with their inputs, shapes and
    /// PyTorch constructor arguments; state_dict keys with shapes and dtypes), for other tools.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct ConfigArgs {
    /// The run's TOML config file.
    #[arg(long, required = true)]
    config: Option<PathBuf>,
    /// Override a config value: `--set train.epochs=1` (repeatable; TOML values, else plain strings).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Train (the default when no subcommand is given).
    Train(TrainArgs),
    /// Score a checkpoint or a model file on the test split: print accuracy and loss (a text
    /// run's: validation loss and perplexity).
    Eval(EvalArgs),
    /// Generate text from a text run's checkpoint, as nanoGPT's sample.py (prompt, temperature, top-k).
    Sample(SampleArgs),
    /// Validate the config and dry-run the start of training (the data's files, run.out_dir),
    /// writing nothing; print the resolved config and the model summary.
    Check(CheckArgs),
    /// Print every config key (section, key, type, default, meaning) as markdown: docs/CONFIG.md.
    Keys,
    /// Start this node's ranks with torchrun's environment: `launch --nproc-per-node N -- <ddptrain args>`.
    Launch(ddptrain::launch::LaunchArgs),
    /// Rendezvous and collectives self-test of the distributed layer (for tests and cluster checks).
    #[command(hide = true)]
    DistSelftest(ddptrain::dist::selftest::SelftestArgs),
}

fn exit_code_for(err: &anyhow::Error) -> u8 {
    match err.downcast_ref::<Error>() {
        Some(Error::Config { .. } | Error::Unsupported(_) | Error::Usage(_) | Error::OutDir { .. }) => {
            EXIT_CONFIG
        }
        _ => EXIT_FAILURE,
    }
}

fn load(args: &ConfigArgs) -> anyhow::Result<config::Config> {
    let path = args.config.as_ref().ok_or_else(|| anyhow::anyhow!("--config is required"))?;
    Ok(config::load(path, &args.sets)?)
}

fn check(args: &CheckArgs) -> anyhow::Result<u8> {
    let cfg = load(&args.config)?;
    let layers = config::model::resolve(&cfg.model)?;
    let estimate = config::preflight(&cfg)?;
    let policy = ddptrain::amp::Policy::resolve(&cfg.amp)?;
    let desc = config::describe::describe(&cfg.model.input_shape, &layers, &policy);
    if args.json {
        ddptrain::outln!("{}", serde_json::to_string(&desc)?);
        return Ok(0);
    }
    ddptrain::outln!("# resolved config ({})\n{}", cfg.config_path.display(), cfg.to_toml_string());
    ddptrain::outln!("# model\n{}", config::model::summary(&layers));
    ddptrain::outln!("# state_dict at {}\n{}", policy.opt_level, desc.state_dict_table());
    ddptrain::outln!("{estimate}");
    // What training would refuse next: its data and its out_dir, each with training's own message.
    let refused = train::dry_run(&cfg);
    for e in &refused {
        ddptrain::errln!("error: {}", ddptrain::error::cut_message(&e.to_string(), 1000, 200));
    }
    if !refused.is_empty() {
        return Ok(EXIT_CONFIG);
    }
    ddptrain::outln!("config OK");
    Ok(0)
}

fn keys() -> anyhow::Result<u8> {
    ddptrain::metrics::console::out_raw(&config::keys::markdown()?);
    Ok(0)
}

/// Scores a checkpoint, or a model file, at the config's opt level: the fp32
/// weights (a checkpoint's masters under O2; a model file's own weights) cast
/// as apex's `amp.initialize` would, so an O2 checkpoint scores as the run's
/// own evaluation of it did.
fn eval(args: &EvalArgs) -> anyhow::Result<u8> {
    use ddptrain::checkpoint::{config_for, load_eval_weights, locate_weights, EvalSource};
    let weights = locate_weights(&args.checkpoint)?;
    let cfg = config::load(&config_for(&weights, args.config.as_deref())?, &args.sets)?;
    let policy = ddptrain::amp::Policy::resolve(&cfg.amp)?;
    let train::Prepared { mut model, test_ds, .. } = train::prepare(&cfg)?;
    let source = load_eval_weights(&weights, &mut model, &policy)?;
    let level = cfg.amp.opt_level.to_string();
    let (step, epoch) = match &source {
        EvalSource::Checkpoint(state) => {
            if state.opt_level != level {
                ddptrain::errln!(
                    "note: evaluating at {level} (amp.opt_level); the checkpoint was trained at {}",
                    state.opt_level
                );
            }
            (Some(state.progress.step), Some(state.progress.epoch))
        }
        EvalSource::ModelFile => (None, None),
    };
    let ev = train::evaluate(&model, &test_ds, cfg.data.eval_batch_size, cfg.data.prefetch)?;
    // A language model is scored as its run's evaluations are: validation
    // loss per token and perplexity over the fixed validation windows.
    let text = cfg.data.dataset == config::DatasetKind::Text;
    if args.json {
        let kind = if step.is_some() { "checkpoint" } else { "model file" };
        let mut rec = serde_json::json!({"checkpoint": weights, "kind": kind, "step": step,
            "epoch": epoch, "opt_level": level});
        let scores = if text {
            serde_json::json!({"val_loss": ev.loss, "perplexity": ev.loss.exp(), "tokens": ev.total})
        } else {
            serde_json::json!({"test_accuracy": ev.accuracy, "test_loss": ev.loss, "correct": ev.correct,
                "total": ev.total})
        };
        if let (Some(r), serde_json::Value::Object(sc)) = (rec.as_object_mut(), scores) {
            r.extend(sc);
        }
        ddptrain::outln!("{rec}");
        return Ok(0);
    }
    let what = match (step, epoch) {
        (Some(step), Some(epoch)) => {
            format!("checkpoint {} (step {step}, epoch {epoch})", weights.display())
        }
        _ => format!("model file {}", weights.display()),
    };
    if text {
        ddptrain::outln!(
            "{what} at {level}: val loss {:.4} (perplexity {:.2}) over {} tokens",
            ev.loss,
            ev.loss.exp(),
            ev.total
        );
    } else {
        ddptrain::outln!(
            "{what} at {level}: test accuracy {:.4} ({}/{}), test loss {:.4}",
            ev.accuracy,
            ev.correct,
            ev.total,
            ev.loss
        );
    }
    Ok(0)
}

/// Prints `--num-samples` continuations of the prompt (the prompt included,
/// as nanoGPT prints them).
fn sample(args: &SampleArgs) -> anyhow::Result<u8> {
    use ddptrain::generate::{self, Sampling};
    let lm = generate::open(&args.checkpoint, args.config.as_deref(), &args.sets)?;
    let prompt = lm.vocab.encode(&args.prompt).map_err(|c| {
        Error::Usage(format!(
            "the prompt has {c:?}, which is not in the model's vocabulary ({} characters, {}): leave it out",
            lm.vocab.size(),
            lm.vocab_path.display()
        ))
    })?;
    let s = Sampling { tokens: args.tokens, temperature: args.temperature, top_k: args.top_k.0 };
    for i in 0..args.num_samples {
        let mut rng = ddptrain::rng::stream(args.seed, ddptrain::rng::Purpose::Generate, i as u64);
        let ids = generate::generate(&lm.model, lm.block_size, &prompt, s, &mut rng)?;
        if i > 0 {
            ddptrain::outln!("---------------");
        }
        ddptrain::outln!("{}{}", args.prompt, lm.vocab.decode(&ids));
    }
    Ok(0)
}

fn run_train(args: &TrainArgs) -> anyhow::Result<u8> {
    let cfg = load(&args.config)?;
    // Before the device is opened: a missing GPU or a run too large for the
    // machine is a config error, not a failure halfway through setting up.
    config::preflight(&cfg)?;
    let opts = train::RunOptions {
        record_trace: args.record_trace.clone(),
        check_trace: args.check_trace.clone(),
        trace_tolerance: args.trace_tolerance,
        halt_after_steps: args.halt_after_steps,
        save_pause: args.debug_save_pause_ms.map(std::time::Duration::from_millis),
        stop_on_signals: true,
        step_pause: args.debug_step_pause_ms.map(std::time::Duration::from_millis),
    };
    if args.direct_convs {
        ddptrain::ops::conv2d::set_winograd(false);
    }
    let summary = train::train_with(&cfg, &opts)?;
    let report = |line: String| closing_line(&summary, &line, false);
    if let Some(sig) = summary.interrupted {
        // Before any gate: an interrupted run is not judged, it is resumed.
        // Every rank says where it stopped (they agree on the step).
        let report = |line: String| closing_line(&summary, &line, true);
        report(format!(
            "interrupted by {} after step {}: checkpoint written, resume with checkpoint.resume = \"auto\"; exit code {}",
            sig.name(),
            summary.steps,
            sig.exit_code()
        ));
        return Ok(sig.exit_code());
    }
    if let Some(why) = &summary.trace_divergence {
        report(format!("FAIL {why}"));
        return Ok(EXIT_EXPECT);
    }
    if let Some(path) = &args.check_trace {
        report(format!("PASS trace {}: all {} steps match", path.display(), summary.steps));
    }
    // A language model's figures: validation loss and perplexity, tokens/s.
    let (score, rate) = match summary.tokens_per_s {
        Some(tps) => (
            summary
                .val_loss
                .zip(summary.perplexity)
                .map_or("val loss n/a".to_string(), |(l, p)| format!("val loss {l:.4} (perplexity {p:.2})")),
            format!("{tps:.0} tokens/s"),
        ),
        None => (
            format!(
                "test accuracy {}",
                summary.test_accuracy.map_or("n/a".to_string(), |a| format!("{:.2}%", a * 100.0))
            ),
            format!("{:.0} images/s", summary.images_per_s),
        ),
    };
    report(format!(
        "done: {} steps, {} epochs, final loss {:.4}, {score}, {rate}, {:.1}s; wrote {}",
        summary.steps,
        summary.epochs,
        summary.final_loss,
        summary.wall_s,
        cfg.run.out_dir.display()
    ));
    let verdicts = &summary.gates;
    for v in verdicts {
        report(format!("{} {}", if v.passed { "PASS" } else { "FAIL" }, v.line));
    }
    Ok(if verdicts.iter().any(|v| !v.passed) { EXIT_EXPECT } else { 0 })
}

/// A closing line of the run: on stdout on rank 0 (one rank reports for
/// the job, as it writes the job's files) or on `every_rank`, and appended
/// to the run's `train.log` ([`train::Summary::log`]).
fn closing_line(summary: &train::Summary, line: &str, every_rank: bool) {
    if summary.rank == 0 || every_rank {
        ddptrain::outln!("{line}");
    }
    if let Some(log) = &summary.log {
        ddptrain::metrics::append_log(log, line);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::Check(a)) => check(a),
        Some(Command::Train(a)) => run_train(a),
        Some(Command::Eval(a)) => eval(a),
        Some(Command::Sample(a)) => sample(a),
        Some(Command::Keys) => keys(),
        Some(Command::Launch(a)) => ddptrain::launch::run(a).map_err(Into::into),
        Some(Command::DistSelftest(a)) => ddptrain::dist::selftest::run(a).map_err(Into::into),
        None => run_train(&cli.train),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // Library errors carry their cause in their own text; `{err:#}` would repeat it.
            // A runaway value (a 10 MB string, a pasted file) that reached a
            // message unshortened must not come back whole.
            ddptrain::errln!("error: {}", ddptrain::error::cut_message(&err.to_string(), 1000, 200));
            ExitCode::from(exit_code_for(&err))
        }
    }
}
