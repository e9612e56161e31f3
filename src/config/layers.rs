//! `[[model.layers]]` entries: tables tagged by `type`, PyTorch module names
//! and defaults. A layer type's own keys, defaults and checks live in its
//! file under `nn/layers/`; this file reads the tables.
//!
//! Deserialization is hand-written rather than serde's internally tagged
//! derive: that derive buffers the table first, which loses the key path of
//! any error inside it. Reading the keys directly keeps errors pointing at
//! e.g. `model.layers[0].layers[1].kernel_size`, and lets an unknown key be
//! reported against the fields of that layer type only. Every key any layer
//! type takes has its slot in [`RawLayer`] with its type, so a wrongly typed
//! value is reported at its own key.

use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::nn::layers::{LayerSpec, TYPES};

/// One entry of `model.layers` (or of a `sequential`'s `layers`).
#[derive(Debug, Clone, PartialEq)]
pub enum LayerConfig {
    /// A layer of one of the registered types (`nn::layers`). `tie` names
    /// the parameter of an earlier module its `weight` is (nanoGPT's
    /// `self.transformer.wte.weight = self.lm_head.weight`).
    Layer { name: Option<String>, spec: LayerSpec, tie: Option<String> },
    /// A block, like `self.layer1 = nn.Sequential(...)`: its entries are
    /// `layer1.0`, `layer1.1`, ... Unnamed, it takes its position in the
    /// block around it (`layer1.0` holding a ResNet block's `conv1`, ...).
    Sequential { name: Option<String>, layers: Vec<LayerConfig> },
    /// `layers(x) + shortcut(x)`, as a ResNet block's `forward()` writes it
    /// (`out += identity`): wiring, not a module, so it has no name and its
    /// entries are named in the block around it (`conv1`, `downsample.0`,
    /// ...). An empty `shortcut` is the identity.
    Residual { layers: Vec<LayerConfig>, shortcut: Vec<LayerConfig> },
    /// `branch_0(x) + branch_1(x) + ...`: the general form of `residual`
    /// (an empty branch is the identity). Wiring, like `residual`.
    Sum { branches: Vec<Vec<LayerConfig>> },
    /// A block defined under `[model.blocks]` (capitalized, as a Python
    /// class: `BasicBlock`), with its arguments. With `repeat = N` it is an
    /// `nn.Sequential` of N instances named `0`..`N-1`, the first taking
    /// `first`'s arguments over `args` (a ResNet stage's stride and
    /// projection).
    Block {
        name: Option<String>,
        block: String,
        args: toml::Table,
        repeat: Option<usize>,
        first: toml::Table,
    },
}

const SEQUENTIAL: &str = "sequential";
const SEQUENTIAL_KEYS: &[&str] = &["type", "name", "layers"];
const RESIDUAL: &str = "residual";
const RESIDUAL_KEYS: &[&str] = &["type", "layers", "shortcut"];
const SUM: &str = "sum";
const SUM_KEYS: &[&str] = &["type", "branches"];
const BLOCK_KEYS: &[&str] = &["type", "name", "args", "repeat", "first"];

/// The entries of `layers` that are not layer types, with their keys: the
/// `type` each is written with (a block's use: any capitalized name).
pub(crate) const WIRING: &[(&str, &[&str])] =
    &[(SEQUENTIAL, SEQUENTIAL_KEYS), (RESIDUAL, RESIDUAL_KEYS), (SUM, SUM_KEYS), ("<Block>", BLOCK_KEYS)];

/// Every `type` an entry may have: the layer types, then the blocks.
pub(crate) static ENTRY_TYPES: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| TYPES.iter().copied().chain([SEQUENTIAL, RESIDUAL, SUM]).collect());

/// A layer type's keys and `tie`, which every layer type takes (whether it
/// has a weight to share is checked with the graph).
static LAYER_KEYS: LazyLock<HashMap<&'static str, &'static [&'static str]>> = LazyLock::new(|| {
    let with_tie = |ty: &str| -> &'static [&'static str] {
        let keys = LayerSpec::keys(ty).unwrap_or_default().iter().copied().chain(["tie"]);
        Vec::leak(keys.collect())
    };
    TYPES.iter().map(|&ty| (ty, with_tie(ty))).collect()
});

fn unknown_type<E: de::Error>(ty: &str) -> E {
    E::custom(format!(
        "unknown layer type {:?}; expected one of: {}",
        crate::error::cut(ty, crate::error::VALUE_CHARS),
        entry_types_list()
    ))
}

/// `conv2d, batchnorm2d, ..., residual, sum, or a block's name`.
pub(crate) fn entry_types_list() -> String {
    format!("{}, or the name of a block defined under [model.blocks]", ENTRY_TYPES.join(", "))
}

