//! GPT-2's byte-to-unicode table: each byte as one printable character. Printable Latin-1 bytes
//! (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) stand for themselves; the other 68, in byte order, for U+0100
//! onwards (a space is "Ġ", U+0120). Tokenizer files spell tokens in it (`tokenfiles.rs`), and HF's
//! trainer numbers the bytes by it (`train/rules.rs`).

/// Table characters are below this code point: the 68 shifted bytes take 256..324.
const TABLE_CHARS: usize = 256 + 68;
const NOT_A_BYTE: u16 = u16::MAX;

/// Whether byte `b` stands for itself.
const fn visible(b: usize) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE
}

/// Each byte's character, and each character's byte (`NOT_A_BYTE` for the code points below
/// `TABLE_CHARS` that are no table character).
const fn tables() -> ([u16; 256], [u16; TABLE_CHARS]) {
    let mut chars = [0u16; 256];
    let mut bytes = [NOT_A_BYTE; TABLE_CHARS];
    let mut shifted = 0;
    let mut b = 0;
    while b < 256 {
        let c = if visible(b) {
            b
        } else {
            shifted += 1;
            256 + shifted - 1
        };
        chars[b] = c as u16;
        bytes[c] = b as u16;
        b += 1;
    }
    (chars, bytes)
}

static TABLES: ([u16; 256], [u16; TABLE_CHARS]) = tables();

/// The code point that stands for byte `b`.
#[inline]
pub fn char_of(b: u8) -> u32 {
    TABLES.0[b as usize] as u32
}

/// The byte the code point `c` stands for, or `None` when it is no table character.
#[inline]
pub fn byte_of(c: u32) -> Option<u8> {
    match TABLES.1.get(c as usize) {
        Some(&b) if b != NOT_A_BYTE => Some(b as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_gpt2_spelling() {
        assert_eq!((char_of(b' '), char_of(b'\n'), char_of(b'a'), char_of(0)), (0x120, 0x10A, 0x61, 0x100));
        assert_eq!(char_of(0xAD), 0x143, "the soft hyphen is the last shifted byte");
        for b in 0..=255u8 {
            assert_eq!(byte_of(char_of(b)), Some(b));
        }
        let chars = (0..0x200).filter(|&c| byte_of(c).is_some()).count();
        assert_eq!(chars, 256, "no other character stands for a byte");
        for c in [0x20, 0x7F, 0xAD, 0x144, 0x10FFFF] {
            assert_eq!(byte_of(c), None, "{c:#x}");
        }
    }
}
