//! Pre-tokenizers: hand-written scanners for the built-in patterns, fancy-regex for custom ones.
//!
//! Each built-in scanner reproduces, character for character, what the Python `regex` module's
//! `finditer` does with the pattern of the same name in `superbpe/core/pretokenize.py` (alternatives
//! tried in order, greedy quantifiers with backtracking), under the *isolated split* rule: every
//! match and every non-empty gap between matches is a piece. Comments next to each scanner quote
//! the alternative they implement. Input is always valid UTF-8.

use crate::ascii_classes::{kind_masks, lower_mask, Avx512, Baseline, Classes, Classify};
use crate::unicode::{class_at, is_letter, Class, LL, LM, LO, LT, LU, MARK, NUM, OTHER, WS};

/// The built-in patterns that have a hand-written scanner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Gpt2,
    Cl100k,
    O200k,
    SuperbpeStage1,
    Superbpe,
    SuperbpePaper,
}

/// The exact pattern strings of `superbpe.core.pretokenize.PATTERNS`; a scanner is only used when the
/// pattern text is identical, so an edited pattern silently falls back to fancy-regex.
pub fn builtin_pattern(b: Builtin) -> String {
    let contractions = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
    let word_a = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+";
    let word_b = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*";
    let rest = r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    match b {
        Builtin::Gpt2 => r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+".into(),
        Builtin::Cl100k => concat!(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
        .into(),
        Builtin::O200k => format!("{word_a}{contractions}|{word_b}{contractions}|{rest}"),
        Builtin::SuperbpeStage1 => format!("{word_a}|{word_b}|{rest}"),
        Builtin::Superbpe => r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r\n/]*| +(?!\S)".into(),
        Builtin::SuperbpePaper => r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))".into(),
    }
}

pub const ALL_BUILTINS: [Builtin; 6] = [
    Builtin::Gpt2,
    Builtin::Cl100k,
    Builtin::O200k,
    Builtin::SuperbpeStage1,
    Builtin::Superbpe,
    Builtin::SuperbpePaper,
];

/// The scanner for a pattern text, if it is one of the built-ins.
pub fn builtin_for(pattern: &str) -> Option<Builtin> {
    ALL_BUILTINS.into_iter().find(|b| builtin_pattern(*b) == pattern)
}

impl Builtin {
    /// Whether every character is matched by some alternative, so pieces never cross a safe cut
    /// ("\n" followed by a non-space) even without line units.
    pub fn covering(self) -> bool {
        matches!(self, Builtin::Gpt2 | Builtin::Cl100k | Builtin::O200k | Builtin::SuperbpeStage1)
    }
}

/// Where a split's pieces go: one at a time, or a block's at once.
pub trait Pieces<'a> {
    /// The next piece.
    fn piece(&mut self, piece: &'a [u8]);

    /// The next pieces: from `from`, one ending at `from + k` for each bit k set in `ends` (bit
    /// 0 clear), each starting where the one before ends. A block scanner's pieces come this
    /// way: a caller that keeps its state in locals across a block need not store it per piece.
    #[inline(always)]
    fn ends(&mut self, s: &'a [u8], from: usize, ends: u64) {
        let (mut at, mut rest) = (from, ends);
        while rest != 0 {
            let next = from + rest.trailing_zeros() as usize;
            self.piece(&s[at..next]);
            at = next;
            rest &= rest - 1;
        }
    }
}

impl<'a, F: FnMut(&'a [u8])> Pieces<'a> for F {
    #[inline(always)]
    fn piece(&mut self, piece: &'a [u8]) {
        self(piece)
    }
}

/// [`blocks`] with the block starts `$starts` classifying by the best [`Classify`] this CPU
/// has: AVX-512 where it is there, and then the whole scan compiled for it.
macro_rules! best_blocks {
    ($s:expr, $emit:expr, $starts:path, $scalar:expr) => {
        match Avx512::detect() {
            Some(c) => c.run(|| blocks($s, $emit, |s, p| $starts(c, s, p), $scalar)),
            None => blocks($s, $emit, |s, p| $starts(Baseline, s, p), $scalar),
        }
    };
}

/// A compiled pre-tokenizer.
pub enum Splitter {
    Builtin { kind: Builtin, line_units: bool },
    Custom { re: Box<fancy_regex::Regex>, line_units: bool },
}

impl Splitter {
    /// Compile `pattern`; built-in pattern texts get their scanner.
    pub fn new(pattern: &str, line_units: bool) -> Result<Splitter, String> {
        if let Some(kind) = builtin_for(pattern) {
            return Ok(Splitter::Builtin { kind, line_units });
        }
        let re = fancy_regex::RegexBuilder::new(pattern)
            .backtrack_limit(10_000_000)
            .build()
            .map_err(|e| format!("pattern not supported by the native engine: {e}"))?;
        Ok(Splitter::Custom { re: Box::new(re), line_units })
    }

    pub fn line_units(&self) -> bool {
        match self {
            Splitter::Builtin { line_units, .. } | Splitter::Custom { line_units, .. } => *line_units,
        }
    }

    /// Whether text may be cut at safe cuts (or, with line units, after any "\n") without
    /// changing the pieces. False for custom patterns without line units: a custom match may
    /// span a newline.
    pub fn cuttable(&self) -> bool {
        match self {
            Splitter::Builtin { kind, line_units } => *line_units || kind.covering(),
            Splitter::Custom { line_units, .. } => *line_units,
        }
    }

    /// Give `emit` every piece of `text` in order.
    pub fn split<'a, P: Pieces<'a>>(&self, text: &'a [u8], emit: &mut P) -> Result<(), String> {
        if let Splitter::Builtin { kind: Builtin::Superbpe, line_units: true } = self {
            match Avx512::detect() {
                Some(c) => c.run(|| {
                    blocks(text, emit, |s, p| superbpe_line_starts(c, s, p), |s, p| superbpe_line_piece(c, s, p))
                }),
                None => blocks(
                    text,
                    emit,
                    |s, p| superbpe_line_starts(Baseline, s, p),
                    |s, p| superbpe_line_piece(Baseline, s, p),
                ),
            }
            return Ok(());
        }
        if self.line_units() {
            let mut start = 0;
            for nl in memchr::memchr_iter(b'\n', text) {
                self.split_unit(&text[start..=nl], emit)?;
                start = nl + 1;
            }
            if start < text.len() {
                self.split_unit(&text[start..], emit)?;
            }
            Ok(())
        } else {
            self.split_unit(text, emit)
        }
    }

    fn split_unit<'a, P: Pieces<'a>>(&self, s: &'a [u8], emit: &mut P) -> Result<(), String> {
        match self {
            Splitter::Builtin { kind, .. } => {
                match kind {
                    Builtin::Gpt2 => best_blocks!(s, emit, gpt2_block_starts, gpt2),
                    Builtin::Cl100k => best_blocks!(s, emit, cl100k_block_starts, cl100k),
                    Builtin::O200k => best_blocks!(s, emit, o200k_block_starts::<true>, |s, i| o200k(s, i, true)),
                    Builtin::SuperbpeStage1 => {
                        best_blocks!(s, emit, o200k_block_starts::<false>, |s, i| o200k(s, i, false))
                    }
                    Builtin::Superbpe => superbpe(s, &mut |p| emit.piece(p)),
                    Builtin::SuperbpePaper => digit_groups(s, &mut |p| emit.piece(p)),
                }
                Ok(())
            }
            Splitter::Custom { re, .. } => custom(re, s, &mut |p| emit.piece(p)),
        }
    }
}

/// Split with a pattern that matches at every position: pieces are consecutive matches. The
/// scalar split of the patterns that [`blocks`] splits, kept as the tests' reference for it.
#[cfg(test)]
fn cover<'a, F: FnMut(&'a [u8]), M: Fn(&[u8], usize) -> usize>(s: &'a [u8], emit: &mut F, m: M) {
    let mut i = 0;
    while i < s.len() {
        let e = m(s, i);
        debug_assert!(e > i);
        emit(&s[i..e]);
        i = e;
    }
}

// ---------------------------------------------------------------- shared pieces of scanners

/// "Other": not `\s`, `\p{L}` or `\p{N}` (marks included), i.e. `[^\s\p{L}\p{N}]`.
#[inline(always)]
fn is_other(c: Class) -> bool {
    in_set(c, (1 << OTHER) | (1 << MARK))
}

