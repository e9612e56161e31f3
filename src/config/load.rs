//! Layered loading: TOML file <- `DDPTRAIN_<SECTION>__<KEY>` environment
//! variables <- `--set key=value`, later layers winning; then validation.
//!
//! Each environment variable and each `--set` is its own figment provider, so
//! an error's metadata names the exact variable (or `--set`) the bad value
//! came from.

use std::path::Path;

use figment::error::Kind;
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};

use super::model::MODEL_FILE;
use super::schema::{Config, DatasetKind, OptimizerName, SECTIONS};
use crate::error::{cut, Error, Result, VALUE_CHARS};

const ENV_PREFIX: &str = "DDPTRAIN_";
/// Names the provider of the defaults computed from other keys; errors
/// attributed to it are reported against the config file instead.
const DERIVED: &str = "defaults derived from other keys";

/// Loads, merges and validates the config at `path` with the process
/// environment and the `--set key=value` overrides.
pub fn load(path: &Path, sets: &[String]) -> Result<Config> {
    let mut env = Vec::new();
    for (k, v) in std::env::vars_os() {
        // Variables that are not ours may hold anything; only ours must be UTF-8.
        let Ok(k) = k.into_string() else { continue };
        match v.into_string() {
            Ok(v) => env.push((k, v)),
            Err(_) if is_config_var(&k) => {
                return Err(Error::config(
                    format!("environment variable {k}"),
                    env_key(&k).replace("__", "."),
                    "value is not valid UTF-8",
                ));
            }
            Err(_) => {}
        }
    }
    load_with_env(path, sets, &env)
}

/// [`load`] with the environment given explicitly (tests use this so they do
/// not change the process environment).
pub fn load_with_env(path: &Path, sets: &[String], env: &[(String, String)]) -> Result<Config> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::config(&file, "<file>", format!("cannot read the config file: {e}")))?;
    load_text(path, &text, sets, env)
}

/// [`load_with_env`] of `text`, as if read from `path` (which names the run
/// and the errors; nothing is read from it).
pub(crate) fn load_text(
    path: &Path,
    text: &str,
    sets: &[String],
    env: &[(String, String)],
) -> Result<Config> {
    let file = path.display().to_string();
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(&file, text, &e))?;

    let mut fig = Figment::new().merge(Layer {
        meta: Metadata::from(file.clone(), Source::File(path.to_path_buf())),
        dict: table.into_iter().map(|(k, v)| (k, toml_to_value(v))).collect(),
    });

    if let Some(e) = env.iter().find_map(|(k, _)| misspelled_config_var(k)) {
        return Err(e);
    }
    // Sorted so that a key given by two variables (different case) resolves the same way every run.
    let mut vars: Vec<&(String, String)> = env.iter().filter(|(k, _)| is_config_var(k)).collect();
    vars.sort();
    for (k, v) in vars {
        let source = format!("environment variable {}", cut(k, VALUE_CHARS));
        let segments = split_key(&env_key(k), "__", &source)?;
        fig = fig.merge(Layer::nested(Metadata::named(source), &segments, parse_value(v)));
    }

    for set in sets {
        let Some((key, value)) = set.split_once('=') else {
            let set = cut(set.trim(), VALUE_CHARS);
            return Err(Error::config("--set", set, "expected key=value, e.g. --set train.epochs=1"));
        };
        let segments = split_key(key.trim(), ".", "--set")?;
        fig = fig.merge(Layer::nested(Metadata::named("--set"), &segments, parse_value(value)));
    }

    let derived = derived_defaults(&fig, path);
    let fig = fig.join(derived);
    let mut cfg: Config = fig.extract().map_err(|e| convert_error(e, &file))?;
    cfg.config_path = path.to_path_buf();
    cfg.validate().map_err(|e| match e {
        // validate() names the file; say so when the value came from env or --set.
        Error::Config { key, msg, .. } => {
            let base = key.split('[').next().unwrap_or(&key);
            let source = source_name(fig.find_metadata(base), &file);
            let file = if source == file { file.clone() } else { format!("{file} (value from {source})") };
            Error::Config { file, key, msg }
        }
        other => other,
    })?;
    Ok(cfg)
}

