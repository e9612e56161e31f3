//! Checks that need more than a type: ranges, cross-field rules (PyTorch's
//! where it has them) and the model's shapes. Each error names its key.

use super::model::{self, LayerKind, MODEL_FILE};
use super::schema::{
    default_adam_eps, default_betas, Backend, Config, DatasetKind, Device, Layout, LossScale, OptimizerName,
    Resume, SchedulerName,
};
use crate::error::{cut, Error, Result, VALUE_CHARS};

impl Config {
    /// Checks every value and the model's shapes. Errors name the config file;
    /// `load` re-attributes them to the env variable or `--set` that gave the value.
    pub fn validate(&self) -> Result<()> {
        let file = if self.config_path.as_os_str().is_empty() {
            "the config".to_owned()
        } else {
            self.config_path.display().to_string()
        };
        self.check().map_err(|e| match e {
            Error::Config { file: f, key, msg } if f == MODEL_FILE || f.is_empty() => {
                Error::Config { file, key, msg }
            }
            other => other,
        })
    }

    fn check(&self) -> Result<()> {
        let r = &self.run;
        if r.name.trim().is_empty() {
            return Err(bad("run.name", "must not be empty"));
        }
        self.check_lengths()?;
        if let Some(gb) = r.max_memory_gb {
            if !(gb.is_finite() && gb > 0.0) {
                return Err(bad("run.max_memory_gb", format!("must be a positive number of GiB, got {gb}")));
            }
        }
        if r.out_dir.as_os_str().is_empty() {
            return Err(bad("run.out_dir", "must not be empty"));
        }
        if let (true, Resume::Path(p)) = (r.overwrite, &self.checkpoint.resume) {
            // Lexically here; the claim on the out_dir checks again with symlinks resolved.
            let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
            if abs(p).starts_with(abs(&r.out_dir)) {
                return Err(bad(
                    "run.overwrite",
                    format!(
                        "is true, which removes run.out_dir's checkpoints first, and checkpoint.resume names one \
                         of them ({}): leave out one of the two",
                        cut(&p.to_string_lossy(), VALUE_CHARS)
                    ),
                ));
            }
        }
        self.check_model()?;
        self.check_data()?;
        self.check_optimizer()?;
        self.check_scheduler()?;
        self.check_train()?;
        self.check_rest()
    }

