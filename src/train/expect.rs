//! `[expect]` gates: a CI job states what a healthy run achieves; a run that
//! misses any gate reports each verdict and the binary exits 3.

use super::Summary;
use crate::config::Expect;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Verdict {
    pub gate: &'static str,
    pub passed: bool,
    pub line: String,
}

pub fn check(expect: &Expect, s: &Summary) -> Vec<Verdict> {
    let mut out = Vec::new();
    if let Some(min) = expect.min_test_accuracy {
        let got = s.test_accuracy;
        let passed = got.is_some_and(|a| a >= min);
        let got = got.map_or("no evaluation ran".to_string(), |a| format!("{a:.4}"));
        out.push(Verdict {
            gate: "min_test_accuracy",
            passed,
            line: format!("expect.min_test_accuracy: expected >= {min:.4}, got {got}"),
        });
    }
    if let Some(max) = expect.max_final_loss {
        let passed = s.final_loss.is_finite() && s.final_loss <= max;
        out.push(Verdict {
            gate: "max_final_loss",
            passed,
            line: format!("expect.max_final_loss: expected <= {max:.4}, got {:.4}", s.final_loss),
        });
    }
    if let Some(max) = expect.max_val_loss {
        let got = s.val_loss;
        let passed = got.is_some_and(|l| l.is_finite() && l <= max);
        let got = got.map_or("no evaluation ran".to_string(), |l| format!("{l:.4}"));
        out.push(Verdict {
            gate: "max_val_loss",
            passed,
            line: format!("expect.max_val_loss: expected <= {max:.4}, got {got}"),
        });
    }
    if let Some(max) = expect.max_overflow_steps {
        out.push(Verdict {
            gate: "max_overflow_steps",
            passed: s.overflow_steps <= max,
            line: format!("expect.max_overflow_steps: expected <= {max}, got {}", s.overflow_steps),
        });
    }
    out
}
