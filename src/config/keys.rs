//! The table of every config key (`ddptrain keys`, written to docs/CONFIG.md).
//!
//! Nothing in it is listed by hand but the meanings: the sections and their
//! keys are the config structs' own field lists ([`super::probe`]), each
//! key's type is what its `Deserialize` asks for, and its default is what
//! the loader fills in for a minimal config. The layer types' keys are their
//! `Layer::KEYS`; their types and defaults come from reading tables through
//! the reader the config file's own entries go through. A key without a
//! meaning in [`super::key_docs`], or a meaning for a key the code does not
//! have, is an error naming it, and tests/cli_keys.rs holds docs/CONFIG.md
//! to the output, so the table cannot fall behind the code.

use std::path::Path;

use super::key_rows_layers::layer_rows;
use super::load::{derived_keys, load_text};
use super::probe::{shape_of, Shape};
use super::schema::{Config, SECTIONS};
use crate::error::{Error, Result};

pub use super::key_docs::DOCS;

/// The command that writes the table where the docs keep it.
pub const REGENERATE: &str = "cargo run -- keys > docs/CONFIG.md";

/// The smallest config that loads: every key in it is required, and the
/// defaults of all others are read from it once loaded.
const MINIMAL: &str = r#"
[model]
input_shape = [1, 28, 28]
layers = [{ type = "flatten" }, { type = "linear", out_features = 10 }]

[data]
batch_size = 1

[optimizer]
lr = 0.1
"#;
const MINIMAL_PATH: &str = "<name>.toml";
/// Each loads [`MINIMAL`] with one of these, as `--set` gives them (a run
/// needs one of the two); a key's default is read from a variant that does
/// not set it.
const VARIANTS: [&str; 2] = ["train.max_steps=1", "train.epochs=1"];

/// What only a person can say of a key: its meaning (every key has one),
/// and where the code cannot tell, its default or its type. Keys are
/// `section.key` (`data.random_crop.size`), `layer_type.key`
/// (`conv2d.stride`), or `*.key` for every layer type (`*.name`).
pub struct KeyDocs<'a> {
    pub meanings: &'a [(&'a str, &'a str)],
    pub defaults: &'a [(&'a str, &'a str)],
    pub types: &'a [(&'a str, &'a str)],
}

/// One row of a table.
pub(super) struct Row {
    /// The section, or the layer type.
    pub(super) place: String,
    pub(super) key: String,
    /// How [`KeyDocs`] names it.
    pub(super) doc: String,
    pub(super) ty: String,
    pub(super) default: String,
}

/// The key table as markdown, with ddptrain's own meanings.
pub fn markdown() -> Result<String> {
    markdown_with(&DOCS)
}

/// The key table as markdown, with the meanings of `docs`.
pub fn markdown_with(docs: &KeyDocs) -> Result<String> {
    let mut used = Vec::new();
    let sections = section_rows(docs, &mut used)?;
    let layers = layer_rows(docs, &mut used)?;
    let mut out = String::from(HEADER);
    out.push_str("| section | key | type | default | meaning |\n|---|---|---|---|---|\n");
    for r in &sections {
        out.push_str(&table_line(r, meaning(docs, &r.doc, &mut used)?));
    }
    out.push_str(LAYERS_HEADER);
    out.push_str("| entry | key | type | default | meaning |\n|---|---|---|---|---|\n");
    for r in &layers {
        out.push_str(&table_line(r, meaning(docs, &r.doc, &mut used)?));
    }
    for list in [docs.meanings, docs.defaults, docs.types] {
        if let Some((k, _)) = list.iter().find(|(k, _)| !used.contains(k)) {
            return Err(Error::internal(format!(
                "src/config/key_docs.rs documents `{k}`, which is no config key: take it out, then \
                 regenerate the table with `{REGENERATE}`"
            )));
        }
    }
    Ok(out)
}

const HEADER: &str = "# Config keys