/// Whether class `c` is in the bit set `set` (one bit per class): a shift and a test, where a
/// `matches!` over several classes compiled to a chain of compares in the hottest loops.
#[inline(always)]
fn in_set(c: Class, set: u16) -> bool {
    (set >> c) & 1 != 0
}

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`
#[inline(always)]
fn is_upperish(c: Class) -> bool {
    in_set(c, (1 << LU) | (1 << LT) | (1 << LM) | (1 << LO) | (1 << MARK))
}

/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`
#[inline(always)]
fn is_lowerish(c: Class) -> bool {
    in_set(c, (1 << LL) | (1 << LM) | (1 << LO) | (1 << MARK))
}

/// End of the run of characters from `i` whose class satisfies `pred`.
#[inline(always)]
fn run<P: Fn(Class) -> bool>(s: &[u8], mut i: usize, pred: P) -> usize {
    while i < s.len() {
        let (c, n) = class_at(s, i);
        if !pred(c) {
            break;
        }
        i += n;
    }
    i
}

/// End of at most `max` characters of class `\p{N}` from `i`.
#[inline(always)]
fn digits_upto(s: &[u8], mut i: usize, max: usize) -> usize {
    for _ in 0..max {
        if i >= s.len() {
            break;
        }
        let (c, n) = class_at(s, i);
        if c != NUM {
            break;
        }
        i += n;
    }
    i
}

/// End of the run of bytes from `i` that are in `set` (all ASCII).
#[inline(always)]
fn ascii_run(s: &[u8], mut i: usize, set: &[u8]) -> usize {
    while i < s.len() && set.contains(&s[i]) {
        i += 1;
    }
    i
}

