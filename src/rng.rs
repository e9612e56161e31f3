//! Every random stream in a run is derived from (run seed, purpose, index), so
//! nothing depends on the order in which streams are consumed and nothing needs
//! to be saved to reproduce a run: the sampler of epoch 7 is the same whether
//! the run started at epoch 0 or resumed at epoch 7.
//!
//! Dropout draws its masks from Philox4x32-10, the counter-based generator
//! of cuRAND and PyTorch, keyed by (run seed, node, rank) with the
//! micro-batch and the element in the counter ([`Draws`]): every element's
//! bit is a pure function of where it is, so the CPU and the device
//! (`kernels/dropout.cu`, the same function in CUDA C) draw the same mask
//! whatever the thread count or launch geometry, and a resumed run draws
//! what an unbroken one would.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// What a stream is for; part of the stream's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    Init = 1,
    Sampler = 2,
    Synthetic = 3,
    Dropout = 4,
    /// Training-time augmentation, indexed by (epoch, sample) so a sample's
    /// crop and flip do not depend on batch size, rank count or resume.
    Augment = 5,
    /// Text windows' offsets, indexed by (epoch and split, sample) (`data::text`).
    TextWindow = 6,
    /// `ddptrain sample`'s draws, indexed by the sample number: sample 3 of
    /// a seed is the same text whether 1 or 10 were asked for.
    Generate = 7,
}

/// SplitMix64's finalizer: well-mixed keys for nearby inputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn stream_key(seed: u64, purpose: Purpose, index: u64) -> u64 {
    mix(seed
        .wrapping_add((purpose as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(index.wrapping_mul(0xD1B5_4A32_D192_ED03)))
}

pub fn stream(seed: u64, purpose: Purpose, index: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(stream_key(seed, purpose, index))
}

/// The stream of (seed, purpose, `major`) on ChaCha's stream number `minor`:
/// 2^64 independent streams per index, each reached without drawing the
/// others (a text window's draw from its epoch and sample index).
pub fn stream_at(seed: u64, purpose: Purpose, major: u64, minor: u64) -> ChaCha8Rng {
    let mut rng = stream(seed, purpose, major);
    rng.set_stream(minor);
    rng
}

/// Philox4x32's multipliers and Weyl key increments (Random123's
/// `PHILOX_M4x32_0/1`, `PHILOX_W32_0/1`).
const PHILOX_M: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
const PHILOX_W: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

/// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
/// easy as 1, 2, 3", SC11): four 32-bit words from a 128-bit counter and a
/// 64-bit key, as Random123's `philox4x32(ctr, key)`, cuRAND's
/// `curand_Philox4x32_10` and PyTorch's `at::Philox4_32` compute them.
/// `kernels/dropout.cu` holds the same function for the device.
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(PHILOX_W[0]), k[1].wrapping_add(PHILOX_W[1])];
        }
        let p0 = u64::from(PHILOX_M[0]) * u64::from(c[0]);
        let p1 = u64::from(PHILOX_M[1]) * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// Which micro-batch of the run a training forward computes: its epoch
/// and its position in the epoch (batches a resumed checkpoint consumed
/// counted), the same on every rank and after a resume. Unlike the
/// optimizer step it tells the micro-batches of an accumulation window
/// apart, including the ones an epoch leaves over for the next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MicroBatch {
    pub epoch: u64,
    pub index: u64,
}

/// The key of a training forward's random draws (dropout's masks): the run
/// seed, this rank, and the micro-batch. Ranks draw different masks (their
/// rank is part of the key), as independent dropout over the global batch
/// would; PyTorch's DDP ranks, seeded alike by default, would draw the same
/// mask for different samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Draws {
    pub seed: u64,
    pub rank: u64,
    pub at: MicroBatch,
}

/// One node's draws in one micro-batch: the Philox key, and the counter's
/// upper words. Element `e` of the node's output `[N, ...]` (row-major,
/// this rank's micro-batch) takes word `e % 4` of
/// `philox4x32_10([lo32(e / 4), hi32(e / 4), ctr_hi[0], ctr_hi[1]], key)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeDraws {
    pub key: [u32; 2],
    pub ctr_hi: [u32; 2],
}

impl Draws {
    /// The draws of node `node` (its index in execution order): the key
    /// mixes (seed, node, rank); the counter holds the low 32 bits of the
    /// micro-batch's index and epoch (masks repeat only after 2^32 of
    /// either).
    pub fn node(&self, node: usize) -> NodeDraws {
        let k = mix(stream_key(self.seed, Purpose::Dropout, node as u64)
            ^ self.rank.wrapping_mul(0xA24B_AED4_963E_E407));
        NodeDraws { key: [k as u32, (k >> 32) as u32], ctr_hi: [self.at.index as u32, self.at.epoch as u32] }
    }
}

impl NodeDraws {
    /// The four words of element group `group` (elements `4 * group ..`).
    #[inline]
    pub fn words(&self, group: u64) -> [u32; 4] {
        philox4x32_10([group as u32, (group >> 32) as u32, self.ctr_hi[0], self.ctr_hi[1]], self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known answers (`tests/kat_vectors`, the three
    /// `philox4x32 10` lines: counter, key, result).
    #[test]
    fn philox4x32_10_known_answers() {
        let kat: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            ([0; 4], [0; 2], [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]),
            ([u32::MAX; 4], [u32::MAX; 2], [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (ctr, key, want) in kat {
            assert_eq!(philox4x32_10(ctr, key), want, "philox4x32_10({ctr:08x?}, {key:08x?})");
        }
    }

    #[test]
    fn node_draws_differ_by_node_rank_and_micro_batch() {
        let d = Draws { seed: 7, rank: 0, at: MicroBatch { epoch: 2, index: 5 } };
        let base = d.node(3);
        assert_eq!(base, d.node(3));
        let others = [
            d.node(4),
            Draws { rank: 1, ..d }.node(3),
            Draws { seed: 8, ..d }.node(3),
            Draws { at: MicroBatch { epoch: 2, index: 6 }, ..d }.node(3),
            Draws { at: MicroBatch { epoch: 3, index: 5 }, ..d }.node(3),
        ];
        for o in others {
            assert_ne!(o.words(0), base.words(0), "{o:?} draws what {base:?} does");
        }
        assert_ne!(base.words(0), base.words(1));
        assert_ne!(base.words(0), base.words(1 << 32));
    }
}
