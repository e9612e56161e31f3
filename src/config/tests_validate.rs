//! validate(): every range and cross-field rule names its key.

use super::tests_load::{config_err, load_text, MINIMAL};
use super::*;

/// (overrides, key the error must name, fragment the message must contain)
const CASES: &[(&[&str], &str, &str)] = &[
    (&["run.name=\"\""], "run.name", "must not be empty"),
    (&["data.batch_size=0"], "data.batch_size", "at least 1"),
    (&["data.eval_batch_size=0"], "data.eval_batch_size", "at least 1"),
    (&["data.num_classes=1"], "data.num_classes", "at least 2"),
    (&["data.mean=[0.5, 0.5]"], "data.mean", "has 2 values but the input has 1 channel(s)"),
    (&["data.std=[0.2, 0.2, 0.2]"], "data.std", "has 3 values but the input has 1 channel(s)"),
    (&["data.std=[0.0]"], "data.std", "must be positive"),
    (&["data.std=[-1.0]"], "data.std", "must be positive"),
    (&["data.dataset=synthetic", "data.synthetic_train_size=0"], "data.synthetic_train_size", "at least 1"),
    (&["data.layout=nhwc"], "data.layout", "applies to dataset = \"npz\" only"),
    (&["data.dataset=cifar10"], "model.input_shape", "is [1, 4, 4] but CIFAR images are [3, 32, 32]"),
    (&["data.random_horizontal_flip=1.5"], "data.random_horizontal_flip", "in [0, 1], got 1.5"),
    (&["data.random_crop.size=0"], "data.random_crop.size", "at least 1"),
    (
        &["data.random_crop.size=7", "data.random_crop.padding=1"],
        "data.random_crop.size",
        "7 is larger than the padded image, 6x6 (4x4 from model.input_shape plus padding 1 on each side)",
    ),
    (
        &["data.random_crop.size=3", "data.random_crop.padding=1"],
        "data.random_crop.size",
        "3 must equal the image size 4x4 (model.input_shape): test images are not cropped",
    ),
    (&["data.dataset=synthetic", "data.synthetic_test_size=0"], "data.synthetic_test_size", "at least 1"),
    (&["optimizer.lr=0"], "optimizer.lr", "positive"),
    (&["optimizer.lr=-0.1"], "optimizer.lr", "positive"),
    (&["optimizer.lr=nan"], "optimizer.lr", "positive"),
    (&["optimizer.momentum=1.0"], "optimizer.momentum", "[0, 1)"),
    (&["optimizer.momentum=-0.5"], "optimizer.momentum", "[0, 1)"),
    (&["optimizer.dampening=2"], "optimizer.dampening", "[0, 1]"),
    (&["optimizer.weight_decay=-1e-4"], "optimizer.weight_decay", ">= 0"),
    (&["optimizer.nesterov=true"], "optimizer.nesterov", "momentum > 0 and zero dampening"),
    (
        &["optimizer.nesterov=true", "optimizer.momentum=0.9", "optimizer.dampening=0.1"],
        "optimizer.nesterov",
        "dampening is 0.1",
    ),
    (&["optimizer.name=adam", "optimizer.betas=[0.9, 1.0]"], "optimizer.betas", "betas[1] must be in [0, 1)"),
    (
        &["optimizer.name=adam", "optimizer.betas=[-0.1, 0.9]"],
        "optimizer.betas",
        "betas[0] must be in [0, 1)",
    ),
    (&["optimizer.name=adam", "optimizer.eps=-1e-8"], "optimizer.eps", ">= 0"),
    (&["optimizer.name=adam", "optimizer.momentum=0.9"], "optimizer.momentum", "applies to sgd only"),
    (&["optimizer.name=adamw", "optimizer.nesterov=true"], "optimizer.nesterov", "applies to sgd only"),
    (&["optimizer.betas=[0.8, 0.99]"], "optimizer.betas", "applies to adam and adamw only"),
    (&["optimizer.eps=1e-6"], "optimizer.eps", "applies to adam and adamw only"),
    (&["scheduler.name=step"], "scheduler.step_size", "required for the step scheduler"),
    (&["scheduler.name=step", "scheduler.step_size=0"], "scheduler.step_size", "at least 1"),
    (&["scheduler.step_size=10"], "scheduler.step_size", "applies to the step scheduler only"),
    (&["scheduler.gamma=0"], "scheduler.gamma", "positive"),
    (&["scheduler.eta_min=-1"], "scheduler.eta_min", "[0, optimizer.lr = 0.1]"),
    (&["scheduler.eta_min=0.5"], "scheduler.eta_min", "[0, optimizer.lr = 0.1]"),
    (&["train.max_steps=0"], "train.max_steps", "at least 1"),
    (&["train.epochs=0"], "train.epochs", "at least 1"),
    (&["train.grad_clip_norm=0"], "train.grad_clip_norm", "positive"),
    (&["train.grad_accum_steps=0"], "train.grad_accum_steps", "at least 1"),
    (&["amp.loss_scale=0"], "amp.loss_scale", "\"dynamic\" or a positive number"),
    (&["parallel.backend=nccl", "run.device=cpu"], "parallel.backend", "nccl needs CUDA"),
    (&["parallel.master_addr=\"\""], "parallel.master_addr", "must not be empty"),
    (&["parallel.master_port=0"], "parallel.master_port", "1..=65535"),
    (&["parallel.timeout_s=0"], "parallel.timeout_s", "at least 1 second"),
    (&["parallel.bucket_cap_mb=0"], "parallel.bucket_cap_mb", "positive"),
    (&["parallel.first_bucket_mb=-1"], "parallel.first_bucket_mb", "positive"),
    (&["parallel.gradient_predivide_factor=0"], "parallel.gradient_predivide_factor", "positive"),
    (&["checkpoint.keep_last=0"], "checkpoint.keep_last", "at least 1"),
    (
        &["checkpoint.every_minutes=-1"],
        "checkpoint.every_minutes",
        "0 or more (0 turns timed saves off), got -1",
    ),
    (&["checkpoint.every_minutes=nan"], "checkpoint.every_minutes", "got NaN"),
    (&["checkpoint.every_minutes=inf"], "checkpoint.every_minutes", "got inf"),
    (&["checkpoint.resume=\"\""], "checkpoint.resume", "checkpoint directory"),
    (
        &["checkpoint.resume=ato"],
        "checkpoint.resume",
        "\"ato\" is neither \"auto\", \"never\" nor a checkpoint directory (did you mean \"auto\"?)",
    ),
    (&["checkpoint.resume=nevr"], "checkpoint.resume", "(did you mean \"never\"?)"),
    (
        &["run.overwrite=true", "run.out_dir=runs/x", "checkpoint.resume=runs/x/ckpt/latest"],
        "run.overwrite",
        "is true, which removes run.out_dir's checkpoints first, and checkpoint.resume names one of them \
         (runs/x/ckpt/latest): leave out one of the two",
    ),
    (&["logging.every_steps=0"], "logging.every_steps", "at least 1"),
    (&["expect.min_test_accuracy=97"], "expect.min_test_accuracy", "fraction in [0, 1]"),
    (&["expect.max_final_loss=0"], "expect.max_final_loss", "positive"),
    (&["model.init_from=\"\""], "model.init_from", "must not be empty"),
];