/// Length of the letter at `i` when it is `ch` (ASCII lowercase), ignoring case as `(?i)` does
/// in `regex`: only ASCII case pairs, plus U+017F LONG S for "s" (simple case folding).
#[inline(always)]
fn ci_letter(s: &[u8], i: usize, ch: u8) -> usize {
    match s.get(i) {
        Some(&b) if b | 0x20 == ch => 1,
        Some(&0xC5) if ch == b's' && s.get(i + 1) == Some(&0xBF) => 2,
        _ => 0,
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `i` (which holds `'`), optionally case-insensitive: match end.
#[inline]
fn contraction(s: &[u8], i: usize, ignore_case: bool) -> Option<usize> {
    let j = i + 1;
    let letter = |k: usize, ch: u8| -> usize {
        if ignore_case {
            ci_letter(s, k, ch)
        } else {
            usize::from(s.get(k) == Some(&ch))
        }
    };
    for ch in [b's', b't', b'm', b'd'] {
        let n = letter(j, ch);
        if n > 0 {
            return Some(j + n);
        }
    }
    for (a, b) in [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')] {
        let n = letter(j, a);
        if n > 0 {
            let m = letter(j + n, b);
            if m > 0 {
                return Some(j + n + m);
            }
        }
    }
    None
}

/// `\s+(?!\S)|\s+` at a whitespace character `i`: the run, minus its last character when a
/// non-space follows and the run is longer than one character.
#[inline]
fn ws_tail(s: &[u8], i: usize) -> usize {
    let (_, n0) = class_at(s, i);
    let mut last = i;
    let mut j = i + n0;
    while j < s.len() {
        let (c, n) = class_at(s, j);
        if c != WS {
            break;
        }
        last = j;
        j += n;
    }
    if j == s.len() || last == i {
        j
    } else {
        last
    }
}

/// `\s*[\r\n]+|\s+(?!\S)|\s+` at a whitespace character `i`: up to the last "\r"/"\n" in the
/// whitespace run if there is one, else as [`ws_tail`].
#[inline]
fn ws_newline(s: &[u8], i: usize) -> usize {
    // An all-ASCII run (the usual newline and indentation) by table; the general scan otherwise.
    let j = kind_run(s, i, K_SPACE);
    if j > i && (j == s.len() || s[j] < 0x80) {
        if let Some(p) = s[i..j].iter().rposition(|&b| b == b'\n' || b == b'\r') {
            return i + p + 1;
        }
        return if j == s.len() || j - i == 1 { j } else { j - 1 };
    }
    let mut last = i;
    let mut nl_end = 0;
    let mut j = i;
    while j < s.len() {
        let (c, n) = class_at(s, j);
        if c != WS {
            break;
        }
        if s[j] == b'\n' || s[j] == b'\r' {
            nl_end = j + 1;
        }
        last = j;
        j += n;
    }
    if nl_end > 0 {
        nl_end
    } else if j == s.len() || last == i {
        j
    } else {
        last
    }
}

// ---------------------------------------------------------------- ASCII fast paths

/// Kinds of ASCII byte as bit flags (0 for bytes >= 0x80), so that the commonest runs — letters,
/// digits, punctuation, whitespace, all ASCII in English and code — are scanned a byte at a time
/// with one table load, stopping at the first byte of another kind or of a multi-byte character.
const K_LETTER: u8 = 1;
const K_DIGIT: u8 = 2;
const K_OTHER: u8 = 4;
const K_SPACE: u8 = 8;

static KIND: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 128 {
        t[b] = match crate::unicode::ASCII[b] {
            LU | LL => K_LETTER,
            NUM => K_DIGIT,
            WS => K_SPACE,
            _ => K_OTHER,
        };
        b += 1;
    }
    t
};

/// End of the run from `i` of ASCII bytes whose kind is in `mask`. Sixteen bytes are classified
/// at a time where they are there, so a run's end costs a bit scan instead of a mispredicted exit
/// from a byte loop (mispredictions, about one per piece, were most of the scanner's time).
#[inline(always)]
fn kind_run(s: &[u8], mut i: usize, mask: u8) -> usize {
    // A run that ends at once (a one-character piece, common in code) needs no block.
    if s.get(i).is_none_or(|&b| KIND[b as usize] & mask == 0) {
        return i;
    }
    while let Some(block) = s.get(i..i + 16) {
        let kinds = kind_masks(block.try_into().unwrap());
        let selected = (if mask & K_LETTER != 0 { kinds[0] } else { 0 })
            | (if mask & K_DIGIT != 0 { kinds[1] } else { 0 })
            | (if mask & K_OTHER != 0 { kinds[2] } else { 0 })
            | (if mask & K_SPACE != 0 { kinds[3] } else { 0 });
        let run = (!selected).trailing_zeros() as usize;
        if run < 16 {
            return i + run;
        }
        i += 16;
    }
    while i < s.len() && KIND[s[i] as usize] & mask != 0 {
        i += 1;
    }
    i
}

/// End of the run from `i` of characters whose class satisfies `pred`, where every ASCII byte of
/// kind `mask` satisfies it and no other ASCII byte does: ASCII bytes by table, and only a
/// multi-byte character sends the scan to [`run`].
#[inline(always)]
fn fast_run<P: Fn(Class) -> bool>(s: &[u8], i: usize, mask: u8, pred: P) -> usize {
    let e = kind_run(s, i, mask);
    if e < s.len() && s[e] >= 0x80 {
        run(s, e, pred)
    } else {
        e
    }
}

// ---------------------------------------------------------------- gpt2

/// `'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
#[inline]
fn gpt2(s: &[u8], i: usize) -> usize {
    let b = s[i];
    if b == b'\'' {
        if let Some(e) = contraction(s, i, false) {
            return e;
        }
    }
    // ASCII first: a letter, digit or punctuation run (`\p{L}+`, `\p{N}+`, `[^\s\p{L}\p{N}]+`,
    // each optionally after one space), or a whitespace run; a multi-byte character met on the
    // way continues in the general scan, and one at the start takes the general path below.
    let k = KIND[b as usize];
    if k & (K_LETTER | K_DIGIT | K_OTHER) != 0 {
        return gpt2_ascii_run(s, i + 1, k);
    }
    if b == b' ' && i + 1 < s.len() {
        let k2 = KIND[s[i + 1] as usize];
        if k2 & (K_LETTER | K_DIGIT | K_OTHER) != 0 {
            return gpt2_ascii_run(s, i + 2, k2);
        }
    }
    if k == K_SPACE {
        let e = kind_run(s, i + 1, K_SPACE);
        if e == s.len() || s[e] < 0x80 {
            // `\s+(?!\S)|\s+`: the run, less its last character when a non-space follows.
            return if e == s.len() || e - i == 1 { e } else { e - 1 };
        }
    }
    let (c, n) = class_at(s, i);
    if b == b' ' && i + 1 < s.len() {
        let (c2, _) = class_at(s, i + 1);
        if is_letter(c2) {
            return run(s, i + 1, is_letter);
        }
        if c2 == NUM {
            return run(s, i + 1, |c| c == NUM);
        }
        if is_other(c2) {
            return run(s, i + 1, is_other);
        }
    }
    if is_letter(c) {
        run(s, i + n, is_letter)
    } else if c == NUM {
        run(s, i + n, |c| c == NUM)
    } else if is_other(c) {
        run(s, i + n, is_other)
    } else {
        ws_tail(s, i)
    }
}

/// The rest of a gpt2 run of kind `k` (one ASCII letter, digit or punctuation kind) from `i`.
#[inline(always)]
fn gpt2_ascii_run(s: &[u8], i: usize, k: u8) -> usize {
    if k == K_LETTER {
        fast_run(s, i, K_LETTER, is_letter)
    } else if k == K_DIGIT {
        fast_run(s, i, K_DIGIT, |c| c == NUM)
    } else {
        fast_run(s, i, K_OTHER, is_other)
    }
}

/// A split 64 bytes at a time where a block is plain (ASCII, without the bytes a pattern's rare
/// alternatives need): each byte's kind is classified at once and where pieces start follows
/// from the kinds of the bytes around it, so the pieces come out of a bit mask, one bit scan
/// each, instead of a branch on every piece's kind (those branches mispredict about once per
/// piece). `block_starts(s, p)` gives the piece starts of `s[p..p + 64]` (bit k for byte k, bit
/// 0 set) or `None` when that block is not plain; there, and for a piece longer than a block,
/// the scalar scanner `scalar` runs.
///
/// A block starts at a known piece start, so its first byte needs no left context (a match
/// depends only on the text from where it starts), and the byte after it must be plain too: the
/// rules at its last byte look at the next one.
#[inline(always)]
fn blocks<'a, P: Pieces<'a>>(
    s: &'a [u8],
    emit: &mut P,
    block_starts: impl Fn(&[u8], usize) -> Option<u64>,
    scalar: impl Fn(&[u8], usize) -> usize,
) {
    let mut p = 0;
    while p < s.len() {
        let Some(starts) = block_starts(s, p) else {
            // Not a plain block: the scalar scanner takes the pieces that start in it.
            let end = (p + 64).min(s.len());
            while p < end {
                let e = scalar(s, p);
                emit.piece(&s[p..e]);
                p = e;
            }
            continue;
        };
        // Bit 0 (p itself) is set. Every start but the last ends a piece within the block; the
        // last piece may run on, so the next block starts there.
        let rest = starts & !1;
        if rest == 0 {
            let e = scalar(s, p);
            emit.piece(&s[p..e]);
            p = e;
            continue;
        }
        emit.ends(s, p, rest);
        p += 63 - rest.leading_zeros() as usize;
    }
}

/// The gpt2 piece starts in `s[p..p + 64]` for [`blocks`], or `None` when the block is not
/// plain: too close to the end, or holding a byte from 0x80 or an apostrophe (contractions), or
/// followed by a byte from 0x80. In plain text a piece starts where
/// - a letter, digit or other run begins (the byte before is of another kind), unless a space
///   right before it joins it (` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`);
/// - a space is followed by a letter, digit or other byte: the start of such a joined run;
/// - a whitespace run begins;
/// - the last byte of a whitespace run of two or more that a non-space follows (`\s+(?!\S)`
///   leaves it: it is a piece alone, or the space joining the next run).
#[inline(always)]
fn gpt2_block_starts(classify: impl Classify, s: &[u8], p: usize) -> Option<u64> {
    let block: &[u8; 65] = s.get(p..p + 65)?.try_into().unwrap();
    let next = block[64];
    let Classes { letter, digit, other, ws: space, blank, apostrophe, .. } =
        classify.classes(block[..64].try_into().unwrap());
    if (letter | digit | other | space) != u64::MAX || apostrophe != 0 || next >= 0x80 {
        return None;
    }
    let next_kind = KIND[next as usize];
    let after = |mask: u64, kind: u8| after_kind(mask, next_kind, kind);
    // Spaces that join the run after them.
    let joining = blank & after(letter | digit | other, K_LETTER | K_DIGIT | K_OTHER);
    let run_starts = (letter & !(letter << 1)) | (digit & !(digit << 1)) | (other & !(other << 1));
    let ws_starts = space & !(space << 1);
    let ws_last = space & (space << 1) & !after(space, K_SPACE);
    Some((run_starts & !(joining << 1)) | joining | ws_starts | ws_last | 1)
}

/// The runs of `mask` that start at a bit of `seeds` (each seed the first bit of its run), whole:
/// adding a run's first bit carries through the run.
#[inline(always)]
fn fill_runs(mask: u64, seeds: u64) -> u64 {
    (mask.wrapping_add(seeds) ^ mask) & mask
}

/// The bits of `mask` reached from a bit of `seeds` by a run of `mask` bits towards bit 63
/// (seeds are in `mask`): a fill in doubling steps.
#[inline(always)]
fn fill_up(seeds: u64, mask: u64) -> u64 {
    // Most blocks have no seed (no newline after an other byte, say): skip the six steps.
    if seeds == 0 {
        return 0;
    }
    let (mut g, mut m) = (seeds, mask);
    for shift in [1, 2, 4, 8, 16, 32] {
        g |= m & (g << shift);
        m &= m << shift;
    }
    g
}

/// The bits of `mask` from which a run of `mask` bits leads up to a bit of `seeds` (seeds are
/// in `mask`): a fill towards bit 0 in doubling steps.
#[inline(always)]
fn fill_down(seeds: u64, mask: u64) -> u64 {
    // Most blocks have no seed (no newline in a whitespace run, say): skip the six steps.
    if seeds == 0 {
        return 0;
    }
    let (mut g, mut m) = (seeds, mask);
    for shift in [1, 2, 4, 8, 16, 32] {
        g |= m & (g >> shift);
        m &= m >> shift;
    }
    g
}

// ---------------------------------------------------------------- cl100k

/// The cl100k piece starts in `s[p..p + 64]` for [`blocks`], or `None` when the block is not
/// plain: too close to the end, holding a byte from 0x80, an apostrophe (contractions) or a
/// carriage return, or followed by a byte from 0x80 or a carriage return. In plain text (bit k
/// for byte k; "ws" is whitespace, "other" `[^\s\p{L}\p{N}]`) a piece starts where
/// - a letter run begins, unless the byte before is its prefix (`[^\r\n\p{L}\p{N}]?\p{L}+`):
///   a ws byte but a newline (always the start of a piece: the last byte of its run), or an
///   other byte that starts an other run (no other byte or space before it);
/// - a digit run begins, and every third digit of it (`\p{N}{1,3}`);
/// - an other run begins that no space joins (` ?[^\s\p{L}\p{N}]+[\r\n]*`; a space before an
///   other byte always joins it, being the last byte of its ws run); the newlines right after
///   an other run are the end of its piece;
/// - a ws run (without those newlines) begins; then, in a run with a newline, the byte after
///   its last newline (`\s*[\r\n]+` ends there); and the last byte of a run, or of its part
///   after the last newline, of two or more bytes that a non-ws byte follows (`\s+(?!\S)`).
///   The starts inside a ws run that goes on past the block depend on what follows: only the
///   run's own start is kept, and the next block starts there.
#[inline(always)]
fn cl100k_block_starts(classify: impl Classify, s: &[u8], p: usize) -> Option<u64> {
    let PlainBlock { next_kind, classes } = plain_block(classify, s, p, false)?;
    let Classes { letter, digit, other, ws, blank, newline, .. } = classes;
    let after = |mask: u64, kind: u8| after_kind(mask, next_kind, kind);
    let before_letter = after(letter, K_LETTER);
    let other_starts = other & !(other << 1) & !(blank << 1);
    let prefixes = (ws & !newline & before_letter) | (other_starts & before_letter);
    let letter_starts = letter & !(letter << 1) & !(prefixes << 1);
    // Whitespace pieces: the newlines that end an other run's piece are left out.
    let ws = ws & !fill_runs(newline, newline & (other << 1));
    Some(letter_starts | prefixes | digit_group_starts(digit) | other_starts | ws_starts(ws, newline, next_kind) | 1)
}

/// A plain block of `s` at `p` for the block scanners: the kind of the byte after it and the
/// classes of its bytes, or None when the block holds a byte the kinds do not cover (non-ASCII,
/// a carriage return, or such a byte right after it; an apostrophe unless `apostrophes`, for a
/// pattern without contractions, where it is an other byte like any).
struct PlainBlock {
    next_kind: u8,
    classes: Classes,
}

#[inline(always)]
fn plain_block(classify: impl Classify, s: &[u8], p: usize, apostrophes: bool) -> Option<PlainBlock> {
    let block: &[u8; 65] = s.get(p..p + 65)?.try_into().unwrap();
    let next = block[64];
    let classes = classify.classes(block[..64].try_into().unwrap());
    let Classes { letter, digit, other, ws, apostrophe, cr, .. } = classes;
    let apostrophe = if apostrophes { 0 } else { apostrophe };
    if (letter | digit | other | ws) != u64::MAX || apostrophe | cr != 0 || next >= 0x80 || next == b'\r' {
        return None;
    }
    Some(PlainBlock { next_kind: KIND[next as usize], classes })
}

/// "The byte after k is of kind X": `mask` shifted down, with the byte after the block on top.
#[inline(always)]
fn after_kind(mask: u64, next_kind: u8, kind: u8) -> u64 {
    (mask >> 1) | u64::from(next_kind & kind != 0) << 63
}

/// Digit groups (`\p{N}{1,3}`): each run's first digit, then every third while the run goes on.
#[inline(always)]
fn digit_group_starts(digit: u64) -> u64 {
    let mut group = digit & !(digit << 1);
    let mut starts = group;
    let three = digit & (digit << 1) & (digit << 2);
    while group != 0 {
        group = (group << 3) & three;
        starts |= group;
    }
    starts
}

/// The starts of whitespace pieces in `ws` (the block's whitespace that no other piece took): each
/// run's start, the byte after its last newline, and the last byte of a run that a non-space
/// follows (`\s+(?!\S)`); inside a run that goes on past the block only its own start.
#[inline(always)]
fn ws_starts(ws: u64, newline: u64, next_kind: u8) -> u64 {
    let tail = ws & !fill_down(newline & ws, ws);
    let mut inner = (tail & !(tail << 1)) | (tail & (tail << 1) & !after_kind(ws, next_kind, K_SPACE));
    if ws >> 63 == 1 && next_kind == K_SPACE {
        let gaps = !ws;
        inner &= if gaps == 0 { 0 } else { !(u64::MAX << (64 - gaps.leading_zeros())) };
    }
    (ws & !(ws << 1)) | inner
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}`
/// `| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
#[inline]
fn cl100k(s: &[u8], i: usize) -> usize {
    let b = s[i];
    if b == b'\'' {
        if let Some(e) = contraction(s, i, true) {
            return e;
        }
    }
    let (c, n) = class_at(s, i);
    if is_letter(c) {
        return fast_run(s, i + n, K_LETTER, is_letter);
    }
    if c != NUM && b != b'\r' && b != b'\n' && i + n < s.len() {
        let (c2, _) = class_at(s, i + n);
        if is_letter(c2) {
            return fast_run(s, i + n, K_LETTER, is_letter);
        }
    }
    if c == NUM {
        return digits_upto(s, i, 3);
    }
    if b == b' ' && i + 1 < s.len() && is_other(class_at(s, i + 1).0) {
        return ascii_run(s, fast_run(s, i + 1, K_OTHER, is_other), b"\r\n");
    }
    if is_other(c) {
        return ascii_run(s, fast_run(s, i + n, K_OTHER, is_other), b"\r\n");
    }
    ws_newline(s, i)
}

// ---------------------------------------------------------------- o200k / superbpe-stage1

/// The o200k (and superbpe-stage1) piece starts in `s[p..p + 64]` for [`blocks`], or `None`
/// when the block is not plain, as for [`cl100k_block_starts`] (an apostrophe would start a
/// contraction). The rules are cl100k's but for three: a word is a run of capitals and then a
/// run of lowercase letters (`U*W+|U+W*` in ASCII), so a capital after a lowercase letter starts
/// a word too; digits never take a prefix either; and what ends an other run's piece is the run
/// of newlines and slashes right after it (`[\r\n/]*`), whose slashes start no other run.
#[inline(always)]
fn o200k_block_starts<const CONTRACTIONS: bool>(classify: impl Classify, s: &[u8], p: usize) -> Option<u64> {
    let PlainBlock { next_kind, classes } = plain_block(classify, s, p, !CONTRACTIONS)?;
    let Classes { letter, digit, other, ws, blank, newline, slash, lower, .. } = classes;
    let after = |mask: u64, kind: u8| after_kind(mask, next_kind, kind);
    // The newlines and slashes that end an other run's piece: from a newline right after an
    // other byte, as far as newlines and slashes go.
    let joined = fill_up(newline & (other << 1), newline | slash);
    let other = other & !joined;
    let before_letter = after(letter, K_LETTER);
    let other_starts = other & !(other << 1) & !(blank << 1);
    let prefixes = (ws & !newline & before_letter) | (other_starts & before_letter);
    let upper = letter & !lower;
    let word_starts = ((letter & !(letter << 1)) | (upper & (lower << 1))) & !(prefixes << 1);
    let ws = ws & !joined;
    Some(word_starts | prefixes | digit_group_starts(digit) | other_starts | ws_starts(ws, newline, next_kind) | 1)
}

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+` from `t`, with backtracking:
/// the upper run is taken whole when a lower-ish character follows it; otherwise the match ends
/// after the last character of the run that is both upper-ish and lower-ish (Lm, Lo, M).
#[inline]
fn o200k_word_a(s: &[u8], t: usize) -> Option<usize> {
    let mut j = t;
    let mut both_end = None;
    while j < s.len() {
        let (c, n) = class_at(s, j);
        if !is_upperish(c) {
            if is_lowerish(c) {
                return Some(run(s, j + n, is_lowerish));
            }
            break;
        }
        j += n;
        if is_lowerish(c) {
            both_end = Some(j);
        }
    }
    both_end
}

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*` from `t`.
#[inline]
fn o200k_word_b(s: &[u8], t: usize) -> Option<usize> {
    if t >= s.len() || !is_upperish(class_at(s, t).0) {
        return None;
    }
    let j = run(s, t, is_upperish);
    Some(run(s, j, is_lowerish))
}

/// End of the run of lower-ish characters (`[\p{Ll}\p{Lm}\p{Lo}\p{M}]`) from `i`: ASCII lowercase
/// letters 16 bytes at a time, the general scan only from a multi-byte character (no other ASCII
/// byte is lower-ish).
#[inline(always)]
fn lower_run(s: &[u8], i: usize) -> usize {
    let e = ascii_lower_blocks(s, i);
    if e < s.len() && s[e] >= 0x80 {
        run(s, e, is_lowerish)
    } else {
        e
    }
}

/// [`ascii_lower_end`] with 16-byte blocks: the end of a run costs a bit scan, not a mispredicted
/// loop exit.
#[inline(always)]
fn ascii_lower_blocks(s: &[u8], mut i: usize) -> usize {
    if !s.get(i).is_some_and(|b| b.is_ascii_lowercase()) {
        return i;
    }
    while let Some(block) = s.get(i..i + 16) {
        let run = (!lower_mask(block.try_into().unwrap())).trailing_zeros() as usize;
        if run < 16 {
            return i + run;
        }
        i += 16;
    }
    ascii_lower_end(s, i)
}

/// End of the run of ASCII lowercase letters from `i` (all lower-ish: a `run` of
/// [`is_lowerish`] may start there without changing its end).
#[inline(always)]
fn ascii_lower_end(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && s[i].is_ascii_lowercase() {
        i += 1;
    }
    i
}

/// The o200k pattern (`contractions` on) or superbpe-stage1 (the same without contractions):
/// `P?U*W+C?|P?U+W*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// with P = `[^\r\n\p{L}\p{N}]`, U/W the upper-/lower-ish classes, C the contractions.
#[inline]
fn o200k(s: &[u8], i: usize, contractions: bool) -> usize {
    let b = s[i];
    let finish = |e: usize| -> usize {
        if contractions && s.get(e) == Some(&b'\'') {
            contraction(s, e, true).unwrap_or(e)
        } else {
            e
        }
    };
    // Fast paths for the commonest pieces, "word" and " word" in lowercase ASCII: the upper-ish
    // run is empty, so the first alternative takes the lower-ish run (same result as below).
    if b.is_ascii_lowercase() {
        return finish(lower_run(s, i + 1));
    }
    // The same after any ASCII character the prefix P = `[^\r\n\p{L}\p{N}]` takes (space,
    // tab, punctuation, ...): P matches it, the upper-ish run is empty and the lower-ish run
    // starts right after it, so the first alternative matches.
    let ascii_prefix = b.is_ascii() && !b.is_ascii_alphanumeric() && b != b'\r' && b != b'\n';
    let lower_at = |k: usize| s.get(k).is_some_and(|x| x.is_ascii_lowercase());
    let upper_at = |k: usize| s.get(k).is_some_and(|x| x.is_ascii_uppercase());
    if ascii_prefix && lower_at(i + 1) {
        return finish(lower_run(s, i + 2));
    }
    // Capitalised words ("The", " The", "(The"): the upper-ish run is the one capital (an ASCII
    // lowercase letter is not upper-ish), then the lower-ish run, as the first alternative.
    if b.is_ascii_uppercase() && lower_at(i + 1) {
        return finish(lower_run(s, i + 2));
    }
    if ascii_prefix && upper_at(i + 1) && lower_at(i + 2) {
        return finish(lower_run(s, i + 3));
    }
    // The word alternatives can only match from a letter or mark, so each attempt is made only
    // when its first character qualifies (the result is the same; the failing calls are skipped).
    let (c, n) = class_at(s, i);
    let prefix = !(is_letter(c) || c == NUM || b == b'\r' || b == b'\n');
    let c1 = if prefix && i + n < s.len() { class_at(s, i + n).0 } else { OTHER };
    let wordish = |c: Class| is_upperish(c) || is_lowerish(c);
    if prefix && wordish(c1) {
        if let Some(e) = o200k_word_a(s, i + n) {
            return finish(e);
        }
    }
    if wordish(c) {
        if let Some(e) = o200k_word_a(s, i) {
            return finish(e);
        }
    }
    if prefix && is_upperish(c1) {
        if let Some(e) = o200k_word_b(s, i + n) {
            return finish(e);
        }
    }
    if is_upperish(c) {
        if let Some(e) = o200k_word_b(s, i) {
            return finish(e);
        }
    }
    if c == NUM {
        return digits_upto(s, i, 3);
    }
    if b == b' ' && is_other(c1) && i + 1 < s.len() {
        return ascii_run(s, fast_run(s, i + 1, K_OTHER, is_other), b"\r\n/");
    }
    if is_other(c) {
        return ascii_run(s, fast_run(s, i + n, K_OTHER, is_other), b"\r\n/");
    }
    ws_newline(s, i)
}

// ---------------------------------------------------------------- superbpe (stage 2)

/// A match of `\p{N}{1,3}| ?[^\s\p{L}\p{N}]{2,}[\r\n/]*| +(?!\S)` at `i`, if any.
#[inline]
fn superbpe_match<const LINES: bool>(s: &[u8], i: usize) -> Option<usize> {
    let b = s[i];
    let (c, _) = class_at(s, i);
    if c == NUM {
        return Some(digits_upto(s, i, 3));
    }
    // ` ?[^\s\p{L}\p{N}]{2,}[\r\n/]*`: the optional space is only tried on a space.
    let others_from = if b == b' ' { i + 1 } else { i };
    if others_from < s.len() {
        let (c1, n1) = class_at(s, others_from);
        if is_other(c1) && others_from + n1 < s.len() && is_other(class_at(s, others_from + n1).0) {
            return Some(after_others::<LINES>(s, fast_run(s, others_from + n1, K_OTHER, is_other)));
        }
    }
    if b == b' ' {
        // ` +(?!\S)`: the space run, or one space less when a non-space follows it.
        let j = ascii_run(s, i, b" ");
        if j == s.len() || class_at(s, j).0 == WS {
            return Some(j);
        }
        if j - i >= 2 {
            return Some(j - 1);
        }
    }
    None
}

/// The end of `[\r\n/]*` from `i`, after a run of punctuation. With `LINES` a "\n" ends the line
/// being split, and the run with it.
#[inline(always)]
fn after_others<const LINES: bool>(s: &[u8], i: usize) -> usize {
    if !LINES {
        return ascii_run(s, i, b"\r\n/");
    }
    let e = ascii_run(s, i, b"\r/");
    e + usize::from(s.get(e) == Some(&b'\n'))
}

/// Whether no alternative of the stage-2 pattern can match at ASCII byte `b`, followed by `next`
/// (0 at the end): letters and non-space whitespace never start a match; neither does a space or
/// a punctuation character followed by an ASCII letter (one space before a non-space is no
/// ` +(?!\S)` match, and the punctuation run needs two `[^\s\p{L}\p{N}]` characters), nor
/// punctuation followed by ASCII whitespace or a digit. With `LINES` a "\n" is not skipped: the
/// line it ends is cut there.
#[inline(always)]
fn superbpe_skips<const LINES: bool>(b: u8, next: u8) -> bool {
    if b.is_ascii_alphabetic() || matches!(b, b'\t' | b'\r') || (!LINES && b == b'\n') {
        return true;
    }
    if b == b' ' {
        return next.is_ascii_alphabetic();
    }
    b.is_ascii_punctuation() && (next.is_ascii_alphanumeric() || matches!(next, b' ' | b'\t' | b'\n' | b'\r'))
}

/// [`superbpe_skips`] for the 16 positions from `i`, as bits (`s` must hold `i + 17` bytes): web
/// text is mostly such positions, and a branch on each byte was most of counting it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn superbpe_skips16<const LINES: bool>(s: &[u8], i: usize) -> u32 {
    use std::arch::x86_64::*;
    // Not `i + 17 <= s.len()`: for an `i` near `usize::MAX` the sum wraps round and passes.
    assert!(s.len().checked_sub(17).is_some_and(|last| i <= last), "17 bytes from {i}");
    // SAFETY: the assert keeps both unaligned 16-byte loads (from `i` and `i + 1`) inside `s`.
    // The other intrinsics only compute on registers; they need SSE2, which every x86_64 CPU has.
    unsafe {
        let x = _mm_loadu_si128(s.as_ptr().add(i) as *const __m128i);
        let next = _mm_loadu_si128(s.as_ptr().add(i + 1) as *const __m128i);
        // Signed compares: bytes from 0x80 are negative, below every bound used here.
        let between = |v: __m128i, lo: u8, hi: u8| {
            _mm_and_si128(
                _mm_cmpgt_epi8(v, _mm_set1_epi8(lo as i8 - 1)),
                _mm_cmplt_epi8(v, _mm_set1_epi8(hi as i8 + 1)),
            )
        };
        let is = |v: __m128i, b: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8));
        let letter = |v: __m128i| between(_mm_or_si128(v, _mm_set1_epi8(0x20)), b'a', b'z');
        let breaks = |v: __m128i| _mm_or_si128(_mm_or_si128(is(v, b'\t'), is(v, b'\n')), is(v, b'\r'));
        let (x_letter, next_letter) = (letter(x), letter(next));
        let x_digit = between(x, b'0', b'9');
        let punct = _mm_andnot_si128(_mm_or_si128(x_letter, x_digit), between(x, 0x21, 0x7e));
        let after_punct = _mm_or_si128(
            _mm_or_si128(next_letter, between(next, b'0', b'9')),
            _mm_or_si128(is(next, b' '), breaks(next)),
        );
        let x_breaks = if LINES { _mm_or_si128(is(x, b'\t'), is(x, b'\r')) } else { breaks(x) };
        let skips = _mm_or_si128(
            _mm_or_si128(x_letter, x_breaks),
            _mm_or_si128(_mm_and_si128(is(x, b' '), next_letter), _mm_and_si128(punct, after_punct)),
        );
        _mm_movemask_epi8(skips) as u32
    }
}