Every key a ddptrain config takes. A key is written under its `[section]` in \
the TOML file, or given as `--set section.key=value` or \
`DDPTRAIN_<SECTION>__<KEY>=value` (README, \"Using it\"); an unknown key is an \
error. \"required\" keys have no default; \"unset\" keys are left out unless \
given.

This page is generated from the code's own key lists by `ddptrain keys`; \
`tests/cli_keys.rs` fails when it differs from what the code generates. \
Regenerate it with `cargo run -- keys > docs/CONFIG.md`.

## Sections

";

const LAYERS_HEADER: &str = "
## Entries of `model.layers`

Each entry of `model.layers` (and of a block's `layers`) is a table whose \
`type` is a layer type, `sequential`, `residual`, `sum`, or the name of a \
block defined under `[model.blocks]` (capitalized, written `<Block>` here). \
Layer types take PyTorch's argument names and defaults.

";

fn table_line(r: &Row, meaning: &str) -> String {
    format!("| {} | `{}` | {} | {} | {} |\n", r.place, r.key, r.ty, r.default, meaning)
}

fn find<'a>(list: &[(&'a str, &'a str)], key: &str) -> Option<(&'a str, &'a str)> {
    list.iter().find(|(k, _)| *k == key).copied()
}

/// The meaning of `doc`: for a layer key `type.key`, the type's own
/// ([`crate::nn::layers::Layer::DOCS`]), else `doc`'s or `*.key`'s here,
/// marked as used.
fn meaning<'a>(docs: &KeyDocs<'a>, doc: &str, used: &mut Vec<&'a str>) -> Result<&'a str> {
    let own = doc.split_once('.').and_then(|(ty, key)| find(crate::nn::layers::LayerSpec::docs(ty), key));
    let any = doc.split_once('.').map(|(_, k)| format!("*.{k}"));
    let here = || find(docs.meanings, doc).or_else(|| any.and_then(|k| find(docs.meanings, &k)));
    let m = match own {
        Some((_, m)) => m,
        None => {
            let (k, m) = here().ok_or_else(|| {
                Error::internal(format!(
                    "config key `{doc}` has no meaning in src/config/key_docs.rs: add one, then regenerate \
                     the table with `{REGENERATE}`"
                ))
            })?;
            used.push(k);
            m
        }
    };
    if m.contains('|') || m.contains('\n') {
        return Err(Error::internal(format!("the meaning of `{doc}` has a `|` or a line break")));
    }
    Ok(m)
}

/// A hand-written default or type for `doc`, marked as used.
pub(super) fn given<'a>(list: &[(&'a str, &'a str)], doc: &str, used: &mut Vec<&'a str>) -> Option<&'a str> {
    let (k, v) = find(list, doc)?;
    used.push(k);
    Some(v)
}

/// The probe's shape in words.
fn type_words(s: &Shape) -> Option<String> {
    Some(match s {
        Shape::Bool => "bool".into(),
        Shape::Int => "integer".into(),
        Shape::Float => "float".into(),
        Shape::Str => "string".into(),
        Shape::Seq(e) => format!("array of {}", plural(e)?),
        Shape::Tuple(n, e) => format!("array of {n} {}", plural(e)?),
        Shape::Option(s) => type_words(s)?,
        Shape::Enum(vs) => one_of(vs),
        Shape::Struct(_) | Shape::Map => "table".into(),
        Shape::Any => return None,
    })
}

fn plural(s: &Shape) -> Option<String> {
    Some(match s.inner() {
        Shape::Int => "integers".into(),
        Shape::Float => "floats".into(),
        Shape::Str => "strings".into(),
        Shape::Bool => "bools".into(),
        Shape::Struct(_) | Shape::Map => "tables".into(),
        _ => return None,
    })
}

fn one_of(vs: &[&str]) -> String {
    let quoted: Vec<String> = vs.iter().map(|v| format!("`\"{v}\"`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.join(""),
    }
}

/// A default as the config file would write it.
pub(super) fn toml_words(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("`\"{s}\"`"),
        toml::Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| toml_words(x).replace('`', "")).collect();
            format!("`[{}]`", items.join(", "))
        }
        toml::Value::Float(f) => format!("`{}`", float_words(*f)),
        toml::Value::Table(t) if t.is_empty() => "`{}`".into(),
        other => format!("`{other}`"),
    }
}

