//! The ASCII classes of a block of text as bit masks (bit k for byte k), for the block scanners
//! of `scan.rs`: letters, digits, other ASCII, whitespace and a few single bytes.
//!
//! A 64-byte block is classified by a [`Classify`]: [`Baseline`] takes it 16 bytes at a time with
//! SSE2 (part of every x86_64 CPU; a byte loop elsewhere), then joins four masks per class;
//! [`Avx512`], where the CPU has AVX-512BW, takes it whole, a compare per class giving its mask.
//! Both give the same masks (tested), so the pieces do not depend on the CPU.

/// The classes of the bytes of a 64-byte block, one bit per byte. The kinds (`letter`, `digit`,
/// `other`, `ws`) are those of the scanners' byte table: bytes from 0x80 are in none of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Classes {
    /// `[A-Za-z]`
    pub letter: u64,
    /// `[0-9]`
    pub digit: u64,
    /// ASCII that is neither a letter, a digit nor whitespace (punctuation, controls)
    pub other: u64,
    /// `[\t\n\x0b\x0c\r ]`
    pub ws: u64,
    /// `' '`
    pub blank: u64,
    /// `'\''`
    pub apostrophe: u64,
    /// `'\n'`
    pub newline: u64,
    /// `'\r'`
    pub cr: u64,
    /// `'/'`
    pub slash: u64,
    /// `[a-z]`
    pub lower: u64,
}

/// A way to classify a 64-byte block. The scanners are generic over it and inline it, so the
/// classes a scanner does not read are never computed.
pub trait Classify: Copy {
    fn classes(self, block: &[u8; 64]) -> Classes;
}

/// Sixteen bytes at a time with SSE2 on x86_64, a byte loop elsewhere.
#[derive(Clone, Copy, Debug)]
pub struct Baseline;

impl Classify for Baseline {
    #[inline(always)]
    fn classes(self, block: &[u8; 64]) -> Classes {
        let mut c = Classes::default();
        for k in 0..4 {
            let chunk: &[u8; 16] = block[16 * k..16 * k + 16].try_into().unwrap();
            let [letter, digit, other, ws] = kind_masks(chunk);
            let [blank, apostrophe] = byte_masks(chunk, [b' ', b'\'']);
            let [newline, cr] = byte_masks(chunk, [b'\n', b'\r']);
            let [slash, _] = byte_masks(chunk, [b'/', b'/']);
            let lower = lower_mask(chunk);
            let fields = [
                (&mut c.letter, letter),
                (&mut c.digit, digit),
                (&mut c.other, other),
                (&mut c.ws, ws),
                (&mut c.blank, blank),
                (&mut c.apostrophe, apostrophe),
                (&mut c.newline, newline),
                (&mut c.cr, cr),
                (&mut c.slash, slash),
                (&mut c.lower, lower),
            ];
            for (slot, m) in fields {
                *slot |= u64::from(m) << (16 * k);
            }
        }
        c
    }
}

/// The whole block at once with AVX-512BW. A value exists only where the CPU has it
/// ([`Avx512::detect`]): that is what makes [`Classify::classes`] safe to call on it.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub struct Avx512(());

/// Never made off x86_64.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy, Debug)]
pub enum Avx512 {}

