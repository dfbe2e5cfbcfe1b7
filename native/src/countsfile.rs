//! The `.counts` file format (docs/DESIGN.md), byte-identical to `PieceCounts.save`:
//! magic `SBPC\x02\n`, u32-LE meta length + JSON meta, u64-LE entry count, entries
//! `u32-LE len, bytes, u64-LE count` sorted by bytes, then the u32-LE CRC-32 (zlib's) of every byte
//! before it. Format 1 (magic `SBPC\x01\n`) is the same without the checksum; it is read only when
//! the caller accepts counts that cannot be checked.

use crate::tables::Counts;

pub const MAGIC: &[u8] = b"SBPC\x02\n";
/// The magic of format 1, which has no checksum.
pub const MAGIC_UNCHECKED: &[u8] = b"SBPC\x01\n";
/// The bytes of the checksum that ends a file.
const CHECKSUM_BYTES: usize = 4;

/// The checksum a file ends with: CRC-32 as zlib computes it (`zlib.crc32` on the Python side).
/// It catches any change of up to 32 bits in a row, so every flipped byte, at a few percent of the
/// time a parse takes.
pub fn checksum(data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(data);
    hasher.finalize()
}

/// File bytes for `counts` with the given (already serialized) JSON meta.
pub fn serialize(counts: &Counts, meta: &[u8]) -> Vec<u8> {
    let chunks = Chunks::new(counts, meta);
    let mut out = vec![0; chunks.size()];
    chunks.fill(&mut out);
    out
}

/// The file bytes of some counts a chunk at a time, for a writer that should not hold them whole:
/// a stage 2's counts of gigabytes of text make a file of gigabytes.
pub struct Chunks<'a> {
    header: Vec<u8>,
    entries: Vec<([u64; 2], &'a [u8], u64)>,
    next: usize,
    /// The checksum of the bytes handed out so far.
    hasher: crc32fast::Hasher,
    /// Whether the checksum has been handed out (the file is complete).
    ended: bool,
}

impl<'a> Chunks<'a> {
    /// The entries of `counts` sorted, behind the header with `meta`.
    pub fn new(counts: &'a Counts, meta: &[u8]) -> Chunks<'a> {
        let entries = counts.sorted_with_prefixes();
        let mut header = Vec::with_capacity(MAGIC.len() + 4 + meta.len() + 8);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        header.extend_from_slice(meta);
        header.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        Chunks { header, entries, next: 0, hasher: crc32fast::Hasher::new(), ended: false }
    }

    /// Bytes of the whole file.
    pub fn size(&self) -> usize {
        self.header.len() + self.entries.iter().map(|(_, k, _)| 12 + k.len()).sum::<usize>() + CHECKSUM_BYTES
    }

    /// The next bytes of the file: the header, then whole entries up to about `max` bytes (at least
    /// one), the checksum with the last of them; None at the end.
    pub fn next_chunk(&mut self, max: usize) -> Option<Vec<u8>> {
        if self.ended {
            return None;
        }
        let mut out = std::mem::take(&mut self.header);
        for &(_, k, c) in &self.entries[self.next..] {
            if out.len() >= max {
                break;
            }
            entry(k, c, |bytes| out.extend_from_slice(bytes));
            self.next += 1;
        }
        self.hasher.update(&out);
        if self.next == self.entries.len() {
            out.extend_from_slice(&self.hasher.clone().finalize().to_le_bytes());
            self.ended = true;
        }
        Some(out)
    }

    /// Write the rest of the file into `out`, which is exactly that long (a buffer made for it,
    /// so that the bytes are not made once more and copied).
    pub fn fill(mut self, out: &mut [u8]) {
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(&std::mem::take(&mut self.header));
        for &(_, k, c) in &self.entries[self.next..] {
            entry(k, c, &mut put);
        }
        assert_eq!(at + CHECKSUM_BYTES, out.len(), "the buffer is the rest of the file");
        self.hasher.update(&out[..at]);
        out[at..].copy_from_slice(&self.hasher.finalize().to_le_bytes());
    }
}

/// An entry's bytes (length, key, count), handed to `put` in order.
#[inline]
fn entry(key: &[u8], count: u64, mut put: impl FnMut(&[u8])) {
    put(&(key.len() as u32).to_le_bytes());
    put(key);
    put(&count.to_le_bytes());
}

fn take<'a>(data: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = pos.checked_add(n).filter(|&e| e <= data.len()).ok_or("truncated")?;
    let s = &data[*pos..end];
    *pos = end;
    Ok(s)
}