/// The shortest form of `f`, as an f32 where it is one (`1e-5`, not
/// `0.000009999999747378752`).
fn float_words(f: f64) -> String {
    let narrow = f as f32;
    let s = if f64::from(narrow) == f { narrow.to_string() } else { f.to_string() };
    if f != 0.0 && f.abs() < 1e-3 {
        if f64::from(narrow) == f {
            format!("{narrow:e}")
        } else {
            format!("{f:e}")
        }
    } else if f.fract() == 0.0 && !s.contains('.') && !s.contains('e') {
        format!("{s}.0")
    } else {
        s
    }
}

pub(super) fn internal(what: impl std::fmt::Display) -> Error {
    Error::internal(format!("the key table: {what}"))
}

/// The rows of the sections' keys.
fn section_rows<'a>(docs: &KeyDocs<'a>, used: &mut Vec<&'a str>) -> Result<Vec<Row>> {
    let path = Path::new(MINIMAL_PATH);
    let sections = match shape_of::<Config>(&[]).map_err(internal)? {
        Shape::Struct(s) => s,
        other => return Err(internal(format!("the config probed as {other:?}"))),
    };
    if sections != SECTIONS {
        return Err(internal(format!(
            "SECTIONS in src/config/schema.rs lists {SECTIONS:?}, the Config struct has {sections:?}"
        )));
    }
    let mut resolved = Vec::new();
    for set in VARIANTS {
        let cfg = load_text(path, MINIMAL, &[set.to_owned()], &[]).map_err(|e| {
            internal(format!("its minimal config (MINIMAL in src/config/keys.rs) does not load: {e}"))
        })?;
        let written = toml::Value::try_from(&cfg).map_err(internal)?;
        resolved.push(Variant { set, cfg, written });
    }
    let derived = derived_keys(path, MINIMAL)?;
    let required = required_keys(path)?;
    let mut ctx = Sections { docs, resolved, derived, required, used, rows: Vec::new() };
    for section in sections {
        ctx.walk(section, &[])?;
    }
    Ok(ctx.rows)
}

/// Every key of [`MINIMAL`], each checked to be required: without it the
/// config does not load, and the error names it.
fn required_keys(path: &Path) -> Result<Vec<String>> {
    let table: toml::Table = toml::from_str(MINIMAL).map_err(internal)?;
    let mut keys = Vec::new();
    for (section, value) in &table {
        for key in value.as_table().map(|t| t.keys()).into_iter().flatten() {
            let mut without = table.clone();
            if let Some(t) = without.get_mut(section).and_then(|v| v.as_table_mut()) {
                t.remove(key);
            }
            let dotted = format!("{section}.{key}");
            let text = toml::to_string(&without).map_err(internal)?;
            match load_text(path, &text, &[VARIANTS[0].to_owned()], &[]) {
                Err(Error::Config { key: k, msg, .. })
                    if k == dotted && msg.starts_with("missing required") =>
                {
                    keys.push(dotted)
                }
                _ => return Err(internal(format!("MINIMAL holds `{dotted}`, which is not required"))),
            }
        }
    }
    Ok(keys)
}

/// The minimal config loaded with one of [`VARIANTS`].
struct Variant {
    set: &'static str,
    cfg: Config,
    /// As the resolved config writes it (keys at their default may be left out).
    written: toml::Value,
}

impl Variant {
    fn sets(&self, doc: &str) -> bool {
        self.set.split('=').next() == Some(doc)
    }
}

struct Sections<'d, 'a> {
    docs: &'d KeyDocs<'a>,
    /// The minimal config loaded with each of [`VARIANTS`].
    resolved: Vec<Variant>,
    derived: Vec<String>,
    required: Vec<String>,
    used: &'d mut Vec<&'a str>,
    rows: Vec<Row>,
}