/// The dotted keys whose defaults [`derived_defaults`] computes from other
/// keys for the config `text` (`run.name`, `data.eval_batch_size`, ...).
pub(crate) fn derived_keys(path: &Path, text: &str) -> Result<Vec<String>> {
    let file = path.display().to_string();
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(&file, text, &e))?;
    let fig = Figment::new().merge(Layer {
        meta: Metadata::named(file),
        dict: table.into_iter().map(|(k, v)| (k, toml_to_value(v))).collect(),
    });
    let mut keys = Vec::new();
    for (section, value) in derived_defaults(&fig, path).dict {
        if let Some(dict) = value.into_dict() {
            keys.extend(dict.into_keys().map(|k| format!("{section}.{k}")));
        }
    }
    Ok(keys)
}

/// Defaults that depend on other values, joined under everything else.
fn derived_defaults(fig: &Figment, path: &Path) -> Layer {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
    let name = fig.extract_inner::<String>("run.name").unwrap_or(stem);
    let mut run = Dict::new();
    run.insert("out_dir".into(), Value::from(format!("runs/{name}")));
    run.insert("name".into(), Value::from(name));

    let mut dict = Dict::new();
    dict.insert("run".into(), Value::from(run));
    let mut data = Dict::new();
    // An absent or mistyped batch_size gets no derived default; extraction reports it.
    if let Ok(batch) = fig.extract_inner::<u64>("data.batch_size") {
        data.insert("eval_batch_size".into(), Value::from(batch));
    }
    // Each dataset's own directory, normalization and class count, as the
    // torchvision recipes for it write them (a mistyped dataset gets none).
    let kind = fig.extract_inner::<DatasetKind>("data.dataset").unwrap_or_default();
    data.insert("path".into(), Value::from(kind.default_path()));
    // Text has no channels to normalize (and its input_shape is [block_size]).
    let channels = match kind {
        DatasetKind::Text => 1,
        _ => fig
            .extract_inner::<Vec<u64>>("model.input_shape")
            .ok()
            .and_then(|s| s.first().copied())
            .unwrap_or(1)
            .min(64),
    };
    let (mean, std) = match kind.default_normalize() {
        Some((m, s)) => (m.to_vec(), s.to_vec()),
        // Arrays of unknown content: ToTensor's scaling only.
        None => (vec![0.0; channels as usize], vec![1.0; channels as usize]),
    };
    let floats = |v: Vec<f32>| Value::from(v.iter().map(|x| f64::from(*x)).collect::<Vec<f64>>());
    data.insert("mean".into(), floats(mean));
    data.insert("std".into(), floats(std));
    if let Some(classes) = kind.classes() {
        data.insert("num_classes".into(), Value::from(classes as u64));
    }
    dict.insert("data".into(), Value::from(data));
    // PyTorch: AdamW defaults to weight_decay=0.01, SGD and Adam to 0.
    let wd = match fig.extract_inner::<OptimizerName>("optimizer.name") {
        Ok(OptimizerName::AdamW) => 0.01,
        _ => 0.0,
    };
    dict.insert("optimizer".into(), Value::from(Dict::from([("weight_decay".into(), Value::from(wd))])));
    Layer { meta: Metadata::named(DERIVED), dict }
}

/// Reads layer entries from `value`, a block's body after its arguments are
/// substituted, with the errors and messages of the config file's own
/// entries, at `key` (`model.blocks.BasicBlock.layers[0].kernel_size`).
pub(crate) fn extract_layers(key: &str, value: toml::Value) -> Result<Vec<super::layers::LayerConfig>> {
    #[derive(serde::Deserialize)]
    struct Body {
        layers: Vec<super::layers::LayerConfig>,
    }
    let dict = Dict::from([("layers".to_owned(), toml_to_value(value))]);
    let fig = Figment::new().merge(Layer { meta: Metadata::named(MODEL_FILE), dict });
    // The path figment reports starts at `layers`: put the block's key before it.
    let at = key.strip_suffix("layers").unwrap_or(key);
    fig.extract::<Body>().map(|b| b.layers).map_err(|e| match convert_error(e, MODEL_FILE) {
        Error::Config { file, key, msg } => Error::Config { file, key: format!("{at}{key}"), msg },
        other => other,
    })
}

/// One source of values with its own metadata.
struct Layer {
    meta: Metadata,
    dict: Dict,
}

