//! The binary's edge: parse arguments, load the config, run, map errors to exit
//! codes (2: config or usage error, nothing written; 3: an `[expect]` gate missed;
//! 1: anything else).

use clap::{Args, Parser, Subcommand};
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
    train: ConfigArgs,
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
    Train(ConfigArgs),
    /// Validate the config; print the resolved config and the model summary.
    Check(ConfigArgs),
    /// Start this node's ranks with torchrun's environment: `launch --nproc-per-node N -- <ddptrain args>`.
    Launch(ddptrain::launch::LaunchArgs),
    /// Rendezvous and collectives self-test of the distributed layer (for tests and cluster checks).
    #[command(hide = true)]
    DistSelftest(ddptrain::dist::selftest::SelftestArgs),
}

const EXIT_FAILURE: u8 = 1;
const EXIT_CONFIG: u8 = 2;
const EXIT_EXPECT: u8 = 3;

fn exit_code_for(err: &anyhow::Error) -> u8 {
    match err.downcast_ref::<Error>() {
        Some(Error::Config { .. } | Error::Unsupported(_)) => EXIT_CONFIG,
        _ => EXIT_FAILURE,
    }
}

fn load(args: &ConfigArgs) -> anyhow::Result<config::Config> {
    let path = args.config.as_ref().ok_or_else(|| anyhow::anyhow!("--config is required"))?;
    Ok(config::load(path, &args.sets)?)
}

fn check(args: &ConfigArgs) -> anyhow::Result<u8> {
    let cfg = load(args)?;
    let layers = config::model::resolve(&cfg.model)?;
    println!("# resolved config ({})\n{}", cfg.config_path.display(), cfg.to_toml_string());
    println!("# model\n{}", config::model::summary(&layers));
    println!("config OK");
    Ok(0)
}

fn run_train(args: &ConfigArgs) -> anyhow::Result<u8> {
    let cfg = load(args)?;
    let summary = train::train(&cfg)?;
    let acc = summary.test_accuracy.map_or("n/a".to_string(), |a| format!("{:.2}%", a * 100.0));
    println!(
        "done: {} steps, {} epochs, final loss {:.4}, test accuracy {acc}, {:.0} images/s, {:.1}s; wrote {}",
        summary.steps,
        summary.epochs,
        summary.final_loss,
        summary.images_per_s,
        summary.wall_s,
        cfg.run.out_dir.display()
    );
    let verdicts = train::expect::check(&cfg.expect, &summary);
    for v in &verdicts {
        println!("{} {}", if v.passed { "PASS" } else { "FAIL" }, v.line);
    }
    Ok(if verdicts.iter().any(|v| !v.passed) { EXIT_EXPECT } else { 0 })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::Check(a)) => check(a),
        Some(Command::Train(a)) => run_train(a),
        Some(Command::Launch(a)) => ddptrain::launch::run(a).map_err(Into::into),
        Some(Command::DistSelftest(a)) => ddptrain::dist::selftest::run(a).map_err(Into::into),
        None => run_train(&cli.train),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(exit_code_for(&err))
        }
    }
}
