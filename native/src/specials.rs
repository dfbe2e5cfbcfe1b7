//! Splitting text at special tokens, the way `superbpe.core.pretokenize.SpecialSplitter` does:
//! the leftmost occurrence wins, and among specials starting there the longest one.

use memchr::memmem::Finder;

/// A set of special tokens, searched with one substring finder each.
pub struct Specials {
    /// Longest first (stable among equal lengths), so the first hit at a position is the longest.
    finders: Vec<Finder<'static>>,
}

impl Specials {
    /// `tokens` must be non-empty byte strings (validated in Python).
    pub fn new(tokens: &[Vec<u8>]) -> Specials {
        let mut sorted: Vec<&Vec<u8>> = tokens.iter().collect();
        sorted.sort_by_key(|t| std::cmp::Reverse(t.len()));
        let finders = sorted.into_iter().map(|t| Finder::new(t).into_owned()).collect();
        Specials { finders }
    }

    pub fn is_empty(&self) -> bool {
        self.finders.is_empty()
    }

    /// Length of the longest special token (0 when there are none).
    pub fn max_len(&self) -> usize {
        self.finders.first().map_or(0, |f| f.needle().len())
    }

    /// Call `found(start, end)` for each special token match in `text`, left to right.
    pub fn matches<F: FnMut(usize, usize)>(&self, text: &[u8], mut found: F) {
        if self.finders.is_empty() {
            return;
        }
        // next[i]: next occurrence of special i at or after the search position (None = no more).
        let mut next: Vec<Option<usize>> = self.finders.iter().map(|f| f.find(text)).collect();
        let mut pos = 0;
        loop {
            let mut best: Option<(usize, usize)> = None;
            for (i, f) in self.finders.iter().enumerate() {
                if let Some(at) = next[i] {
                    let at = if at < pos { f.find(&text[pos..]).map(|x| x + pos) } else { Some(at) };
                    next[i] = at;
                    if let Some(at) = at {
                        if best.is_none_or(|(b, _)| at < b) {
                            best = Some((at, f.needle().len()));
                        }
                    }
                }
            }
            match best {
                Some((at, len)) => {
                    found(at, at + len);
                    pos = at + len;
                }
                None => return,
            }
        }
    }

    /// Whether any special token occurs in `text` (a substring search each).
    pub fn occur_in(&self, text: &[u8]) -> bool {
        self.finders.iter().any(|finder| finder.find(text).is_some())
    }

    /// Call `emit` with each non-empty stretch of `text` between special tokens.
    pub fn ordinary<'a, F: FnMut(&'a [u8])>(&self, text: &'a [u8], mut emit: F) {
        let mut pos = 0;
        self.matches(text, |start, end| {
            if start > pos {
                emit(&text[pos..start]);
            }
            pos = end;
        });
        if pos < text.len() {
            emit(&text[pos..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(specials: &[&str], text: &str) -> Vec<String> {
        let sp = Specials::new(&specials.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>());
        let mut out = Vec::new();
        sp.ordinary(text.as_bytes(), |s| out.push(String::from_utf8(s.to_vec()).unwrap()));
        out
    }

    #[test]
    fn longest_special_wins_at_same_position() {
        assert_eq!(segs(&["<a>", "<a><b>"], "x<a><b>y<a>z"), ["x", "y", "z"]);
        assert_eq!(segs(&["ab", "b"], "aab"), ["a"]);
        assert_eq!(segs(&["bc", "abcd"], "abce"), ["a", "e"]);
    }

    #[test]
    fn occurrence_is_any_match() {
        let specials = Specials::new(&[b"<|a|>".to_vec(), b"<|bb|>".to_vec()]);
        for text in ["", "plain", "<|a|", "x<|bb|>", "<|a|>", "<|bb|<|a|>"] {
            let mut found = false;
            specials.matches(text.as_bytes(), |_, _| found = true);
            assert_eq!(specials.occur_in(text.as_bytes()), found, "{text}");
        }
        assert!(!Specials::new(&[]).occur_in(b"anything"));
    }

    #[test]
    fn no_specials_and_empty_pieces() {
        assert_eq!(segs(&[], "abc"), ["abc"]);
        assert_eq!(segs(&["<s>"], "<s><s>"), Vec::<String>::new());
    }
}
