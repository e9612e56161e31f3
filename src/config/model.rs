//! Shape inference over `[model]`: flattens the layer list (sequential blocks
//! and residual wiring included) into a graph in execution order, with
//! PyTorch module paths, the values each node reads and per-sample shapes.
//! Used by validation, by `ddptrain check` and by the model builder.

use std::collections::HashMap;

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
    /// The values read: 0 is the model input, `i + 1` the output of node `i`.
    pub inputs: Vec<usize>,
    /// Per-sample shapes (no batch dimension); `in_shape` is every input's.
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
    let x = Value { id: 0, shape: input.to_vec() };
    let shape = walk(&model.layers, &mut Namespace::new(""), "model.layers", x, &mut out)?.shape;
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
    // A node that reads anything but the one before it says what it reads.
    let producer = |v: usize| match v.checked_sub(1).and_then(|i| layers.get(i)) {
        Some(p) => p.name.clone(),
        None => "(input)".to_owned(),
    };
    for (i, l) in layers.iter().enumerate() {
        let repr = if l.inputs == [i] {
            l.kind.to_string()
        } else {
            let from: Vec<String> = l.inputs.iter().map(|&v| producer(v)).collect();
            format!("{} <- {}", l.kind, from.join(" + "))
        };
        rows.push([l.name.clone(), repr, format!("{:?}", l.out_shape), l.kind.num_params().to_string()]);
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

/// A value of the graph: its id (0 the model input, `i + 1` node `i`'s
/// output) and its per-sample shape.
#[derive(Debug, Clone)]
struct Value {
    id: usize,
    shape: Vec<usize>,
}

/// The children of one module (the model, a sequential block): their names
/// and the position the next one takes. Residual wiring adds no module, so
/// its entries are counted and named in the namespace around it.
struct Namespace<'p> {
    prefix: &'p str,
    /// Each name given, and whether its module holds parameters or buffers.
    names: HashMap<String, bool>,
    next: usize,
    adds: usize,
}

impl<'p> Namespace<'p> {
    fn new(prefix: &'p str) -> Self {
        Namespace { prefix, names: HashMap::new(), next: 0, adds: 0 }
    }

    fn path(&self, local: &str) -> String {
        if self.prefix.is_empty() {
            local.to_owned()
        } else {
            format!("{}.{local}", self.prefix)
        }
    }

    /// The path of the next child: its `name`, or like nn.Sequential its
    /// position. A module without state may be named twice (one `relu`
    /// called twice, as torchvision's blocks do); one with state may not.
    fn child(&mut self, name: Option<&str>, key: &str, stateful: bool) -> Result<String> {
        let position = self.next;
        self.next += 1;
        let Some(n) = name else { return Ok(self.path(&position.to_string())) };
        if !is_identifier(n) {
            return Err(err(
                format!("{key}.name"),
                format!(
                    "{:?} is not a valid module name (letters, digits and _, not starting with a digit)",
                    crate::error::cut(n, crate::error::VALUE_CHARS)
                ),
            ));
        }
        self.claim(n, &format!("{key}.name"), stateful)?;
        Ok(self.path(n))
    }

    fn claim(&mut self, n: &str, key: &str, stateful: bool) -> Result<()> {
        let before = self.names.insert(n.to_owned(), stateful);
        let why = match before {
            None => return Ok(()),
            Some(false) if !stateful => return Ok(()),
            Some(_) => {
                " (a module with parameters or buffers cannot be used twice: give each use its own name)"
            }
        };
        Err(err(
            key,
            format!(
                "the name {:?} is used twice in the same block{why}",
                crate::error::cut(n, crate::error::VALUE_CHARS)
            ),
        ))
    }

    /// The name of the next residual add (`add`, `add_1`, ... as torch.fx names them).
    fn add(&mut self, key: &str) -> Result<String> {
        let local = if self.adds == 0 { "add".to_owned() } else { format!("add_{}", self.adds) };
        self.adds += 1;
        self.claim(&local, key, true)?;
        Ok(self.path(&local))
    }
}

