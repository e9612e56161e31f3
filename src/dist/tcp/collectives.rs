//! The collective algorithms over the mesh, one operation at a time.
//!
//! Bitwise agreement: every reduced element is computed once, by one rank (the
//! ring's chunk owner) or by every rank in the same rank order from the same
//! inputs (the small-buffer exchange), so all ranks end with the same bits.
//!
//! f16 sums round like NCCL's: each hop adds its f16 input to the f16 partial
//! sum in f32 and rounds the result to f16, so partial sums travel as f16 (half
//! the bytes) and an f16 sum can overflow to inf on the way, which is what
//! `gradient_predivide_factor` guards against.

use super::{Fail, OpKind};
use crate::dist::{Buffer, DType, ReduceOp};
use half::f16;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const KIND_DATA: u8 = 1;
const KIND_ABORT: u8 = 2;
const HEADER: usize = 24;
pub(super) const MAX_ABORT_MSG: usize = 4096;

fn op_code(k: OpKind) -> u8 {
    match k {
        OpKind::AllReduce(_) => 1,
        OpKind::Broadcast(_) => 2,
        OpKind::AllGather => 3,
        OpKind::Barrier => 4,
    }
}

fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F32 => 1,
        DType::F16 => 2,
    }
}

pub(super) fn abort_frame(msg: &str) -> Vec<u8> {
    let mut cut = msg.len().min(MAX_ABORT_MSG);
    while !msg.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut f = vec![0u8; HEADER];
    f[0] = KIND_ABORT;
    f[20..24].copy_from_slice(&(cut as u32).to_be_bytes());
    f.extend_from_slice(&msg.as_bytes()[..cut]);
    f
}

/// One operation's view of the mesh.
pub(super) struct Ctx<'a> {
    pub rank: usize,
    pub world: usize,
    pub peers: &'a [Option<TcpStream>],
    pub seq: u64,
    pub kind: OpKind,
    pub desc: &'a str,
    pub timeout: Duration,
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f16_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}
fn bytes_f32(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}
fn bytes_f16(b: &[u8]) -> impl Iterator<Item = f16> + '_ {
    b.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
}
fn buf_bytes(b: &Buffer) -> Vec<u8> {
    match b {
        Buffer::F32(v) => f32_bytes(v),
        Buffer::F16(v) => f16_bytes(v),
    }
}
fn bytes_buf(d: DType, b: &[u8]) -> Buffer {
    match d {
        DType::F32 => Buffer::F32(bytes_f32(b).collect()),
        DType::F16 => Buffer::F16(bytes_f16(b).collect()),
    }
}

