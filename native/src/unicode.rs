//! Character classes used by the hand-written scanners.
//!
//! The classes come from `unicode_tables.rs`, generated from the Python `regex` module (the
//! reference implementation of the patterns), so `\p{L}`, `\p{N}`, `\p{M}` and `\s` agree with it
//! code point for code point. Every code point is in at most one class.

#[allow(clippy::all)]
mod tables {
    include!("unicode_tables.rs");
}

/// General-category-like class of one code point (values fixed by the table generator).
pub type Class = u8;
pub const OTHER: Class = 0;
pub const LU: Class = 1;
pub const LL: Class = 2;
pub const LT: Class = 3;
pub const LM: Class = 4;
pub const LO: Class = 5;
pub const MARK: Class = 6;
pub const NUM: Class = 7;
pub const WS: Class = 8;

/// Class of every ASCII byte, so the common case needs no table walk.
pub(crate) const ASCII: [Class; 128] = {
    let mut t = [OTHER; 128];
    let mut i = 0;
    while i < 128 {
        let b = i as u8;
        t[i] = if b.is_ascii_uppercase() {
            LU
        } else if b.is_ascii_lowercase() {
            LL
        } else if b.is_ascii_digit() {
            NUM
        } else if b == b' ' || (b >= 0x09 && b <= 0x0d) {
            WS
        } else {
            OTHER
        };
        i += 1;
    }
    t
};

/// Class of a code point.
#[inline(always)]
pub fn class_of(cp: u32) -> Class {
    if cp < 128 {
        return ASCII[cp as usize];
    }
    if cp >= 0x110000 {
        return OTHER;
    }
    let block = tables::BLOCK_INDEX[(cp >> 8) as usize] as usize;
    tables::BLOCKS[block][(cp & 0xff) as usize]
}

/// Decode the UTF-8 character starting at `i` of valid UTF-8 `s`: (code point, byte length).
#[inline(always)]
pub fn decode(s: &[u8], i: usize) -> (u32, usize) {
    let b0 = s[i] as u32;
    if b0 < 0x80 {
        (b0, 1)
    } else if b0 < 0xE0 {
        (((b0 & 0x1F) << 6) | (s[i + 1] as u32 & 0x3F), 2)
    } else if b0 < 0xF0 {
        (((b0 & 0x0F) << 12) | ((s[i + 1] as u32 & 0x3F) << 6) | (s[i + 2] as u32 & 0x3F), 3)
    } else {
        (
            ((b0 & 0x07) << 18)
                | ((s[i + 1] as u32 & 0x3F) << 12)
                | ((s[i + 2] as u32 & 0x3F) << 6)
                | (s[i + 3] as u32 & 0x3F),
            4,
        )
    }
}

/// Class and byte length of the character at `i` (valid UTF-8, `i < s.len()`).
#[inline(always)]
pub fn class_at(s: &[u8], i: usize) -> (Class, usize) {
    let b = s[i];
    if b < 0x80 {
        return (ASCII[b as usize], 1);
    }
    let (cp, n) = decode(s, i);
    (class_of(cp), n)
}

#[inline(always)]
pub fn is_letter(c: Class) -> bool {
    (LU..=LO).contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_classes() {
        assert_eq!(class_of('A' as u32), LU);
        assert_eq!(class_of('z' as u32), LL);
        assert_eq!(class_of('5' as u32), NUM);
        assert_eq!(class_of('\n' as u32), WS);
        assert_eq!(class_of('\'' as u32), OTHER);
        assert_eq!(class_of(0x1c), OTHER, "\\x1c is not White_Space for regex");
    }

    #[test]
    fn non_ascii_classes() {
        assert_eq!(class_of(0x00C9), LU); // É
        assert_eq!(class_of(0x01C5), LT); // ǅ
        assert_eq!(class_of(0x02B0), LM); // ʰ
        assert_eq!(class_of(0x4E2D), LO); // 中
        assert_eq!(class_of(0x0301), MARK); // combining acute
        assert_eq!(class_of(0x0663), NUM); // Arabic-Indic three
        assert_eq!(class_of(0x00BD), NUM); // ½ (No)
        assert_eq!(class_of(0x2163), NUM); // Ⅳ (Nl)
        assert_eq!(class_of(0x3000), WS);
        assert_eq!(class_of(0x0085), WS);
        assert_eq!(class_of(0x1F600), OTHER); // emoji
    }

    #[test]
    fn decode_lengths() {
        let s = "aé中😀".as_bytes();
        assert_eq!(decode(s, 0), ('a' as u32, 1));
        assert_eq!(decode(s, 1), (0xE9, 2));
        assert_eq!(decode(s, 3), (0x4E2D, 3));
        assert_eq!(decode(s, 6), (0x1F600, 4));
    }
}
