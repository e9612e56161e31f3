//! `dataset = "text"`: a UTF-8 text file, or every `*.txt` file under a
//! directory in sorted order, as one token stream, split as nanoGPT's
//! `prepare.py` splits it (the first `1 - val_fraction` for training, the
//! rest for validation).
//!
//! Vocabularies: `"bytes"` (each byte a token, 256 ids) or `"chars"` (the
//! sorted distinct characters of the whole text, as nanoGPT's
//! shakespeare_char builds `stoi`/`itos`). The vocabulary is written with the
//! run (`vocab.json`) so that evaluation and generation decode the same way.
//!
//! A sample is a window of `block_size + 1` tokens at an offset drawn from
//! (run seed, split, epoch, sample index): the first `block_size` are the
//! model's input, the last `block_size` the targets (nanoGPT's `get_batch`).
//! The sampler's indices say which draws a rank's batch takes, so ranks draw
//! different windows, a resumed run draws what an unbroken one would, and
//! the validation split's windows (epoch 0 always) are one fixed stream.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::Split;
use crate::error::{Error, Result};
use crate::rng::{stream_at, Purpose};

/// How text becomes token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "vocab", rename_all = "lowercase")]
pub enum Vocab {
    /// Token `b` is the byte `b`.
    Bytes,
    /// Token `i` is `itos[i]`: the sorted distinct characters of the text.
    Chars { itos: Vec<char> },
}

impl Vocab {
    pub fn size(&self) -> usize {
        match self {
            Vocab::Bytes => 256,
            Vocab::Chars { itos } => itos.len(),
        }
    }

    /// The text of token ids (invalid UTF-8 from a byte vocabulary shown as U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Vocab::Bytes => {
                let bytes: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Vocab::Chars { itos } => {
                ids.iter().map(|&i| itos.get(i as usize).copied().unwrap_or('\u{FFFD}')).collect()
            }
        }
    }

    /// The ids of `text`, or the first character the vocabulary lacks.
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, char> {
        match self {
            Vocab::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Vocab::Chars { itos } => {
                // ASCII by table (a corpus is mostly ASCII), the rest by search.
                let mut ascii = [u32::MAX; 128];
                for (i, &c) in itos.iter().enumerate().filter(|(_, c)| c.is_ascii()) {
                    ascii[c as usize] = i as u32;
                }
                text.chars()
                    .map(|c| match ascii.get(c as usize) {
                        Some(&id) if id != u32::MAX => Ok(id),
                        Some(_) => Err(c),
                        None => itos.binary_search(&c).map(|i| i as u32).map_err(|_| c),
                    })
                    .collect()
            }
        }
    }
}

/// The vocabulary's file in a run's directory and in each checkpoint.
pub const VOCAB_FILE: &str = "vocab.json";

impl Vocab {
    /// `{"vocab": "bytes"}` or `{"vocab": "chars", "itos": ["\n", " ", ...]}`.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| Error::internal(format!("cannot encode the vocabulary: {e}")))
    }

    /// Reads a [`VOCAB_FILE`].
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::data(path, format!("cannot read it: {e}")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::data(path, format!("is not a ddptrain vocabulary: {e}")))
    }
}

/// `data.vocab`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VocabKind {
    #[default]
    Bytes,
    Chars,
}

impl VocabKind {
    /// Its `data.vocab` value.
    pub fn name(self) -> &'static str {
        match self {
            VocabKind::Bytes => "bytes",
            VocabKind::Chars => "chars",
        }
    }
}

/// A text corpus read and tokenized, split for training and validation.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub vocab: Arc<Vocab>,
    pub train: Arc<Vec<u32>>,
    pub val: Arc<Vec<u32>>,
}

/// The files `path` names: itself, or the `*.txt` files under it (recursively), sorted by path.
pub fn files(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).map_err(|e| {
        Error::data(path, format!("cannot read it ({e}); run scripts/fetch-sotu.sh for the SOTU corpus"))
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| Error::data(&d, format!("cannot list it: {e}")))?;
        for entry in entries {
            let p = entry.map_err(|e| Error::data(&d, format!("cannot list it: {e}")))?.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "txt") {
                files.push(p);
            }
        }
    }
    if files.is_empty() {
        return Err(Error::data(path, "holds no *.txt file"));
    }
    files.sort();
    Ok(files)
}