/// A block's name is capitalized, as a Python class (`BasicBlock`), so it
/// can never shadow a layer type (those are lower case).
pub(crate) fn is_block_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl LayerConfig {
    /// The `name` key, if the entry has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            LayerConfig::Layer { name, .. } => name.as_deref(),
            LayerConfig::Sequential { name, .. } => name.as_deref(),
            LayerConfig::Block { name, .. } => name.as_deref(),
            LayerConfig::Residual { .. } | LayerConfig::Sum { .. } => None,
        }
    }

    /// The `type` value as written in the config.
    pub fn type_name(&self) -> &str {
        match self {
            LayerConfig::Layer { spec, .. } => spec.type_name(),
            LayerConfig::Sequential { .. } => SEQUENTIAL,
            LayerConfig::Residual { .. } => RESIDUAL,
            LayerConfig::Sum { .. } => SUM,
            LayerConfig::Block { block, .. } => block,
        }
    }
}

impl Serialize for LayerConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Sequential<'a> {
            #[serde(rename = "type")]
            ty: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            name: Option<&'a str>,
            layers: &'a [LayerConfig],
        }
        #[derive(Serialize)]
        struct Residual<'a> {
            #[serde(rename = "type")]
            ty: &'static str,
            layers: &'a [LayerConfig],
            shortcut: &'a [LayerConfig],
        }
        #[derive(Serialize)]
        struct Sum<'a> {
            #[serde(rename = "type")]
            ty: &'static str,
            branches: &'a [Vec<LayerConfig>],
        }
        #[derive(Serialize)]
        struct Block<'a> {
            #[serde(rename = "type")]
            ty: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            name: Option<&'a str>,
            #[serde(skip_serializing_if = "toml::Table::is_empty")]
            args: &'a toml::Table,
            #[serde(skip_serializing_if = "Option::is_none")]
            repeat: Option<usize>,
            #[serde(skip_serializing_if = "toml::Table::is_empty")]
            first: &'a toml::Table,
        }
        match self {
            LayerConfig::Layer { name, spec, tie } => {
                spec.serialize_table(name.as_deref(), tie.as_deref(), s)
            }
            LayerConfig::Sequential { name, layers } => {
                Sequential { ty: SEQUENTIAL, name: name.as_deref(), layers }.serialize(s)
            }
            LayerConfig::Residual { layers, shortcut } => {
                Residual { ty: RESIDUAL, layers, shortcut }.serialize(s)
            }
            LayerConfig::Sum { branches } => Sum { ty: SUM, branches }.serialize(s),
            LayerConfig::Block { name, block, args, repeat, first } => {
                Block { ty: block, name: name.as_deref(), args, repeat: *repeat, first }.serialize(s)
            }
        }
    }
}

/// The keys of one table as read, each typed once for every layer type.
#[derive(Default)]
pub struct RawLayer {
    ty: Option<String>,
    name: Option<String>,
    pub out_channels: Option<usize>,
    pub kernel_size: Option<usize>,
    pub stride: Option<usize>,
    pub padding: Option<usize>,
    pub bias: Option<bool>,
    pub eps: Option<f32>,
    pub momentum: Option<f32>,
    pub out_features: Option<usize>,
    pub output_size: Option<usize>,
    pub p: Option<f64>,
    pub num_embeddings: Option<usize>,
    pub embedding_dim: Option<usize>,
    pub positions: Option<bool>,
    pub init_std: Option<f64>,
    pub approximate: Option<String>,
    pub n_head: Option<usize>,
    pub dropout_p: Option<f64>,
    tie: Option<String>,
    layers: Option<Vec<LayerConfig>>,
    shortcut: Option<Vec<LayerConfig>>,
    branches: Option<Vec<Vec<LayerConfig>>>,
    args: Option<toml::Table>,
    repeat: Option<usize>,
    first: Option<toml::Table>,
    /// Keys no field above holds: a layer type's own, read by its
    /// `Layer::config` with [`RawLayer::get`].
    own: std::collections::BTreeMap<String, figment::value::Value>,
    /// Keys as written, in order, to check against the type afterwards.
    keys: Vec<String>,
}

impl RawLayer {
    /// The layer type's own key `key` as a `T`; `None` when unset.
    pub fn get<T: serde::de::DeserializeOwned, E: de::Error>(&self, key: &str) -> Result<Option<T>, E> {
        let Some(v) = self.own.get(key) else { return Ok(None) };
        T::deserialize(v).map(Some).map_err(|e| {
            let msg = match &e.kind {
                figment::error::Kind::InvalidType(actual, expected) => {
                    format!(
                        "expected {}, found {}",
                        super::load::readable_type(expected),
                        super::load::describe(actual)
                    )
                }
                other => other.to_string(),
            };
            E::custom(format!("`{key}`: {msg}"))
        })
    }
}

fn set<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
    field: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(field));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

/// The `type` value, refused at its own key when it names no entry type.
struct TypeSeed;

impl<'de> DeserializeSeed<'de> for TypeSeed {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        let ty = String::deserialize(d)?;
        if ENTRY_TYPES.contains(&ty.as_str()) || is_block_name(&ty) {
            Ok(ty)
        } else {
            Err(unknown_type(&ty))
        }
    }
}