/// [`superbpe_skips16`] a byte at a time (no SSE2 here).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn superbpe_skips16<const LINES: bool>(s: &[u8], i: usize) -> u32 {
    (0..16).map(|k| u32::from(superbpe_skips::<LINES>(s[i + k], s[i + k + 1])) << k).sum()
}

/// Isolated split with the superbpe stage-2 pattern: matches plus the gaps between them.
fn superbpe<'a, F: FnMut(&'a [u8])>(s: &'a [u8], emit: &mut F) {
    let mut gap = 0;
    let mut i = 0;
    while i < s.len() {
        match superbpe_match::<false>(s, i) {
            Some(e) => {
                if gap < i {
                    emit(&s[gap..i]);
                }
                emit(&s[i..e]);
                i = e;
                gap = e;
            }
            None => i = superbpe_gap_step::<false>(Baseline, s, i),
        }
    }
    if gap < s.len() {
        emit(&s[gap..]);
    }
}

/// [`superbpe_skips`] for the 64 positions from `i`, as bits (`s` must hold `i + 65` bytes): the
/// gaps of English lines run for hundreds of bytes, and 16 positions at a time was a tenth of
/// counting them with the stage-2 pattern.
trait Skips64: Copy {
    fn superbpe_skips64<const LINES: bool>(self, s: &[u8], i: usize) -> u64;
}

