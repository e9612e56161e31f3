//! Shape inference over `[model]`: flattens the layer list (sequential blocks
//! included) into execution order, with PyTorch module paths and per-sample
//! shapes. Used by validation, by `ddptrain check` and by the model builder.

use std::collections::HashSet;

use super::layers::LayerConfig;
use super::schema::ModelConfig;
use crate::error::{Error, Result};
pub use crate::nn::layers::LayerKind;

/// Errors from [`resolve`] carry this as their file; `Config::validate` and
/// `load` replace it with the config file (or env / --set source).
pub(crate) const MODEL_FILE: &str = "[model]";

/// One computing layer, with its place in the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedLayer {
    /// Module path as in a PyTorch state_dict, e.g. `layer1.0` or `fc`.
    pub name: String,
    pub kind: LayerKind,
    /// Per-sample shapes (no batch dimension).
    pub in_shape: Vec<usize>,
    pub out_shape: Vec<usize>,
    /// The config key of the entry, e.g. `model.layers[0].layers[1]`, for errors.
    pub key: String,
}

/// Flattens `model.layers` into execution order and infers every shape.
pub fn resolve(model: &ModelConfig) -> Result<Vec<ResolvedLayer>> {
    let input = &model.input_shape;
    if input.contains(&0) {
        return Err(err("model.input_shape", format!("sizes must be at least 1, got {input:?}")));
    }
    if numel(input).is_none() {
        return Err(err("model.input_shape", format!("{input:?} has more elements than fit in 64 bits")));
    }
    if model.layers.is_empty() {
        return Err(err("model.layers", "must not be empty"));
    }
    let mut out = Vec::new();
    let mut shape = input.to_vec();
    walk(&model.layers, "", "model.layers", &mut shape, &mut out)?;
    // Every later size (parameter buffers, the model's total) is a sum or
    // product of these, so checking them here keeps the rest unchecked-safe.
    let mut total = 0usize;
    for l in &out {
        total =
            l.kind.params().iter().try_fold(total, |t, (_, s)| t.checked_add(numel(s)?)).ok_or_else(
                || err(&l.key, "the model's parameter count does not fit in 64 bits".to_owned()),
            )?;
    }
    if shape.len() != 1 {
        return Err(err(
            "model.layers",
            format!("the model's output is {shape:?} per sample; a classifier must end in 1-D logits (add flatten and linear layers)"),
        ));
    }
    Ok(out)
}

/// Total learnable scalars, as `sum(p.numel() for p in model.parameters())`.
pub fn param_count(layers: &[ResolvedLayer]) -> usize {
    layers.iter().map(|l| l.kind.num_params()).sum()
}

/// A table of the model: module path, PyTorch repr, output shape, #params.
pub fn summary(layers: &[ResolvedLayer]) -> String {
    let mut rows =
        vec![["Name".to_owned(), "Layer".to_owned(), "Output shape".to_owned(), "Params".to_owned()]];
    if let Some(first) = layers.first() {
        rows.push(["(input)".into(), String::new(), format!("{:?}", first.in_shape), String::new()]);
    }
    for l in layers {
        rows.push([
            l.name.clone(),
            l.kind.to_string(),
            format!("{:?}", l.out_shape),
            l.kind.num_params().to_string(),
        ]);
    }
    let mut width = [0usize; 4];
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut s = String::new();
    for (i, row) in rows.iter().enumerate() {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3]
        );
        s.push_str(line.trim_end());
        s.push('\n');
        if i == 0 {
            s.push_str(&"-".repeat(width.iter().sum::<usize>() + 6));
            s.push('\n');
        }
    }
    s.push_str(&format!("Total params: {}\n", param_count(layers)));
    s
}

fn err(key: impl Into<String>, msg: impl Into<String>) -> Error {
    Error::config(MODEL_FILE, key, msg)
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn walk(
    entries: &[LayerConfig],
    prefix: &str,
    key_prefix: &str,
    shape: &mut Vec<usize>,
    out: &mut Vec<ResolvedLayer>,
) -> Result<()> {
    let mut names = HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = format!("{key_prefix}[{i}]");
        // Like nn.Sequential: a named child is addressed by its name, others by position.
        let local = match entry.name() {
            Some(n) => {
                if !is_identifier(n) {
                    return Err(err(
                        format!("{key}.name"),
                        format!(
                            "{:?} is not a valid module name (letters, digits and _, not starting with a digit)",
                            crate::error::cut(n, crate::error::VALUE_CHARS)
                        ),
                    ));
                }
                if !names.insert(n) {
                    return Err(err(
                        format!("{key}.name"),
                        format!(
                            "the name {:?} is used twice in the same block",
                            crate::error::cut(n, crate::error::VALUE_CHARS)
                        ),
                    ));
                }
                n.to_owned()
            }
            None => i.to_string(),
        };
        let path = if prefix.is_empty() { local } else { format!("{prefix}.{local}") };
        if let LayerConfig::Sequential { layers, .. } = entry {
            if layers.is_empty() {
                return Err(err(format!("{key}.layers"), "a sequential block must have at least one layer"));
            }
            walk(layers, &path, &format!("{key}.layers"), shape, out)?;
            continue;
        }
        let LayerConfig::Layer { spec, .. } = entry else {
            return Err(Error::internal(format!(
                "{key}: a {} entry reached shape inference",
                entry.type_name()
            )));
        };
        let (kind, out_shape) = spec.resolve(shape, &key)?;
        out.push(ResolvedLayer {
            name: path,
            kind,
            in_shape: shape.clone(),
            out_shape: out_shape.clone(),
            key,
        });
        *shape = out_shape;
    }
    Ok(())
}

/// The element count of `shape`, or `None` when it does not fit in a usize.
pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}
