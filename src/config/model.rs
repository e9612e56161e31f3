//! Shape inference over `[model]`: flattens the layer list (sequential blocks
//! and residual wiring included) into a graph in execution order, with
//! PyTorch module paths, the values each node reads and per-sample shapes.
//! Used by validation, by `ddptrain check` and by the model builder.

use std::collections::HashMap;

use super::blocks::{self, Blocks};
use super::layers::LayerConfig;
use super::schema::ModelConfig;
pub use super::tie::Tie;
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
    /// The parameter of an earlier node this node's weight is.
    pub tie: Option<Tie>,
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
    for (name, def) in &model.blocks {
        blocks::check_def(name, def)?;
    }
    let mut g = Graph { blocks: &model.blocks, using: Vec::new(), out: Vec::new() };
    let x = Value { id: 0, shape: input.to_vec() };
    let shape = g.walk(&model.layers, &mut Namespace::new(""), "model.layers", x)?.shape;
    let out = g.out;
    // Every later size (parameter buffers, the model's total) is a sum or
    // product of these, so checking them here keeps the rest unchecked-safe.
    let mut total = 0usize;
    for l in &out {
        total =
            l.kind.params().iter().try_fold(total, |t, (_, s)| t.checked_add(numel(s)?)).ok_or_else(
                || err(&l.key, "the model's parameter count does not fit in 64 bits".to_owned()),
            )?;
    }
    // A language model maps [T] token ids to [T, vocab_size] logits.
    let language_model = input.len() == 1 && shape.len() == 2;
    if shape.len() != 1 && !language_model {
        return Err(err(
            "model.layers",
            format!("the model's output is {shape:?} per sample; a classifier must end in 1-D logits (add flatten and linear layers)"),
        ));
    }
    Ok(out)
}

/// Total learnable scalars, as `sum(p.numel() for p in model.parameters())`:
/// a tied parameter once.
pub fn param_count(layers: &[ResolvedLayer]) -> usize {
    layers.iter().map(own_params).sum()
}

