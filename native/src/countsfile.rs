//! The `.counts` file format (docs/DESIGN.md), byte-identical to `PieceCounts.save`:
//! magic `SBPC\x01\n`, u32-LE meta length + JSON meta, u64-LE entry count, then entries
//! `u32-LE len, bytes, u64-LE count` sorted by bytes.

use crate::tables::Counts;

pub const MAGIC: &[u8] = b"SBPC\x01\n";

/// File bytes for `counts` with the given (already serialized) JSON meta.
pub fn serialize(counts: &Counts, meta: &[u8]) -> Vec<u8> {
    let entries = counts.sorted();
    let size = MAGIC.len() + 4 + meta.len() + 8 + entries.iter().map(|(k, _)| 12 + k.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(meta);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (k, c) in entries {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&c.to_le_bytes());
    }
    out
}

fn take<'a>(data: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = pos.checked_add(n).filter(|&e| e <= data.len()).ok_or("truncated")?;
    let s = &data[*pos..end];
    *pos = end;
    Ok(s)
}

/// Parse file bytes into (meta JSON bytes, counts).
pub fn parse(data: &[u8]) -> Result<(Vec<u8>, Counts), String> {
    if !data.starts_with(MAGIC) {
        return Err("bad magic".into());
    }
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
        let (meta, back) = parse(&data).unwrap();
        assert_eq!(meta, b"{}");
        assert_eq!(back.sorted(), vec![(&b"a"[..], 1), (&b"b"[..], 2)]);
        assert!(parse(&data[..data.len() - 1]).is_err());
    }
}
