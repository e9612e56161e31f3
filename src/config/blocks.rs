//! `[model.blocks]`: modules defined once in the file and used by name, as a
//! Python file defines `class BasicBlock(nn.Module)` once and a ResNet builds
//! `layer1` ... `layer4` from it.
//!
//! ```toml
//! [model.blocks.BasicBlock]
//! args = { planes = "int", stride = 1, downsample = false }
//! layers = [
//!   { type = "residual", layers = [
//!     { type = "conv2d", name = "conv1", out_channels = "$planes", kernel_size = 3, stride = "$stride", padding = 1, bias = false },
//!     ...
//!   ], shortcut = [
//!     { type = "sequential", name = "downsample", when = "$downsample", layers = [...] },
//!   ] },
//!   { type = "relu", name = "relu" },
//! ]
//! ```
//!
//! An argument is declared with its default, or with its type (`"int"`,
//! `"float"`, `"bool"`, `"string"`) when the caller must give it. A value
//! that is exactly `"$name"` is replaced by the argument; `when = "$flag"`
//! keeps an entry only where the flag is true (the projection shortcut of a
//! ResNet stage's first block). The body is read after substitution, by the
//! same reader as `[[model.layers]]`, so its errors name the key inside the
//! block.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use toml::{Table, Value};

use super::layers::LayerConfig;
use super::model::MODEL_FILE;
use crate::error::{cut, Error, Result, VALUE_CHARS};

/// One `[model.blocks.<Name>]` table, kept as written until it is used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockDef {
    /// Each argument's default, or its type name when it has none.
    #[serde(default, skip_serializing_if = "Table::is_empty")]
    pub args: Table,
    pub layers: Vec<Value>,
}

/// The blocks of a model, by name.
pub type Blocks = BTreeMap<String, BlockDef>;

/// The type an argument takes: what its default is, or what it declares.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ArgType {
    Int,
    Float,
    Bool,
    Str,
    Array,
    Table,
}

impl ArgType {
    fn of(v: &Value) -> ArgType {
        match v {
            Value::Integer(_) => ArgType::Int,
            Value::Float(_) => ArgType::Float,
            Value::Boolean(_) => ArgType::Bool,
            Value::String(_) | Value::Datetime(_) => ArgType::Str,
            Value::Array(_) => ArgType::Array,
            Value::Table(_) => ArgType::Table,
        }
    }

    fn declared(name: &str) -> Option<ArgType> {
        Some(match name {
            "int" => ArgType::Int,
            "float" => ArgType::Float,
            "bool" => ArgType::Bool,
            "string" => ArgType::Str,
            _ => return None,
        })
    }

    fn words(self) -> &'static str {
        match self {
            ArgType::Int => "an integer",
            ArgType::Float => "a number",
            ArgType::Bool => "true or false",
            ArgType::Str => "a string",
            ArgType::Array => "an array",
            ArgType::Table => "a table",
        }
    }

    /// `v` as this type (an integer where a float is expected is widened).
    fn accept(self, v: &Value) -> Option<Value> {
        match (self, v) {
            (ArgType::Float, Value::Integer(i)) => Some(Value::Float(*i as f64)),
            _ if ArgType::of(v) == self => Some(v.clone()),
            _ => None,
        }
    }
}

fn err(key: impl Into<String>, msg: impl Into<String>) -> Error {
    Error::config(MODEL_FILE, key, msg)
}

/// Checks the block's own table: its name and its arguments' declarations.
pub(crate) fn check_def(name: &str, def: &BlockDef) -> Result<()> {
    let key = format!("model.blocks.{}", cut(name, VALUE_CHARS));
    if !super::layers::is_block_name(name) {
        return Err(err(
            key,
            "a block's name starts with a capital letter, like a Python class (BasicBlock), \
             so that it is never taken for a layer type; then letters, digits and _",
        ));
    }
    if def.layers.is_empty() {
        return Err(err(format!("{key}.layers"), "a block must have at least one layer"));
    }
    for arg in def.args.keys() {
        if !super::model::is_identifier(arg) {
            return Err(err(
                format!("{key}.args.{}", cut(arg, VALUE_CHARS)),
                "an argument's name is letters, digits and _, not starting with a digit",
            ));
        }
    }
    Ok(())
}