fn walk(
    entries: &[LayerConfig],
    ns: &mut Namespace<'_>,
    key_prefix: &str,
    mut x: Value,
    out: &mut Vec<ResolvedLayer>,
) -> Result<Value> {
    for (i, entry) in entries.iter().enumerate() {
        let key = format!("{key_prefix}[{i}]");
        x = match entry {
            LayerConfig::Sequential { name, layers } => {
                let path = ns.child(name.as_deref(), &key, true)?;
                if layers.is_empty() {
                    return Err(err(
                        format!("{key}.layers"),
                        "a sequential block must have at least one layer",
                    ));
                }
                walk(layers, &mut Namespace::new(&path), &format!("{key}.layers"), x, out)?
            }
            LayerConfig::Residual { layers, shortcut } => residual(layers, shortcut, ns, &key, x, out)?,
            LayerConfig::Layer { name, spec } => {
                let (kind, out_shape) = spec.resolve(&x.shape, &key)?;
                let stateful = !(kind.params().is_empty() && kind.buffers().is_empty());
                let path = ns.child(name.as_deref(), &key, stateful)?;
                push(out, path, kind, vec![x.id], x.shape, out_shape, key)
            }
        };
    }
    Ok(x)
}

fn push(
    out: &mut Vec<ResolvedLayer>,
    name: String,
    kind: LayerKind,
    inputs: Vec<usize>,
    in_shape: Vec<usize>,
    out_shape: Vec<usize>,
    key: String,
) -> Value {
    out.push(ResolvedLayer { name, kind, inputs, in_shape, out_shape: out_shape.clone(), key });
    Value { id: out.len(), shape: out_shape }
}

/// `layers(x) + shortcut(x)`: the branch's nodes, the shortcut's, then the add.
fn residual(
    layers: &[LayerConfig],
    shortcut: &[LayerConfig],
    ns: &mut Namespace<'_>,
    key: &str,
    x: Value,
    out: &mut Vec<ResolvedLayer>,
) -> Result<Value> {
    if layers.is_empty() {
        return Err(err(format!("{key}.layers"), "a residual block must have at least one layer"));
    }
    let branch = walk(layers, ns, &format!("{key}.layers"), x.clone(), out)?;
    let short = walk(shortcut, ns, &format!("{key}.shortcut"), x.clone(), out)?;
    if branch.shape != short.shape {
        return Err(err(key, mismatch(&branch.shape, &short.shape, shortcut.is_empty())));
    }
    let name = ns.add(key)?;
    let kind = LayerKind::Add(crate::nn::layers::Add { inputs: 2 });
    let shape = branch.shape.clone();
    Ok(push(out, name, kind, vec![branch.id, short.id], shape.clone(), shape, key.to_owned()))
}

/// Why a residual's two sides cannot be added, and the usual fix: a
/// projection shortcut (1x1 conv with the branch's stride and channels,
/// then batchnorm2d), as torchvision's ResNets use.
fn mismatch(branch: &[usize], short: &[usize], identity: bool) -> String {
    let what = if identity { "the shortcut (the identity: no `shortcut` given)" } else { "the shortcut" };
    let mut msg = format!(
        "cannot add the two sides: `layers` gives {branch:?} per sample but {what} gives {short:?}; they must be equal"
    );
    if let ([c, h, w], [_, sh, sw]) = (branch, short) {
        let stride = (sh % h == 0 && sw % w == 0 && sh / h == sw / w).then(|| sh / h);
        match stride {
            Some(s) => msg.push_str(&format!(
                " (give `shortcut` a projection from {short:?} to {branch:?}: {{ type = \"conv2d\", out_channels = {c}, kernel_size = 1, stride = {s}, bias = false }} then {{ type = \"batchnorm2d\" }})"
            )),
            None => msg.push_str(&format!(
                " (the branch's spatial size {h}x{w} is not the shortcut's {sh}x{sw} divided by a whole stride; change the branch's strides or padding)"
            )),
        }
    }
    msg
}

/// The element count of `shape`, or `None` when it does not fit in a usize.
pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}
