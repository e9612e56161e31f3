//! A GPT over `dataset = "text"`: nanoGPT's module names, the language
//! model's shape checks, and the text keys' errors.

use super::tests_load::{config_err, load_text};
use super::*;

/// A 2-layer, 2-head GPT of width 8 over 6 positions: configs/gpt_sotu_o2.toml's structure, small.
pub(crate) const TINY_GPT: &str = r#"
[run]
device = "cpu"
[data]
dataset = "text"
path = "input.txt"
batch_size = 2
[model]
input_shape = [6]
[model.blocks.Block]
layers = [
  { type = "residual", layers = [
    { type = "layernorm", name = "ln_1", bias = false },
    { type = "sequential", name = "attn", layers = [
      { type = "linear", name = "c_attn", out_features = 24, bias = false, init_std = 0.02 },
      { type = "causal_self_attention", name = "attention", n_head = 2 },
      { type = "linear", name = "c_proj", out_features = 8, bias = false, init_std = 0.01 },
    ] },
  ] },
  { type = "residual", layers = [
    { type = "layernorm", name = "ln_2", bias = false },
    { type = "sequential", name = "mlp", layers = [
      { type = "linear", name = "c_fc", out_features = 32, bias = false, init_std = 0.02 },
      { type = "gelu", name = "gelu" },
      { type = "linear", name = "c_proj", out_features = 8, bias = false, init_std = 0.01 },
    ] },
  ] },
]
[[model.layers]]
type = "sequential"
name = "transformer"
layers = [
  { type = "residual", layers = [{ type = "embedding", name = "wte", num_embeddings = 256, embedding_dim = 8, init_std = 0.02 }], shortcut = [{ type = "embedding", name = "wpe", num_embeddings = 6, embedding_dim = 8, positions = true, init_std = 0.02 }] },
  { type = "Block", name = "h", repeat = 2 },
  { type = "layernorm", name = "ln_f", bias = false },
]
[[model.layers]]
type = "linear"
name = "lm_head"
out_features = 256
bias = false
tie = "transformer.wte.weight"
[optimizer]
name = "adamw"
lr = 1e-3
[train]
max_steps = 2
"#;

#[test]
fn a_gpt_has_nanogpts_state_dict_keys() {
    let (cfg, _) = load_text(TINY_GPT, &[], &[]);
    let cfg = cfg.unwrap();
    let layers = model::resolve(&cfg.model).unwrap();
    let model = crate::nn::Model::new(&layers, 0).unwrap();
    let keys: Vec<String> = model.state_dict().unwrap().into_iter().map(|e| e.name).collect();
    let mut want = vec!["transformer.wte.weight".to_owned(), "transformer.wpe.weight".to_owned()];
    for i in 0..2 {
        for k in ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"] {
            want.push(format!("transformer.h.{i}.{k}.weight"));
        }
    }
    want.extend(["transformer.ln_f.weight".to_owned(), "lm_head.weight".to_owned()]);
    assert_eq!(keys, want);
    assert_eq!(layers.last().unwrap().out_shape, vec![6, 256]);
}

#[test]
fn the_device_refuses_a_gpt_naming_the_layer() {
    let (cfg, _) = load_text(TINY_GPT, &[], &[]);
    let layers = model::resolve(&cfg.unwrap().model).unwrap();
    let why = layers.iter().find_map(crate::nn::cuda::plan::without_kernels).unwrap();
    assert_eq!(
        why,
        "layer `transformer.wte` (embedding, input [6]) has no CUDA kernels yet; train this model with run.device = \"cpu\""
    );
}

#[test]
fn text_keys_and_shapes_are_checked() {
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["model.input_shape=[1, 6, 6]"],
            "model.input_shape",
            "expected [block_size] (1 number) for dataset = \"text\", found 3 element(s)",
        ),
        (&["data.val_fraction=1.5"], "data.val_fraction", "must be in (0, 1), got 1.5"),
        (&["train.eval_iters=0"], "train.eval_iters", "must be at least 1"),
        (
            &["train.eval_every=0"],
            "train.eval_every",
            "must be at least 1 (leave it out to evaluate after each epoch)",
        ),
    ];
    for (sets, key, msg) in cases {
        let (_, k, m) = config_err(load_text(TINY_GPT, sets, &[]).0);
        assert_eq!((k.as_str(), m.as_str()), (*key, *msg), "{sets:?}");
    }
    let small_head = TINY_GPT.replace("256", "100");
    let (_, k, m) = config_err(load_text(&small_head, &[], &[]).0);
    let want = "the model outputs 100 logits but data.vocab = \"bytes\" has 256 tokens";
    assert_eq!((k.as_str(), m.as_str()), ("model.layers[1].out_features", want));
    let (_, k, m) = config_err(load_text(super::tests_load::MINIMAL, &["data.vocab=chars"], &[]).0);
    assert_eq!((k.as_str(), m.as_str()), ("data.vocab", "applies to dataset = \"text\" only"));
}