/// Reads `path` (a file, or the `*.txt` files under a directory), builds the
/// vocabulary and splits the tokens: the last `val_fraction` for validation.
/// Each split must hold at least one window of `block_size + 1` tokens.
pub fn load(path: &Path, kind: VocabKind, val_fraction: f64, block_size: usize) -> Result<Corpus> {
    let mut bytes = Vec::new();
    for file in files(path)? {
        let b = std::fs::read(&file).map_err(|e| Error::data(&file, format!("cannot read it: {e}")))?;
        if b.is_empty() {
            return Err(Error::data(&file, "is empty: a text dataset needs text"));
        }
        if kind == VocabKind::Chars {
            if let Err(e) = std::str::from_utf8(&b) {
                return Err(Error::data(
                    &file,
                    format!(
                        "is not valid UTF-8 (at byte {}): data.vocab = \"chars\" reads characters; \
                         use data.vocab = \"bytes\" for other encodings",
                        e.valid_up_to()
                    ),
                ));
            }
        }
        bytes.extend_from_slice(&b);
    }
    let (vocab, tokens) = match kind {
        VocabKind::Bytes => (Vocab::Bytes, bytes.iter().map(|&b| u32::from(b)).collect::<Vec<u32>>()),
        VocabKind::Chars => {
            // Each file was checked above; files end on whole characters, so the sum is valid too.
            let text =
                String::from_utf8(bytes).map_err(|e| Error::data(path, format!("is not UTF-8: {e}")))?;
            // Marked, not sorted: sorting every character of 10 MB of text
            // took half a second. ASCII sorts before every other character.
            let mut ascii = [false; 128];
            let mut other = std::collections::BTreeSet::new();
            for c in text.chars() {
                match ascii.get_mut(c as usize) {
                    Some(seen) => *seen = true,
                    None => {
                        other.insert(c);
                    }
                }
            }
            let itos: Vec<char> =
                (0u8..128).filter(|&b| ascii[usize::from(b)]).map(char::from).chain(other).collect();
            let vocab = Vocab::Chars { itos };
            let tokens = vocab
                .encode(&text)
                .map_err(|c| Error::internal(format!("{c:?} is not in its own vocabulary")))?;
            (vocab, tokens)
        }
    };
    // nanoGPT's prepare.py: `data[:int(n*0.9)]`, `data[int(n*0.9):]`.
    let n = tokens.len();
    let cut = ((n as f64) * (1.0 - val_fraction)) as usize;
    let cut = cut.min(n);
    let window = block_size.saturating_add(1);
    for (name, len) in [("training", cut), ("validation", n - cut)] {
        if len < window {
            return Err(Error::data(
                path,
                format!(
                    "the {name} split holds {len} tokens of {n} (data.val_fraction = {val_fraction}), \
                     fewer than one window of block_size + 1 = {window} (model.input_shape)"
                ),
            ));
        }
    }
    let val = tokens[cut..].to_vec();
    let mut train = tokens;
    train.truncate(cut);
    Ok(Corpus { vocab: Arc::new(vocab), train: Arc::new(train), val: Arc::new(val) })
}

/// One split's windows: what a [`super::Dataset`] of text holds.
#[derive(Debug, Clone)]
pub struct Windows {
    pub tokens: Arc<Vec<u32>>,
    pub vocab: Arc<Vocab>,
    pub block_size: usize,
    /// Samples per epoch: the sampler's length.
    pub count: usize,
    pub seed: u64,
    pub split: Split,
}

impl Windows {
    /// Sample `i`'s first token in `epoch` (uniform over every whole window).
    pub fn offset(&self, epoch: u64, i: usize) -> usize {
        let starts = self.tokens.len() - self.block_size;
        let major = (epoch << 1) | self.split.index();
        stream_at(self.seed, Purpose::TextWindow, major, i as u64).random_range(0..starts)
    }

    /// Appends sample `i` of `epoch`: its `block_size` input ids (as f32,
    /// exact below 2^24) and its `block_size` targets (the next tokens).
    pub fn push(&self, epoch: u64, i: usize, inputs: &mut Vec<f32>, targets: &mut Vec<u32>) {
        let at = self.offset(epoch, i);
        let w = &self.tokens[at..at + self.block_size + 1];
        inputs.extend(w[..self.block_size].iter().map(|&t| t as f32));
        targets.extend_from_slice(&w[1..]);
    }
}