/// Parse file bytes into (meta JSON bytes, counts). The checksum is checked before any entry is
/// read, so damaged bytes are never taken for counts; a file of format 1 (no checksum) is read
/// only with `unchecked`.
pub fn parse(data: &[u8], unchecked: bool) -> Result<(Vec<u8>, Counts), String> {
    let body = if data.starts_with(MAGIC) {
        let (body, sum) = data.split_at(data.len().saturating_sub(CHECKSUM_BYTES).max(MAGIC.len()));
        if sum.len() != CHECKSUM_BYTES || checksum(body).to_le_bytes() != sum {
            return Err("its checksum does not match: damaged or cut short since it was written".into());
        }
        body
    } else if data.starts_with(MAGIC_UNCHECKED) {
        if !unchecked {
            return Err("format 1, which has no checksum to check it by".into());
        }
        data
    } else if data.starts_with(b"SBPC") && data.len() > 5 && data[4] > MAGIC[4] && data[5] == b'\n' {
        return Err(format!("format {} of a later superbpe, not read by this one", data[4]));
    } else {
        return Err("bad magic".into());
    };
    parse_body(body)
}

/// The header and entries behind either format's magic, with nothing after them.
fn parse_body(data: &[u8]) -> Result<(Vec<u8>, Counts), String> {
    let mut pos = MAGIC.len();
    let meta_len = u32::from_le_bytes(take(data, &mut pos, 4)?.try_into().unwrap()) as usize;
    let meta = take(data, &mut pos, meta_len)?.to_vec();
    let n = u64::from_le_bytes(take(data, &mut pos, 8)?.try_into().unwrap());
    let mut counts = Counts::default();
    for _ in 0..n {
        let len = u32::from_le_bytes(take(data, &mut pos, 4)?.try_into().unwrap()) as usize;
        let key = take(data, &mut pos, len)?;
        let c = u64::from_le_bytes(take(data, &mut pos, 8)?.try_into().unwrap());
        counts.add(key, c)?;
    }
    if pos != data.len() {
        return Err("trailing bytes".into());
    }
    Ok((meta, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_sorted() {
        let mut c = Counts::default();
        c.add(b"b", 2).unwrap();
        c.add(b"a", 1).unwrap();
        let data = serialize(&c, b"{}");
        assert_eq!(&data[..6], MAGIC);
        let (meta, back) = parse(&data, false).unwrap();
        assert_eq!(meta, b"{}");
        assert_eq!(back.sorted(), vec![(&b"a"[..], 1), (&b"b"[..], 2)]);
        assert!(parse(&data[..data.len() - 1], false).is_err());
    }

    /// Any byte changed, anywhere, and any cut is refused by the checksum, never read as counts.
    #[test]
    fn damage_is_refused() {
        let mut c = Counts::default();
        for i in 0..50u32 {
            c.add(format!("piece {i}").as_bytes(), i as u64 + 1).unwrap();
        }
        let data = serialize(&c, b"{}");
        for at in 0..data.len() {
            let mut bad = data.clone();
            bad[at] ^= 0x10;
            assert!(parse(&bad, true).is_err(), "byte {at} changed");
        }
        for len in 0..data.len() {
            assert!(parse(&data[..len], true).is_err(), "cut at {len}");
        }
        let err = parse(&data[..data.len() - 3], true).err().unwrap();
        assert!(err.contains("checksum does not match"), "{err}");
    }

    /// Format 1 is the same bytes without the checksum: read only when asked to, never misread.
    #[test]
    fn format_one_is_read_only_unchecked() {
        let mut c = Counts::default();
        c.add(b"a", 1).unwrap();
        let data = serialize(&c, b"{}");
        let mut old = data[..data.len() - CHECKSUM_BYTES].to_vec();
        old[..MAGIC.len()].copy_from_slice(MAGIC_UNCHECKED);
        assert!(parse(&old, false).err().unwrap().contains("no checksum"));
        assert_eq!(parse(&old, true).unwrap().1.sorted(), vec![(&b"a"[..], 1)]);
        let mut later = data.clone();
        later[4] = 9;
        assert!(parse(&later, true).err().unwrap().contains("format 9"));
    }

    /// Chunk by chunk, of any size, the file is the same bytes.
    #[test]
    fn chunks_make_the_same_file() {
        let mut c = Counts::default();
        for i in 0..500u32 {
            c.add(format!("piece {i} {}", "x".repeat(i as usize % 40)).as_bytes(), i as u64 + 1).unwrap();
        }
        let whole = serialize(&c, b"{\"a\": 1}");
        for max in [1, 7, 100, 4096, usize::MAX] {
            let mut chunks = Chunks::new(&c, b"{\"a\": 1}");
            assert_eq!(chunks.size(), whole.len());
            let mut joined = Vec::new();
            while let Some(chunk) = chunks.next_chunk(max) {
                joined.extend_from_slice(&chunk);
            }
            assert_eq!(joined, whole, "chunks of {max} bytes");
        }
        assert_eq!(parse(&whole, false).unwrap().1.len(), 500);
    }
}
