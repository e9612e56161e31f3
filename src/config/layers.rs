//! `[[model.layers]]` entries: tables tagged by `type`, PyTorch module names
//! and defaults.
//!
//! Deserialization is hand-written rather than serde's internally tagged
//! derive: that derive buffers the table first, which loses the key path of
//! any error inside it. Reading the keys directly keeps errors pointing at
//! e.g. `model.layers[0].layers[1].kernel_size`, and lets an unknown key be
//! reported against the fields of that layer type only.

use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::schema::short_f32;

/// One entry of `model.layers` (or of a `sequential`'s `layers`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum LayerConfig {
    #[serde(rename = "conv2d")]
    Conv2d {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        out_channels: usize,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    },
    #[serde(rename = "batchnorm2d")]
    BatchNorm2d {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(serialize_with = "short_f32::one")]
        eps: f32,
        #[serde(serialize_with = "short_f32::one")]
        momentum: f32,
    },
    #[serde(rename = "relu")]
    Relu {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    #[serde(rename = "maxpool2d")]
    MaxPool2d {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        kernel_size: usize,
        /// Defaults to `kernel_size`, as in PyTorch.
        stride: usize,
    },
    #[serde(rename = "flatten")]
    Flatten {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    #[serde(rename = "linear")]
    Linear {
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        out_features: usize,
        bias: bool,
    },
    /// A named block, like `self.layer1 = nn.Sequential(...)`: its entries are
    /// `layer1.0`, `layer1.1`, ...
    #[serde(rename = "sequential")]
    Sequential { name: String, layers: Vec<LayerConfig> },
}

impl LayerConfig {
    /// The `name` key, if the entry has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            LayerConfig::Conv2d { name, .. }
            | LayerConfig::BatchNorm2d { name, .. }
            | LayerConfig::Relu { name }
            | LayerConfig::MaxPool2d { name, .. }
            | LayerConfig::Flatten { name }
            | LayerConfig::Linear { name, .. } => name.as_deref(),
            LayerConfig::Sequential { name, .. } => Some(name),
        }
    }

    /// The `type` value as written in the config.
    pub fn type_name(&self) -> &'static str {
        match self {
            LayerConfig::Conv2d { .. } => "conv2d",
            LayerConfig::BatchNorm2d { .. } => "batchnorm2d",
            LayerConfig::Relu { .. } => "relu",
            LayerConfig::MaxPool2d { .. } => "maxpool2d",
            LayerConfig::Flatten { .. } => "flatten",
            LayerConfig::Linear { .. } => "linear",
            LayerConfig::Sequential { .. } => "sequential",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum LayerType {
    #[serde(rename = "conv2d")]
    Conv2d,
    #[serde(rename = "batchnorm2d")]
    BatchNorm2d,
    #[serde(rename = "relu")]
    Relu,
    #[serde(rename = "maxpool2d")]
    MaxPool2d,
    #[serde(rename = "flatten")]
    Flatten,
    #[serde(rename = "linear")]
    Linear,
    #[serde(rename = "sequential")]
    Sequential,
}

impl LayerType {
    /// The keys this layer type accepts (used in "unknown key" messages).
    fn fields(self) -> &'static [&'static str] {
        match self {
            LayerType::Conv2d => {
                &["type", "name", "out_channels", "kernel_size", "kernel", "stride", "padding", "bias"]
            }
            LayerType::BatchNorm2d => &["type", "name", "eps", "momentum"],
            LayerType::Relu | LayerType::Flatten => &["type", "name"],
            LayerType::MaxPool2d => &["type", "name", "kernel_size", "kernel", "stride"],
            LayerType::Linear => &["type", "name", "out_features", "bias"],
            LayerType::Sequential => &["type", "name", "layers"],
        }
    }
}

#[derive(Default)]
struct RawLayer {
    ty: Option<LayerType>,
    name: Option<String>,
    out_channels: Option<usize>,
    kernel_size: Option<usize>,
    stride: Option<usize>,
    padding: Option<usize>,
    bias: Option<bool>,
    eps: Option<f32>,
    momentum: Option<f32>,
    out_features: Option<usize>,
    layers: Option<Vec<LayerConfig>>,
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
                "type" => set(&mut map, &mut raw.ty, "type")?,
                "name" => set(&mut map, &mut raw.name, "name")?,
                "out_channels" => set(&mut map, &mut raw.out_channels, "out_channels")?,
                "kernel_size" | "kernel" => set(&mut map, &mut raw.kernel_size, "kernel_size")?,
                "stride" => set(&mut map, &mut raw.stride, "stride")?,
                "padding" => set(&mut map, &mut raw.padding, "padding")?,
                "bias" => set(&mut map, &mut raw.bias, "bias")?,
                "eps" => set(&mut map, &mut raw.eps, "eps")?,
                "momentum" => set(&mut map, &mut raw.momentum, "momentum")?,
                "out_features" => set(&mut map, &mut raw.out_features, "out_features")?,
                "layers" => set(&mut map, &mut raw.layers, "layers")?,
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
    let ty = raw.ty.ok_or_else(|| E::missing_field("type"))?;
    let fields = ty.fields();
    if let Some(bad) = raw.keys.iter().find(|k| !fields.contains(&k.as_str())) {
        return Err(E::unknown_field(bad, fields));
    }
    let name = raw.name;
    Ok(match ty {
        LayerType::Conv2d => LayerConfig::Conv2d {
            name,
            out_channels: raw.out_channels.ok_or_else(|| E::missing_field("out_channels"))?,
            kernel_size: raw.kernel_size.ok_or_else(|| E::missing_field("kernel_size"))?,
            stride: raw.stride.unwrap_or(1),
            padding: raw.padding.unwrap_or(0),
            bias: raw.bias.unwrap_or(true),
        },
        LayerType::BatchNorm2d => LayerConfig::BatchNorm2d {
            name,
            eps: raw.eps.unwrap_or(1e-5),
            momentum: raw.momentum.unwrap_or(0.1),
        },
        LayerType::Relu => LayerConfig::Relu { name },
        LayerType::MaxPool2d => {
            let kernel_size = raw.kernel_size.ok_or_else(|| E::missing_field("kernel_size"))?;
            LayerConfig::MaxPool2d { name, kernel_size, stride: raw.stride.unwrap_or(kernel_size) }
        }
        LayerType::Flatten => LayerConfig::Flatten { name },
        LayerType::Linear => LayerConfig::Linear {
            name,
            out_features: raw.out_features.ok_or_else(|| E::missing_field("out_features"))?,
            bias: raw.bias.unwrap_or(true),
        },
        LayerType::Sequential => LayerConfig::Sequential {
            name: name.ok_or_else(|| E::missing_field("name"))?,
            layers: raw.layers.ok_or_else(|| E::missing_field("layers"))?,
        },
    })
}

impl<'de> Deserialize<'de> for LayerConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(LayerVisitor)
    }
}