impl Avx512 {
    /// The classifier, when this CPU has AVX-512BW (the check is a cached flag).
    #[inline]
    pub fn detect() -> Option<Avx512> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
            return Some(Avx512(()));
        }
        None
    }

    /// `f()`, compiled with AVX-512BW on: the classification `f` inlines is then inlined into it
    /// in turn, instead of being a call per block.
    #[inline]
    pub fn run<R>(self, f: impl FnOnce() -> R) -> R {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `self` exists only where `detect` found the features `with_avx512` enables.
            unsafe { with_avx512(f) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        match self {}
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

impl Classify for Avx512 {
    #[inline(always)]
    fn classes(self, block: &[u8; 64]) -> Classes {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `self` exists only where `detect` found the features `classes_avx512` needs.
            unsafe { classes_avx512(block) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        match self {}
    }
}

/// [`Classes`] of a block with AVX-512BW: a range test is a subtraction and one unsigned compare.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn classes_avx512(block: &[u8; 64]) -> Classes {
    use std::arch::x86_64::*;
    // SAFETY: `block` is 64 readable bytes, and the unaligned load reads exactly those.
    let x = unsafe { _mm512_loadu_si512(block.as_ptr().cast()) };
    let splat = |b: u8| _mm512_set1_epi8(b as i8);
    // Bytes of `v` in `lo..lo + n`.
    let within = |v: __m512i, lo: u8, n: u8| _mm512_cmplt_epu8_mask(_mm512_sub_epi8(v, splat(lo)), splat(n));
    let eq = |b: u8| _mm512_cmpeq_epi8_mask(x, splat(b));
    // Setting bit 5 folds capitals onto lowercase letters and moves no other byte into a-z.
    let letter = within(_mm512_or_si512(x, splat(0x20)), b'a', 26);
    let digit = within(x, b'0', 10);
    let blank = eq(b' ');
    let ws = within(x, 0x09, 5) | blank;
    let ascii = !_mm512_movepi8_mask(x);
    Classes {
        letter,
        digit,
        other: ascii & !(letter | digit | ws),
        ws,
        blank,
        apostrophe: eq(b'\''),
        newline: eq(b'\n'),
        cr: eq(b'\r'),
        slash: eq(b'/'),
        lower: within(x, b'a', 26),
    }
}

/// One bit per byte of `block` for each ASCII kind: letters, digits, other (punctuation and the
/// like), whitespace; bytes from 0x80 are in none.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn kind_masks(block: &[u8; 16]) -> [u32; 4] {
    use std::arch::x86_64::*;
    // SAFETY: `block` is 16 readable bytes, and the unaligned load reads exactly those. The other
    // intrinsics only compute on registers; they need SSE2, which every x86_64 CPU has (it is
    // part of the target's baseline features).
    unsafe {
        let x = _mm_loadu_si128(block.as_ptr() as *const __m128i);
        // Signed compares: bytes from 0x80 are negative, below every bound used here.
        let between = |v: __m128i, lo: u8, hi: u8| {
            _mm_and_si128(
                _mm_cmpgt_epi8(v, _mm_set1_epi8(lo as i8 - 1)),
                _mm_cmplt_epi8(v, _mm_set1_epi8(hi as i8 + 1)),
            )
        };
        let folded = _mm_or_si128(x, _mm_set1_epi8(0x20));
        let letter = between(folded, b'a', b'z');
        let digit = between(x, b'0', b'9');
        let space = _mm_or_si128(between(x, 0x09, 0x0d), _mm_cmpeq_epi8(x, _mm_set1_epi8(b' ' as i8)));
        let ascii = _mm_cmpgt_epi8(x, _mm_set1_epi8(-1));
        let other = _mm_andnot_si128(_mm_or_si128(_mm_or_si128(letter, digit), space), ascii);
        [letter, digit, other, space].map(|m| _mm_movemask_epi8(m) as u32)
    }
}

/// [`kind_masks`] a byte at a time (no SSE2 here).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn kind_masks(block: &[u8; 16]) -> [u32; 4] {
    let mut out = [0u32; 4];
    for (j, &b) in block.iter().enumerate() {
        let kinds = [b.is_ascii_alphabetic(), b.is_ascii_digit(), false, matches!(b, 0x09..=0x0d | b' ')];
        let other = b.is_ascii() && !kinds.iter().any(|&k| k);
        for (m, k) in out.iter_mut().zip([kinds[0], kinds[1], other, kinds[3]]) {
            *m |= u32::from(k) << j;
        }
    }
    out
}

