//! The rows of the key table (`super::keys`) for the entries of
//! `model.layers`: every layer type's `Layer::KEYS` and the wiring entries'
//! keys, each typed by the first probe value the entry reader takes for it,
//! required when a table without it is refused as missing it, and defaulted
//! as the reader fills it in (a default that moves with a required key, as
//! maxpool2d's stride with its kernel_size, is named as that key).

use std::collections::BTreeMap;

use super::keys::{given, internal, toml_words, KeyDocs, Row, REGENERATE};
use super::layers::{LayerConfig, WIRING};
use super::load::extract_layers;
use crate::error::{Error, Result};
use crate::nn::layers::{LayerSpec, TYPES};

/// Values that try each type, in order: a float key takes 1 too, so 0.5
/// comes first.
fn candidates() -> [(&'static str, toml::Value); 6] {
    [
        ("float", toml::Value::Float(0.5)),
        ("integer", toml::Value::Integer(1)),
        ("bool", toml::Value::Boolean(true)),
        ("string", toml::Value::String("x".into())),
        ("array", toml::Value::Array(Vec::new())),
        ("table", toml::Value::Table(toml::Table::new())),
    ]
}

/// The entry `{ type = ty, <keys> }`, read as the config file's entries are.
fn entry(ty: &str, keys: &BTreeMap<String, toml::Value>) -> Result<LayerConfig> {
    let mut t = toml::Table::new();
    t.insert("type".into(), toml::Value::String(ty.into()));
    t.extend(keys.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut layers = extract_layers("layers", toml::Value::Array(vec![toml::Value::Table(t)]))?;
    layers.pop().ok_or_else(|| internal(format!("a `{ty}` entry read as nothing")))
}

/// The key an error of [`entry`] says is missing.
fn missing(e: &Error) -> Option<&str> {
    match e {
        Error::Config { key, msg, .. } if msg.starts_with("missing required") => {
            key.strip_prefix("layers[0].")
        }
        _ => None,
    }
}

/// The rows of every entry type's keys: the keys every layer type takes
/// first, then each layer type's own, then the wiring entries'.
pub(super) fn layer_rows<'a>(docs: &KeyDocs<'a>, used: &mut Vec<&'a str>) -> Result<Vec<Row>> {
    let mut entries: Vec<(String, &str, Vec<&str>)> = Vec::new();
    for &ty in TYPES {
        let keys = LayerSpec::keys(ty).ok_or_else(|| internal(format!("{ty} has no keys")))?;
        let keys = keys.iter().copied().chain(["tie"]).filter(|k| *k != "type").collect();
        entries.push((ty.to_owned(), ty, keys));
    }
    let common: Vec<&str> = entries
        .first()
        .map(|(_, _, ks)| {
            ks.iter().copied().filter(|k| entries.iter().all(|(_, _, o)| o.contains(k))).collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    if let Some((_, first, _)) = entries.first() {
        out.extend(entry_rows(docs, used, first, "every layer type", "*", &common)?);
    }
    for (ty, _, keys) in &entries {
        let own: Vec<&str> = keys.iter().copied().filter(|k| !common.contains(k)).collect();
        out.extend(entry_rows(docs, used, ty, &format!("`{ty}`"), ty, &own)?);
    }
    for (ty, keys) in WIRING {
        let keys: Vec<&str> = keys.iter().copied().filter(|k| *k != "type").collect();
        // A block's use is written with the block's own (capitalized) name.
        let written = if *ty == "<Block>" { "Block" } else { ty };
        out.extend(entry_rows(docs, used, written, &format!("`{ty}`"), ty, &keys)?);
    }
    Ok(out)
}

/// The rows of `keys` of entries of type `ty`, shown as `place` and
/// documented under `doc_ty`.
fn entry_rows<'a>(
    docs: &KeyDocs<'a>,
    used: &mut Vec<&'a str>,
    ty: &str,
    place: &str,
    doc_ty: &str,
    keys: &[&str],
) -> Result<Vec<Row>> {
    // Each key's type: the first candidate it takes.
    let mut types = BTreeMap::new();
    let all: std::collections::BTreeSet<&str> = LayerSpec::keys(ty)
        .unwrap_or_default()
        .iter()
        .chain(keys)
        .copied()
        .filter(|k| *k != "type")
        .collect();
    for key in all {
        let mut taken = None;
        for (name, v) in candidates() {
            let one = BTreeMap::from([(key.to_string(), v.clone())]);
            let ok = match entry(ty, &one) {
                Ok(_) => true,
                Err(e) => missing(&e).is_some(),
            };
            if ok {
                taken = Some((name, v));
                break;
            }
        }
        let t = taken.ok_or_else(|| internal(format!("`{ty}.{key}` takes none of the probe's values")))?;
        types.insert(key.to_string(), t);
    }
    // The required keys, each given the value its type took.
    let mut given_keys = BTreeMap::new();
    let mut required = Vec::new();
    let base = loop {
        match entry(ty, &given_keys) {
            Ok(cfg) => break cfg,
            Err(e) => {
                let key = missing(&e).ok_or_else(|| internal(format!("a `{ty}` entry: {e}")))?;
                let (_, v) = types.get(key).ok_or_else(|| internal(format!("`{ty}` requires `{key}`")))?;
                if required.iter().any(|r| r == key) {
                    return Err(internal(format!("`{ty}` still misses `{key}`")));
                }
                required.push(key.to_owned());
                given_keys.insert(key.to_owned(), v.clone());
            }
        }
    };
    let table = toml::Value::try_from(&base).map_err(internal)?;
    // A default that follows a required integer key (maxpool2d's stride).
    let mut follows = BTreeMap::new();
    for r in &required {
        if !matches!(types.get(r), Some((_, toml::Value::Integer(_)))) {
            continue;
        }
        let mut other = given_keys.clone();
        other.insert(r.clone(), toml::Value::Integer(3));
        let t = toml::Value::try_from(&entry(ty, &other)?).map_err(internal)?;
        for k in keys {
            if k != r && table.get(*k) != t.get(*k) {
                follows.insert(k.to_string(), r.clone());
            }
        }
    }
    // A bool left out of the written table at its default (embedding's `positions`).
    let mut left_out = BTreeMap::new();
    for key in keys {
        if table.get(*key).is_some() || !matches!(types.get(*key), Some(("bool", _))) {
            continue;
        }
        for b in [false, true] {
            let mut with = given_keys.clone();
            with.insert(key.to_string(), toml::Value::Boolean(b));
            if entry(ty, &with).is_ok_and(|e| e == base) {
                left_out.insert(key.to_string(), toml::Value::Boolean(b));
            }
        }
    }
    let mut rows = Vec::new();
    for key in keys {
        let doc = format!("{doc_ty}.{key}");
        let (name, _) = types.get(*key).ok_or_else(|| internal(format!("`{ty}.{key}` has no type")))?;
        let ty_words = given(docs.types, &doc, used).unwrap_or(name).to_owned();
        let written = given(docs.defaults, &doc, used);
        let default = if required.iter().any(|r| r == key) {
            "required".to_owned()
        } else if let Some(r) = follows.get(*key) {
            format!("`{r}`")
        } else {
            match (table.get(*key).or(left_out.get(*key)), written) {
                (Some(v), None) => toml_words(v),
                (Some(v), Some(_)) => {
                    return Err(Error::internal(format!(
                        "src/config/key_docs.rs gives a default for `{doc}`, which the code sets \
                         ({}): take it out, then regenerate the table with `{REGENERATE}`",
                        toml_words(v)
                    )))
                }
                (None, Some(w)) => w.to_owned(),
                (None, None) => "unset".to_owned(),
            }
        };
        rows.push(Row { place: place.to_owned(), key: key.to_string(), doc, ty: ty_words, default });
    }
    Ok(rows)
}
