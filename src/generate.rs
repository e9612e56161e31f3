//! Text generation from a trained language model (`ddptrain sample`), as
//! nanoGPT's `sample.py` does it: the context cropped to the last
//! `block_size` tokens, the last position's logits divided by the
//! temperature, all but the `top_k` largest dropped, one token drawn from the
//! softmax, repeated.
//!
//! The model's input is always `[1, block_size]`: a shorter context is padded
//! at the end, and the causal mask keeps the padding from reaching the
//! positions read, so the logits at position `len - 1` are those of the
//! context alone.

use crate::config::{self, DatasetKind};
use crate::data::text::{Vocab, VOCAB_FILE};
use crate::error::{Error, Result};
use crate::nn::Model;
use crate::tensor::Tensor;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};

/// nanoGPT's `sample.py` defaults.
pub const DEFAULT_TEMPERATURE: f64 = 0.8;
pub const DEFAULT_TOP_K: usize = 200;

#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    /// New tokens to generate.
    pub tokens: usize,
    /// Divides the logits: below 1 sharper, above 1 flatter. Finite and > 0.
    pub temperature: f64,
    /// Keep only the `k` most likely tokens (`None`: all of them).
    pub top_k: Option<usize>,
}

/// A trained language model, ready to generate.
pub struct LanguageModel {
    /// The weights cast as the run's opt level casts them (apex's `amp.initialize`).
    pub model: Model,
    pub vocab: Vocab,
    /// The context length: the model's input shape `[block_size]`.
    pub block_size: usize,
    /// Where the config, the weights and the vocabulary were read from.
    pub config: PathBuf,
    pub weights: PathBuf,
    pub vocab_path: PathBuf,
}

/// Opens what a text run left (as [`crate::checkpoint::locate_weights`]
/// finds it in a checkpoint directory, a `ckpt` folder, a run's out_dir or
/// a model file); the run's config (`config`, or the `config.toml` the run
/// wrote beside its weights) with `sets` applied; and its `vocab.json`.
pub fn open(checkpoint: &Path, config: Option<&Path>, sets: &[String]) -> Result<LanguageModel> {
    let ckpt_err = |msg: String| Error::Checkpoint { path: checkpoint.to_path_buf(), msg };
    let weights = crate::checkpoint::locate_weights(checkpoint)?;
    let config = crate::checkpoint::config_for(&weights, config)?;
    let cfg = config::load(&config, sets)?;
    if cfg.data.dataset != DatasetKind::Text {
        let kind = serde_json::to_value(cfg.data.dataset).ok().and_then(|v| v.as_str().map(str::to_owned));
        return Err(Error::Usage(format!(
            "{}: sample generates text, and this model was trained on dataset = \"{}\"; score it with `ddptrain eval`",
            config.display(),
            kind.unwrap_or_default()
        )));
    }
    let block_size = match cfg.model.input_shape[..] {
        [t] => t,
        _ => return Err(Error::internal("a text model's input shape is [block_size]")),
    };
    let layers = cfg.resolve_model()?;
    let mut model = Model::new(&layers, cfg.run.seed)?;
    let policy = crate::amp::Policy::resolve(&cfg.amp)?;
    crate::checkpoint::load_eval_weights(&weights, &mut model, &policy)?;
    let vocab_path = crate::checkpoint::beside(&weights, VOCAB_FILE).ok_or_else(|| {
        ckpt_err(format!("no {VOCAB_FILE} in it or in the two folders above: it is not from a text run"))
    })?;
    let vocab = Vocab::read(&vocab_path)?;
    let out = layers.last().map(|l| l.out_shape.clone()).unwrap_or_default();
    if out.last() != Some(&vocab.size()) {
        return Err(Error::data(
            &vocab_path,
            format!(
                "has {} tokens, and the model predicts {:?}: not this model's vocabulary",
                vocab.size(),
                out
            ),
        ));
    }
    Ok(LanguageModel { model, vocab, block_size, config, weights, vocab_path })
}

