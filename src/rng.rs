//! Every random stream in a run is derived from (run seed, purpose, index), so
//! nothing depends on the order in which streams are consumed and nothing needs
//! to be saved to reproduce a run: the sampler of epoch 7 is the same whether
//! the run started at epoch 0 or resumed at epoch 7.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// What a stream is for; part of the stream's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    Init = 1,
    Sampler = 2,
    Synthetic = 3,
    /// Training-time augmentation, indexed by (epoch, sample) so a sample's
    /// crop and flip do not depend on batch size, rank count or resume.
    Augment = 4,
}

pub fn stream(seed: u64, purpose: Purpose, index: u64) -> ChaCha8Rng {
    // SplitMix64 finalizer: well-mixed keys for nearby (seed, index) pairs.
    let mut z = seed
        .wrapping_add((purpose as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(index.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ChaCha8Rng::seed_from_u64(z)
}