/// One bit per byte of `chunk` equal to each of `bytes`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn byte_masks(chunk: &[u8; 16], bytes: [u8; 2]) -> [u32; 2] {
    use std::arch::x86_64::*;
    // SAFETY: `chunk` is 16 readable bytes, and the unaligned load reads exactly those; the
    // compares need only SSE2, part of the x86_64 baseline.
    unsafe {
        let x = _mm_loadu_si128(chunk.as_ptr() as *const __m128i);
        bytes.map(|b| _mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(b as i8))) as u32)
    }
}

/// [`byte_masks`] a byte at a time (no SSE2 here).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn byte_masks(chunk: &[u8; 16], bytes: [u8; 2]) -> [u32; 2] {
    bytes.map(|b| chunk.iter().enumerate().fold(0u32, |a, (j, &x)| a | u32::from(x == b) << j))
}

/// One bit per ASCII lowercase letter of `block`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn lower_mask(block: &[u8; 16]) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: `block` is 16 readable bytes, and the unaligned load reads exactly those; the
    // compares need only SSE2, part of the x86_64 baseline.
    unsafe {
        let x = _mm_loadu_si128(block.as_ptr() as *const __m128i);
        let ge_a = _mm_cmpgt_epi8(x, _mm_set1_epi8(b'a' as i8 - 1));
        let le_z = _mm_cmplt_epi8(x, _mm_set1_epi8(b'z' as i8 + 1));
        _mm_movemask_epi8(_mm_and_si128(ge_a, le_z)) as u32
    }
}

/// [`lower_mask`] a byte at a time (no SSE2 here).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn lower_mask(block: &[u8; 16]) -> u32 {
    block.iter().enumerate().fold(0, |m, (j, b)| m | u32::from(b.is_ascii_lowercase()) << j)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The classes of one byte, by definition.
    fn expected(b: u8) -> [bool; 10] {
        let ws = matches!(b, 0x09..=0x0d | b' ');
        [
            b.is_ascii_alphabetic(),
            b.is_ascii_digit(),
            b.is_ascii() && !b.is_ascii_alphanumeric() && !ws,
            ws,
            b == b' ',
            b == b'\'',
            b == b'\n',
            b == b'\r',
            b == b'/',
            b.is_ascii_lowercase(),
        ]
    }

    fn bits(c: &Classes) -> [u64; 10] {
        [c.letter, c.digit, c.other, c.ws, c.blank, c.apostrophe, c.newline, c.cr, c.slash, c.lower]
    }

    /// Every classifier this CPU has, with its name.
    fn classifiers(block: &[u8; 64]) -> Vec<(&'static str, Classes)> {
        let mut out = vec![("baseline", Baseline.classes(block))];
        if let Some(c) = Avx512::detect() {
            out.push(("avx512", c.run(|| c.classes(block))));
        }
        out
    }

    /// Each classifier puts every byte value, at every position, in exactly its classes.
    #[test]
    fn every_byte_at_every_position() {
        for b in 0..=255u8 {
            for at in 0..64 {
                let mut block = [b'a'; 64];
                block[at] = b;
                for (name, c) in classifiers(&block) {
                    for (k, (mask, want)) in bits(&c).into_iter().zip(expected(b)).enumerate() {
                        assert_eq!(mask >> at & 1 == 1, want, "{name}: byte {b:#x} at {at}, class {k}");
                    }
                }
            }
        }
    }

    /// The classifiers agree on random blocks of every byte value.
    #[test]
    fn classifiers_agree_on_random_blocks() {
        let state = &mut 0x5DEE_CE66_D1CE_4E5Bu64;
        for _ in 0..20_000 {
            let block: [u8; 64] = std::array::from_fn(|_| crate::test_random(state) as u8);
            let all = classifiers(&block);
            for (name, c) in &all[1..] {
                assert_eq!(*c, all[0].1, "{name} {block:?}");
            }
        }
    }
}
