//! Distributed resume: rank 0 alone reads the checkpoint (no shared file system
//! is assumed) and broadcasts its files' bytes; every other rank verifies them
//! (sizes and SHA-256, as rank 0 did) and restores from them, so all ranks
//! continue from the same model, optimizer, master weights, loss scaler and
//! position. When rank 0 cannot resume, its reason goes to every rank and all
//! of them fail with it; a rank that cannot apply rank 0's checkpoint makes
//! every rank fail too (an all-gather of one flag per rank), so none trains on alone.
//!
//! On the wire the message is bytes packed four to an f32 (their bits, never
//! their values): a broadcast moves bytes, so the bits arrive intact.

use super::load::{parse_checkpoint, RawCheckpoint};
use super::state::TrainProgress;
use super::Checkpointer;
use crate::amp::Amp;
use crate::dist::{Buffer, Communicator};
use crate::error::{Error, Result};
use crate::nn::Model;
use crate::optim::Optimizer;
use std::path::PathBuf;

/// What rank 0 tells the other ranks about the resume.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumeMessage {
    /// No checkpoint to resume from: start over.
    Fresh,
    /// Resume from this checkpoint.
    Resume(RawCheckpoint),
    /// Rank 0 could not resume; the reason.
    Failed(String),
    /// Rank 0 refused the run for what its out_dir is or holds
    /// ([`Error::OutDir`]): every rank fails with the same error.
    Refused { dir: PathBuf, msg: String },
}

const FRESH: u8 = 0;
const RESUME: u8 = 1;
const FAILED: u8 = 2;
const REFUSED: u8 = 3;

fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The message as bytes: a tag, then length-prefixed fields.
pub fn encode_message(m: &ResumeMessage) -> Vec<u8> {
    let mut out = Vec::new();
    match m {
        ResumeMessage::Fresh => out.push(FRESH),
        ResumeMessage::Resume(raw) => {
            out.push(RESUME);
            field(&mut out, raw.dir.to_string_lossy().as_bytes());
            field(&mut out, &raw.state_json);
            field(&mut out, &raw.model);
            field(&mut out, &raw.optim);
        }
        ResumeMessage::Failed(msg) => {
            out.push(FAILED);
            field(&mut out, msg.as_bytes());
        }
        ResumeMessage::Refused { dir, msg } => {
            out.push(REFUSED);
            field(&mut out, dir.to_string_lossy().as_bytes());
            field(&mut out, msg.as_bytes());
        }
    }
    out
}

/// Inverse of [`encode_message`]; a malformed message is an error saying where.
pub fn decode_message(bytes: &[u8]) -> std::result::Result<ResumeMessage, String> {
    let (&tag, mut rest) = bytes.split_first().ok_or("the resume message from rank 0 is empty")?;
    let mut take = |what: &str| -> std::result::Result<Vec<u8>, String> {
        let short = || format!("the resume message from rank 0 is truncated in its {what}");
        let (len, tail) = rest.split_first_chunk::<8>().ok_or_else(short)?;
        let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| short())?;
        if tail.len() < len {
            return Err(short());
        }
        let (value, tail) = tail.split_at(len);
        rest = tail;
        Ok(value.to_vec())
    };
    let text = |b: Vec<u8>, what: &str| String::from_utf8(b).map_err(|_| format!("{what} is not UTF-8"));
    let m = match tag {
        FRESH => ResumeMessage::Fresh,
        RESUME => {
            let dir = text(take("directory")?, "the checkpoint directory")?;
            let state_json = take("state.json")?;
            let model = take("model.safetensors")?;
            let optim = take("optim.safetensors")?;
            ResumeMessage::Resume(RawCheckpoint { dir: PathBuf::from(dir), state_json, model, optim })
        }
        FAILED => ResumeMessage::Failed(text(take("reason")?, "rank 0's reason")?),
        REFUSED => {
            let dir = PathBuf::from(text(take("directory")?, "the out_dir")?);
            ResumeMessage::Refused { dir, msg: text(take("reason")?, "rank 0's reason")? }
        }
        t => return Err(format!("the resume message from rank 0 has an unknown tag {t}")),
    };
    if !rest.is_empty() {
        return Err(format!("the resume message from rank 0 has {} trailing bytes", rest.len()));
    }
    Ok(m)
}

fn to_words(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(w))
        })
        .collect()
}

fn from_words(words: &[f32], len: usize) -> Vec<u8> {
    let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_bits().to_le_bytes()).collect();
    out.truncate(len);
    out
}