impl Layer {
    fn nested(meta: Metadata, segments: &[String], value: Value) -> Layer {
        let mut value = value;
        for seg in segments[1..].iter().rev() {
            value = Value::from(Dict::from([(seg.clone(), value)]));
        }
        Layer { meta, dict: Dict::from([(segments[0].clone(), value)]) }
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        self.meta.clone()
    }
    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

fn is_config_var(k: &str) -> bool {
    k.strip_prefix(ENV_PREFIX).is_some_and(|rest| rest.contains("__"))
}

/// `DDPTRAIN_TRAIN_EPOCHS`: a section and a key joined by one underscore
/// instead of two. Left alone it would be silently ignored, as are the
/// other `DDPTRAIN_*` variables (`DDPTRAIN_JOB_TOKEN`, ...), none of which
/// starts with a section name.
fn misspelled_config_var(k: &str) -> Option<Error> {
    let rest = k.strip_prefix(ENV_PREFIX)?;
    // Byte offsets below assume ASCII (lowercasing some letters changes their length).
    if rest.contains("__") || !rest.is_ascii() {
        return None;
    }
    let lower = rest.to_lowercase();
    let section = SECTIONS
        .iter()
        .find(|s| lower.strip_prefix(**s).is_some_and(|r| r.len() > 1 && r.starts_with('_')))?;
    let key = &rest[section.len() + 1..];
    let var = cut(k, VALUE_CHARS);
    Some(Error::config(
        format!("environment variable {var}"),
        cut(&format!("{section}.{}", key.to_lowercase()), VALUE_CHARS),
        format!(
            "names no config key: a config variable is DDPTRAIN_<SECTION>__<KEY>, with two underscores \
             after the section (did you mean `{}`?)",
            cut(&format!("{ENV_PREFIX}{}__{key}", &rest[..section.len()]), VALUE_CHARS)
        ),
    ))
}

/// `DDPTRAIN_TRAIN__MAX_STEPS` -> `train__max_steps`.
fn env_key(k: &str) -> String {
    k.strip_prefix(ENV_PREFIX).unwrap_or(k).to_lowercase()
}

fn split_key(key: &str, sep: &str, source: &str) -> Result<Vec<String>> {
    let segments: Vec<String> = key.split(sep).map(str::to_owned).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(Error::config(
            source,
            cut(key, VALUE_CHARS),
            "empty key segment; expected e.g. train.epochs",
        ));
    }
    if key.contains('[') {
        return Err(Error::config(
            source,
            cut(key, VALUE_CHARS),
            "array elements cannot be set one by one; set the whole array, e.g. model.layers=[...]",
        ));
    }
    Ok(segments)
}

/// A value given on the command line or in the environment: a TOML value
/// (`1`, `0.5`, `true`, `[1, 2]`, `"quoted"`), else the text as a string.
fn parse_value(text: &str) -> Value {
    // Parsing as a one-key document refuses anything that is more than a value.
    match toml::from_str::<toml::Table>(&format!("v = {text}")) {
        Ok(mut t) if t.len() == 1 => match t.remove("v") {
            Some(v) => toml_to_value(v),
            None => Value::from(text.to_owned()),
        },
        _ => Value::from(text.to_owned()),
    }
}

fn toml_to_value(v: toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::from(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => Value::from(f),
        toml::Value::Boolean(b) => Value::from(b),
        // No key takes a date; as a string it fails with an ordinary type error.
        toml::Value::Datetime(d) => Value::from(d.to_string()),
        toml::Value::Array(a) => Value::from(a.into_iter().map(toml_to_value).collect::<Vec<_>>()),
        toml::Value::Table(t) => {
            Value::from(t.into_iter().map(|(k, v)| (k, toml_to_value(v))).collect::<Dict>())
        }
    }
}

fn syntax_error(file: &str, text: &str, e: &toml::de::Error) -> Error {
    let msg = match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            let src = cut(text.lines().nth(line - 1).unwrap_or("").trim_end(), 2 * VALUE_CHARS);
            format!(
                "TOML syntax error at line {line}, column {col}: {}\n  {line} | {src}",
                cut(&one_line(e.message()), 2 * VALUE_CHARS)
            )
        }
        None => format!("TOML syntax error: {}", cut(&one_line(e.message()), 2 * VALUE_CHARS)),
    };
    Error::config(file, "<syntax>", msg)
}

fn one_line(msg: &str) -> String {
    msg.trim().lines().map(str::trim).collect::<Vec<_>>().join("; ")
}