#[test]
fn every_invalid_value_names_its_key() {
    for (set, want_key, want_msg) in CASES {
        let (r, path) = load_text(MINIMAL, set, &[]);
        let (file, key, msg) = config_err(r);
        // The error names where the key's value came from; a key given nowhere belongs in the file.
        let from_set = set.iter().any(|s| s.starts_with(&format!("{want_key}=")));
        let file_name = path.display().to_string();
        let want_file = if from_set { format!("{file_name} (value from --set)") } else { file_name };
        assert_eq!(file, want_file, "{set:?}");
        assert_eq!(key, *want_key, "{set:?}: {msg}");
        assert!(msg.contains(want_msg), "{set:?}: {key}: {msg}");
    }
}

#[test]
fn epochs_or_max_steps_is_required() {
    let (r, path) = load_text(&MINIMAL.replace("max_steps = 10", ""), &[], &[]);
    let (file, key, msg) = config_err(r);
    assert_eq!(file, path.display().to_string());
    assert_eq!(key, "train.epochs");
    assert!(msg.contains("train.epochs or train.max_steps"), "{msg}");
}

#[test]
fn validation_errors_from_the_file_name_the_file() {
    let (r, path) = load_text(&MINIMAL.replace("lr = 0.1", "lr = 0.0"), &[], &[]);
    let (file, key, msg) = config_err(r);
    assert_eq!(file, path.display().to_string());
    assert_eq!(key, "optimizer.lr");
    assert!(msg.contains("positive number, got 0"), "{msg}");
    let shown = crate::Error::Config { file, key, msg }.to_string();
    assert!(
        shown.starts_with(&format!("config error in {}: `optimizer.lr`: must be", path.display())),
        "{shown}"
    );
}