/// The block's body for one use: the arguments bound (defaults, then
/// `args`, then `first` for the first of a `repeat`), substituted, entries
/// whose `when` is false dropped, and read as layer entries.
pub(crate) fn instantiate(
    name: &str,
    def: &BlockDef,
    call_key: &str,
    calls: &[(&str, &Table)],
) -> Result<Vec<LayerConfig>> {
    let mut bound: BTreeMap<&str, Value> = BTreeMap::new();
    let mut types: BTreeMap<&str, ArgType> = BTreeMap::new();
    for (arg, decl) in &def.args {
        match decl.as_str().and_then(ArgType::declared) {
            Some(t) => {
                types.insert(arg, t);
            }
            None => {
                types.insert(arg, ArgType::of(decl));
                bound.insert(arg, decl.clone());
            }
        }
    }
    for (field, given) in calls {
        for (arg, v) in given.iter() {
            let key = format!("{call_key}.{field}.{}", cut(arg, VALUE_CHARS));
            let Some(&t) = types.get(arg.as_str()) else {
                let mut msg =
                    format!("{name} has no argument `{}`; {}", cut(arg, VALUE_CHARS), arg_list(def));
                if let Some(s) = def.args.keys().find(|a| super::load::similar(arg, a)) {
                    msg.push_str(&format!(" (did you mean `{s}`?)"));
                }
                return Err(err(key, msg));
            };
            let v =
                t.accept(v).ok_or_else(|| err(&key, format!("expected {}, found {}", t.words(), show(v))))?;
            if let Some((k, _)) = def.args.get_key_value(arg.as_str()) {
                bound.insert(k, v);
            }
        }
    }
    if let Some((arg, t)) = types.iter().find(|(a, _)| !bound.contains_key(*a)) {
        return Err(err(
            call_key,
            format!(
                "{name} needs the argument `{arg}` ({}): give it in `args = {{ {arg} = ... }}`",
                t.words()
            ),
        ));
    }
    let body_key = format!("model.blocks.{name}.layers");
    let mut body = Value::Array(def.layers.clone());
    let scope = Scope { block: name, def, bound: &bound };
    scope.substitute(&mut body, &body_key)?;
    super::load::extract_layers(&body_key, body)
}

struct Scope<'a> {
    block: &'a str,
    def: &'a BlockDef,
    bound: &'a BTreeMap<&'a str, Value>,
}

impl Scope<'_> {
    /// Replaces every `"$arg"` under `v` and applies `when`; `key` is `v`'s.
    fn substitute(&self, v: &mut Value, key: &str) -> Result<()> {
        match v {
            Value::String(s) => {
                if let Some(arg) = s.strip_prefix('$') {
                    let Some(value) = self.bound.get(arg) else {
                        return Err(err(
                            key,
                            format!(
                                "\"${}\" names no argument of {}; {}",
                                cut(arg, VALUE_CHARS),
                                self.block,
                                arg_list(self.def)
                            ),
                        ));
                    };
                    *v = value.clone();
                }
            }
            Value::Array(items) => {
                let mut kept = Vec::with_capacity(items.len());
                for (i, mut item) in std::mem::take(items).into_iter().enumerate() {
                    let key = format!("{key}[{i}]");
                    self.substitute(&mut item, &key)?;
                    if self.keep(&mut item, &key)? {
                        kept.push(item);
                    }
                }
                *items = kept;
            }
            Value::Table(t) => {
                for (k, item) in t.iter_mut() {
                    self.substitute(item, &format!("{key}.{}", cut(k, VALUE_CHARS)))?;
                }
            }
            Value::Integer(_) | Value::Float(_) | Value::Boolean(_) | Value::Datetime(_) => {}
        }
        Ok(())
    }

    /// Whether an entry stays: `when` (already substituted) is true or absent.
    fn keep(&self, item: &mut Value, key: &str) -> Result<bool> {
        let Value::Table(t) = item else { return Ok(true) };
        match t.remove("when") {
            None | Some(Value::Boolean(true)) => Ok(true),
            Some(Value::Boolean(false)) => Ok(false),
            Some(other) => Err(err(
                format!("{key}.when"),
                format!(
                    "expected true or false (a bool argument such as \"$downsample\"), found {}",
                    show(&other)
                ),
            )),
        }
    }
}

/// `its arguments: planes (an integer), stride (default 1)`.
fn arg_list(def: &BlockDef) -> String {
    if def.args.is_empty() {
        return "it takes no arguments".to_owned();
    }
    let args: Vec<String> = def
        .args
        .iter()
        .map(|(a, d)| match d.as_str().and_then(ArgType::declared) {
            Some(t) => format!("{a} ({})", t.words()),
            None => format!("{a} (default {})", cut(&d.to_string(), VALUE_CHARS)),
        })
        .collect();
    format!("its arguments: {}", args.join(", "))
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("string {:?}", cut(s, VALUE_CHARS)),
        other => cut(&other.to_string(), VALUE_CHARS),
    }
}
