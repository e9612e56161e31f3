//! Golden traces for CI: `--record-trace FILE` writes one JSON line per
//! optimizer step (step, loss, the total norm of the unscaled gradients before
//! clipping, the loss scale the step ran with, and per parameter a
//! SHA-256 of its f32 bytes, truncated to 16 hex digits, plus its L2 norm);
//! `--check-trace FILE` compares a run against such a file and stops it at the
//! first step that differs beyond `--trace-tolerance`.
//!
//! Numbers are written as strings of their shortest round-trip decimal, so
//! they read back to the same bits. Tolerance 0 means bit for bit (digests
//! included); a tolerance t > 0 accepts |a - b| <= t * max(1, |b|) on the loss,
//! gradient norm, loss scale and each parameter's norm.

use crate::error::{Error, Result};
use crate::nn::Model;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Options of one invocation that are not part of the config (they do not
/// change what is computed, so they stay out of the config's fingerprint).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub record_trace: Option<PathBuf>,
    pub check_trace: Option<PathBuf>,
    /// 0 = bitwise.
    pub trace_tolerance: f64,
    /// Test hook: fail right after this step, as a crash would (checkpoints stay).
    pub halt_after_steps: Option<u64>,
    /// Test hook: pause inside every checkpoint save, between its files.
    pub save_pause: Option<Duration>,
    /// Stop after the current step on SIGTERM/SIGINT, with a checkpoint
    /// (src/train/stop.rs); off for library callers, whose process keeps
    /// the default dispositions.
    pub stop_on_signals: bool,
    /// Test hook: pause after every step, so that a test's signal lands mid-run.
    pub step_pause: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamDigest {
    pub name: String,
    pub sha256: String,
    pub norm: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceLine {
    pub step: u64,
    pub loss: String,
    pub grad_norm: String,
    pub loss_scale: String,
    pub params: Vec<ParamDigest>,
}

pub fn trace_line(step: u64, loss: f64, grad_norm: f32, loss_scale: f32, model: &Model) -> Result<TraceLine> {
    let mut params = Vec::new();
    for p in model.params() {
        // f16 weights (O2, O3) are digested widened to f32, which is exact.
        let v = p.value.to_f32_vec();
        let mut h = Sha256::new();
        v.iter().for_each(|x| h.update(x.to_le_bytes()));
        let sha256 = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
        params.push(ParamDigest { name: p.name.clone(), sha256, norm: norm.to_string() });
    }
    Ok(TraceLine {
        step,
        loss: loss.to_string(),
        grad_norm: grad_norm.to_string(),
        loss_scale: loss_scale.to_string(),
        params,
    })
}

pub struct Tracer {
    record: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
    golden: Option<(PathBuf, BTreeMap<u64, TraceLine>)>,
    tolerance: f64,
}

fn num(s: &str) -> f64 {
    s.parse().unwrap_or(f64::NAN)
}

impl Tracer {
    /// `None` when neither recording nor checking was asked for. Only the
    /// rank that writes files (`record_here`) records: DDP ranks trace the
    /// same line, and each checks it.
    pub fn new(opts: &RunOptions, record_here: bool) -> Result<Option<Self>> {
        if opts.record_trace.is_none() && opts.check_trace.is_none() {
            return Ok(None);
        }
        if !(opts.trace_tolerance.is_finite() && opts.trace_tolerance >= 0.0) {
            return Err(Error::config(
                "command line",
                "--trace-tolerance",
                format!("must be a number >= 0, got {}", opts.trace_tolerance),
            ));
        }
        let golden = match &opts.check_trace {
            None => None,
            Some(path) => {
                let bad = |msg: String| Error::data(path, msg);
                let text =
                    std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read the trace: {e}")))?;
                let mut lines = BTreeMap::new();
                for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                    let t: TraceLine = serde_json::from_str(l)
                        .map_err(|e| bad(format!("line {}: not a trace line: {e}", i + 1)))?;
                    lines.insert(t.step, t);
                }
                if lines.is_empty() {
                    return Err(bad("the trace has no steps".into()));
                }
                Some((path.clone(), lines))
            }
        };
        let record = match opts.record_trace.as_ref().filter(|_| record_here) {
            None => None,
            Some(path) => {
                let f = std::fs::File::create(path)
                    .map_err(|e| Error::io(format!("cannot create the trace {}", path.display()), e))?;
                Some((path.clone(), std::io::BufWriter::new(f)))
            }
        };
        Ok(Some(Tracer { record, golden, tolerance: opts.trace_tolerance }))
    }

    /// Whether this rank records or checks lines (a rank other than 0 that
    /// only records has nothing to do, not even to bring its weights to the host).
    pub fn uses_lines(&self) -> bool {
        self.record.is_some() || self.golden.is_some()
    }

    /// After the update of step `step`: records, and returns a verdict line
    /// when the run diverges from the golden trace. `grad_norm` is the total
    /// norm of the step's unscaled gradients before clipping (what
    /// `clip_grad_norm_` returns; inf or NaN on a step skipped for overflow),
    /// `loss_scale` the scale its gradients were computed with.
    pub fn after_update(
        &mut self,
        step: u64,
        loss: f64,
        grad_norm: f32,
        loss_scale: f32,
        model: &Model,
    ) -> Result<Option<String>> {
        let line = trace_line(step, loss, grad_norm, loss_scale, model)?;
        if let Some((path, out)) = &mut self.record {
            let io = |e| Error::io(format!("cannot write the trace {}", path.display()), e);
            serde_json::to_writer(&mut *out, &line).map_err(|e| io(std::io::Error::other(e)))?;
            out.write_all(b"\n").map_err(io)?;
            out.flush().map_err(io)?;
        }
        let Some((path, golden)) = &self.golden else { return Ok(None) };
        let Some(want) = golden.get(&step) else {
            let last = golden.keys().next_back().copied().unwrap_or(0);
            return Ok(Some(format!(
                "trace {}: step {step} is not in the trace (it covers steps {}..={last})",
                path.display(),
                golden.keys().next().copied().unwrap_or(0)
            )));
        };
        Ok(self
            .compare(&line, want)
            .map(|what| format!("trace {}: diverges at step {step}: {what}", path.display())))
    }

    /// At the end of the run: a run that stopped before the trace's end diverged too.
    pub fn finish(&self, step: u64) -> Option<String> {
        let (path, golden) = self.golden.as_ref()?;
        let last = golden.keys().next_back().copied()?;
        (step < last).then(|| {
            format!(
                "trace {}: the run ended at step {step} but the trace goes on to step {last}",
                path.display()
            )
        })
    }

    fn compare(&self, got: &TraceLine, want: &TraceLine) -> Option<String> {
        let tol = self.tolerance;
        let first_digest = got
            .params
            .iter()
            .zip(&want.params)
            .find(|(a, b)| a.sha256 != b.sha256 || a.name != b.name)
            .map(|(a, _)| a.name.clone());
        let params_note = match &first_digest {
            Some(n) => format!("; first parameter whose digest differs: {n}"),
            None => "; every parameter digest matches".into(),
        };
        let close = |a: &str, b: &str| {
            // Equal text covers the non-finite norms of skipped steps, which no tolerance accepts.
            if tol == 0.0 || a == b {
                a == b
            } else {
                let (a, b) = (num(a), num(b));
                (a - b).abs() <= tol * b.abs().max(1.0)
            }
        };
        for (what, a, b) in [
            ("loss", &got.loss, &want.loss),
            ("grad_norm", &got.grad_norm, &want.grad_norm),
            ("loss_scale", &got.loss_scale, &want.loss_scale),
        ] {
            if !close(a, b) {
                return Some(format!("{what} is {a}, the trace has {b} (tolerance {tol}){params_note}"));
            }
        }
        if got.params.len() != want.params.len() {
            return Some(format!(
                "the run has {} parameter tensors, the trace {}",
                got.params.len(),
                want.params.len()
            ));
        }
        for (a, b) in got.params.iter().zip(&want.params) {
            if a.name != b.name {
                return Some(format!("parameter `{}` is `{}` in the trace", a.name, b.name));
            }
            let differs = if tol == 0.0 { a.sha256 != b.sha256 } else { !close(&a.norm, &b.norm) };
            if differs {
                return Some(format!(
                    "parameter {} differs (digest {} vs {}, norm {} vs {}, tolerance {tol}){params_note}",
                    a.name, a.sha256, b.sha256, a.norm, b.norm
                ));
            }
        }
        None
    }
}