/// Rank 0's `message` to every rank (the others pass `None`): its length
/// first, so the others can size their buffers, then the bytes.
fn broadcast_message(comm: &dyn Communicator, message: Option<&ResumeMessage>) -> Result<ResumeMessage> {
    let bytes = message.map(encode_message).unwrap_or_default();
    let len = bytes.len() as u64;
    let header = [f32::from_bits(len as u32), f32::from_bits((len >> 32) as u32)];
    let header = comm.broadcast(Buffer::F32(header.to_vec()), 0, "resume: checkpoint size")?.into_f32()?;
    let [lo, hi] = header[..] else {
        return Err(Error::Training(format!("resume: rank 0 sent a {}-word header", header.len())));
    };
    let len = u64::from(lo.to_bits()) | (u64::from(hi.to_bits()) << 32);
    let len = usize::try_from(len).map_err(|_| {
        Error::Training(format!("resume: rank 0's checkpoint of {len} bytes does not fit here"))
    })?;
    let words = if message.is_some() { to_words(&bytes) } else { vec![0.0; len.div_ceil(4)] };
    drop(bytes);
    let words = comm.broadcast(Buffer::F32(words), 0, "resume: checkpoint")?.into_f32()?;
    decode_message(&from_words(&words, len)).map_err(Error::Training)
}

/// Every rank says whether it restored rank 0's checkpoint; any failure fails all.
fn agree(comm: &dyn Communicator, ok: bool) -> Result<()> {
    let flags = comm.all_gather(Buffer::F32(vec![if ok { 0.0 } else { 1.0 }]), "resume: agreement")?;
    let failed: Vec<String> =
        flags.into_f32()?.iter().enumerate().filter(|(_, &f)| f != 0.0).map(|(r, _)| r.to_string()).collect();
    if failed.is_empty() || !ok {
        return Ok(());
    }
    Err(Error::Training(format!(
        "rank(s) {} could not restore rank 0's checkpoint (see their messages); no rank resumes",
        failed.join(", ")
    )))
}

/// What rank 0 tells the others when it cannot go on with `e`.
fn failure(e: &Error) -> ResumeMessage {
    match e {
        Error::OutDir { dir, msg } => ResumeMessage::Refused { dir: dir.clone(), msg: msg.clone() },
        other => ResumeMessage::Failed(other.to_string()),
    }
}

/// A rank's own error for rank 0's failure `m` at `what` (a refusal is rank
/// 0's own error, so every rank exits with the same code).
fn failed_too(ckpt: &Checkpointer, rank: usize, what: &str, m: ResumeMessage) -> Error {
    match m {
        ResumeMessage::Refused { dir, msg } => Error::OutDir { dir, msg },
        ResumeMessage::Failed(why) => Error::Checkpoint {
            path: ckpt.root.clone(),
            msg: format!("rank 0 cannot {what}, so rank {rank} cannot either: {why}"),
        },
        other => Error::internal(format!("rank {rank} got {other:?} from rank 0 where it {what}s")),
    }
}

/// [`Checkpointer::claim`] with several ranks: rank 0 claims the out_dir
/// (only it writes there) and sends its verdict, so no rank trains on alone
/// and none waits for a rank 0 that has left.
pub(super) fn claim_distributed(ckpt: &mut Checkpointer, comm: &dyn Communicator) -> Result<()> {
    let rank = comm.rank();
    if rank == 0 {
        let claimed = ckpt.claim_local();
        let message = claimed.as_ref().map_or_else(failure, |()| ResumeMessage::Fresh);
        broadcast_message(comm, Some(&message))?;
        return claimed;
    }
    match broadcast_message(comm, None)? {
        ResumeMessage::Fresh => Ok(()),
        m => Err(failed_too(ckpt, rank, "claim run.out_dir", m)),
    }
}

/// [`Checkpointer::resume`] with several ranks.
pub(super) fn resume_distributed(
    ckpt: &mut Checkpointer,
    model: &mut Model,
    opt: &mut Optimizer,
    amp: &mut Amp,
    comm: &dyn Communicator,
) -> Result<Option<TrainProgress>> {
    let rank = comm.rank();
    if rank == 0 {
        let (progress, message) = match ckpt.resume_local(model, opt, amp) {
            Ok(None) => (Ok(None), ResumeMessage::Fresh),
            Ok(Some((p, raw))) => (Ok(Some(p)), ResumeMessage::Resume(raw)),
            Err(e) => {
                let message = failure(&e);
                (Err(e), message)
            }
        };
        broadcast_message(comm, Some(&message))?;
        if matches!(message, ResumeMessage::Resume(_)) {
            agree(comm, true)?;
        }
        return progress;
    }
    match broadcast_message(comm, None)? {
        ResumeMessage::Fresh => Ok(None),
        m @ (ResumeMessage::Failed(_) | ResumeMessage::Refused { .. }) => {
            Err(failed_too(ckpt, rank, "resume", m))
        }
        ResumeMessage::Resume(raw) => {
            let restored = parse_checkpoint(&raw).and_then(|c| ckpt.apply(c, model, opt, amp));
            agree(comm, restored.is_ok())?;
            restored.map(Some)
        }
    }
}