impl Skips64 for Baseline {
    #[inline(always)]
    fn superbpe_skips64<const LINES: bool>(self, s: &[u8], i: usize) -> u64 {
        (0..4).fold(0, |bits, k| bits | (superbpe_skips16::<LINES>(s, i + 16 * k) as u64) << (16 * k))
    }
}

impl Skips64 for Avx512 {
    #[inline(always)]
    fn superbpe_skips64<const LINES: bool>(self, s: &[u8], i: usize) -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            // Not `i + 65 <= s.len()`: for an `i` near `usize::MAX` the sum wraps round and passes.
            assert!(s.len().checked_sub(65).is_some_and(|last| i <= last), "65 bytes from {i}");
            // SAFETY: `self` exists only where the CPU has AVX-512BW (`Avx512::detect`), and the
            // assert keeps the two 64-byte loads (from `i` and `i + 1`) inside `s`.
            unsafe { superbpe_skips64_avx512::<LINES>(s.as_ptr().add(i)) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        match self {}
    }
}

/// [`superbpe_skips16`] with AVX-512BW, 64 positions: the same tests, one compare per class.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW, and `p..p + 65` must be readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn superbpe_skips64_avx512<const LINES: bool>(p: *const u8) -> u64 {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees both 64-byte loads are readable.
    let (x, next) = unsafe { (_mm512_loadu_si512(p.cast()), _mm512_loadu_si512(p.add(1).cast())) };
    let splat = |b: u8| _mm512_set1_epi8(b as i8);
    // Bytes of `v` in `lo..lo + n` (a subtraction and one unsigned compare).
    let within = |v: __m512i, lo: u8, n: u8| _mm512_cmplt_epu8_mask(_mm512_sub_epi8(v, splat(lo)), splat(n));
    let is = |v: __m512i, b: u8| _mm512_cmpeq_epi8_mask(v, splat(b));
    let letter = |v: __m512i| within(_mm512_or_si512(v, splat(0x20)), b'a', 26);
    let digit = |v: __m512i| within(v, b'0', 10);
    let breaks = |v: __m512i| is(v, b'\t') | is(v, b'\n') | is(v, b'\r');
    let (x_letter, next_letter) = (letter(x), letter(next));
    let punct = within(x, 0x21, 0x7e - 0x21 + 1) & !(x_letter | digit(x));
    let after_punct = next_letter | digit(next) | is(next, b' ') | breaks(next);
    let x_breaks = if LINES { is(x, b'\t') | is(x, b'\r') } else { breaks(x) };
    x_letter | x_breaks | (is(x, b' ') & next_letter) | (punct & after_punct)
}

