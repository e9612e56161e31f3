//! Shape inference over `[model]`: flattens the layer list (sequential blocks
//! included) into execution order, with PyTorch module paths and per-sample
//! shapes. Used by validation, by `ddptrain check` and by the model builder.

use std::collections::HashSet;
use std::fmt;

use serde::Serialize;

use super::layers::LayerConfig;
use super::schema::{short_f32, ModelConfig};
use crate::error::{Error, Result};

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

/// Serialized as the PyTorch constructor's keyword arguments (`ddptrain check --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum LayerKind {
    Conv2d {
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    },
    BatchNorm2d {
        num_features: usize,
        #[serde(serialize_with = "short_f32::one")]
        eps: f32,
        #[serde(serialize_with = "short_f32::one")]
        momentum: f32,
    },
    Relu,
    MaxPool2d {
        kernel_size: usize,
        stride: usize,
    },
    Flatten,
    Linear {
        in_features: usize,
        out_features: usize,
        bias: bool,
    },
}

impl LayerKind {
    /// Learnable parameters as (name, shape), in PyTorch registration order.
    pub fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        match *self {
            LayerKind::Conv2d { in_channels, out_channels, kernel_size, bias, .. } => {
                let mut p = vec![("weight", vec![out_channels, in_channels, kernel_size, kernel_size])];
                if bias {
                    p.push(("bias", vec![out_channels]));
                }
                p
            }
            LayerKind::BatchNorm2d { num_features, .. } => {
                vec![("weight", vec![num_features]), ("bias", vec![num_features])]
            }
            LayerKind::Linear { in_features, out_features, bias } => {
                let mut p = vec![("weight", vec![out_features, in_features])];
                if bias {
                    p.push(("bias", vec![out_features]));
                }
                p
            }
            LayerKind::Relu | LayerKind::MaxPool2d { .. } | LayerKind::Flatten => Vec::new(),
        }
    }

    /// Non-learnable state saved in the state_dict, in PyTorch order.
    pub fn buffers(&self) -> Vec<(&'static str, Vec<usize>)> {
        match *self {
            LayerKind::BatchNorm2d { num_features, .. } => vec![
                ("running_mean", vec![num_features]),
                ("running_var", vec![num_features]),
                ("num_batches_tracked", vec![]),
            ],
            _ => Vec::new(),
        }
    }

    /// Number of learnable scalars.
    pub fn num_params(&self) -> usize {
        self.params().iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }
}

/// PyTorch's module repr, e.g. `Conv2d(1, 16, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))`.
impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match *self {
            LayerKind::Conv2d { in_channels, out_channels, kernel_size: k, stride: s, padding: p, bias } => {
                write!(f, "Conv2d({in_channels}, {out_channels}, kernel_size=({k}, {k}), stride=({s}, {s})")?;
                if p != 0 {
                    write!(f, ", padding=({p}, {p})")?;
                }
                if !bias {
                    write!(f, ", bias=False")?;
                }
                write!(f, ")")
            }
            LayerKind::BatchNorm2d { num_features, eps, momentum } => {
                write!(f, "BatchNorm2d({num_features}, eps={eps:?}, momentum={momentum:?})")
            }
            LayerKind::Relu => write!(f, "ReLU()"),
            LayerKind::MaxPool2d { kernel_size, stride } => {
                write!(f, "MaxPool2d(kernel_size={kernel_size}, stride={stride})")
            }
            LayerKind::Flatten => write!(f, "Flatten()"),
            LayerKind::Linear { in_features, out_features, bias } => {
                let b = if bias { "True" } else { "False" };
                write!(f, "Linear(in_features={in_features}, out_features={out_features}, bias={b})")
            }
        }
    }
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
        let (kind, out_shape) = infer(entry, shape, &key)?;
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

fn positive(v: usize, key: &str, field: &str) -> Result<()> {
    if v == 0 {
        return Err(err(format!("{key}.{field}"), "must be at least 1"));
    }
    Ok(())
}

/// `[C, H, W]` or an error naming the layer type that needs it.
fn chw(shape: &[usize], ty: &str, key: &str) -> Result<(usize, usize, usize)> {
    match *shape {
        [c, h, w] => Ok((c, h, w)),
        _ => Err(err(key, format!("{ty} needs a [C, H, W] input, but its input is {shape:?}"))),
    }
}

