//! The config-fingerprint check for transports whose launcher already formed
//! the job (MPI): there is no handshake with rank 0 to carry the
//! fingerprint, so the ranks compare it through the communicator itself, and
//! a mismatch fails every rank with the message the TCP rendezvous gives,
//! naming the keys that differ.
//!
//! Bytes travel as f16 words: broadcast and all-gather move them untouched,
//! and every transport carries f16.

use super::rendezvous::describe_config_differences;
use super::{Buffer, Communicator, RendezvousOpts};
use crate::error::{Error, Result};
use half::f16;

/// Lengths travel as f32, exact below 2^24; config text above that is not sent.
const MAX_TEXT: usize = 1 << 24;

fn words(bytes: &[u8], len: usize) -> Vec<f16> {
    let mut b = bytes.to_vec();
    b.resize(len.div_ceil(2) * 2, 0);
    b.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect()
}

fn bytes(words: &[f16], len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = words.iter().flat_map(|w| w.to_bits().to_le_bytes()).collect();
    b.truncate(len);
    b
}

fn text(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).into_owned()
}

/// Every rank's `s`, in rank order.
fn all_gather_text(comm: &dyn Communicator, s: &str, label: &str) -> Result<Vec<String>> {
    let lens = comm.all_gather(Buffer::F32(vec![s.len() as f32]), label)?.into_f32()?;
    let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
    let max = lens.iter().copied().max().unwrap_or(0);
    let per = max.div_ceil(2);
    let all = comm.all_gather(Buffer::F16(words(s.as_bytes(), max)), label)?.into_f16()?;
    Ok(all.chunks(per.max(1)).zip(&lens).map(|(w, &l)| text(bytes(w, l))).collect())
}

/// `root`'s `s` on every rank.
fn broadcast_text(comm: &dyn Communicator, s: &str, root: usize, label: &str) -> Result<String> {
    let len = comm.broadcast(Buffer::F32(vec![s.len() as f32]), root, label)?.into_f32()?;
    let len = len.first().map_or(0, |&l| l as usize);
    let got = comm.broadcast(Buffer::F16(words(s.as_bytes(), len)), root, label)?.into_f16()?;
    Ok(text(bytes(&got, len)))
}

/// Fails on every rank, naming the first rank whose fingerprint differs from
/// rank 0's and the keys that differ, when the ranks' configs disagree.
pub fn check_same_config(comm: &dyn Communicator, opts: &RendezvousOpts) -> Result<()> {
    let label = "config fingerprint";
    let fps = all_gather_text(comm, &opts.fingerprint, label)?;
    let Some(j) = (1..fps.len()).find(|&j| fps[j] != fps[0]) else { return Ok(()) };
    let mut mine = opts.config_text();
    if mine.len() >= MAX_TEXT {
        mine.clear();
    }
    let rank = comm.rank();
    let ours = broadcast_text(comm, &mine, 0, label)?;
    let theirs = broadcast_text(comm, &mine, j, label)?;
    let ours = if rank == 0 {
        opts.config.clone()
    } else {
        serde_json::from_str(&ours).unwrap_or(serde_json::Value::Null)
    };
    let msg = format!(
        "config differs: rank 0 has fingerprint {}, rank {j} has {}; {}",
        fps[0],
        fps[j],
        describe_config_differences(&ours, &theirs, j)
    );
    Err(Error::config("the rendezvous", "config fingerprint", msg))
}