    /// Strings that become file names, paths or host names are held to the
    /// system's limits here, so a runaway value is refused by its key rather
    /// than repeated whole in an I/O error from deep inside the run.
    fn check_lengths(&self) -> Result<()> {
        // NAME_MAX, PATH_MAX (Linux) and a DNS name's 253 characters.
        const NAME_MAX: usize = 255;
        const PATH_MAX: usize = 4096;
        const HOST_MAX: usize = 253;
        let path_of = |p: &std::path::Path| p.as_os_str().to_string_lossy().into_owned();
        let mut strings = vec![
            ("run.name", self.run.name.clone(), NAME_MAX, "it names the run's directory"),
            ("run.out_dir", path_of(&self.run.out_dir), PATH_MAX, "a path"),
            ("data.path", path_of(&self.data.path), PATH_MAX, "a path"),
        ];
        if let Some(p) = &self.model.init_from {
            strings.push(("model.init_from", path_of(p), PATH_MAX, "a path"));
        }
        if let Resume::Path(p) = &self.checkpoint.resume {
            strings.push(("checkpoint.resume", path_of(p), PATH_MAX, "a path"));
        }
        if let Some(a) = &self.parallel.master_addr {
            strings.push(("parallel.master_addr", a.clone(), HOST_MAX, "a host name or address"));
        }
        for (key, value, max, what) in strings {
            if value.len() > max {
                return Err(bad(
                    key,
                    format!(
                        "is {} bytes long, more than {max} ({what}): {:?}",
                        value.len(),
                        cut(&value, VALUE_CHARS)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_model(&self) -> Result<()> {
        self.check_input_rank()?;
        let layers = model::resolve(&self.model)?;
        if self.data.dataset == DatasetKind::Text {
            return self.check_language_model(&layers);
        }
        let classes = self.data.num_classes;
        if classes < 2 {
            return Err(bad("data.num_classes", format!("must be at least 2, got {classes}")));
        }
        let outputs = layers.last().map_or(0, |l| l.out_shape.iter().product::<usize>());
        if outputs != classes {
            let key = match layers.iter().rev().find(|l| matches!(l.kind, LayerKind::Linear { .. })) {
                Some(l) => format!("{}.out_features", l.key),
                None => "model.layers".to_owned(),
            };
            return Err(bad(
                key,
                format!("the model outputs {outputs} logits but data.num_classes is {classes}"),
            ));
        }
        if let Some(p) = &self.model.init_from {
            if p.as_os_str().is_empty() {
                return Err(bad(
                    "model.init_from",
                    "must not be empty (leave it out to start from random weights)",
                ));
            }
        }
        Ok(())
    }

    /// Images are `[C, H, W]`; text is `[block_size]` token ids.
    fn check_input_rank(&self) -> Result<()> {
        let n = self.model.input_shape.len();
        match self.data.dataset {
            DatasetKind::Text if n != 1 => Err(bad(
                "model.input_shape",
                format!("expected [block_size] (1 number) for dataset = \"text\", found {n} element(s)"),
            )),
            DatasetKind::Text => Ok(()),
            _ if n != 3 => {
                Err(bad("model.input_shape", format!("expected [C, H, W] (3 numbers), found {n} element(s)")))
            }
            _ => Ok(()),
        }
    }

    /// A language model maps `[T]` token ids to `[T, vocab]` logits; the
    /// vocabulary it must cover is known once the text is read (bytes: 256).
    fn check_language_model(&self, layers: &[model::ResolvedLayer]) -> Result<()> {
        let t = self.model.input_shape.first().copied().unwrap_or(0);
        let out = layers.last().map(|l| l.out_shape.clone()).unwrap_or_default();
        let key = || match layers.iter().rev().find(|l| matches!(l.kind, LayerKind::Linear { .. })) {
            Some(l) => format!("{}.out_features", l.key),
            None => "model.layers".to_owned(),
        };
        let [ot, v] = out[..] else {
            return Err(bad(
                key(),
                format!("a language model's output must be [block_size, vocab_size] logits, got {out:?}"),
            ));
        };
        if ot != t {
            return Err(bad(
                key(),
                format!("the model outputs {ot} positions but model.input_shape is [{t}]"),
            ));
        }
        if self.data.vocab.unwrap_or_default() == crate::data::text::VocabKind::Bytes && v < 256 {
            return Err(bad(
                key(),
                format!("the model outputs {v} logits but data.vocab = \"bytes\" has 256 tokens"),
            ));
        }
        Ok(())
    }

    fn check_data(&self) -> Result<()> {
        let d = &self.data;
        if d.dataset == DatasetKind::Text {
            return self.check_text();
        }
        // Keys of a language model's run, named so a misplaced one is not ignored.
        let text_only = [
            ("data.vocab", d.vocab.is_some()),
            ("data.val_fraction", d.val_fraction.is_some()),
            ("train.eval_every", self.train.eval_every.is_some()),
            ("train.eval_iters", self.train.eval_iters.is_some()),
            ("expect.max_val_loss", self.expect.max_val_loss.is_some()),
        ];
        if let Some((key, _)) = text_only.iter().find(|(_, set)| *set) {
            return Err(bad(*key, "applies to dataset = \"text\" only"));
        }
        if d.batch_size == 0 {
            return Err(bad("data.batch_size", "must be at least 1"));
        }
        if d.eval_batch_size == 0 {
            return Err(bad("data.eval_batch_size", "must be at least 1"));
        }
        // CIFAR's files have no header: their shape is the format's, known now.
        if matches!(d.dataset, DatasetKind::Cifar10 | DatasetKind::Cifar100)
            && self.model.input_shape != crate::data::cifar::CIFAR_SHAPE
        {
            return Err(bad(
                "model.input_shape",
                format!(
                    "is {:?} but CIFAR images are {:?}",
                    self.model.input_shape,
                    crate::data::cifar::CIFAR_SHAPE
                ),
            ));
        }
        let channels = self.model.input_shape[0];
        for (key, v) in [("data.mean", &d.mean), ("data.std", &d.std)] {
            // One value is every channel's, as torchvision's Normalize broadcasts it.
            if v.len() != channels && v.len() != 1 {
                return Err(bad(
                    key,
                    format!(
                        "has {} values but the input has {channels} channel(s) (model.input_shape[0]); give one per channel, or one for all",
                        v.len()
                    ),
                ));
            }
            if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                return Err(bad(key, format!("must be finite numbers, got {x}")));
            }
        }
        if let Some(s) = d.std.iter().find(|s| **s <= 0.0) {
            return Err(bad("data.std", format!("must be positive (it divides the input), got {s}")));
        }
        if d.dataset == DatasetKind::Synthetic {
            if d.synthetic_train_size == 0 {
                return Err(bad("data.synthetic_train_size", "must be at least 1"));
            }
            if d.synthetic_test_size == 0 {
                return Err(bad("data.synthetic_test_size", "must be at least 1"));
            }
        }
        if d.path.as_os_str().is_empty() {
            return Err(bad("data.path", "must not be empty"));
        }
        if d.layout == Layout::Nhwc && d.dataset != DatasetKind::Npz {
            return Err(bad(
                "data.layout",
                "applies to dataset = \"npz\" only (the other formats fix their layout)",
            ));
        }
        self.check_augment()
    }

    fn check_text(&self) -> Result<()> {
        let d = &self.data;
        if d.batch_size == 0 {
            return Err(bad("data.batch_size", "must be at least 1"));
        }
        if d.eval_batch_size == 0 {
            return Err(bad("data.eval_batch_size", "must be at least 1"));
        }
        let vf = d.val_fraction();
        if !(vf > 0.0 && vf < 1.0) {
            return Err(bad("data.val_fraction", format!("must be in (0, 1), got {vf}")));
        }
        if self.train.eval_iters() == 0 {
            return Err(bad("train.eval_iters", "must be at least 1"));
        }
        if self.train.eval_every == Some(0) {
            return Err(bad(
                "train.eval_every",
                "must be at least 1 (leave it out to evaluate after each epoch)",
            ));
        }
        if d.path.as_os_str().is_empty() {
            return Err(bad("data.path", "must not be empty"));
        }
        if d.augments() || d.layout == Layout::Nhwc {
            return Err(bad(
                if d.augments() { "data.random_crop" } else { "data.layout" },
                "applies to images, not to dataset = \"text\"",
            ));
        }
        Ok(())
    }

    /// torchvision's rules for RandomCrop and RandomHorizontalFlip, and one
    /// of ours: test images are not cropped, so the crop must be the size
    /// the model takes.
    fn check_augment(&self) -> Result<()> {
        let d = &self.data;
        if let Some(p) = d.random_horizontal_flip {
            if !(0.0..=1.0).contains(&p) {
                return Err(bad(
                    "data.random_horizontal_flip",
                    format!("is the flip probability p, in [0, 1], got {p}"),
                ));
            }
        }
        let Some(c) = d.random_crop else { return Ok(()) };
        let [_, h, w] = self.model.input_shape[..] else { return Ok(()) };
        if c.size == 0 {
            return Err(bad("data.random_crop.size", "must be at least 1"));
        }
        let padded = |side: usize| side.checked_add(c.padding.saturating_mul(2));
        let (Some(ph), Some(pw)) = (padded(h), padded(w)) else {
            return Err(bad("data.random_crop.padding", format!("{} does not fit in 64 bits", c.padding)));
        };
        if c.size > ph || c.size > pw {
            return Err(bad(
                "data.random_crop.size",
                format!(
                    "{} is larger than the padded image, {ph}x{pw} ({h}x{w} from model.input_shape plus \
                     padding {} on each side); lower the size or raise data.random_crop.padding",
                    c.size, c.padding
                ),
            ));
        }
        if c.size != h || c.size != w {
            return Err(bad(
                "data.random_crop.size",
                format!(
                    "{} must equal the image size {h}x{w} (model.input_shape): test images are not \
                     cropped, so training crops must have the shape the model takes",
                    c.size
                ),
            ));
        }
        Ok(())
    }

    fn check_optimizer(&self) -> Result<()> {
        let o = &self.optimizer;
        if !(o.lr.is_finite() && o.lr > 0.0) {
            return Err(bad("optimizer.lr", format!("must be a positive number, got {}", o.lr)));
        }
        if !(0.0..1.0).contains(&o.momentum) {
            return Err(bad("optimizer.momentum", format!("must be in [0, 1), got {}", o.momentum)));
        }
        if !(0.0..=1.0).contains(&o.dampening) {
            return Err(bad("optimizer.dampening", format!("must be in [0, 1], got {}", o.dampening)));
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            return Err(bad("optimizer.weight_decay", format!("must be >= 0, got {}", o.weight_decay)));
        }
        for (i, b) in o.betas.iter().enumerate() {
            if !(0.0..1.0).contains(b) {
                return Err(bad("optimizer.betas", format!("betas[{i}] must be in [0, 1), got {b}")));
            }
        }
        if !(o.eps.is_finite() && o.eps >= 0.0) {
            return Err(bad("optimizer.eps", format!("must be >= 0, got {}", o.eps)));
        }
        match o.name {
            OptimizerName::Sgd => {
                if o.nesterov && (o.momentum == 0.0 || o.dampening != 0.0) {
                    return Err(bad(
                        "optimizer.nesterov",
                        format!(
                            "Nesterov momentum requires a momentum > 0 and zero dampening (PyTorch's rule); \
                             momentum is {}, dampening is {}",
                            o.momentum, o.dampening
                        ),
                    ));
                }
                // Settings that only Adam reads would be silently ignored.
                if o.betas != default_betas() {
                    return Err(bad("optimizer.betas", "applies to adam and adamw only, not sgd"));
                }
                if o.eps != default_adam_eps() {
                    return Err(bad("optimizer.eps", "applies to adam and adamw only, not sgd"));
                }
            }
            OptimizerName::Adam | OptimizerName::AdamW => {
                for (key, set) in [
                    ("optimizer.momentum", o.momentum != 0.0),
                    ("optimizer.dampening", o.dampening != 0.0),
                    ("optimizer.nesterov", o.nesterov),
                ] {
                    if set {
                        return Err(bad(key, "applies to sgd only; adam and adamw use betas"));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_scheduler(&self) -> Result<()> {
        let s = &self.scheduler;
        match (s.name, s.step_size) {
            (SchedulerName::Step, None) => {
                return Err(bad(
                    "scheduler.step_size",
                    "is required for the step scheduler (optimizer steps between decays)",
                ));
            }
            (SchedulerName::Step, Some(0)) => return Err(bad("scheduler.step_size", "must be at least 1")),
            (SchedulerName::Constant | SchedulerName::Cosine, Some(_)) => {
                return Err(bad("scheduler.step_size", "applies to the step scheduler only"));
            }
            _ => {}
        }
        if !(s.gamma.is_finite() && s.gamma > 0.0) {
            return Err(bad("scheduler.gamma", format!("must be a positive number, got {}", s.gamma)));
        }
        if !(s.eta_min.is_finite() && s.eta_min >= 0.0 && s.eta_min <= self.optimizer.lr) {
            return Err(bad(
                "scheduler.eta_min",
                format!("must be in [0, optimizer.lr = {}], got {}", self.optimizer.lr, s.eta_min),
            ));
        }
        Ok(())
    }

    fn check_train(&self) -> Result<()> {
        let t = &self.train;
        match (t.epochs, t.max_steps) {
            (None, None) => {
                return Err(bad(
                    "train.epochs",
                    "set train.epochs or train.max_steps (or both: training stops at whichever comes first)",
                ));
            }
            (Some(0), _) => {
                return Err(bad("train.epochs", "must be at least 1 (leave it out to stop on max_steps)"))
            }
            (_, Some(0)) => {
                return Err(bad("train.max_steps", "must be at least 1 (leave it out to stop on epochs)"))
            }
            _ => {}
        }
        if let Some(n) = t.grad_clip_norm {
            if !(n.is_finite() && n > 0.0) {
                return Err(bad("train.grad_clip_norm", format!("must be a positive number, got {n}")));
            }
        }
        if t.grad_accum_steps == 0 {
            return Err(bad("train.grad_accum_steps", "must be at least 1"));
        }
        Ok(())
    }

    fn check_rest(&self) -> Result<()> {
        if let Some(LossScale::Static(v)) = self.amp.loss_scale {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(
                    "amp.loss_scale",
                    format!("must be \"dynamic\" or a positive number, got {v}"),
                ));
            }
        }
        // The opt level's table, its overrides and the scaler settings (src/amp).
        crate::amp::Policy::resolve(&self.amp)?;
        crate::amp::ScalerConfig::resolve(&self.amp)?;
        let p = &self.parallel;
        if p.backend == Backend::Nccl && self.run.device == Device::Cpu {
            return Err(bad(
                "parallel.backend",
                "nccl needs CUDA devices but run.device is \"cpu\"; use \"tcp\" or \"auto\"",
            ));
        }
        if p.master_addr.as_deref().is_some_and(|a| a.trim().is_empty()) {
            return Err(bad("parallel.master_addr", "must not be empty"));
        }
        if p.master_port == Some(0) {
            return Err(bad("parallel.master_port", "must be in 1..=65535"));
        }
        if p.timeout_s == 0 {
            return Err(bad("parallel.timeout_s", "must be at least 1 second"));
        }
        for (key, v) in [
            ("parallel.bucket_cap_mb", p.bucket_cap_mb),
            ("parallel.first_bucket_mb", p.first_bucket_mb),
            ("parallel.gradient_predivide_factor", p.gradient_predivide_factor),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(key, format!("must be a positive number, got {v}")));
            }
        }
        let m = self.checkpoint.every_minutes;
        if !(m.is_finite() && m >= 0.0) {
            return Err(bad(
                "checkpoint.every_minutes",
                format!("must be a number of minutes, 0 or more (0 turns timed saves off), got {m}"),
            ));
        }
        if self.checkpoint.keep_last == 0 {
            return Err(bad("checkpoint.keep_last", "must be at least 1"));
        }
        if let Resume::Path(p) = &self.checkpoint.resume {
            if p.as_os_str().is_empty() {
                return Err(bad(
                    "checkpoint.resume",
                    "must be \"auto\", \"never\" or a checkpoint directory",
                ));
            }
            // A misspelt keyword names no checkpoint: say which it was meant to be.
            let word = p.to_str().filter(|w| !w.contains(['/', '.']) && !p.exists());
            if let Some(meant) =
                word.and_then(|w| ["auto", "never"].into_iter().find(|k| super::load::similar(w, k)))
            {
                return Err(bad(
                    "checkpoint.resume",
                    format!(
                        "{:?} is neither \"auto\", \"never\" nor a checkpoint directory (did you mean \"{meant}\"?)",
                        crate::error::cut(&p.to_string_lossy(), crate::error::VALUE_CHARS)
                    ),
                ));
            }
        }
        if self.logging.every_steps == 0 {
            return Err(bad("logging.every_steps", "must be at least 1"));
        }
        if let Some(a) = self.expect.min_test_accuracy {
            if !(0.0..=1.0).contains(&a) {
                return Err(bad(
                    "expect.min_test_accuracy",
                    format!("is a fraction in [0, 1] (97% is 0.97), got {a}"),
                ));
            }
        }
        for (key, gate) in [
            ("expect.max_final_loss", self.expect.max_final_loss),
            ("expect.max_val_loss", self.expect.max_val_loss),
        ] {
            if let Some(l) = gate.filter(|l| !(l.is_finite() && *l > 0.0)) {
                return Err(bad(key, format!("must be a positive number, got {l}")));
            }
        }
        if self.data.dataset == DatasetKind::Text && self.expect.min_test_accuracy.is_some() {
            return Err(bad(
                "expect.min_test_accuracy",
                "a language model is gated by its validation loss: set expect.max_val_loss",
            ));
        }
        Ok(())
    }
}

/// The file is filled in by `validate`.
fn bad(key: impl Into<String>, msg: impl Into<String>) -> Error {
    Error::config(String::new(), key, msg)
}