fn infer(entry: &LayerConfig, shape: &[usize], key: &str) -> Result<(LayerKind, Vec<usize>)> {
    Ok(match *entry {
        LayerConfig::Conv2d { out_channels, kernel_size: k, stride: s, padding: p, bias, .. } => {
            let (c, h, w) = chw(shape, "conv2d", key)?;
            positive(out_channels, key, "out_channels")?;
            positive(k, key, "kernel_size")?;
            positive(s, key, "stride")?;
            let padded = |side: usize| p.checked_mul(2).and_then(|pp| side.checked_add(pp));
            let (Some(hp), Some(wp)) = (padded(h), padded(w)) else {
                return Err(err(
                    format!("{key}.padding"),
                    format!("padding {p} is too large: the padded input {h}x{w} (+2*padding) does not fit in 64 bits"),
                ));
            };
            if hp < k || wp < k {
                return Err(err(
                    format!("{key}.kernel_size"),
                    format!("kernel_size {k} is larger than the input {h}x{w} (+2*padding {p})"),
                ));
            }
            let (ho, wo) = ((hp - k) / s + 1, (wp - k) / s + 1);
            let out_shape = vec![out_channels, ho, wo];
            if numel(&out_shape).is_none() {
                // Name what made it large: the channels, or the padding that grew the image.
                let field = if out_channels > ho.max(wo) || p == 0 { "out_channels" } else { "padding" };
                return Err(err(
                    format!("{key}.{field}"),
                    format!("the output {out_shape:?} has more elements than fit in 64 bits"),
                ));
            }
            if numel(&[out_channels, c, k, k]).is_none() {
                let field = if out_channels >= k.saturating_mul(k) { "out_channels" } else { "kernel_size" };
                return Err(err(
                    format!("{key}.{field}"),
                    format!(
                        "the weight [{out_channels}, {c}, {k}, {k}] has more elements than fit in 64 bits"
                    ),
                ));
            }
            let kind = LayerKind::Conv2d {
                in_channels: c,
                out_channels,
                kernel_size: k,
                stride: s,
                padding: p,
                bias,
            };
            (kind, out_shape)
        }
        LayerConfig::BatchNorm2d { eps, momentum, .. } => {
            let (c, _, _) = chw(shape, "batchnorm2d", key)?;
            if !(eps.is_finite() && eps > 0.0) {
                return Err(err(format!("{key}.eps"), format!("must be a positive number, got {eps}")));
            }
            if !(0.0..=1.0).contains(&momentum) {
                return Err(err(format!("{key}.momentum"), format!("must be in [0, 1], got {momentum}")));
            }
            (LayerKind::BatchNorm2d { num_features: c, eps, momentum }, shape.to_vec())
        }
        LayerConfig::Relu { .. } => (LayerKind::Relu, shape.to_vec()),
        LayerConfig::MaxPool2d { kernel_size: k, stride: s, .. } => {
            let (c, h, w) = chw(shape, "maxpool2d", key)?;
            positive(k, key, "kernel_size")?;
            positive(s, key, "stride")?;
            if h < k || w < k {
                return Err(err(
                    format!("{key}.kernel_size"),
                    format!("kernel_size {k} is larger than the input {h}x{w}"),
                ));
            }
            (LayerKind::MaxPool2d { kernel_size: k, stride: s }, vec![c, (h - k) / s + 1, (w - k) / s + 1])
        }
        LayerConfig::Flatten { .. } => {
            // Every shape reaching here was checked to fit by the layer that made it.
            let n = numel(shape)
                .ok_or_else(|| err(key, format!("its input {shape:?} does not fit in 64 bits")))?;
            (LayerKind::Flatten, vec![n])
        }
        LayerConfig::Linear { out_features, bias, .. } => {
            let [in_features] = *shape else {
                return Err(err(
                    key,
                    format!(
                        "linear needs a 1-D input, but its input is {shape:?}: add a flatten layer before it"
                    ),
                ));
            };
            positive(out_features, key, "out_features")?;
            if numel(&[out_features, in_features]).is_none() {
                return Err(err(
                    format!("{key}.out_features"),
                    format!(
                        "the weight [{out_features}, {in_features}] has more elements than fit in 64 bits"
                    ),
                ));
            }
            (LayerKind::Linear { in_features, out_features, bias }, vec![out_features])
        }
        LayerConfig::Sequential { .. } => {
            return Err(Error::shape(format!("{key}: sequential blocks are expanded by walk()")));
        }
    })
}
