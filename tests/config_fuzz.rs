//! Property test of the config front door: many configs mutated from
//! `configs/*.toml` (wrong types, huge, negative and zero numbers, unknown
//! and missing keys, broken nesting, garbage bytes, truncation, a 10 MB
//! file) go through `ddptrain check` and a short CPU training run. Each must
//! exit 0, 2 or 3 (never a panic's 101 or a signal), keep its message short,
//! and write nothing when it exits 2.
//!
//! The generator is seeded (`FUZZ_SEED`, `FUZZ_CASES` override), so a failure
//! names the seed and case that reproduce it.

mod common;
use common::*;

use std::path::Path;
use std::process::Output;
use toml::Value;

/// xorshift64*: enough randomness to pick mutations, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// Values a config author (or a broken script) could write where any value is expected.
fn odd_value(rng: &mut Rng) -> Value {
    let pick = rng.below(19);
    match pick {
        0 => Value::Integer(0),
        1 => Value::Integer(-1),
        2 => Value::Integer(i64::MAX),
        3 => Value::Integer(i64::MIN),
        4 => Value::Integer(1 << 40),
        5 => Value::Float(f64::NAN),
        6 => Value::Float(f64::INFINITY),
        7 => Value::Float(-0.5),
        8 => Value::Float(1e300),
        9 => Value::Boolean(true),
        10 => Value::String("x".repeat(rng.below(3) * 5000)),
        11 => Value::String("cuda".into()),
        12 => Value::Array(vec![Value::Integer(1), Value::String("a".into())]),
        13 => Value::Array(Vec::new()),
        14 => Value::Table(toml::Table::from_iter([("type".to_owned(), Value::String("conv2d".into()))])),
        // A block argument, and a use of the block, wherever they land.
        15 => Value::String("$planes".into()),
        16 => Value::Table(toml::Table::from_iter([("type".to_owned(), Value::String("BasicBlock".into()))])),
        // A tie target: a parameter of the seeds' models, a buffer, or nothing.
        17 => Value::String(
            rng.pick(&[
                "layer1.0.weight",
                "conv1.weight",
                "layer1.0.conv1.weight",
                "fc.weight",
                "bn1.running_mean",
            ])
            .to_string(),
        ),
        _ => Value::Integer(rng.below(5) as i64 + 1),
    }
}

/// A value of the same type close to `v`, so that many mutants stay valid
/// and go on to train with odd but legal settings.
fn near(v: &Value, rng: &mut Rng) -> Value {
    match v {
        Value::Integer(i) => Value::Integer(*rng.pick(&[
            i.saturating_add(1),
            i.saturating_sub(1),
            i.saturating_mul(2),
            i / 2,
            1,
        ])),
        Value::Float(f) => Value::Float(*rng.pick(&[f * 10.0, f / 10.0, 0.0, 1.0, f * 0.5])),
        Value::Boolean(b) => Value::Boolean(!b),
        Value::String(_) => {
            let words = [
                "O0",
                "O1",
                "O2",
                "O3",
                "adam",
                "adamw",
                "sgd",
                "cosine",
                "step",
                "auto",
                "never",
                "relu",
                "flatten",
                "maxpool2d",
                "batchnorm2d",
            ];
            Value::String(rng.pick(&words).to_string())
        }
        other => other.clone(),
    }
}

