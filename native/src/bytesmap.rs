//! A map from short byte strings to values, tuned for tokens and pieces.
//!
//! Most tokens and pieces of natural text are at most 7 bytes. Those are packed, with their
//! length, into one u64 that is its own key: a lookup is one multiply-hash and one word compare,
//! with no pointer chase and no `memcmp` call (which dominated profiles with `HashMap<Box<[u8]>>`).
//! Longer keys are stored boxed with their full hash, compared word by word.

use hashbrown::HashTable;

/// Longest key stored packed (7 data bytes + 1 length byte in a u64).
pub const SHORT_MAX: usize = 7;

/// `piece` (at most [`SHORT_MAX`] bytes) as one word: bytes little-endian, length in the top byte.
#[inline(always)]
pub fn pack_short(piece: &[u8]) -> u64 {
    debug_assert!(piece.len() <= SHORT_MAX);
    let n = piece.len();
    // Two overlapping loads cover the piece (the overlap holds the same bytes, so OR is exact).
    let data = if n >= 4 {
        let lo = u32::from_le_bytes(piece[..4].try_into().unwrap()) as u64;
        let hi = u32::from_le_bytes(piece[n - 4..].try_into().unwrap()) as u64;
        lo | hi << (8 * (n - 4))
    } else if n >= 2 {
        let lo = u16::from_le_bytes(piece[..2].try_into().unwrap()) as u64;
        let hi = u16::from_le_bytes(piece[n - 2..].try_into().unwrap()) as u64;
        lo | hi << (8 * (n - 2))
    } else if n == 1 {
        piece[0] as u64
    } else {
        0
    };
    (n as u64) << 56 | data
}

/// The bytes of a packed key (first `.1` bytes of `.0`).
#[inline(always)]
pub fn unpack_short(key: u64) -> ([u8; 8], usize) {
    ((key & 0x00FF_FFFF_FFFF_FFFF).to_le_bytes(), (key >> 56) as usize)
}

/// A cheap, well-mixed hash of a packed key (hashbrown uses both its top and bottom bits).
#[inline(always)]
pub fn hash_short(key: u64) -> u64 {
    let h = (key ^ (key >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

/// Slice equality without a libc `memcmp` call (keys are short; the call overhead dominated).
#[inline(always)]
pub fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let n = a.len();
    if n < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().unwrap());
    let mut i = 0;
    while i + 8 <= n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    i == n || word(a, n - 8) == word(b, n - 8)
}

/// Owned byte-string keys to values.
pub struct BytesMap<V> {
    state: ahash::RandomState,
    short: HashTable<(u64, V)>,
    long: HashTable<(u64, Box<[u8]>, V)>,
}

impl<V> Default for BytesMap<V> {
    fn default() -> Self {
        BytesMap {
            state: ahash::RandomState::with_seeds(7, 11, 13, 17),
            short: HashTable::new(),
            long: HashTable::new(),
        }
    }
}

impl<V> BytesMap<V> {
    pub fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline(always)]
    pub fn get(&self, key: &[u8]) -> Option<&V> {
        if key.len() <= SHORT_MAX {
            let k = pack_short(key);
            self.short.find(hash_short(k), |e| e.0 == k).map(|e| &e.1)
        } else {
            let h = self.state.hash_one(key);
            self.long.find(h, |e| e.0 == h && bytes_eq(&e.1, key)).map(|e| &e.2)
        }
    }

    /// Insert `key` unless present; returns whether it was inserted.
    pub fn insert_new(&mut self, key: &[u8], value: V) -> bool {
        if key.len() <= SHORT_MAX {
            let k = pack_short(key);
            let h = hash_short(k);
            if self.short.find(h, |e| e.0 == k).is_some() {
                return false;
            }
            self.short.insert_unique(h, (k, value), |e| hash_short(e.0));
        } else {
            let h = self.state.hash_one(key);
            if self.long.find(h, |e| e.0 == h && bytes_eq(&e.1, key)).is_some() {
                return false;
            }
            self.long.insert_unique(h, (h, key.into(), value), |e| e.0);
        }
        true
    }

    /// Insert or replace.
    pub fn insert(&mut self, key: &[u8], value: V) {
        if key.len() <= SHORT_MAX {
            let k = pack_short(key);
            let h = hash_short(k);
            match self.short.find_mut(h, |e| e.0 == k) {
                Some(e) => e.1 = value,
                None => {
                    self.short.insert_unique(h, (k, value), |e| hash_short(e.0));
                }
            }
        } else {
            let h = self.state.hash_one(key);
            match self.long.find_mut(h, |e| e.0 == h && bytes_eq(&e.1, key)) {
                Some(e) => e.2 = value,
                None => {
                    self.long.insert_unique(h, (h, key.into(), value), |e| e.0);
                }
            }
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.get(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_keys() {
        let mut m = BytesMap::default();
        for k in [&b""[..], b"\0", b"\0\0", b"abcdefg", b"abcdefgh", b"a longer key with bytes"] {
            assert!(m.insert_new(k, k.len()));
            assert!(!m.insert_new(k, 99));
        }
        assert_eq!(m.get(b"\0\0"), Some(&2));
        assert_eq!(m.get(b"\0\0\0"), None);
        assert_eq!(m.get(b"abcdefgh"), Some(&8));
        m.insert(b"abcdefgh", 1);
        assert_eq!(m.get(b"abcdefgh"), Some(&1));
        assert_eq!(m.len(), 6);
    }

    #[test]
    fn word_equality() {
        assert!(bytes_eq(b"0123456789abc", b"0123456789abc"));
        assert!(!bytes_eq(b"0123456789abc", b"0123456789abd"));
        assert!(!bytes_eq(b"01234567", b"01234568"));
        for n in 0..=SHORT_MAX {
            let piece: Vec<u8> = (0..n as u8).map(|i| 0xA0 + i).collect();
            let (buf, len) = unpack_short(pack_short(&piece));
            assert_eq!(&buf[..len], &piece[..]);
            let slow = piece.iter().enumerate().fold((n as u64) << 56, |k, (i, &b)| k | (b as u64) << (8 * i));
            assert_eq!(pack_short(&piece), slow);
        }
    }
}
