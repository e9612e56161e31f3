//! `ddptrain check`'s dry run: what training would refuse after the config
//! is valid, found without training or writing anything. The data is
//! opened as training opens it (MNIST-style files by their headers and
//! labels, a text by its vocabulary against the model's logits), and
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
    let idx = match d.dataset {
        DatasetKind::Synthetic => return Ok(()),
        DatasetKind::Text => {
            let resolved = config::model::resolve(&cfg.model)?;
            let (train, _) = load_text(cfg)?;
            return check_vocab(cfg, &resolved, &train);
        }
        DatasetKind::Mnist => data::IdxSet::Mnist,
        DatasetKind::FashionMnist => data::IdxSet::FashionMnist,
        // No header-only reader for these yet: they load as for training.
        DatasetKind::Cifar10 | DatasetKind::Cifar100 | DatasetKind::Npz => {
            return load_datasets(cfg).map(drop)
        }
    };
    let channels = cfg.model.input_shape.first().copied().unwrap_or(1);
    let norm = Normalize::broadcast(&d.mean, &d.std, channels);
    for split in [Split::Train, Split::Test] {
        let seen = data::inspect_idx(idx, &d.path, split, &norm)?;
        check_split(cfg, split, &seen.sample_shape, seen.max_label)?;
    }
    Ok(())
}
