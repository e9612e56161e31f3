//! `ddptrain keys`: the table of every config key, generated from the code's
//! own key lists, and docs/CONFIG.md held to it, so a key added to the code
//! without the table regenerated fails here with the command that
//! regenerates it.

mod common;
use common::*;

use ddptrain::config::keys::{self, KeyDocs, DOCS, REGENERATE};

#[test]
fn the_committed_key_table_is_the_one_the_code_generates() {
    let o = ddptrain(&["keys"], &repo_root());
    assert_eq!(o.status.code(), Some(0), "`ddptrain keys` failed:\n{}", text(&o));
    let generated = String::from_utf8_lossy(&o.stdout).into_owned();
    let path = repo_root().join("docs/CONFIG.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let (n, (ours, theirs)) = committed
            .lines()
            .chain(std::iter::repeat(""))
            .zip(generated.lines().chain(std::iter::repeat("")))
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((0, ("", "")));
        panic!(
            "{} is not the key table the code generates; first difference at line {}:\n  \
             committed: {ours}\n  generated: {theirs}\nregenerate it with `{REGENERATE}`",
            path.display(),
            n + 1
        );
    }
}

#[test]
fn the_table_types_and_defaults_every_key_from_the_code() {
    let table = keys::markdown().unwrap();
    for row in [
        "| run | `seed` | integer | `0` |",
        "| run | `device` | `\"auto\"`, `\"cpu\"` or `\"cuda\"` | `\"auto\"` |",
        "| data | `batch_size` | integer | required |",
        "| data | `eval_batch_size` | integer | `batch_size` |",
        "| data | `random_crop.size` | integer | required |",
        "| optimizer | `betas` | array of 2 floats | `[0.9, 0.999]` |",
        "| optimizer | `eps` | float | `1e-8` |",
        "| model | `blocks.<Name>.args` | table |",
        "| `conv2d` | `out_channels` | integer | required |",
        "| `conv2d` | `stride` | integer | `1` |",
        "| `maxpool2d` | `stride` | integer | `kernel_size` |",
        "| `layernorm` | `eps` | float | `1e-5` |",
        "| `gelu` | `approximate` | string | `\"none\"` |",
        "| every layer type | `tie` | string | unset |",
        "| `residual` | `shortcut` | array of entries | `[]` |",
    ] {
        assert!(table.contains(row), "the table lacks {row:?}:\n{table}");
    }
}

/// ddptrain's own key docs, to change one line of.
struct Docs {
    meanings: Vec<(&'static str, &'static str)>,
    defaults: Vec<(&'static str, &'static str)>,
    types: Vec<(&'static str, &'static str)>,
}

/// The error of the key table with ddptrain's key docs changed by `edit`.
fn error_of(edit: impl FnOnce(&mut Docs)) -> String {
    let mut d = Docs {
        meanings: DOCS.meanings.to_vec(),
        defaults: DOCS.defaults.to_vec(),
        types: DOCS.types.to_vec(),
    };
    edit(&mut d);
    let docs = KeyDocs { meanings: &d.meanings, defaults: &d.defaults, types: &d.types };
    match keys::markdown_with(&docs) {
        Ok(_) => panic!("the key table was made from docs that should have been refused"),
        Err(e) => e.to_string(),
    }
}

fn without(list: &mut Vec<(&'static str, &'static str)>, key: &str) {
    list.retain(|(k, _)| *k != key);
}

#[test]
fn a_key_without_a_meaning_fails_naming_it_and_the_command() {
    for key in ["train.max_steps", "dropout.p"] {
        let e = error_of(|d| without(&mut d.meanings, key));
        assert!(e.contains(&format!("config key `{key}` has no meaning in src/config/key_docs.rs")), "{e}");
        assert!(e.contains(REGENERATE), "{e}");
    }
}

#[test]
fn a_meaning_for_a_key_the_code_lacks_fails_naming_it() {
    let e = error_of(|d| d.meanings.push(("train.max_step", "A typo.")));
    assert!(e.contains("documents `train.max_step`, which is no config key"), "{e}");
    assert!(e.contains(REGENERATE), "{e}");
}

#[test]
fn a_default_the_code_sets_cannot_be_written_by_hand() {
    let e = error_of(|d| d.defaults.push(("run.seed", "`7`")));
    assert!(e.contains("gives a default for `run.seed`, which the code sets (`0`)"), "{e}");
}

#[test]
fn a_default_computed_from_other_keys_must_be_written_out() {
    let e = error_of(|d| without(&mut d.defaults, "run.out_dir"));
    assert!(e.contains("`run.out_dir` defaults to a value computed from other keys"), "{e}");
}

#[test]
fn a_key_of_more_than_one_kind_needs_its_type_written_out() {
    let e = error_of(|d| without(&mut d.types, "amp.loss_scale"));
    assert!(e.contains("`amp.loss_scale` takes more than one kind of value"), "{e}");
}
