//! Length-prefixed control messages (rendezvous and mesh handshakes): a big-endian
//! u32 length, then the payload. A length over the cap is refused before anything
//! is allocated, so a stranger or garbage on the port costs nothing.

use std::io::{self, Read, Write};

/// Leads every handshake, so a stranger's bytes are recognised at once.
pub const MAGIC: [u8; 4] = *b"DDPT";
/// Bumped whenever any message changes shape.
pub const PROTOCOL_VERSION: u32 = 2;
/// Control messages are small: addresses, fingerprints, tokens.
pub const MAX_CONTROL_FRAME: usize = 1 << 20;

pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| invalid("frame too large to send".into()))?;
    let mut out = Vec::with_capacity(4 + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    w.write_all(&out)?;
    w.flush()
}

pub fn read_frame(r: &mut impl Read, cap: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > cap {
        return Err(invalid(format!(
            "message claims {len} bytes, more than the {cap} allowed (not a ddptrain peer, or a different protocol)"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

pub fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Builds a payload field by field.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn str(self, s: &str) -> Self {
        self.u32(s.len() as u32).bytes(s.as_bytes())
    }
}

/// Reads a payload field by field; every read is bounds-checked.
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Dec { buf, pos: 0 }
    }
    pub fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            invalid(format!(
                "message truncated: wanted {n} more bytes at offset {} of {}",
                self.pos,
                self.buf.len()
            ))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u32(&mut self) -> io::Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> io::Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    pub fn str(&mut self) -> io::Result<String> {
        let n = self.u32()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| invalid("string field is not UTF-8".into()))
    }
    pub fn finish(&self) -> io::Result<()> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(invalid(format!("{} unexpected trailing bytes in message", self.buf.len() - self.pos)))
        }
    }
}
