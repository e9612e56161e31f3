//! The resolved model as one JSON document (`ddptrain check --json`): enough
//! for another tool (scripts/torch_model.py) to rebuild the same network with
//! the same `state_dict()` keys. Values are numbered: 0 is the model's input,
//! `i + 1` the output of node `i`; a node lists the values it reads, so a
//! graph with branches has the same form as today's chains. `args` use
//! PyTorch's constructor argument names.

use serde::{Serialize, Serializer};

use super::model::{param_count, LayerKind, ResolvedLayer};
use super::schema::OptLevel;
use crate::amp::Policy;
use crate::nn::layers::AmpClass;
use crate::tensor::DType;

#[derive(Debug, Serialize)]
pub struct Description {
    pub input_shape: Vec<usize>,
    pub opt_level: OptLevel,
    pub nodes: Vec<Node>,
    /// The value the model returns.
    pub output: usize,
    pub state_dict: Vec<StateKey>,
    pub num_params: usize,
}

#[derive(Debug, Serialize)]
pub struct Node {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: &'static str,
    pub inputs: Vec<usize>,
    pub in_shapes: Vec<Vec<usize>>,
    pub out_shape: Vec<usize>,
    #[serde(serialize_with = "args")]
    pub args: LayerKind,
    /// The state_dict key of the earlier parameter this node's weight is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tie: Option<String>,
}

/// A node's constructor arguments: [`LayerKind`]'s fields, which are
/// PyTorch's names, in its order (`{}` for the layers that take none).
fn args<S: Serializer>(kind: &LayerKind, s: S) -> Result<S::Ok, S::Error> {
    kind.serialize(s)
}

/// One `state_dict()` entry: its key, shape and the dtype ddptrain holds it
/// in at the opt level (what `model.half()` under apex leaves it as).
#[derive(Debug, Serialize)]
pub struct StateKey {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: &'static str,
    /// The key of the parameter this one is (a tied weight).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tied_to: Option<String>,
}

fn torch_dtype(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "float32",
        DType::F16 => "float16",
    }
}

/// The description of `layers` (from [`super::resolve`]) at `policy`'s opt level.
pub fn describe(input_shape: &[usize], layers: &[ResolvedLayer], policy: &Policy) -> Description {
    let mut nodes = Vec::with_capacity(layers.len());
    let mut state_dict = Vec::new();
    for l in layers {
        // apex casts BatchNorm's parameters and running statistics together
        // (src/amp: cast_model); num_batches_tracked stays an integer.
        let dtype = torch_dtype(policy.param_dtype(l.kind.amp_class() == AmpClass::BatchNorm));
        for (i, (suffix, shape)) in l.kind.params().into_iter().chain(l.kind.buffers()).enumerate() {
            let dtype = if suffix == "num_batches_tracked" { "int64" } else { dtype };
            let tied_to = l.tie.as_ref().filter(|t| t.slot == i).map(|t| t.key.clone());
            state_dict.push(StateKey { name: format!("{}.{suffix}", l.name), shape, dtype, tied_to });
        }
        nodes.push(Node {
            name: l.name.clone(),
            ty: l.kind.type_name(),
            inputs: l.inputs.clone(),
            in_shapes: vec![l.in_shape.clone(); l.inputs.len()],
            out_shape: l.out_shape.clone(),
            args: l.kind.clone(),
            tie: l.tie.as_ref().map(|t| t.key.clone()),
        });
    }
    Description {
        input_shape: input_shape.to_vec(),
        opt_level: policy.opt_level,
        output: nodes.len(),
        nodes,
        state_dict,
        num_params: param_count(layers),
    }
}

impl Description {
    /// One line per `state_dict` key: name, shape and dtype, aligned.
    pub fn state_dict_table(&self) -> String {
        let width = self.state_dict.iter().map(|e| e.name.len()).max().unwrap_or(0);
        let shape = |s: &[usize]| format!("{s:?}");
        let swidth = self.state_dict.iter().map(|e| shape(&e.shape).len()).max().unwrap_or(0);
        let mut out = String::new();
        for e in &self.state_dict {
            let line = format!("{:<width$}  {:<swidth$}  {}", e.name, shape(&e.shape), e.dtype);
            match &e.tied_to {
                Some(t) => out.push_str(&format!("{line}  (= {t})\n")),
                None => out.push_str(&format!("{line}\n")),
            }
        }
        out
    }
}