#[test]
fn valid_overrides_pass_validation() {
    let ok: &[&[&str]] = &[
        &["optimizer.nesterov=true", "optimizer.momentum=0.9"],
        &["optimizer.name=adam", "optimizer.betas=[0.8, 0.99]", "optimizer.eps=1e-6"],
        &["scheduler.name=step", "scheduler.step_size=100", "scheduler.gamma=0.5"],
        &["scheduler.name=cosine", "scheduler.eta_min=0.001", "scheduler.warmup_steps=5"],
        &["train.epochs=2", "train.grad_clip_norm=1.0", "train.grad_accum_steps=4"],
        &["amp.opt_level=O2", "amp.loss_scale=dynamic", "amp.master_weights=true"],
        &["amp.opt_level=O3", "amp.loss_scale=128", "amp.keep_batchnorm_fp32=true"],
        &["parallel.backend=tcp", "parallel.master_addr=node0", "parallel.master_port=29500"],
        &["checkpoint.resume=never", "checkpoint.every_steps=100", "checkpoint.keep_last=1"],
        &["expect.min_test_accuracy=0.5", "expect.max_final_loss=0.3", "logging.progress=never"],
        &["data.dataset=synthetic", "data.drop_last=true", "data.prefetch=0"],
        &["run.overwrite=true", "run.out_dir=runs/x", "checkpoint.resume=runs/y/ckpt/latest"],
    ];
    for set in ok {
        if let Err(e) = load_text(MINIMAL, set, &[]).0 {
            panic!("{set:?}: {e}");
        }
    }
    let c = load_text(MINIMAL, &["amp.opt_level=O3", "amp.loss_scale=128"], &[]).0.unwrap();
    assert_eq!((c.amp.opt_level, c.amp.loss_scale), (OptLevel::O3, Some(LossScale::Static(128.0))));
    let c = load_text(MINIMAL, &["checkpoint.resume=never"], &[]).0.unwrap();
    assert_eq!(c.checkpoint.resume, Resume::Never);
}

#[test]
fn validate_on_a_config_built_in_code_names_the_path() {
    let mut c = load_text(MINIMAL, &[], &[]).0.unwrap();
    c.config_path = "somewhere/x.toml".into();
    c.data.batch_size = 0;
    let (file, key, _) = config_err(c.validate().map(|_| c.clone()));
    assert_eq!((file.as_str(), key.as_str()), ("somewhere/x.toml", "data.batch_size"));
}

/// A one-value mean and std are every channel's (torchvision's Normalize
/// broadcasts them): synthetic data's MNIST statistics on a 3-channel model.
#[test]
fn one_mean_and_std_serve_every_channel() {
    let sets = [
        "data.dataset=synthetic",
        "model.input_shape=[3, 4, 4]",
        "model.layers=[{type=\"flatten\"}, {type=\"linear\", out_features=10}]",
    ];
    let d = load_text(MINIMAL, &sets, &[]).0.unwrap().data;
    assert_eq!((&d.mean, &d.std), (&vec![0.1307], &vec![0.3081]));
    let n = crate::data::Normalize::broadcast(&d.mean, &d.std, 3);
    assert_eq!((n.mean, n.std), (vec![0.1307; 3], vec![0.3081; 3]));
    // Two of three channels is neither.
    let (_, key, msg) =
        config_err(load_text(MINIMAL, &[&sets[..], &["data.mean=[0.5, 0.5]"]].concat(), &[]).0);
    assert_eq!(key, "data.mean", "{msg}");
    assert!(msg.contains("has 2 values but the input has 3 channel(s) (model.input_shape[0]); give one per channel, or one for all"), "{msg}");
}

#[test]
fn each_dataset_brings_its_path_normalization_and_classes() {
    let load = |sets: &[&str]| load_text(MINIMAL, sets, &[]).0.unwrap().data;
    let mnist = load(&[]);
    assert_eq!(
        (mnist.path.to_str(), mnist.mean, mnist.std),
        (Some("data/mnist"), vec![0.1307], vec![0.3081])
    );
    let f = load(&["data.dataset=fashion_mnist"]);
    assert_eq!((f.path.to_str(), f.mean, f.std), (Some("data/fashion-mnist"), vec![0.286], vec![0.353]));
    let c = load(&[
        "data.dataset=cifar100",
        "model.input_shape=[3, 32, 32]",
        "model.layers=[{type=\"flatten\"}, {type=\"linear\", out_features=100}]",
    ]);
    assert_eq!((c.path.to_str(), c.num_classes, c.mean.len()), (Some("data/cifar100"), 100, 3));
    // Arrays of unknown content: ToTensor only, one value per channel of the input.
    let n = load(&["data.dataset=npz", "model.input_shape=[2, 4, 4]", "data.layout=nhwc"]);
    assert_eq!((n.mean, n.std, n.layout), (vec![0.0; 2], vec![1.0; 2], Layout::Nhwc));
    // Explicit values win over the dataset's.
    let own = load(&["data.dataset=fashion_mnist", "data.path=\"/x\"", "data.mean=[0.5]", "data.std=[0.5]"]);
    assert_eq!((own.path.to_str(), own.mean, own.std), (Some("/x"), vec![0.5], vec![0.5]));
    let aug = load(&["data.random_crop={size=4, padding=2}", "data.random_horizontal_flip=0.5"]);
    assert_eq!(aug.random_crop, Some(RandomCrop { size: 4, padding: 2, fill: 0 }));
    assert_eq!(aug.random_horizontal_flip, Some(0.5));
    let (_, key, msg) = config_err(load_text(MINIMAL, &["data.random_crop={size=4, fill=256}"], &[]).0);
    assert_eq!(key, "data.random_crop.fill", "{msg}");
    let (_, key, msg) = config_err(load_text(MINIMAL, &["data.random_crop={size=4, pad=2}"], &[]).0);
    assert!(key.starts_with("data.random_crop") && msg.contains("pad"), "{key}: {msg}");
}