impl Sections<'_, '_> {
    /// The rows of `section`'s key at `path` and of any table under it
    /// (`&[]`: every key of the section).
    fn walk(&mut self, section: &str, path: &[&str]) -> Result<()> {
        let full: Vec<&str> = std::iter::once(section).chain(path.iter().copied()).collect();
        let shape = shape_of::<Config>(&full).map_err(internal)?;
        if !path.is_empty() {
            self.row(section, path, &shape)?;
        }
        let keys = match shape.inner() {
            Shape::Struct(keys) => keys.to_vec(),
            // A table of named tables (`[model.blocks.<Name>]`): the keys of one.
            Shape::Map => {
                let named: Vec<&str> = full.iter().copied().chain(["<Name>"]).collect();
                if let Ok(Shape::Struct(keys)) = shape_of::<Config>(&named) {
                    let at: Vec<&str> = path.iter().copied().chain(["<Name>"]).collect();
                    for k in keys {
                        let sub: Vec<&str> = at.iter().copied().chain([*k]).collect();
                        self.walk(section, &sub)?;
                    }
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        for k in keys {
            let sub: Vec<&str> = path.iter().copied().chain([k]).collect();
            self.walk(section, &sub)?;
        }
        Ok(())
    }

    fn row(&mut self, section: &str, path: &[&str], shape: &Shape) -> Result<()> {
        let key = path.join(".");
        let doc = format!("{section}.{key}");
        let written = given(self.docs.types, &doc, self.used);
        let ty = match written.map(str::to_owned).or_else(|| type_words(shape)) {
            Some(t) => t,
            None => {
                return Err(Error::internal(format!(
                    "config key `{doc}` takes more than one kind of value: give its type in \
                     src/config/key_docs.rs, then regenerate the table with `{REGENERATE}`"
                )))
            }
        };
        let variant = self.resolved.iter().find(|v| !v.sets(&doc));
        let written = variant.and_then(|v| v.written.get(section));
        let value = path.iter().try_fold(written, |v, k| Some(v?.get(k))).flatten().cloned();
        // A bool or a choice left out of the resolved config at its default.
        let value = match (value, variant) {
            (None, Some(v)) => self.left_out(v, &doc, shape)?,
            (value, _) => value,
        };
        let value = value.as_ref();
        let written = given(self.docs.defaults, &doc, self.used);
        let default = if self.derived.contains(&doc) {
            written.map(str::to_owned).ok_or_else(|| {
                Error::internal(format!(
                    "config key `{doc}` defaults to a value computed from other keys: say which in \
                     src/config/key_docs.rs, then regenerate the table with `{REGENERATE}`"
                ))
            })?
        } else if self.required.contains(&doc) || self.required_in_table(&doc)? {
            "required".to_owned()
        } else {
            match (value, written) {
                (Some(v), Some(_)) => {
                    return Err(Error::internal(format!(
                        "src/config/key_docs.rs gives a default for `{doc}`, which the code sets \
                         ({}): take it out, then regenerate the table with `{REGENERATE}`",
                        toml_words(v)
                    )))
                }
                (Some(v), None) => toml_words(v),
                (None, Some(w)) => w.to_owned(),
                (None, None) => "unset".to_owned(),
            }
        };
        self.rows.push(Row { place: section.to_owned(), key, doc, ty, default });
        Ok(())
    }
}

impl Sections<'_, '_> {
    /// Whether `doc`, a key of a table inside a section
    /// (`data.random_crop.size`), must be given when the table is.
    fn required_in_table(&self, doc: &str) -> Result<bool> {
        let Some((table, _)) = doc.rsplit_once('.').filter(|(t, _)| t.contains('.')) else {
            return Ok(false);
        };
        let Some(v) = self.resolved.first() else { return Ok(false) };
        let sets = [v.set.to_owned(), format!("{table}={{}}")];
        Ok(match load_text(Path::new(MINIMAL_PATH), MINIMAL, &sets, &[]) {
            Err(Error::Config { key, msg, .. }) => key == doc && msg.starts_with("missing required"),
            _ => false,
        })
    }

    /// The value of `doc` that leaves the config as `v` has it, where the
    /// key takes a bool or one of a few strings: the default the resolved
    /// config leaves out.
    fn left_out(&self, v: &Variant, doc: &str, shape: &Shape) -> Result<Option<toml::Value>> {
        let choices: Vec<toml::Value> = match shape.inner() {
            Shape::Bool => vec![toml::Value::Boolean(false), toml::Value::Boolean(true)],
            Shape::Enum(vs) => vs.iter().map(|s| toml::Value::String((*s).to_owned())).collect(),
            _ => return Ok(None),
        };
        for c in choices {
            let sets = [v.set.to_owned(), format!("{doc}={c}")];
            if load_text(Path::new(MINIMAL_PATH), MINIMAL, &sets, &[]).is_ok_and(|cfg| cfg == v.cfg) {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }
}
