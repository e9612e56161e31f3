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

use std::fmt;
use std::sync::LazyLock;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::nn::layers::{LayerSpec, TYPES};

/// One entry of `model.layers` (or of a `sequential`'s `layers`).
#[derive(Debug, Clone, PartialEq)]
pub enum LayerConfig {
    /// A layer of one of the registered types (`nn::layers`).
    Layer { name: Option<String>, spec: LayerSpec },
    /// A block, like `self.layer1 = nn.Sequential(...)`: its entries are
    /// `layer1.0`, `layer1.1`, ... Unnamed, it takes its position in the
    /// block around it (`layer1.0` holding a ResNet block's `conv1`, ...).
    Sequential { name: Option<String>, layers: Vec<LayerConfig> },
    /// `layers(x) + shortcut(x)`, as a ResNet block's `forward()` writes it
    /// (`out += identity`): wiring, not a module, so it has no name and its
    /// entries are named in the block around it (`conv1`, `downsample.0`,
    /// ...). An empty `shortcut` is the identity.
    Residual { layers: Vec<LayerConfig>, shortcut: Vec<LayerConfig> },
}

const SEQUENTIAL: &str = "sequential";
const SEQUENTIAL_KEYS: &[&str] = &["type", "name", "layers"];
const RESIDUAL: &str = "residual";
const RESIDUAL_KEYS: &[&str] = &["type", "layers", "shortcut"];

/// Every `type` an entry may have: the layer types, then the blocks.
pub(crate) static ENTRY_TYPES: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| TYPES.iter().copied().chain([SEQUENTIAL, RESIDUAL]).collect());

fn entry_types() -> &'static [&'static str] {
    &ENTRY_TYPES
}

/// `conv2d, batchnorm2d, ..., linear or sequential`.
pub(crate) fn entry_types_list() -> String {
    match ENTRY_TYPES.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => ENTRY_TYPES.join(", "),
    }
}

impl LayerConfig {
    /// The `name` key, if the entry has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            LayerConfig::Layer { name, .. } => name.as_deref(),
            LayerConfig::Sequential { name, .. } => name.as_deref(),
            LayerConfig::Residual { .. } => None,
        }
    }

    /// The `type` value as written in the config.
    pub fn type_name(&self) -> &'static str {
        match self {
            LayerConfig::Layer { spec, .. } => spec.type_name(),
            LayerConfig::Sequential { .. } => SEQUENTIAL,
            LayerConfig::Residual { .. } => RESIDUAL,
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
        match self {
            LayerConfig::Layer { name, spec } => spec.serialize_table(name.as_deref(), s),
            LayerConfig::Sequential { name, layers } => {
                Sequential { ty: SEQUENTIAL, name: name.as_deref(), layers }.serialize(s)
            }
            LayerConfig::Residual { layers, shortcut } => {
                Residual { ty: RESIDUAL, layers, shortcut }.serialize(s)
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
    layers: Option<Vec<LayerConfig>>,
    shortcut: Option<Vec<LayerConfig>>,
    /// Keys as written, in order, to check against the type afterwards.
    keys: Vec<String>,
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
        if ENTRY_TYPES.contains(&ty.as_str()) {
            Ok(ty)
        } else {
            Err(de::Error::unknown_variant(&ty, entry_types()))
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
                "layers" => set(&mut map, &mut raw.layers, "layers")?,
                "shortcut" => set(&mut map, &mut raw.shortcut, "shortcut")?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
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
        _ => LayerSpec::keys(ty),
    };
    let fields = fields.ok_or_else(|| E::unknown_variant(ty, entry_types()))?;
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
    let spec = LayerSpec::from_raw(ty, &raw).ok_or_else(|| E::unknown_variant(ty, entry_types()))??;
    Ok(LayerConfig::Layer { name: raw.name, spec })
}

impl<'de> Deserialize<'de> for LayerConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(LayerVisitor)
    }
}