impl Ctx<'_> {
    fn stream(&self, p: usize) -> &TcpStream {
        // The mesh has a stream for every rank but this one; callers never pass self.
        self.peers[p].as_ref().unwrap_or_else(|| unreachable!("no stream to rank {p} on rank {}", self.rank))
    }

    fn lost(&self, p: usize, e: io::Error) -> Fail {
        let detail = match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                "connection closed (the process exited or was killed)".to_string()
            }
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!("no progress for {}s (parallel.timeout_s)", self.timeout.as_secs_f64())
            }
            _ => e.to_string(),
        };
        Fail { context: format!("rank {p} lost during {}", self.desc), kind: e.kind(), detail }
    }

    /// A data frame: header for `n` elements of `total` in `dtype`, then the bytes.
    fn frame(&self, dtype: DType, total: usize, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::with_capacity(HEADER + payload.len());
        f.extend_from_slice(&[KIND_DATA, op_code(self.kind), dtype_code(dtype), 0]);
        f.extend_from_slice(&self.seq.to_be_bytes());
        f.extend_from_slice(&(total as u64).to_be_bytes());
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn send(&self, p: usize, frame: &[u8]) -> Result<(), Fail> {
        self.stream(p).write_all(frame).map_err(|e| self.lost(p, e))
    }

    /// Receives the frame rank `p` must send now: `total` elements in the
    /// operation, `len` payload bytes in `dtype`. Anything else is an error.
    fn recv(&self, p: usize, dtype: DType, total: usize, len: usize) -> Result<Vec<u8>, Fail> {
        let mut s = self.stream(p);
        let mut h = [0u8; HEADER];
        s.read_exact(&mut h).map_err(|e| self.lost(p, e))?;
        let d = wire_dec(&h);
        let claimed = d.3 as usize;
        if d.0[0] == KIND_ABORT {
            let n = claimed.min(MAX_ABORT_MSG);
            let mut msg = vec![0u8; n];
            s.read_exact(&mut msg).map_err(|e| self.lost(p, e))?;
            return Err(Fail {
                context: format!("rank {p} aborted {}", self.desc),
                kind: io::ErrorKind::ConnectionAborted,
                detail: String::from_utf8_lossy(&msg).into_owned(),
            });
        }
        let ok = d.0 == [KIND_DATA, op_code(self.kind), dtype_code(dtype), 0]
            && d.1 == self.seq
            && d.2 == total as u64
            && claimed == len;
        if !ok {
            let op = match d.0[1] {
                1 => "all_reduce",
                2 => "broadcast",
                3 => "all_gather",
                4 => "barrier",
                _ => "an unknown operation",
            };
            let dt = match d.0[2] {
                1 => "f32",
                2 => "f16",
                _ => "?",
            };
            return Err(Fail {
                context: format!("rank {p} is out of step with rank {} in {}", self.rank, self.desc),
                kind: io::ErrorKind::InvalidData,
                detail: format!(
                    "it sent {op} #{} over {} {dt} elements ({claimed} bytes), this rank expected {} #{} over {total} {} elements ({len} bytes): \
                     every rank must issue the same collectives on buffers of the same size",
                    d.1,
                    d.2,
                    self.kind.name(),
                    self.seq,
                    dtype.name()
                ),
            });
        }
        let mut buf = vec![0u8; len];
        s.read_exact(&mut buf).map_err(|e| self.lost(p, e))?;
        Ok(buf)
    }

    /// Sends `frame` to `to` on a helper thread while receiving from `from`, so
    /// that a ring of ranks all sending at once cannot deadlock on full buffers.
    fn sendrecv(
        &self,
        to: usize,
        frame: &[u8],
        from: usize,
        dtype: DType,
        total: usize,
        len: usize,
    ) -> Result<Vec<u8>, Fail> {
        std::thread::scope(|sc| {
            let h = sc.spawn(|| self.send(to, frame));
            let got = self.recv(from, dtype, total, len);
            let sent =
                h.join().unwrap_or_else(|_| Err(self.lost(to, io::Error::other("sender thread panicked"))));
            let got = got?;
            sent?;
            Ok(got)
        })
    }

    /// Every rank sends `frame` to every other and receives one frame of `len`
    /// bytes from each; slot `rank` of the result is `None`.
    fn exchange(
        &self,
        frame: &[u8],
        dtype: DType,
        total: usize,
        len: usize,
    ) -> Result<Vec<Option<Vec<u8>>>, Fail> {
        std::thread::scope(|sc| {
            let senders: Vec<_> = (0..self.world)
                .filter(|&p| p != self.rank)
                .map(|p| sc.spawn(move || self.send(p, frame)))
                .collect();
            let mut out = Vec::with_capacity(self.world);
            let mut first_err = None;
            for p in 0..self.world {
                if p == self.rank {
                    out.push(None);
                } else if first_err.is_none() {
                    match self.recv(p, dtype, total, len) {
                        Ok(b) => out.push(Some(b)),
                        Err(f) => first_err = Some(f),
                    }
                }
            }
            for h in senders {
                let r = h.join().unwrap_or_else(|_| {
                    Err(self.lost(self.rank, io::Error::other("sender thread panicked")))
                });
                if let (Err(f), None) = (r, &first_err) {
                    first_err = Some(f);
                }
            }
            match first_err {
                Some(f) => Err(f),
                None => Ok(out),
            }
        })
    }

    pub(super) fn run(&self, buf: Buffer) -> Result<Buffer, Fail> {
        if buf.len() * buf.dtype().size() > u32::MAX as usize {
            return Err(Fail {
                context: format!("{} on rank {}", self.desc, self.rank),
                kind: io::ErrorKind::InvalidInput,
                detail: format!(
                    "a buffer of {} elements is too large for one collective; split it",
                    buf.len()
                ),
            });
        }
        match self.kind {
            OpKind::AllReduce(op) => {
                let bytes = buf.len() * buf.dtype().size();
                if buf.len() >= self.world && bytes > super::RING_MIN_BYTES {
                    self.ring_all_reduce(buf, op)
                } else {
                    self.exchange_all_reduce(buf, op)
                }
            }
            OpKind::Broadcast(root) => self.broadcast(buf, root),
            OpKind::AllGather => {
                let (d, n) = (buf.dtype(), buf.len());
                let mine = buf_bytes(&buf);
                let got = self.exchange(&self.frame(d, n, &mine), d, n, mine.len())?;
                let all: Vec<u8> = got.into_iter().flat_map(|b| b.unwrap_or_else(|| mine.clone())).collect();
                Ok(bytes_buf(d, &all))
            }
            OpKind::Barrier => {
                self.exchange(&self.frame(DType::F32, 0, &[]), DType::F32, 0, 0)?;
                Ok(Buffer::F32(Vec::new()))
            }
        }
    }

    fn finish(&self, mut acc: Vec<f32>, op: ReduceOp, dtype: DType) -> Buffer {
        if op == ReduceOp::Avg {
            let w = self.world as f32;
            acc.iter_mut().for_each(|x| *x /= w);
        }
        match dtype {
            DType::F32 => Buffer::F32(acc),
            DType::F16 => Buffer::F16(acc.into_iter().map(f16::from_f32).collect()),
        }
    }

    /// Small buffers: everyone gets everyone's buffer and sums in rank order
    /// (f16: rounded after each addition, as a chain of hops from rank 0 would).
    fn exchange_all_reduce(&self, buf: Buffer, op: ReduceOp) -> Result<Buffer, Fail> {
        let (d, n) = (buf.dtype(), buf.len());
        let mine = buf_bytes(&buf);
        let got = self.exchange(&self.frame(d, n, &mine), d, n, mine.len())?;
        let mut acc: Option<Vec<f32>> = None;
        for b in &got {
            let vals: Vec<f32> = match b {
                Some(b) => bytes_buf(d, b).to_f32(),
                None => buf.to_f32(),
            };
            match acc.as_mut() {
                None => acc = Some(vals),
                Some(a) => accumulate(a, vals, d),
            }
        }
        Ok(self.finish(acc.unwrap_or_default(), op, d))
    }

    /// Ring reduce-scatter then ring all-gather, both in the buffer's dtype.
    /// Chunk `c` is summed starting at rank `c` and finished by its owner,
    /// rank `c - 1`, whose result every rank copies.
    fn ring_all_reduce(&self, buf: Buffer, op: ReduceOp) -> Result<Buffer, Fail> {
        let (w, r, dtype, n) = (self.world, self.rank, buf.dtype(), buf.len());
        let bounds = |c: usize| (c * n / w, (c + 1) * n / w);
        let (next, prev) = ((r + 1) % w, (r + w - 1) % w);
        // f32 holding values exactly representable in `dtype` (f16 partial sums
        // are rounded at every hop), so the wire carries `dtype` losslessly.
        let mut acc = buf.to_f32();
        drop(buf);
        let wire = |v: &[f32]| match dtype {
            DType::F32 => f32_bytes(v),
            DType::F16 => v.iter().flat_map(|&x| f16::from_f32(x).to_bits().to_le_bytes()).collect(),
        };
        for s in 0..w - 1 {
            let (sc, rc) = ((r + w - s) % w, (r + 2 * w - s - 1) % w);
            let (a, b) = bounds(sc);
            let frame = self.frame(dtype, n, &wire(&acc[a..b]));
            let (a, b) = bounds(rc);
            let got = self.sendrecv(next, &frame, prev, dtype, n, (b - a) * dtype.size())?;
            // IEEE addition commutes: received + own has the same bits either way.
            accumulate(&mut acc[a..b], bytes_buf(dtype, &got).to_f32(), dtype);
        }
        let own = (r + 1) % w;
        let (a, b) = bounds(own);
        if op == ReduceOp::Avg {
            let wf = w as f32;
            acc[a..b].iter_mut().for_each(|x| *x /= wf);
        }
        let chunk_bytes = |v: &Buffer, c: usize| {
            let (a, b) = bounds(c);
            match v {
                Buffer::F32(v) => f32_bytes(&v[a..b]),
                Buffer::F16(v) => f16_bytes(&v[a..b]),
            }
        };
        let mut out = match dtype {
            DType::F32 => Buffer::F32(acc),
            DType::F16 => Buffer::F16(acc.into_iter().map(f16::from_f32).collect()),
        };
        for s in 0..w - 1 {
            let (sc, rc) = ((r + 1 + w - s) % w, (r + w - s) % w);
            let frame = self.frame(dtype, n, &chunk_bytes(&out, sc));
            let (a, b) = bounds(rc);
            let got = self.sendrecv(next, &frame, prev, dtype, n, (b - a) * dtype.size())?;
            match &mut out {
                Buffer::F32(v) => v[a..b].iter_mut().zip(bytes_f32(&got)).for_each(|(x, g)| *x = g),
                Buffer::F16(v) => v[a..b].iter_mut().zip(bytes_f16(&got)).for_each(|(x, g)| *x = g),
            }
        }
        Ok(out)
    }

    fn broadcast(&self, buf: Buffer, root: usize) -> Result<Buffer, Fail> {
        let (d, n) = (buf.dtype(), buf.len());
        if self.rank == root {
            let frame = self.frame(d, n, &buf_bytes(&buf));
            std::thread::scope(|sc| {
                let hs: Vec<_> = (0..self.world)
                    .filter(|&p| p != root)
                    .map(|p| {
                        let frame = &frame;
                        sc.spawn(move || self.send(p, frame))
                    })
                    .collect();
                let mut res = Ok(());
                for h in hs {
                    let r = h
                        .join()
                        .unwrap_or_else(|_| Err(self.lost(root, io::Error::other("sender thread panicked"))));
                    if res.is_ok() {
                        res = r;
                    }
                }
                res
            })?;
            Ok(buf)
        } else {
            let got = self.recv(root, d, n, n * d.size())?;
            Ok(bytes_buf(d, &got))
        }
    }
}

/// One hop of a sum: `acc += vals`, rounded to f16 after each addition for
/// f16 buffers (NCCL's per-hop rounding).
fn accumulate(acc: &mut [f32], vals: Vec<f32>, dtype: DType) {
    match dtype {
        DType::F32 => acc.iter_mut().zip(vals).for_each(|(a, v)| *a += v),
        DType::F16 => acc.iter_mut().zip(vals).for_each(|(a, v)| *a = f16::from_f32(*a + v).to_f32()),
    }
}

/// Splits a header into (kind/op/dtype/reserved, seq, total, payload length).
fn wire_dec(h: &[u8; HEADER]) -> ([u8; 4], u64, u64, u32) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&h[4..12]);
    let seq = u64::from_be_bytes(a);
    a.copy_from_slice(&h[12..20]);
    let total = u64::from_be_bytes(a);
    let len = u32::from_be_bytes([h[20], h[21], h[22], h[23]]);
    ([h[0], h[1], h[2], h[3]], seq, total, len)
}
