//! `ddptrain check`'s dry run: what training would refuse after the config
//! is valid, found without training or writing anything. The data is
//! opened as training opens it (MNIST-style and CIFAR files by their
//! headers, sizes and labels, a text by its vocabulary against the model's
//! logits; a user's .npz arrays load whole), and
//! `run.out_dir` is looked at as the run's claim would look at it (its
//! lock, another run's files in it, whether it can be written). Each
//! refusal is training's own error, from training's own functions.

use super::{check_split, check_vocab, load_datasets, load_text};
use crate::config::{self, Config, DatasetKind};
use crate::data::{self, Normalize, Split};
use crate::error::{Error, Result};

/// Every refusal training would make of `cfg` past its validation, the
/// data's first and the out_dir's: empty when it would start.
pub fn dry_run(cfg: &Config) -> Vec<Error> {
    [check_data(cfg), crate::checkpoint::check_out_dir(cfg)].into_iter().filter_map(Result::err).collect()
}

fn check_data(cfg: &Config) -> Result<()> {
    let d = &cfg.data;
    let channels = cfg.model.input_shape.first().copied().unwrap_or(1);
    let norm = Normalize::broadcast(&d.mean, &d.std, channels);
    let inspect = |split: Split| match d.dataset {
        DatasetKind::Mnist => data::inspect_idx(data::IdxSet::Mnist, &d.path, split, &norm),
        DatasetKind::FashionMnist => data::inspect_idx(data::IdxSet::FashionMnist, &d.path, split, &norm),
        DatasetKind::Cifar10 => data::cifar::inspect(&d.path, data::cifar::Cifar::Ten, split, &norm),
        _ => data::cifar::inspect(&d.path, data::cifar::Cifar::Hundred, split, &norm),
    };
    match d.dataset {
        DatasetKind::Synthetic => Ok(()),
        DatasetKind::Text => {
            let resolved = config::model::resolve(&cfg.model)?;
            let (train, _) = load_text(cfg)?;
            check_vocab(cfg, &resolved, &train)
        }
        // No header-only reader for a user's arrays yet: they load as for training.
        DatasetKind::Npz => load_datasets(cfg).map(drop),
        DatasetKind::Mnist | DatasetKind::FashionMnist | DatasetKind::Cifar10 | DatasetKind::Cifar100 => {
            for split in [Split::Train, Split::Test] {
                let seen = inspect(split)?;
                check_split(cfg, split, &seen.sample_shape, seen.max_label)?;
            }
            Ok(())
        }
    }
}
