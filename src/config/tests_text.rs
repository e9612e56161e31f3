//! A GPT over `dataset = "text"`: nanoGPT's module names, the language
//! model's shape checks, and the text keys' errors.

use super::tests_load::{config_err, load_text};
use super::*;

/// A 2-layer, 2-head GPT of width 8 over 6 positions of bytes:
/// configs/gpt_sotu_o2.toml's structure, small (the integration tests' template).
fn tiny_gpt() -> String {
    let fill = [("{VOCAB}", "bytes"), ("{C3}", "24"), ("{C4}", "32"), ("{C}", "8"), ("{T}", "6")];
    let fill = fill.into_iter().chain([("{H}", "2"), ("{L}", "2"), ("{V}", "256"), ("{P}", "0.0")]);
    fill.fold(include_str!("../../tests/common/gpt.toml").to_owned(), |t, (k, v)| t.replace(k, v))
}

#[test]
fn a_gpt_has_nanogpts_state_dict_keys() {
    let (cfg, _) = load_text(&tiny_gpt(), &[], &[]);
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

/// The device runs every layer of the GPT, attention dropout included.
#[test]
fn the_device_runs_the_gpt_with_and_without_attention_dropout() {
    for p in ["0.0", "0.1"] {
        let (cfg, _) =
            load_text(&tiny_gpt().replace("dropout_p = 0.0", &format!("dropout_p = {p}")), &[], &[]);
        let layers = model::resolve(&cfg.unwrap().model).unwrap();
        let model = crate::nn::Model::new(&layers, 1).unwrap();
        if let Err(e) = crate::nn::cuda::plan::Plan::new(&model, 2) {
            panic!("dropout_p = {p}: the device plan refused the GPT: {e}");
        }
    }
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
        let (_, k, m) = config_err(load_text(&tiny_gpt(), sets, &[]).0);
        assert_eq!((k.as_str(), m.as_str()), (*key, *msg), "{sets:?}");
    }
    let small_head = tiny_gpt().replace("256", "100");
    let (_, k, m) = config_err(load_text(&small_head, &[], &[]).0);
    let want = "the model outputs 100 logits but data.vocab = \"bytes\" has 256 tokens";
    assert_eq!((k.as_str(), m.as_str()), ("model.layers[1].out_features", want));
    for set in ["data.vocab=chars", "train.eval_every=5", "train.eval_iters=2", "expect.max_val_loss=2.5"] {
        let (_, k, m) = config_err(load_text(super::tests_load::MINIMAL, &[set], &[]).0);
        let key = set.split('=').next().unwrap_or_default();
        assert_eq!((k.as_str(), m.as_str()), (key, "applies to dataset = \"text\" only"));
    }
}

#[test]
fn text_gates_are_checked() {
    let cases: &[(&str, &str, &str)] = &[
        ("expect.max_val_loss=0", "expect.max_val_loss", "must be a positive number, got 0"),
        ("expect.max_val_loss=nan", "expect.max_val_loss", "must be a positive number, got NaN"),
        (
            "expect.min_test_accuracy=0.5",
            "expect.min_test_accuracy",
            "a language model is gated by its validation loss: set expect.max_val_loss",
        ),
    ];
    for (set, key, msg) in cases {
        let (_, k, m) = config_err(load_text(&tiny_gpt(), &[set], &[]).0);
        assert_eq!((k.as_str(), m.as_str()), (*key, *msg), "{set}");
    }
    let cfg = load_text(&tiny_gpt(), &["expect.max_val_loss=2.5"], &[]).0;
    assert_eq!(cfg.map(|c| c.expect.max_val_loss).ok(), Some(Some(2.5)));
}