/// Generates `s.tokens` ids after `prompt` with `model` (the prompt's ids
/// not included). `block_size` is the model's context length, its input shape.
pub fn generate(
    model: &Model,
    block_size: usize,
    prompt: &[u32],
    s: Sampling,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Err(Error::Usage("the prompt is empty: give at least one character".into()));
    }
    if !(s.temperature.is_finite() && s.temperature > 0.0) {
        return Err(Error::Usage(format!(
            "--temperature must be a number above 0 (got {}); use a small value such as 0.01 for near-greedy text",
            s.temperature
        )));
    }
    if s.top_k == Some(0) {
        return Err(Error::Usage("--top-k must be at least 1 (leave it out to keep every token)".into()));
    }
    let mut context: Vec<u32> = prompt.to_vec();
    let mut out = Vec::with_capacity(s.tokens);
    for _ in 0..s.tokens {
        let start = context.len().saturating_sub(block_size);
        let window = &context[start..];
        let mut ids = vec![0.0f32; block_size];
        for (slot, &id) in ids.iter_mut().zip(window) {
            *slot = id as f32;
        }
        let logits = model.forward_eval(Tensor::from_vec(&[1, block_size], ids)?)?;
        let logits = logits.to_f32_vec();
        let vocab = logits.len() / block_size.max(1);
        if vocab == 0 || logits.len() != vocab * block_size {
            return Err(Error::shape(format!(
                "the model's output has {} values, not [1, {block_size}, vocabulary]",
                logits.len()
            )));
        }
        let at = (window.len() - 1) * vocab;
        let next = draw(&logits[at..at + vocab], s, rng);
        out.push(next);
        context.push(next);
    }
    Ok(out)
}

/// One token drawn from `logits` (one position's) under temperature and top-k.
pub fn draw(logits: &[f32], s: Sampling, rng: &mut ChaCha8Rng) -> u32 {
    let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l) / s.temperature).collect();
    // torch.topk's cut as nanoGPT applies it: everything below the k-th
    // largest value goes, so ties with it stay.
    let floor = match s.top_k {
        Some(k) if k < scaled.len() => {
            let mut sorted = scaled.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[k - 1]
        }
        _ => f64::NEG_INFINITY,
    };
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> =
        scaled.iter().map(|&v| if v >= floor && v.is_finite() { (v - max).exp() } else { 0.0 }).collect();
    let total: f64 = weights.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        // Every logit non-finite: nothing to weigh, so take the most likely.
        return argmax(&scaled);
    }
    let mut u = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if *w > 0.0 {
            if u < *w {
                return i as u32;
            }
            u -= w;
        }
    }
    // Rounding left u at the end of the range: the last token with weight.
    weights.iter().rposition(|w| *w > 0.0).unwrap_or(0) as u32
}

fn argmax(v: &[f64]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if x.total_cmp(&v[best]).is_gt() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn sampling(temperature: f64, top_k: Option<usize>) -> Sampling {
        Sampling { tokens: 1, temperature, top_k }
    }

    fn counts(logits: &[f32], s: Sampling, n: usize) -> Vec<usize> {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut c = vec![0; logits.len()];
        for _ in 0..n {
            c[draw(logits, s, &mut rng) as usize] += 1;
        }
        c
    }

    #[test]
    fn draws_follow_the_softmax() {
        // Probabilities 1/7, 2/7, 4/7.
        let logits = [0.0, 2f32.ln(), 4f32.ln()];
        let c = counts(&logits, sampling(1.0, None), 70_000);
        for (i, p) in [1.0, 2.0, 4.0].iter().enumerate() {
            let f = c[i] as f64 / 70_000.0;
            assert!((f - p / 7.0).abs() < 0.01, "token {i}: {f} against {}", p / 7.0);
        }
    }

    #[test]
    fn top_k_keeps_only_the_k_largest_and_their_ties() {
        let c = counts(&[1.0, 5.0, 3.0, 4.0], sampling(1.0, Some(2)), 2_000);
        assert_eq!((c[0], c[2]), (0, 0), "{c:?}");
        assert!(c[1] > c[3] && c[3] > 0, "{c:?}");
        let c = counts(&[1.0, 3.0, 3.0, 0.0], sampling(1.0, Some(1)), 2_000);
        assert!(c[1] > 0 && c[2] > 0 && c[0] + c[3] == 0, "ties with the k-th stay: {c:?}");
    }

    #[test]
    fn a_low_temperature_is_nearly_greedy_and_a_high_one_nearly_uniform() {
        let logits = [0.0, 1.0, 0.5];
        assert_eq!(counts(&logits, sampling(0.01, None), 1_000), vec![0, 1_000, 0]);
        let c = counts(&logits, sampling(1e6, None), 30_000);
        assert!(c.iter().all(|&n| (9_000..11_000).contains(&n)), "{c:?}");
    }

    #[test]
    fn non_finite_logits_never_win_and_all_non_finite_takes_the_largest() {
        let c = counts(&[f32::NAN, 0.0, f32::NEG_INFINITY, 0.0], sampling(1.0, None), 1_000);
        assert_eq!((c[0], c[2]), (0, 0), "{c:?}");
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(draw(&[f32::NEG_INFINITY, f32::INFINITY], sampling(1.0, None), &mut rng), 1);
    }
}
