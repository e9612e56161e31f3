//! `[model.blocks]` and `sum`: names as nn.Sequential and torch.fx give
//! them, arguments bound and checked, and every mistake at its key.

use super::tests_load::{config_err, load_text, MINIMAL};
use super::*;

/// MINIMAL with `blocks` (TOML tables, each `[model.blocks.X]` ...) and
/// `layers` (inline tables) before its flatten and linear layers.
fn with_blocks(blocks: &str, layers: &str) -> String {
    let text = MINIMAL.replace(
        r#"[{ type = "flatten" }, { type = "linear", out_features = 10 }]"#,
        &format!(r#"[{layers}, {{ type = "flatten" }}, {{ type = "linear", out_features = 10 }}]"#),
    );
    format!("{text}\n{blocks}\n")
}

const UNIT: &str = r#"
[model.blocks.Unit]
args = { width = "int", stride = 1, project = false }
layers = [
  { type = "residual", layers = [
    { type = "conv2d", name = "conv", out_channels = "$width", kernel_size = 3, stride = "$stride", padding = 1, bias = false },
    { type = "batchnorm2d", name = "bn" },
  ], shortcut = [
    { type = "conv2d", name = "proj", when = "$project", out_channels = "$width", kernel_size = 1, stride = "$stride", bias = false },
  ] },
  { type = "relu", name = "relu" },
]
"#;

fn names(text: &str) -> Vec<(String, Vec<usize>)> {
    let layers = load_text(text, &[], &[]).0.unwrap().resolve_model().unwrap();
    layers.iter().map(|l| (l.name.clone(), l.out_shape.clone())).collect()
}

fn err_of(text: &str) -> (String, String) {
    let (file, key, msg) = config_err(load_text(text, &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    (key, msg)
}

#[test]
fn a_repeated_block_numbers_its_instances_and_gives_the_first_its_own_arguments() {
    let text = with_blocks(
        UNIT,
        r#"{ type = "Unit", name = "stage", repeat = 3, args = { width = 2 }, first = { stride = 2, project = true } }"#,
    );
    let got = names(&text);
    let find = |n: &str| got.iter().find(|(m, _)| m == n).map(|(_, s)| s.clone());
    assert_eq!(find("stage.0.conv"), Some(vec![2, 2, 2]));
    assert_eq!(find("stage.0.proj"), Some(vec![2, 2, 2]));
    assert_eq!(find("stage.0.add"), Some(vec![2, 2, 2]));
    assert_eq!(find("stage.2.bn"), Some(vec![2, 2, 2]));
    // Only the first takes `first`: no projection (and stride 1) after it.
    assert_eq!(find("stage.1.proj"), None);
    assert_eq!(got.iter().filter(|(n, _)| n.ends_with(".relu")).count(), 3);

    // Without `repeat`, the block is the named module itself.
    let text = with_blocks(UNIT, r#"{ type = "Unit", name = "b", args = { width = 1 } }"#);
    let got = names(&text);
    assert_eq!(got[0].0, "b.conv");
    assert!(got.iter().all(|(n, _)| !n.contains("proj")), "{got:?}");
}

#[test]
fn blocks_nest_and_their_names_are_module_paths() {
    let outer = r#"
[model.blocks.Pair]
layers = [{ type = "Unit", name = "a", args = { width = 1 } }, { type = "Unit", name = "b", args = { width = 1 } }]
"#;
    let text = with_blocks(&format!("{UNIT}{outer}"), r#"{ type = "Pair", name = "h", repeat = 2 }"#);
    let got = names(&text);
    for n in ["h.0.a.conv", "h.0.b.bn", "h.1.a.add", "h.1.b.conv"] {
        assert!(got.iter().any(|(m, _)| m == n), "no {n} in {got:?}");
    }
}

#[test]
fn a_sum_adds_every_branch_and_an_empty_branch_is_the_identity() {
    let conv = r#"{ type = "conv2d", out_channels = 1, kernel_size = 3, padding = 1 }"#;
    let text = with_blocks(
        "",
        &format!(r#"{{ type = "sum", branches = [[{conv}], [], [{conv}, {{ type = "relu" }}]] }}"#),
    );
    let layers = load_text(&text, &[], &[]).0.unwrap().resolve_model().unwrap();
    let got: Vec<(&str, &[usize])> = layers.iter().map(|l| (l.name.as_str(), l.inputs.as_slice())).collect();
    assert_eq!(
        got[..5],
        [("0", &[0][..]), ("1", &[0][..]), ("2", &[2][..]), ("add", &[1, 0, 3][..]), ("3", &[4][..])]
    );
    assert_eq!(layers[3].kind, LayerKind::Add(crate::nn::layers::Add { inputs: 3 }));
}

#[test]
fn sum_mistakes_name_the_branch_and_the_fix() {
    let strided = r#"{ type = "conv2d", out_channels = 3, kernel_size = 3, stride = 2, padding = 1 }"#;
    let (key, msg) =
        err_of(&with_blocks("", &format!(r#"{{ type = "sum", branches = [[{strided}], []] }}"#)));
    assert_eq!(key, "model.layers[0]");
    assert!(
        msg.contains("branches[0] gives [3, 2, 2]")
            && msg.contains("branches[1] (the identity) gives [1, 4, 4]"),
        "{msg}"
    );
    assert!(
        msg.contains("give branches[1] a projection")
            && msg.contains("out_channels = 3, kernel_size = 1, stride = 2"),
        "{msg}"
    );

    let (key, msg) = err_of(&with_blocks("", r#"{ type = "sum", branches = [[{ type = "relu" }]] }"#));
    assert_eq!(
        (key.as_str(), msg.as_str()),
        ("model.layers[0].branches", "a sum needs at least two branches (an empty branch is the identity)")
    );
    let (key, _) = err_of(&with_blocks("", r#"{ type = "sum" }"#));
    assert_eq!(key, "model.layers[0].branches");
}

#[test]
fn a_mistake_inside_a_block_names_its_key_in_the_block_and_the_use() {
    let bad =
        UNIT.replace(r#"{ type = "batchnorm2d", name = "bn" }"#, r#"{ type = "batchnorm3d", name = "bn" }"#);
    let (key, msg) =
        err_of(&with_blocks(&bad, r#"{ type = "Unit", name = "s", repeat = 2, args = { width = 1 } }"#));
    assert_eq!(key, "model.blocks.Unit.layers[0].layers[1].type");
    assert!(msg.contains("unknown layer type \"batchnorm3d\"") && msg.contains("batchnorm2d"), "{msg}");
    assert!(msg.contains("(in `s.0`, the Unit at model.layers[0])"), "{msg}");

    // A shape error shows up in the instance whose arguments cause it.
    let (key, msg) = err_of(&with_blocks(
        UNIT,
        r#"{ type = "Unit", name = "s", repeat = 2, args = { width = 3 }, first = { width = 2, project = true } }"#,
    ));
    assert_eq!(key, "model.blocks.Unit.layers[0]");
    assert!(msg.contains("the identity") && msg.contains("(in `s.1`, the Unit at model.layers[0])"), "{msg}");

    // A module with parameters named twice in the body.
    let twice = UNIT.replace(r#"name = "bn""#, r#"name = "conv""#);
    let (key, msg) = err_of(&with_blocks(&twice, r#"{ type = "Unit", args = { width = 1 } }"#));
    assert_eq!(key, "model.blocks.Unit.layers[0].layers[1].name");
    assert!(msg.contains("\"conv\" is used twice") && msg.contains("cannot be used twice"), "{msg}");
}

#[test]
fn block_arguments_are_checked_at_the_use() {
    let use_ =
        |args: &str| err_of(&with_blocks(UNIT, &format!(r#"{{ type = "Unit", name = "u", {args} }}"#)));
    let (key, msg) = use_("args = { stride = 2 }");
    assert_eq!(key, "model.layers[0]");
    assert_eq!(msg, "Unit needs the argument `width` (an integer): give it in `args = { width = ... }`");

    let (key, msg) = use_("args = { width = 1, widht = 2 }");
    assert_eq!(key, "model.layers[0].args.widht");
    assert!(msg.starts_with("Unit has no argument `widht`; its arguments: project (default false), stride (default 1), width (an integer)"), "{msg}");
    assert!(msg.ends_with("(did you mean `width`?)"), "{msg}");

    let (key, msg) = use_(r#"args = { width = "2" }"#);
    assert_eq!(
        (key.as_str(), msg.as_str()),
        ("model.layers[0].args.width", "expected an integer, found string \"2\"")
    );

    let (key, msg) = use_("args = { width = 1 }, first = { stride = 2 }");
    assert_eq!(key, "model.layers[0].first");
    assert!(msg.contains("add `repeat`"), "{msg}");

    let (key, msg) = use_("args = { width = 1 }, repeat = 0");
    assert_eq!((key.as_str(), msg.as_str()), ("model.layers[0].repeat", "must be 1 to 10000, got 0"));

    let (key, msg) = use_("args = { width = 1 }, first = { width = true }, repeat = 2");
    assert_eq!(
        (key.as_str(), msg.as_str()),
        ("model.layers[0].first.width", "expected an integer, found true")
    );

    let (key, msg) = use_("args = { width = 1 }, shortcut = []");
    assert_eq!(key, "model.layers[0].shortcut");
    assert!(msg.contains("type, name, args, repeat, first"), "{msg}");
}

#[test]
fn block_definitions_are_checked() {
    let (key, msg) = err_of(&with_blocks(UNIT, r#"{ type = "Unti", args = { width = 1 } }"#));
    assert_eq!(key, "model.layers[0].type");
    assert!(
        msg.contains("\"Unti\" is neither a layer type nor a block")
            && msg.contains("the blocks defined are Unit"),
        "{msg}"
    );

    // PyTorch's class names point at the layer type.
    for (class, ty) in
        [("ReLU", "relu"), ("BatchNorm2d", "batchnorm2d"), ("AdaptiveAvgPool2d", "adaptive_avgpool2d")]
    {
        let (key, msg) = err_of(&with_blocks(UNIT, &format!(r#"{{ type = "{class}" }}"#)));
        assert_eq!(key, "model.layers[0].type");
        let hint =
            format!("nor a block under [model.blocks] (did you mean `{ty}`? layer types are lower case); ");
        assert!(msg.contains(&hint), "{msg}");
    }
    let (_, msg) = err_of(&with_blocks(UNIT, r#"{ type = "Unti", args = { width = 1 } }"#));
    assert!(!msg.contains("did you mean"), "{msg}");

    let bad = UNIT.replace("\"$width\", kernel_size = 3", "\"$widht\", kernel_size = 3");
    let (key, msg) = err_of(&with_blocks(&bad, r#"{ type = "Unit", args = { width = 1 } }"#));
    assert_eq!(key, "model.blocks.Unit.layers[0].layers[0].out_channels");
    assert!(msg.starts_with("\"$widht\" names no argument of Unit; its arguments: project"), "{msg}");

    let bad = UNIT.replace("when = \"$project\"", "when = \"$width\"");
    let (key, msg) = err_of(&with_blocks(&bad, r#"{ type = "Unit", args = { width = 1 } }"#));
    assert_eq!(key, "model.blocks.Unit.layers[0].shortcut[0].when");
    assert!(msg.starts_with("expected true or false") && msg.contains("found 1"), "{msg}");

    let lower = "[model.blocks.unit]\nlayers = [{ type = \"relu\" }]\n";
    let (key, msg) = err_of(&with_blocks(lower, r#"{ type = "relu" }"#));
    assert_eq!(key, "model.blocks.unit");
    assert!(msg.contains("capital letter"), "{msg}");

    let (key, msg) = err_of(&with_blocks("[model.blocks.E]\nlayers = []\n", r#"{ type = "relu" }"#));
    assert_eq!(
        (key.as_str(), msg.as_str()),
        ("model.blocks.E.layers", "a block must have at least one layer")
    );

    let selfish =
        "[model.blocks.A]\nlayers = [{ type = \"B\" }]\n[model.blocks.B]\nlayers = [{ type = \"A\" }]\n";
    let (key, msg) = err_of(&with_blocks(selfish, r#"{ type = "A" }"#));
    assert_eq!(key, "model.blocks.B.layers[0].type");
    assert!(msg.starts_with("A uses itself (A -> B -> A)"), "{msg}");

    let (key, msg) = err_of(&with_blocks(
        "[model.blocks.A]\nlayers = [{ type = \"relu\" }]\nbody = 1\n",
        r#"{ type = "A" }"#,
    ));
    assert_eq!(key, "model.blocks.A.body");
    assert!(msg.contains("args, layers"), "{msg}");

    // `when` and "$..." belong to blocks: in model.layers they are errors.
    let (key, _) = err_of(&with_blocks("", r#"{ type = "relu", when = true }"#));
    assert_eq!(key, "model.layers[0].when");
    let (key, _) = err_of(&with_blocks("", r#"{ type = "maxpool2d", kernel_size = "$k" }"#));
    assert_eq!(key, "model.layers[0].kernel_size");
}

#[test]
fn a_huge_repeat_is_refused_before_it_is_built() {
    let (key, msg) =
        err_of(&with_blocks(UNIT, r#"{ type = "Unit", repeat = 1000000, args = { width = 1 } }"#));
    assert_eq!((key.as_str(), msg.as_str()), ("model.layers[0].repeat", "must be 1 to 10000, got 1000000"));
    let nest = "[model.blocks.R]\nlayers = [{ type = \"Unit\", repeat = 10000, args = { width = 1 } }]\n";
    let (key, msg) = err_of(&with_blocks(&format!("{UNIT}{nest}"), r#"{ type = "R", repeat = 10000 }"#));
    assert!(key.starts_with("model.blocks.Unit.layers"), "{key}");
    assert!(msg.contains("more than 100000 nodes"), "{msg}");
}