/// From `i`, where no match starts, the next position where one may: past the character at `i`,
/// then past the positions where none can (`superbpe_skips`), 64 at a time while 65 bytes are
/// left, then 16 at a time while 17 are, then one by one.
#[inline(always)]
fn superbpe_gap_step<const LINES: bool>(skips: impl Skips64, s: &[u8], i: usize) -> usize {
    let mut i = i + class_at(s, i).1;
    while i + 65 <= s.len() {
        let bits = skips.superbpe_skips64::<LINES>(s, i);
        i += bits.trailing_ones() as usize;
        if bits != u64::MAX {
            return i;
        }
    }
    while i + 17 <= s.len() {
        let skips = superbpe_skips16::<LINES>(s, i);
        i += skips.trailing_ones() as usize;
        if skips != 0xFFFF {
            return i;
        }
    }
    while i < s.len() && superbpe_skips::<LINES>(s[i], s.get(i + 1).copied().unwrap_or(0)) {
        i += 1;
    }
    i
}

/// The end of the superbpe piece at `p` when each line (up to and including its "\n") is split
/// on its own: the match there, or the gap up to the next match or through the line's end.
#[inline]
fn superbpe_line_piece(skips: impl Skips64, s: &[u8], p: usize) -> usize {
    if s[p] == b'\n' {
        return p + 1;
    }
    if let Some(e) = superbpe_match::<true>(s, p) {
        return e;
    }
    let mut i = superbpe_gap_step::<true>(skips, s, p);
    while i < s.len() {
        if s[i] == b'\n' {
            return i + 1;
        }
        if superbpe_match::<true>(s, i).is_some() {
            return i;
        }
        i = superbpe_gap_step::<true>(skips, s, i);
    }
    i
}

/// The superbpe piece starts in `s[p..p + 64]` for [`blocks`], each line split on its own, or
/// `None` when the block is not plain: too close to the end, holding a byte from 0x80 or a
/// carriage return, or followed by a byte from 0x80. A block starts at a piece start, where the
/// pattern starts afresh, so nothing before bit 0 counts. In plain text (bit k for byte k; "ws" is
/// whitespace, "other" `[^\s\p{L}\p{N}]`) a piece starts
/// - after a newline;
/// - where a digit run begins, at every third digit of it (`\p{N}{1,3}`), and where it ends;
/// - where a run of two or more other bytes begins, or at the space right before it
///   (` ?[^\s\p{L}\p{N}]{2,}`); and where it ends, unless at a newline: `[\r\n/]*` takes that
///   (without a carriage return there is nothing else it can take);
/// - where a run of two or more spaces begins, or a lone space that ws follows (` +(?!\S)`);
/// - after a space run that ws follows (it matches whole), and at the last space of a run of
///   two or more that a non-ws byte follows (the match leaves that space).
///
/// Letters, ws but spaces and lone other bytes start no piece: they are the gaps between matches.
/// A start at the last byte that depends on the two bytes after the block (a space before an
/// other run that begins there) is left out: the next block starts earlier and finds it.
#[inline(always)]
fn superbpe_line_starts(classify: impl Classify, s: &[u8], p: usize) -> Option<u64> {
    let block: &[u8; 65] = s.get(p..p + 65)?.try_into().unwrap();
    let next = block[64];
    let Classes { letter, digit, other, ws, blank, newline, cr, .. } =
        classify.classes(block[..64].try_into().unwrap());
    if (letter | digit | other | ws) != u64::MAX || cr != 0 || next >= 0x80 {
        return None;
    }
    let next_kind = KIND[next as usize];
    let next_ws = after_kind(ws, next_kind, K_SPACE);
    let digits = digit_group_starts(digit) | (!digit & (digit << 1));
    let runs = other & !(other << 1) & after_kind(other, next_kind, K_OTHER);
    let others = ((runs >> 1) & blank) | (runs & !(blank << 1)) | (!other & (other << 1) & (other << 2) & !newline);
    let spaces = (blank & !(blank << 1) & next_ws) | (ws & !blank & (blank << 1)) | (blank & (blank << 1) & !next_ws);
    Some((newline << 1) | digits | others | spaces | 1)
}

// ---------------------------------------------------------------- superbpe-paper

/// Isolated split with `\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))`: each run of digits is cut into
/// groups of three aligned from its right end (the first group holds the remainder); everything
/// else is gap.
fn digit_groups<'a, F: FnMut(&'a [u8])>(s: &'a [u8], emit: &mut F) {
    let mut gap = 0;
    let mut i = 0;
    let mut bounds: Vec<usize> = Vec::new();
    while i < s.len() {
        let (c, n) = class_at(s, i);
        if c != NUM {
            i += n;
            continue;
        }
        if gap < i {
            emit(&s[gap..i]);
        }
        bounds.clear();
        let mut j = i;
        while j < s.len() {
            let (c, n) = class_at(s, j);
            if c != NUM {
                break;
            }
            bounds.push(j);
            j += n;
        }
        let count = bounds.len();
        let first = if count.is_multiple_of(3) { 3 } else { count % 3 };
        let mut k = first;
        let mut start = i;
        while k <= count {
            let end = if k == count { j } else { bounds[k] };
            emit(&s[start..end]);
            start = end;
            k += 3;
        }
        i = j;
        gap = j;
    }
    if gap < s.len() {
        emit(&s[gap..]);
    }
}

// ---------------------------------------------------------------- custom patterns