struct LayerVisitor;

impl<'de> Visitor<'de> for LayerVisitor {
    type Value = LayerConfig;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a layer table with a `type` key")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LayerConfig, A::Error> {
        let mut raw = RawLayer::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "type" => {
                    if raw.ty.is_some() {
                        return Err(de::Error::duplicate_field("type"));
                    }
                    raw.ty = Some(map.next_value_seed(TypeSeed)?);
                }
                "name" => set(&mut map, &mut raw.name, "name")?,
                "out_channels" => set(&mut map, &mut raw.out_channels, "out_channels")?,
                "kernel_size" | "kernel" => set(&mut map, &mut raw.kernel_size, "kernel_size")?,
                "stride" => set(&mut map, &mut raw.stride, "stride")?,
                "padding" => set(&mut map, &mut raw.padding, "padding")?,
                "bias" => set(&mut map, &mut raw.bias, "bias")?,
                "eps" => set(&mut map, &mut raw.eps, "eps")?,
                "momentum" => set(&mut map, &mut raw.momentum, "momentum")?,
                "out_features" => set(&mut map, &mut raw.out_features, "out_features")?,
                "output_size" => set(&mut map, &mut raw.output_size, "output_size")?,
                "p" => set(&mut map, &mut raw.p, "p")?,
                "num_embeddings" => set(&mut map, &mut raw.num_embeddings, "num_embeddings")?,
                "embedding_dim" => set(&mut map, &mut raw.embedding_dim, "embedding_dim")?,
                "positions" => set(&mut map, &mut raw.positions, "positions")?,
                "init_std" => set(&mut map, &mut raw.init_std, "init_std")?,
                "approximate" => set(&mut map, &mut raw.approximate, "approximate")?,
                "n_head" => set(&mut map, &mut raw.n_head, "n_head")?,
                "dropout_p" => set(&mut map, &mut raw.dropout_p, "dropout_p")?,
                "tie" => set(&mut map, &mut raw.tie, "tie")?,
                "layers" => set(&mut map, &mut raw.layers, "layers")?,
                "shortcut" => set(&mut map, &mut raw.shortcut, "shortcut")?,
                "branches" => set(&mut map, &mut raw.branches, "branches")?,
                "args" => set(&mut map, &mut raw.args, "args")?,
                "repeat" => set(&mut map, &mut raw.repeat, "repeat")?,
                "first" => set(&mut map, &mut raw.first, "first")?,
                _ => {
                    if raw.own.contains_key(&key) {
                        return Err(de::Error::custom(format!("duplicate field `{key}`")));
                    }
                    raw.own.insert(key.clone(), map.next_value()?);
                }
            }
            raw.keys.push(key);
        }
        build(raw)
    }
}

fn build<E: de::Error>(raw: RawLayer) -> Result<LayerConfig, E> {
    let ty = raw.ty.as_deref().ok_or_else(|| E::missing_field("type"))?;
    let fields = match ty {
        SEQUENTIAL => Some(SEQUENTIAL_KEYS),
        RESIDUAL => Some(RESIDUAL_KEYS),
        SUM => Some(SUM_KEYS),
        _ if is_block_name(ty) => Some(BLOCK_KEYS),
        _ => LayerSpec::keys(ty),
    };
    let fields = fields.ok_or_else(|| unknown_type::<E>(ty))?;
    let fields = match LAYER_KEYS.get(ty) {
        Some(with_tie) => with_tie,
        None => fields,
    };
    if let Some(bad) = raw.keys.iter().find(|k| !fields.contains(&k.as_str())) {
        return Err(E::unknown_field(bad, fields));
    }
    if ty == SEQUENTIAL {
        return Ok(LayerConfig::Sequential {
            name: raw.name,
            layers: raw.layers.ok_or_else(|| E::missing_field("layers"))?,
        });
    }
    if ty == RESIDUAL {
        return Ok(LayerConfig::Residual {
            layers: raw.layers.ok_or_else(|| E::missing_field("layers"))?,
            shortcut: raw.shortcut.unwrap_or_default(),
        });
    }
    if ty == SUM {
        return Ok(LayerConfig::Sum { branches: raw.branches.ok_or_else(|| E::missing_field("branches"))? });
    }
    if is_block_name(ty) {
        return Ok(LayerConfig::Block {
            name: raw.name,
            block: ty.to_owned(),
            args: raw.args.unwrap_or_default(),
            repeat: raw.repeat,
            first: raw.first.unwrap_or_default(),
        });
    }
    let spec = LayerSpec::from_raw(ty, &raw).ok_or_else(|| unknown_type::<E>(ty))??;
    Ok(LayerConfig::Layer { name: raw.name, spec, tie: raw.tie })
}

impl<'de> Deserialize<'de> for LayerConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(LayerVisitor)
    }
}