/// Every path to a value in `v` (tables by key, arrays by index).
fn paths(v: &Value, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Table(t) => {
            for (k, c) in t {
                let mut p = prefix.clone();
                p.push(k.clone());
                out.push(p.clone());
                paths(c, p, out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                let mut p = prefix.clone();
                p.push(i.to_string());
                out.push(p.clone());
                paths(c, p, out);
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let Some((first, rest)) = path.split_first() else { return Some(v) };
    let child = match v {
        Value::Table(t) => t.get_mut(first)?,
        Value::Array(a) => a.get_mut(first.parse::<usize>().ok()?)?,
        _ => return None,
    };
    at(child, rest)
}

/// One mutation of the TOML document `doc`: a value replaced, a key removed
/// or added, a table turned into a scalar.
fn mutate_value(doc: &mut Value, rng: &mut Rng) {
    let mut all = Vec::new();
    paths(doc, Vec::new(), &mut all);
    let path = rng.pick(&all).clone();
    let (parent, last) = path.split_at(path.len() - 1);
    let Some(parent) = at(doc, parent) else { return };
    match (rng.below(4), parent) {
        (0, Value::Table(t)) => {
            t.remove(&last[0]);
        }
        (1, Value::Table(t)) => {
            let names = [
                "epochz",
                "batchsize",
                "lr",
                "type",
                "layers",
                "shortcut",
                "output_size",
                "branches",
                "args",
                "repeat",
                "first",
                "when",
                "tie",
                "p",
                "kernel",
                "name",
                "x",
            ];
            t.insert(rng.pick(&names).to_string(), odd_value(rng));
        }
        (_, p) => {
            if let Some(slot) = at(p, last) {
                *slot = if rng.below(2) == 0 { near(slot, rng) } else { odd_value(rng) };
            }
        }
    }
}

/// A config text: the document mutated one to three times, or its text
/// broken (garbage bytes, cut short), each from a seed config.
fn case_text(seeds: &[String], rng: &mut Rng) -> Vec<u8> {
    let text = rng.pick(seeds).clone();
    match rng.below(10) {
        0 => {
            // Garbage bytes somewhere in the text.
            let mut b = text.into_bytes();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            b
        }
        1 => {
            let mut b = text.into_bytes();
            b.truncate(rng.below(b.len()));
            b
        }
        _ => {
            let mut doc: Value = toml::from_str(&text).expect("seed configs parse");
            for _ in 0..1 + rng.below(2) {
                mutate_value(&mut doc, rng);
            }
            toml::to_string(&doc).unwrap_or(text).into_bytes()
        }
    }
}

fn run(args: &[&str], cwd: &Path) -> Output {
    ddptrain(args, cwd)
}

/// The contract for one run: an exit code of 0, 2 or 3, a bounded message,
/// and nothing written on a config error.
fn check_contract(what: &str, o: &Output, out_dir: &Path, cfg: &Path) {
    use std::os::unix::process::ExitStatusExt;
    let t = text(o);
    let body = std::fs::read(cfg).unwrap_or_default();
    let head = String::from_utf8_lossy(&body[..body.len().min(3000)]).into_owned();
    let code = o.status.code();
    // A legal config may still diverge (weight_decay = 2^40, lr = 2^63): that
    // is the documented exit 1 with a training error, not a crash.
    let stderr = String::from_utf8_lossy(&o.stderr);
    let diverged = code == Some(1) && stderr.lines().any(|l| l.starts_with("error: training error: "));
    assert!(
        matches!(code, Some(0 | 2 | 3)) || diverged,
        "{what}: exit {code:?} (signal {:?})\n--- output (tail) ---\n{}\n--- config ---\n{head}",
        o.status.signal(),
        &t[t.len().saturating_sub(3000)..]
    );
    assert!(String::from_utf8_lossy(&o.stderr).len() < 4000, "{what}: stderr is {} bytes", o.stderr.len());
    if code == Some(2) {
        assert!(!out_dir.exists(), "{what}: exit 2 but {} was written\n{t}\n{head}", out_dir.display());
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn mutated_configs_exit_cleanly_from_check_and_training() {
    let seed = env_number("FUZZ_SEED", 0x5eed_c0f1);
    let cases = env_number("FUZZ_CASES", 160);
    let mut rng = Rng(seed | 1);
    let configs = repo_root().join("configs");
    let mut seeds: Vec<String> = std::fs::read_dir(&configs)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    seeds.sort();
    let dir = tempfile::tempdir().unwrap();
    // `check` opens the data, at the seeds' paths relative to the repository.
    std::os::unix::fs::symlink(repo_root().join("data"), dir.path().join("data")).unwrap();
    let (mut trained, mut by_code) = (0, std::collections::BTreeMap::new());
    for case in 0..cases {
        let what = format!("seed {seed:#x} case {case}");
        let cfg = dir.path().join(format!("case{case}.toml"));
        std::fs::write(&cfg, case_text(&seeds, &mut rng)).unwrap();
        let out_dir = dir.path().join(format!("out{case}"));
        let out = format!("run.out_dir={}", out_dir.display());
        let c = cfg.to_str().unwrap();
        let o = run(&["check", "--config", c, "--set", &out], dir.path());
        check_contract(&format!("{what}: check"), &o, &out_dir, &cfg);
        *by_code.entry(o.status.code()).or_insert(0) += 1;
        // Train the ones `check` accepts, plus every fourth, on the CPU with
        // synthetic data, for two steps, with a memory limit that keeps an
        // accepted-but-large model from taking the machine.
        if o.status.code() != Some(0) && case % 4 != 0 {
            continue;
        }
        trained += 1;
        let mut args = vec!["--config", c, "--set", &out];
        for s in [
            "run.device=\"cpu\"",
            "run.max_memory_gb=0.5",
            "train.max_steps=2",
            "data.dataset=\"synthetic\"",
            "data.synthetic_train_size=64",
            "data.synthetic_test_size=16",
            "logging.progress=\"never\"",
            "checkpoint.resume=\"never\"",
        ] {
            args.extend(["--set", s]);
        }
        let o = run(&args, dir.path());
        check_contract(&format!("{what}: training"), &o, &out_dir, &cfg);
    }
    eprintln!("{cases} configs: exit codes of check {by_code:?}; {trained} trained");
    // A broken generator would only test the parser: make sure some configs
    // pass and some fail, and that training ran.
    assert!(by_code.get(&Some(0)).copied().unwrap_or(0) >= cases / 20, "{by_code:?}");
    assert!(by_code.get(&Some(2)).copied().unwrap_or(0) >= cases / 4, "{by_code:?}");
    assert!(trained >= cases / 8, "trained {trained}");
}

/// Every number of the CI config, one at a time, set to each extreme: the
/// systematic half of the search (a random mutant rarely hits the one key
/// whose product overflows, e.g. train.epochs x steps per epoch).
#[test]
fn every_number_at_its_extremes_exits_cleanly() {
    let text = std::fs::read_to_string(repo_root().join("configs/ci_smoke.toml")).unwrap();
    let doc: Value = toml::from_str(&text).unwrap();
    let mut all = Vec::new();
    paths(&doc, Vec::new(), &mut all);
    let numbers: Vec<Vec<String>> = all
        .into_iter()
        .filter(|p| {
            let mut d = doc.clone();
            matches!(at(&mut d, p), Some(Value::Integer(_) | Value::Float(_)))
        })
        .collect();
    assert!(numbers.len() > 20, "{numbers:?}");
    let dir = tempfile::tempdir().unwrap();
    let extremes = [i64::MAX, 1 << 40, 0, -1];
    for (i, path) in numbers.iter().enumerate() {
        for (j, &v) in extremes.iter().enumerate() {
            let mut d = doc.clone();
            if let Some(slot) = at(&mut d, path) {
                *slot = Value::Integer(v);
            }
            let cfg = dir.path().join(format!("n{i}_{j}.toml"));
            std::fs::write(&cfg, toml::to_string(&d).unwrap()).unwrap();
            let out_dir = dir.path().join(format!("out{i}_{j}"));
            let out = format!("run.out_dir={}", out_dir.display());
            let c = cfg.to_str().unwrap();
            let what = format!("{} = {v}", path.join("."));
            let mut args = vec!["--config", c, "--set", &out];
            // Huge values train (2 steps, synthetic data, a memory limit); the
            // others only go through check, to keep the test short.
            if v > 1 {
                for s in [
                    "run.device=\"cpu\"",
                    "run.max_memory_gb=0.5",
                    "data.dataset=\"synthetic\"",
                    "data.synthetic_train_size=640",
                    "data.synthetic_test_size=16",
                    "logging.progress=\"never\"",
                ] {
                    args.extend(["--set", s]);
                }
                // Keep the run short unless the step budget is what is being tested.
                if !what.starts_with("train.max_steps") {
                    args.extend(["--set", "train.max_steps=2"]);
                }
            } else {
                args.insert(0, "check");
            }
            let o = run(&args, dir.path());
            check_contract(&what, &o, &out_dir, &cfg);
        }
    }
}

#[test]
fn a_ten_megabyte_config_is_a_short_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
    // A 10 MB run name: refused by its key, with the value cut.
    let body = seed.replacen("[run]\n", &format!("[run]\nname = \"{}\"\n", "z".repeat(10 << 20)), 1);
    assert!(body.len() > 10 << 20);
    let cfg = write(dir.path(), "big.toml", &body);
    let out_dir = dir.path().join("out");
    let out = format!("run.out_dir={}", out_dir.display());
    for args in [vec!["check", "--config", cfg.to_str().unwrap()], vec!["--config", cfg.to_str().unwrap()]] {
        let mut args = args.clone();
        args.extend(["--set", &out]);
        let o = run(&args, dir.path());
        assert_eq!(o.status.code(), Some(2), "{}", &text(&o)[..2000.min(text(&o).len())]);
        check_contract("10 MB config", &o, &out_dir, &cfg);
    }
}