/// Isolated split with a fancy-regex pattern. After an empty match the search resumes one
/// character later (Python would also allow a non-empty match at the same position; empty
/// pieces are dropped either way). fancy-regex needs a `str`: `split` is a safe fn taking bytes,
/// so the text is checked here (a pass that costs little next to the regex itself).
fn custom<'a, F: FnMut(&'a [u8])>(re: &fancy_regex::Regex, s: &'a [u8], emit: &mut F) -> Result<(), String> {
    let text = std::str::from_utf8(s).map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    let mut gap = 0;
    let mut pos = 0;
    while pos <= text.len() {
        let m = match re.find_from_pos(text, pos) {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => return Err(format!("custom pattern failed: {e}")),
        };
        let (start, end) = (m.start(), m.end());
        if start > gap {
            emit(&s[gap..start]);
        }
        if end > start {
            emit(&s[start..end]);
            pos = end;
        } else {
            if end >= s.len() {
                gap = end;
                break;
            }
            pos = end + class_at(s, end).1;
        }
        gap = end;
    }
    if gap < s.len() {
        emit(&s[gap..]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `split` is a safe fn: with a custom pattern it must check UTF-8 before handing the bytes to
    /// fancy-regex as `str`, so invalid UTF-8 is an error, never undefined behaviour.
    #[test]
    fn custom_split_of_invalid_utf8_is_an_error() {
        let sp = Splitter::new("a+|b", false).unwrap();
        let err = sp.split(b"aa\xffb", &mut |_: &[u8]| {}).unwrap_err();
        assert!(err.contains("invalid UTF-8 at byte 2"), "{err}");
        let mut out = Vec::new();
        sp.split("aab\u{e9}".as_bytes(), &mut |p: &[u8]| out.push(p.to_vec())).unwrap();
        assert_eq!(out, [b"aa".to_vec(), b"b".to_vec(), "\u{e9}".as_bytes().to_vec()]);
    }

    fn pieces(b: Builtin, text: &str) -> Vec<String> {
        let sp = Splitter::new(&builtin_pattern(b), false).unwrap();
        let mut out = Vec::new();
        sp.split(text.as_bytes(), &mut |p: &[u8]| out.push(String::from_utf8(p.to_vec()).unwrap())).unwrap();
        out
    }

    #[test]
    fn gpt2_basics() {
        assert_eq!(pieces(Builtin::Gpt2, "Hello world's  end"), ["Hello", " world", "'s", " ", " end"]);
        assert_eq!(pieces(Builtin::Gpt2, "a\n\nb  "), ["a", "\n", "\n", "b", "  "]);
        assert_eq!(pieces(Builtin::Gpt2, "x   \ty"), ["x", "   ", "\t", "y"]);
        assert_eq!(pieces(Builtin::Gpt2, "''s 12ab"), ["''", "s", " 12", "ab"]);
    }

    #[test]
    fn cl100k_basics() {
        assert_eq!(pieces(Builtin::Cl100k, "I'M (hello) 12345"), ["I", "'M", " (", "hello", ")", " ", "123", "45"]);
        assert_eq!(pieces(Builtin::Cl100k, "a \n\n b"), ["a", " \n\n", " b"]);
        assert_eq!(pieces(Builtin::Cl100k, "x!!\r\ny"), ["x", "!!\r\n", "y"]);
    }

    #[test]
    fn o200k_basics() {
        assert_eq!(pieces(Builtin::O200k, "HELLOworld HTTPServer don't"), ["HELLOworld", " HTTPServer", " don't"]);
        assert_eq!(pieces(Builtin::SuperbpeStage1, "don't"), ["don", "'t"]);
        assert_eq!(pieces(Builtin::O200k, "a//\nb"), ["a", "//\n", "b"]);
    }

    #[test]
    fn superbpe_stage2() {
        assert_eq!(
            pieces(Builtin::Superbpe, "hello, world... 1234 ok  "),
            ["hello, world", "...", " ", "123", "4", " ok", "  "]
        );
    }

    #[test]
    fn paper_digit_groups() {
        assert_eq!(pieces(Builtin::SuperbpePaper, "x1234567y12"), ["x", "1", "234", "567", "y", "12"]);
    }

    #[test]
    fn line_units_cut_after_newline() {
        let sp = Splitter::new(&builtin_pattern(Builtin::SuperbpePaper), true).unwrap();
        let mut out = Vec::new();
        sp.split(b"ab\ncd\n\nef", &mut |p: &[u8]| out.push(p.to_vec())).unwrap();
        assert_eq!(out, [b"ab\n".to_vec(), b"cd\n".to_vec(), b"\n".to_vec(), b"ef".to_vec()]);
    }

    /// The scanners against fancy-regex running the same pattern text, on random ASCII text
    /// (where fancy-regex's Unicode tables cannot differ from `regex`'s): exercises the ASCII
    /// fast paths (prefix + lowercase word, skipped positions of the stage-2 scanner).
    #[test]
    fn scanners_match_fancy_regex_on_ascii() {
        let alphabet = b"aqZK09 \t\n\r.,;:_(){}[]/*-+'=\"#sdtmlrev";
        let state = &mut 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || crate::test_random(state);
        for b in ALL_BUILTINS {
            let re = fancy_regex::Regex::new(&builtin_pattern(b)).unwrap();
            for line_units in [false, true] {
                let fast = Splitter::Builtin { kind: b, line_units };
                let slow = Splitter::Custom { re: Box::new(re.clone()), line_units };
                for round in 0..3000 {
                    // Longer texts too, so that lines of split line units pass the 16-byte skip.
                    let len = (next() % if round % 2 == 0 { 48 } else { 120 }) as usize;
                    let text: Vec<u8> = (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
                    let (mut x, mut y) = (Vec::new(), Vec::new());
                    fast.split(&text, &mut |p: &[u8]| x.push(p.to_vec())).unwrap();
                    slow.split(&text, &mut |p: &[u8]| y.push(p.to_vec())).unwrap();
                    assert_eq!(x, y, "{b:?} {line_units} {:?}", String::from_utf8_lossy(&text));
                }
            }
        }
    }

    /// The 16-position skip test agrees with the byte one for every byte and following byte.
    #[test]
    fn superbpe_skips16_agrees_with_the_byte_test() {
        for b in 0..=255u8 {
            for next in 0..=255u8 {
                for at in [0, 7, 15] {
                    let mut s = [b'a'; 17];
                    (s[at], s[at + 1]) = (b, next);
                    let want = superbpe_skips::<false>(b, next);
                    assert_eq!(superbpe_skips16::<false>(&s, 0) >> at & 1 == 1, want, "{b:#x} then {next:#x} at {at}");
                    let want = superbpe_skips::<true>(b, next);
                    assert_eq!(
                        superbpe_skips16::<true>(&s, 0) >> at & 1 == 1,
                        want,
                        "lines: {b:#x}, {next:#x} at {at}"
                    );
                }
            }
        }
    }

    /// A position too near the end for the 16 or 64 bytes (and one more) the skip tests load is
    /// refused, however large: for one near `usize::MAX` the bytes to load once wrapped round to
    /// look in range, and were read from before the text.
    #[test]
    fn skip_tests_refuse_positions_past_the_end() {
        let s = [b'a'; 100];
        let refused = |f: &dyn Fn() -> u64| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err();
        for i in [84, 100, 101, usize::MAX - 16, usize::MAX - 8, usize::MAX] {
            assert!(refused(&|| u64::from(superbpe_skips16::<false>(&s, i))), "16 from {i}");
        }
        assert_eq!(superbpe_skips16::<false>(&s, 83), 0xFFFF);
        let mut classifiers: Vec<Box<dyn Fn(usize) -> u64>> =
            vec![Box::new(|i| Baseline.superbpe_skips64::<false>(&s, i))];
        if let Some(c) = Avx512::detect() {
            classifiers.push(Box::new(move |i| c.superbpe_skips64::<false>(&s, i)));
        }
        for skips in &classifiers {
            for i in [36, 100, usize::MAX - 64, usize::MAX - 40, usize::MAX] {
                assert!(refused(&|| skips(i)), "64 from {i}");
            }
            assert_eq!(skips(35), u64::MAX);
        }
    }

    /// The 64-position skip test agrees with the byte one for every byte and following byte, with
    /// every classifier this CPU has.
    #[test]
    fn superbpe_skips64_agrees_with_the_byte_test() {
        fn check(c: impl Skips64, name: &str) {
            for b in 0..=255u8 {
                for next in 0..=255u8 {
                    for at in [0, 15, 16, 40, 63] {
                        let mut s = [b'a'; 65];
                        (s[at], s[at + 1]) = (b, next);
                        let got = |lines: bool| {
                            let bits = if lines {
                                c.superbpe_skips64::<true>(&s, 0)
                            } else {
                                c.superbpe_skips64::<false>(&s, 0)
                            };
                            bits >> at & 1 == 1
                        };
                        assert_eq!(
                            got(false),
                            superbpe_skips::<false>(b, next),
                            "{name}: {b:#x} then {next:#x} at {at}"
                        );
                        assert_eq!(
                            got(true),
                            superbpe_skips::<true>(b, next),
                            "{name} lines: {b:#x}, {next:#x} at {at}"
                        );
                    }
                }
            }
        }
        check(Baseline, "baseline");
        if let Some(c) = Avx512::detect() {
            c.run(|| check(c, "avx512"));
        }
    }

    /// The block classifier agrees with the byte table for every byte value at every position.
    #[test]
    fn kind_masks_agree_with_the_table() {
        for b in 0..=255u8 {
            for at in 0..16 {
                let mut block = [b'a'; 16];
                block[at] = b;
                let masks = kind_masks(&block);
                for (bit, m) in [K_LETTER, K_DIGIT, K_OTHER, K_SPACE].into_iter().zip(masks) {
                    assert_eq!(m >> at & 1 == 1, KIND[b as usize] & bit != 0, "byte {b:#x} at {at}");
                }
            }
        }
        let text = b"abc  12;; \t\nxyz!0123456789abcdefghij\xc3\xa9";
        for mask in 1..16u8 {
            for i in 0..text.len() {
                let mut slow = i;
                while slow < text.len() && KIND[text[slow] as usize] & mask != 0 {
                    slow += 1;
                }
                assert_eq!(kind_run(text, i, mask), slow, "mask {mask} from {i}");
            }
        }
    }

    /// The block scanners (gpt2, cl100k, o200k, superbpe-stage1; superbpe's lines against the
    /// split of one line at a time), with every classifier this CPU has, against the scalar ones
    /// on long random texts: plain ASCII ones (blocks taken), and ones with apostrophes, carriage
    /// returns, multi-byte characters and long runs (blocks refused, pieces longer than a block,
    /// switches back and forth); code-like texts with indentation, digits, punctuation before
    /// words and newlines after it.
    #[test]
    fn block_scanners_match_the_scalar_ones() {
        let alphabets: [&[&str]; 8] = [
            &["a", "Z", "q", "0", "7", " ", "  ", "\t", "\n", "\r", ".", ";", "(", "{", "-", "\x0b", "\x0c"],
            &["ab", " ", "x", "1", "\n\t\t", "    ", "()", ";\n", "'s", "'", "é", "\u{a0}", "中", "\u{3000}"],
            &["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", " ", "\n", "1", "."],
            &["                                                                  ", "a", "\n", "x\u{300}", "!"],
            &["\n    ", "\n\t", "if", " (", "x_1", "->", "{\n", "}\n", ";\n", " = ", "12345", "0x1f", "/*", " */"],
            &[" ", "  ", "\n", "\n\n", "\t", "(", "((", "a", "b", "1", "22", "4444", " \n ", "=", ".\n\n", "x"],
            &["A", "b", "Cd", "EF", "/", "//", "\n", "/\n", "*", " ", "{\n/", "1", "_", "'", "é", "\n  "],
            &["don", "'t", "'", "'s", "''", " '", "x'y", "A", "b", " ", "\n", "1", ".", "'\n", "/"],
        ];
        let state = &mut 0x1234_5678_9ABC_DEF1u64;
        for alphabet in alphabets {
            for _ in 0..400 {
                let parts = crate::test_below(state, 120);
                let text: String = (0..parts).map(|_| alphabet[crate::test_below(state, alphabet.len())]).collect();
                block_scanners_match_on(Baseline, &text, "baseline");
                if let Some(c) = Avx512::detect() {
                    c.run(|| block_scanners_match_on(c, &text, "avx512"));
                }
            }
        }
    }

    /// The check of [`block_scanners_match_the_scalar_ones`] on one text with one classifier.
    fn block_scanners_match_on(c: impl Classify + Skips64, text: &str, classifier: &str) {
        let s = text.as_bytes();
        for (name, fast, slow) in [
            (
                "gpt2",
                pieces_of(s, |s, o| blocks(s, &mut |p| o.push(p), |s, p| gpt2_block_starts(c, s, p), gpt2)),
                pieces_of(s, |s, o| cover(s, &mut |p| o.push(p), gpt2)),
            ),
            (
                "cl100k",
                pieces_of(s, |s, o| blocks(s, &mut |p| o.push(p), |s, p| cl100k_block_starts(c, s, p), cl100k)),
                pieces_of(s, |s, o| cover(s, &mut |p| o.push(p), cl100k)),
            ),
            (
                "o200k",
                pieces_of(s, |s, o| {
                    blocks(s, &mut |p| o.push(p), |s, p| o200k_block_starts::<true>(c, s, p), |s, i| o200k(s, i, true))
                }),
                pieces_of(s, |s, o| cover(s, &mut |p| o.push(p), |s, i| o200k(s, i, true))),
            ),
            (
                "superbpe-stage1",
                pieces_of(s, |s, o| {
                    blocks(
                        s,
                        &mut |p| o.push(p),
                        |s, p| o200k_block_starts::<false>(c, s, p),
                        |s, i| o200k(s, i, false),
                    )
                }),
                pieces_of(s, |s, o| cover(s, &mut |p| o.push(p), |s, i| o200k(s, i, false))),
            ),
            (
                "superbpe lines",
                pieces_of(s, |s, o| {
                    blocks(
                        s,
                        &mut |p| o.push(p),
                        |s, p| superbpe_line_starts(c, s, p),
                        |s, p| superbpe_line_piece(c, s, p),
                    )
                }),
                pieces_of(s, |s, o| {
                    for line in s.split_inclusive(|&b| b == b'\n') {
                        superbpe(line, &mut |p| o.push(p));
                    }
                }),
            ),
        ] {
            assert_eq!(fast, slow, "{name} ({classifier}) {text:?}");
        }
    }

    /// The pieces a split function gives.
    fn pieces_of<'a>(s: &'a [u8], split: impl Fn(&'a [u8], &mut Vec<&'a [u8]>)) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        split(s, &mut out);
        out
    }

    /// The block scanners against fancy-regex on long plain ASCII texts (where fancy-regex's
    /// Unicode tables cannot differ from `regex`'s), so the blocks are checked against the
    /// pattern itself and not only against the scalar scanners.
    #[test]
    fn block_scanners_match_fancy_regex_on_long_ascii() {
        let alphabet: &[&str] = &[
            "a", "Zq", "0", "123", " ", "  ", "\t", "\n", "\n    ", ".", ";", "(", "{\n", "=", "_", "/", "B", "xY",
            "*/",
        ];
        let state = &mut 0x0F1E_2D3C_4B5A_6978u64;
        let kinds = [Builtin::Gpt2, Builtin::Cl100k, Builtin::O200k, Builtin::SuperbpeStage1, Builtin::Superbpe];
        for (b, line_units) in kinds.map(|b| (b, false)).into_iter().chain([(Builtin::Superbpe, true)]) {
            let fast = Splitter::Builtin { kind: b, line_units };
            let slow =
                Splitter::Custom { re: Box::new(fancy_regex::Regex::new(&builtin_pattern(b)).unwrap()), line_units };
            for _ in 0..300 {
                let parts = crate::test_below(state, 200);
                let text: String = (0..parts).map(|_| alphabet[crate::test_below(state, alphabet.len())]).collect();
                let (mut x, mut y) = (Vec::new(), Vec::new());
                fast.split(text.as_bytes(), &mut |p: &[u8]| x.push(p.to_vec())).unwrap();
                slow.split(text.as_bytes(), &mut |p: &[u8]| y.push(p.to_vec())).unwrap();
                assert_eq!(x, y, "{b:?} {line_units} {text:?}");
            }
        }
    }

    #[test]
    fn custom_isolated_split() {
        let sp = Splitter::new(r"\d+|(?=x)", false).unwrap();
        let mut out = Vec::new();
        sp.split(b"ab12cxd", &mut |p: &[u8]| out.push(p.to_vec())).unwrap();
        assert_eq!(out, [b"ab".to_vec(), b"12".to_vec(), b"c".to_vec(), b"xd".to_vec()]);
    }
}
