//! The safe-cut rule: where text may be cut so that pre-tokenizing the parts gives the pieces of
//! the whole. Counting cuts work units and file blocks with it, encoding cuts parallel chunks.
//! The rule is written once ([`is_safe_cut`]); the searches forward and backward only find
//! candidate positions (after a "\n").

use crate::scan::Splitter;
use crate::unicode::{class_at, WS};

/// Whether the character ending right before byte `p` is whitespace.
///
/// A cut after "\n" is only safe for every built-in pattern when the "\n" is not the end of a
/// longer whitespace run: gpt2's `\s+(?!\S)` splits " \n" + "b" as " ", "\n" but would keep
/// " \n" whole at the end of a chunk.
fn ws_before(s: &[u8], p: usize) -> bool {
    if p == 0 {
        return false;
    }
    let mut start = p - 1;
    while start > 0 && p - start < 4 && s[start] & 0xC0 == 0x80 {
        start -= 1;
    }
    class_at(s, start).0 == WS
}

/// Whether cutting `seg` before byte `cut` (just after a "\n", not at either end) cannot change
/// its pieces: always with line units; else only when the "\n" is not the end of a longer
/// whitespace run (see [`ws_before`]) and the next character is neither whitespace nor "/"
/// (o200k's `[\r\n/]*` tail would carry a piece such as " .\n/" across the cut). Only valid when
/// `splitter.cuttable()`.
fn is_safe_cut(splitter: &Splitter, seg: &[u8], cut: usize) -> bool {
    debug_assert!(cut > 0 && cut < seg.len() && seg[cut - 1] == b'\n');
    splitter.line_units() || (seg[cut] != b'/' && class_at(seg, cut).0 != WS && !ws_before(seg, cut - 1))
}

/// The first safe cut ([`is_safe_cut`]) at or after `from` in `seg`, if any.
pub(crate) fn next_cut(splitter: &Splitter, seg: &[u8], from: usize) -> Option<usize> {
    let mut p = from.max(1) - 1;
    while let Some(off) = memchr::memchr(b'\n', &seg[p..]) {
        let cut = p + off + 1;
        if cut >= seg.len() {
            return None;
        }
        if is_safe_cut(splitter, seg, cut) {
            return Some(cut);
        }
        p = cut;
    }
    None
}

/// `text` cut into pieces of about `target` bytes where pieces cannot cross (or whole when the
/// splitter allows no cuts), for parallel encoding.
pub fn safe_chunks<'a>(splitter: &Splitter, mut text: &'a [u8], target: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    while splitter.cuttable() && text.len() > target {
        match next_cut(splitter, text, target) {
            Some(cut) => {
                let (head, tail) = text.split_at(cut);
                out.push(head);
                text = tail;
            }
            None => break,
        }
    }
    if !text.is_empty() {
        out.push(text);
    }
    out
}

/// The last safe cut ([`is_safe_cut`]) at or before `upto` (and after 0) in `seg`, if any.
pub(crate) fn prev_cut(splitter: &Splitter, seg: &[u8], upto: usize) -> Option<usize> {
    let mut end = upto.min(seg.len());
    while let Some(nl) = memchr::memrchr(b'\n', &seg[..end]) {
        let cut = nl + 1;
        if cut < seg.len() && is_safe_cut(splitter, seg, cut) {
            return Some(cut);
        }
        end = nl;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{builtin_pattern, Builtin};

    /// Every safe cut found forward is found backward too, and both agree with the rule.
    #[test]
    fn forward_and_backward_searches_find_the_same_cuts() {
        let text = "a\nb \n c\n/d\n\ne\n  f\nGg\n".repeat(3);
        let seg = text.as_bytes();
        for line_units in [false, true] {
            let sp = Splitter::new(&builtin_pattern(Builtin::O200k), line_units).unwrap();
            let forward: Vec<usize> =
                std::iter::successors(next_cut(&sp, seg, 1), |&c| next_cut(&sp, seg, c + 1)).collect();
            let mut backward: Vec<usize> =
                std::iter::successors(prev_cut(&sp, seg, seg.len() - 1), |&c| prev_cut(&sp, seg, c - 1)).collect();
            backward.reverse();
            assert_eq!(forward, backward, "line_units {line_units}");
            let rule: Vec<usize> =
                (1..seg.len()).filter(|&c| seg[c - 1] == b'\n' && is_safe_cut(&sp, seg, c)).collect();
            assert_eq!(forward, rule);
            assert!(!forward.is_empty());
        }
    }
}