/// A node's parameter count, less the one it shares with an earlier node.
fn own_params(l: &ResolvedLayer) -> usize {
    let tied = l.tie.as_ref().and_then(|t| l.kind.params().get(t.slot).map(|(_, s)| s.iter().product()));
    l.kind.num_params() - tied.unwrap_or(0)
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
        let repr = match &l.tie {
            Some(t) => format!("{repr} (weight = {})", t.key),
            None => repr,
        };
        rows.push([l.name.clone(), repr, format!("{:?}", l.out_shape), own_params(l).to_string()]);
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

pub(super) fn err(key: impl Into<String>, msg: impl Into<String>) -> Error {
    Error::config(MODEL_FILE, key, msg)
}

pub(crate) fn is_identifier(s: &str) -> bool {
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

/// More nodes than any real network has: a `repeat` typo (or a block
/// that multiplies) is refused before it eats the memory.
const MAX_NODES: usize = 100_000;
/// More instances than any real stage holds.
const MAX_REPEAT: usize = 10_000;

/// The graph being built, and the blocks it may use.
struct Graph<'b> {
    blocks: &'b Blocks,
    /// The blocks being expanded, outermost first: a block may not use itself.
    using: Vec<&'b str>,
    out: Vec<ResolvedLayer>,
}

impl<'b> Graph<'b> {
    fn walk(
        &mut self,
        entries: &[LayerConfig],
        ns: &mut Namespace<'_>,
        key_prefix: &str,
        mut x: Value,
    ) -> Result<Value> {
        for (i, entry) in entries.iter().enumerate() {
            let key = format!("{key_prefix}[{i}]");
            if self.out.len() >= MAX_NODES {
                return Err(err(key, format!("the model has more than {MAX_NODES} nodes; check `repeat`")));
            }
            x = match entry {
                LayerConfig::Sequential { name, layers } => {
                    let path = ns.child(name.as_deref(), &key, true)?;
                    if layers.is_empty() {
                        return Err(err(
                            format!("{key}.layers"),
                            "a sequential block must have at least one layer",
                        ));
                    }
                    self.walk(layers, &mut Namespace::new(&path), &format!("{key}.layers"), x)?
                }
                LayerConfig::Residual { layers, shortcut } => {
                    if layers.is_empty() {
                        return Err(err(
                            format!("{key}.layers"),
                            "a residual block must have at least one layer",
                        ));
                    }
                    let branch = self.walk(layers, ns, &format!("{key}.layers"), x.clone())?;
                    let short = self.walk(shortcut, ns, &format!("{key}.shortcut"), x.clone())?;
                    if branch.shape != short.shape {
                        let note =
                            if shortcut.is_empty() { " (the identity: no `shortcut` given)" } else { "" };
                        let (a, b) =
                            (("`layers`", &branch.shape[..]), ("the shortcut", note, &short.shape[..]));
                        return Err(err(&key, mismatch(a, b, "`shortcut`")));
                    }
                    self.add(ns, &key, vec![branch, short])?
                }
                LayerConfig::Sum { branches } => {
                    if branches.len() < 2 {
                        return Err(err(
                            format!("{key}.branches"),
                            "a sum needs at least two branches (an empty branch is the identity)",
                        ));
                    }
                    let mut outs: Vec<Value> = Vec::with_capacity(branches.len());
                    for (j, b) in branches.iter().enumerate() {
                        let v = self.walk(b, ns, &format!("{key}.branches[{j}]"), x.clone())?;
                        if let Some(first) = outs.first().filter(|f| f.shape != v.shape) {
                            let a = "branches[0]".to_owned();
                            let fix = format!("branches[{j}]");
                            let note = if b.is_empty() { " (the identity)" } else { "" };
                            return Err(err(
                                &key,
                                mismatch((&a, &first.shape), (&fix, note, &v.shape), &fix),
                            ));
                        }
                        outs.push(v);
                    }
                    self.add(ns, &key, outs)?
                }
                LayerConfig::Block { name, block, args, repeat, first } => {
                    let path = ns.child(name.as_deref(), &key, true)?;
                    self.block(&path, &key, block, args, *repeat, first, x)?
                }
                LayerConfig::Layer { name, spec, tie } => {
                    let (kind, out_shape) = spec.resolve(&x.shape, &key)?;
                    let stateful = !(kind.params().is_empty() && kind.buffers().is_empty());
                    let path = ns.child(name.as_deref(), &key, stateful)?;
                    let tie =
                        tie.as_deref().map(|t| super::tie::resolve(&self.out, &kind, &key, t)).transpose()?;
                    let v = self.push(path, kind, vec![x.id], x.shape, out_shape, key);
                    if let Some(last) = self.out.last_mut() {
                        last.tie = tie;
                    }
                    v
                }
            };
        }
        Ok(x)
    }

    /// A use of `[model.blocks.<block>]` as the module `path`: once, or
    /// `repeat` times as the children `path.0`, `path.1`, ...
    #[allow(clippy::too_many_arguments)]
    fn block(
        &mut self,
        path: &str,
        key: &str,
        block: &str,
        args: &toml::Table,
        repeat: Option<usize>,
        first: &toml::Table,
        mut x: Value,
    ) -> Result<Value> {
        let Some((block, def)) = self.blocks.get_key_value(block) else {
            let defined: Vec<&str> = self.blocks.keys().map(String::as_str).collect();
            let have = if defined.is_empty() {
                "no blocks are defined (add a [model.blocks.<Name>] table)".to_owned()
            } else {
                format!("the blocks defined are {}", defined.join(", "))
            };
            // PyTorch's class name (`ReLU`, `BatchNorm2d`, `AdaptiveAvgPool2d`)
            // for its layer type, which is lower case.
            let bare = |s: &str| s.replace('_', "").to_lowercase();
            let meant = crate::nn::layers::TYPES.iter().find(|t| bare(t) == bare(block));
            let hint = meant
                .map(|t| format!(" (did you mean `{t}`? layer types are lower case)"))
                .unwrap_or_default();
            return Err(err(
                format!("{key}.type"),
                format!(
                    "{:?} is neither a layer type nor a block under [model.blocks]{hint}; {have}",
                    crate::error::cut(block, crate::error::VALUE_CHARS)
                ),
            ));
        };
        if self.using.contains(&block.as_str()) {
            let chain = self.using.join(" -> ");
            return Err(err(format!("{key}.type"), format!("{block} uses itself ({chain} -> {block})")));
        }
        let count = match repeat {
            None if !first.is_empty() => {
                return Err(err(
                    format!("{key}.first"),
                    "`first` applies to the first of a `repeat`; add `repeat`",
                ));
            }
            None => None,
            Some(n) if n == 0 || n > MAX_REPEAT => {
                return Err(err(format!("{key}.repeat"), format!("must be 1 to {MAX_REPEAT}, got {n}")));
            }
            Some(n) => Some(n),
        };
        self.using.push(block);
        for i in 0..count.unwrap_or(1) {
            let mut calls = vec![("args", args)];
            if i == 0 && count.is_some() {
                calls.push(("first", first));
            }
            let inst = match count {
                Some(_) => format!("{path}.{i}"),
                None => path.to_owned(),
            };
            let body_key = format!("model.blocks.{block}.layers");
            let res = blocks::instantiate(block, def, key, &calls)
                .and_then(|body| self.walk(&body, &mut Namespace::new(&inst), &body_key, x.clone()));
            x = res.map_err(|e| match e {
                Error::Config { file, key: at, msg } if at.starts_with("model.blocks.") => {
                    let msg = format!("{msg} (in `{inst}`, the {block} at {key})");
                    Error::Config { file, key: at, msg }
                }
                other => other,
            })?;
        }
        self.using.pop();
        Ok(x)
    }

    /// The add node summing `operands`, named in `ns` as torch.fx names it.
    fn add(&mut self, ns: &mut Namespace<'_>, key: &str, operands: Vec<Value>) -> Result<Value> {
        let name = ns.add(key)?;
        let kind = LayerKind::Add(crate::nn::layers::Add { inputs: operands.len() });
        let shape = operands.first().map(|v| v.shape.clone()).unwrap_or_default();
        let inputs = operands.iter().map(|v| v.id).collect();
        Ok(self.push(name, kind, inputs, shape.clone(), shape, key.to_owned()))
    }

    fn push(
        &mut self,
        name: String,
        kind: LayerKind,
        inputs: Vec<usize>,
        in_shape: Vec<usize>,
        out_shape: Vec<usize>,
        key: String,
    ) -> Value {
        self.out.push(ResolvedLayer {
            name,
            kind,
            inputs,
            in_shape,
            out_shape: out_shape.clone(),
            key,
            tie: None,
        });
        Value { id: self.out.len(), shape: out_shape }
    }
}

/// Why two operands of an add cannot be added, and the usual fix: a
/// projection (1x1 conv with the stride and channels that fit, then
/// batchnorm2d), as torchvision's ResNets use for their shortcut.
/// `b` is the side to fix (`the shortcut`, `branches[1]`), `note` says
/// more of it, `fix_at` is where its projection goes.
fn mismatch((a, want): (&str, &[usize]), (b, note, got): (&str, &str, &[usize]), fix_at: &str) -> String {
    let mut msg = format!(
        "cannot add the two sides: {a} gives {want:?} per sample but {b}{note} gives {got:?}; they must be equal"
    );
    if let ([c, h, w], [_, sh, sw]) = (want, got) {
        let stride = (sh % h == 0 && sw % w == 0 && sh / h == sw / w).then(|| sh / h);
        match stride {
            Some(s) => msg.push_str(&format!(
                " (give {fix_at} a projection from {got:?} to {want:?}: {{ type = \"conv2d\", out_channels = {c}, kernel_size = 1, stride = {s}, bias = false }} then {{ type = \"batchnorm2d\" }})"
            )),
            None => msg.push_str(&format!(
                " ({a}'s spatial size {h}x{w} is not {b}'s {sh}x{sw} divided by a whole stride; change {a}'s strides or padding)"
            )),
        }
    }
    msg
}

/// The element count of `shape`, or `None` when it does not fit in a usize.
pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}