/// The source to name in an error: the file, an environment variable, or `--set`.
fn source_name(meta: Option<&Metadata>, file: &str) -> String {
    match meta {
        Some(m) if m.name != DERIVED => match &m.source {
            Some(Source::File(p)) => p.display().to_string(),
            _ => m.name.to_string(),
        },
        _ => file.to_owned(),
    }
}

/// `["model", "layers", "0", "kernel_size"]` -> `model.layers[0].kernel_size`.
pub(crate) fn format_key(path: &[String]) -> String {
    let mut key = String::new();
    for seg in path {
        if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
            key.push_str(&format!("[{seg}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(seg);
        }
    }
    key
}

fn convert_error(e: figment::Error, file: &str) -> Error {
    // A chained error lists several problems; the first is enough to act on.
    let Some(e) = e.into_iter().next() else {
        return Error::config(file, "<file>", "unknown error");
    };
    let source = source_name(e.metadata.as_ref(), file);
    let mut path = e.path.clone();
    let msg = match &e.kind {
        Kind::UnknownField(field, expected) => {
            let parent = if path.last() == Some(field) { &path[..path.len() - 1] } else { &path[..] };
            let place = if parent.is_empty() {
                "at the top level".to_owned()
            } else {
                format!("in `{}`", cut(&format_key(parent), VALUE_CHARS))
            };
            // figment already appends the key for struct fields; layer tables raise it themselves.
            if path.last() != Some(field) {
                path.push(field.clone());
            }
            let mut msg = format!("unknown key; valid keys {place}: {}", expected.join(", "));
            if let Some(s) = expected.iter().find(|c| similar(field, c)) {
                msg.push_str(&format!(" (did you mean `{s}`?)"));
            }
            msg
        }
        Kind::MissingField(field) => {
            let section = path.is_empty();
            path.push(field.to_string());
            if section {
                format!("missing required section [{field}]")
            } else if field == "type" {
                // Only layer tables have a `type`.
                format!(
                    "missing required key (every layer needs a type: {})",
                    super::layers::entry_types_list()
                )
            } else {
                "missing required key".to_owned()
            }
        }
        Kind::UnknownVariant(v, expected) => {
            format!("unknown value {:?}; expected one of: {}", cut(v, VALUE_CHARS), expected.join(", "))
        }
        Kind::InvalidType(actual, expected) => {
            let actual = describe(actual);
            let mut msg = format!("expected {}, found {actual}", readable_type(expected));
            if source != file && expected.contains("string") {
                msg.push_str(" (quote the value to pass it as a string)");
            }
            msg
        }
        Kind::InvalidValue(actual, expected) => {
            format!("invalid value {}: expected {}", describe(actual), readable_type(expected))
        }
        Kind::InvalidLength(n, expected) => format!("expected {expected}, found {n} element(s)"),
        Kind::DuplicateField(field) => {
            path.push(field.to_string());
            "given more than once (`kernel` is an alias of `kernel_size`)".to_owned()
        }
        other => cut(&other.to_string(), 4 * VALUE_CHARS),
    };
    Error::config(source, cut(&format_key(&path), VALUE_CHARS), msg)
}

/// figment's description of a value (`string "abc"`), a long string cut.
pub(crate) fn describe(actual: &figment::error::Actual) -> String {
    match actual {
        figment::error::Actual::Str(v) => format!("string {:?}", cut(v, VALUE_CHARS)),
        other => cut(&other.to_string(), VALUE_CHARS),
    }
}

/// serde's Rust type names in words a config author knows.
pub(crate) fn readable_type(expected: &str) -> String {
    match expected {
        "u8" => "an integer from 0 to 255".to_owned(),
        "u16" | "u32" | "u64" | "usize" => "a non-negative integer".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a boolean" => "true or false".to_owned(),
        other if other.starts_with("struct ") => "a table".to_owned(),
        other => other.to_owned(),
    }
}

/// A likely typo: one edit or one swap of neighbours apart, or one a prefix of the other.
pub(crate) fn similar(a: &str, b: &str) -> bool {
    if a.len() >= 3 && (b.starts_with(a) || a.starts_with(b)) {
        return true;
    }
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // The edit distance is at least the difference in length (and a 10 MB key must not cost seconds).
    if a.len().abs_diff(b.len()) > 1 {
        return false;
    }
    if a.len() == b.len() {
        let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
        if let [i, j] = diff[..] {
            if j == i + 1 && a[i] == b[j] && a[j] == b[i] {
                return true;
            }
        }
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()] <= 1
}
