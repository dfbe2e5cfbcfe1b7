//! GPT-2 tokenizer files read fast: the token strings of `vocab.json` and the lines of `merges.txt`,
//! spelt in GPT-2's byte table, turned into bytes.
//!
//! A tokenizer is loaded before anything is encoded, so its load is a serial part of every encoding
//! job, and the released 200K SuperBPE tokenizer has 600K token strings: decoded one by one in
//! Python they took most of a second. Here each is one pass over its characters, and `vocab.json`
//! is parsed on the way (it is always one flat object of strings to integers).
//!
//! These functions only accept: anything the Python reader (`formats/gpt2.py`) would refuse, and
//! anything it would read another way (a special token written verbatim), makes them answer `None`,
//! and Python reads the file itself, naming the problem. Their results must equal the Python
//! reader's (the tests compare them on random files).

use ahash::AHashSet;

use crate::byte_table::byte_of;
use crate::piecemap::PieceMap;

/// The bytes a token string spells, or `None` when a character is not in the table.
pub fn token_bytes(text: &str) -> Option<Vec<u8>> {
    text.chars().map(|c| byte_of(c as u32)).collect()
}

/// The entries of a `vocab.json` text, `(id, token bytes)` in file order, or `None` unless it is one
/// flat JSON object of distinct non-empty strings, each spelt in the byte table, to distinct
/// non-negative integers (below 10^18: longer numbers are left to Python). What it returns is then
/// a valid vocab as it stands.
pub fn vocab(text: &str) -> Option<Vec<(u64, Vec<u8>)>> {
    vocab_entries(text, false)?
        .into_iter()
        .map(|(id, token)| match token {
            Spelt::Table(bytes) => Some((id, bytes)),
            Spelt::Text(_) => None,
        })
        .collect()
}

/// [`vocab`], or with `texts` a vocab whose strings not spelt in the byte table are kept as
/// [`Spelt::Text`] (distinct ids; distinct tokens among those spelt in the table).
pub fn vocab_entries(text: &str, texts: bool) -> Option<Vec<(u64, Spelt)>> {
    Json::whole(text, |json| json.vocab(texts))
}

/// A vocab entry's token string: the bytes it spells in the byte table, or, when it is not spelt
/// in it (a special token written verbatim, for the caller to judge), the string itself.
#[derive(Debug, PartialEq)]
pub enum Spelt {
    Table(Vec<u8>),
    Text(String),
}

/// The bytes of the entries spelt in the byte table, in order.
pub fn table_tokens(entries: &[(u64, Spelt)]) -> Vec<&[u8]> {
    entries
        .iter()
        .filter_map(|(_, token)| match token {
            Spelt::Table(bytes) => Some(&bytes[..]),
            Spelt::Text(_) => None,
        })
        .collect()
}

/// A cursor over JSON text, for the shapes `vocab` and `hf_model.rs` read.
pub(crate) struct Json<'a> {
    pub(crate) text: &'a str,
    pub(crate) at: usize,
}

impl<'a> Json<'a> {
    /// What `read` makes of `text`, which must hold that one value (spaces around it allowed).
    pub(crate) fn whole<T>(text: &'a str, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        let mut json = Json { text, at: 0 };
        json.skip_space();
        let value = read(&mut json)?;
        json.skip_space();
        (json.at == text.len()).then_some(value)
    }

    /// The items of the array or object at the cursor (`open`, items separated by commas, `close`),
    /// each read by `item` from its first byte (spaces around it skipped here).
    pub(crate) fn items(&mut self, open: u8, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.expect(open)?;
        self.skip_space();
        if self.peek() == Some(close) {
            self.at += 1;
            return Some(());
        }
        loop {
            self.skip_space();
            item(self)?;
            self.skip_space();
            match self.next()? {
                b',' => continue,
                byte if byte == close => return Some(()),
                _ => return None,
            }
        }
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    pub(crate) fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    pub(crate) fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// The `vocab.json`-shaped object at the cursor, read as [`vocab`] reads a whole text; with
    /// `texts`, a string not spelt in the byte table is taken as [`Spelt::Text`]. Ids are distinct,
    /// and so are the tokens spelt in the table.
    pub(crate) fn vocab(&mut self, texts: bool) -> Option<Vec<(u64, Spelt)>> {
        let mut entries = Vec::new();
        self.items(b'{', b'}', |json| {
            let token = json.token_string(texts)?;
            json.skip_space();
            json.expect(b':')?;
            json.skip_space();
            entries.push((json.small_uint()?, token));
            Some(())
        })?;
        let ids: AHashSet<u64> = entries.iter().map(|e| e.0).collect();
        let spelt = table_tokens(&entries);
        let distinct: AHashSet<&[u8]> = spelt.iter().copied().collect();
        (ids.len() == entries.len() && distinct.len() == spelt.len()).then_some(entries)
    }

    /// A non-empty token string: spelt in the byte table, or with `texts` any string.
    fn token_string(&mut self, texts: bool) -> Option<Spelt> {
        let start = self.at;
        if let Some(bytes) = self.table_string() {
            return (!bytes.is_empty()).then_some(Spelt::Table(bytes));
        }
        if !texts {
            return None;
        }
        self.at = start;
        self.expect(b'"')?;
        let mut text = String::new();
        loop {
            let c = match self.next()? {
                b'"' => return (!text.is_empty()).then_some(Spelt::Text(text)),
                b'\\' => self.escaped()?,
                byte if byte < 0x20 => return None,
                byte if byte < 0x80 => byte as u32,
                _ => self.rest_of_char()?,
            };
            text.push(char::from_u32(c)?);
        }
    }

    pub(crate) fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A JSON number that is a plain non-negative integer of at most 18 digits (no leading zero).
    fn small_uint(&mut self) -> Option<u64> {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        let digits = &self.text.as_bytes()[start..self.at];
        if digits.is_empty() || digits.len() > 18 || (digits.len() > 1 && digits[0] == b'0') {
            return None;
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(digits.iter().fold(0u64, |n, &d| n * 10 + (d - b'0') as u64))
    }

    /// A JSON string whose characters (escapes decoded) are all table characters, as the bytes they
    /// spell. Raw control characters are refused, as JSON (and Python's reader) refuses them.
    pub(crate) fn table_string(&mut self) -> Option<Vec<u8>> {
        self.spelt_string(false).map(|(bytes, _)| bytes)
    }

    /// [`Self::table_string`], or with `split` one space (not a table character) allowed, and
    /// where it stands among the bytes.
    pub(crate) fn spelt_string(&mut self, split: bool) -> Option<(Vec<u8>, Option<usize>)> {
        self.expect(b'"')?;
        let mut out = Vec::new();
        let mut space = None;
        loop {
            let c = match self.next()? {
                b'"' => return Some((out, space)),
                b'\\' => self.escaped()?,
                byte if byte < 0x20 => return None,
                byte if byte < 0x80 => byte as u32,
                _ => self.rest_of_char()?,
            };
            if c == ' ' as u32 && split && space.is_none() {
                space = Some(out.len());
                continue;
            }
            out.push(byte_of(c)?);
        }
    }

    /// The code point of an escape (after its backslash); lone surrogates are refused.
    fn escaped(&mut self) -> Option<u32> {
        Some(match self.next()? {
            b'"' => '"' as u32,
            b'\\' => '\\' as u32,
            b'/' => '/' as u32,
            b'b' => 8,
            b'f' => 12,
            b'n' => 10,
            b'r' => 13,
            b't' => 9,
            b'u' => {
                let unit = self.hex4()?;
                if (0xD800..0xDC00).contains(&unit) {
                    self.expect(b'\\')?;
                    self.expect(b'u')?;
                    let low = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return None;
                    }
                    0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00..0xE000).contains(&unit) {
                    return None;
                } else {
                    unit
                }
            }
            _ => return None,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.as_bytes().get(self.at..self.at + 4)?;
        self.at += 4;
        digits.iter().try_fold(0u32, |n, &d| Some(n * 16 + (d as char).to_digit(16)?))
    }

    /// The code point of the multi-byte character whose first byte was just read.
    fn rest_of_char(&mut self) -> Option<u32> {
        let c = self.text.get(self.at - 1..)?.chars().next()?;
        self.at += c.len_utf8() - 1;
        Some(c as u32)
    }
}

/// Merges as `(left, right)` token bytes.
pub type Merges = Vec<(Vec<u8>, Vec<u8>)>;

/// Merges placed among the tokens of a vocab, by position in it.
#[derive(Debug, PartialEq)]
pub struct Placed {
    /// Each merge's left and right part.
    pub parts: Vec<(usize, usize)>,
    /// Whether some merge makes the token.
    pub made: Vec<bool>,
}

impl Placed {
    /// The positions of the tokens of two or more bytes that no merge makes (in a GPT-2 style pair
    /// of files, the special tokens), in order.
    pub fn unmade(&self, tokens: &[&[u8]]) -> Vec<usize> {
        (0..tokens.len()).filter(|&i| !self.made[i] && tokens[i].len() > 1).collect()
    }
}

/// The merges of a `merges.txt` text placed among `tokens` (the vocab), or `None` when a line is
/// malformed (as for [`merges`]) or a merge's parts or the token it makes are not tokens. Positions,
/// not bytes: a caller holding the tokens as objects hands the same objects back as the merges'
/// parts instead of a new copy of each.
pub fn placed_merges(text: &str, tokens: &[&[u8]]) -> Option<Placed> {
    place(&merges(text)?, tokens)
}

/// `merges` placed among `tokens`, or `None` when a merge's parts or the token it makes are not
/// among them.
pub fn place(merges: &Merges, tokens: &[&[u8]]) -> Option<Placed> {
    let entries: Vec<(&[u8], u32)> = tokens.iter().enumerate().map(|(i, &t)| (t, i as u32)).collect();
    let position = PieceMap::of_entries(&entries);
    let mut placed = Placed { parts: Vec::with_capacity(merges.len()), made: vec![false; tokens.len()] };
    for [left, right, made] in position.merge_values(merges) {
        placed.parts.push((left? as usize, right? as usize));
        placed.made[made? as usize] = true;
    }
    Some(placed)
}

/// The merges of a `merges.txt` text (with or without the `#version` first line), or `None` when a
/// line is not two table strings and one space.
pub fn merges(text: &str) -> Option<Merges> {
    let mut merges = Vec::new();
    for (index, line) in text.split('\n').enumerate() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || (index == 0 && line.starts_with("#version")) {
            continue;
        }
        let (left, right) = line.split_once(' ')?;
        if left.is_empty() || right.is_empty() || right.contains(' ') {
            return None;
        }
        merges.push((token_bytes(left)?, token_bytes(right)?));
    }
    Some(merges)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's table, spelt out: a space is "Ġ" (U+0120), a newline "Ċ" (U+010A), "a" itself.
    #[test]
    fn token_strings_are_spelt_in_the_table() {
        assert_eq!(token_bytes("Ġthe"), Some(b" the".to_vec()));
        assert_eq!(token_bytes("Ċ"), Some(b"\n".to_vec()));
        assert_eq!(token_bytes("Ā"), Some(vec![0]));
        assert_eq!(token_bytes("ÿ"), Some(vec![0xFF]));
        assert_eq!(token_bytes("Ń"), Some(vec![0xAD])); // the soft hyphen is the last shifted byte
        assert_eq!(token_bytes(""), Some(Vec::new()));
    }

    #[test]
    fn characters_outside_the_table_are_refused() {
        for text in [" ", "a b", "\n", "\u{AD}", "ń", "€", "é\u{0}"] {
            assert_eq!(token_bytes(text), None, "{text:?}");
        }
    }

    #[test]
    fn merges_lines_are_read_like_the_python_reader() {
        let text = "#version: 0.2\r\nĠ t\r\r\n\nh e\n";
        assert_eq!(merges(text), Some(vec![(b" ".to_vec(), b"t".to_vec()), (b"h".to_vec(), b"e".to_vec())]));
        // The header is skipped only on the first line; elsewhere it reads as a merge.
        let later = merges("a b\n#version: 0.2\n").unwrap();
        assert_eq!(later[1], (b"#version:".to_vec(), b"0.2".to_vec()));
        for bad in ["a\n", "a  b\n", " a\n", "a b c\n", "a b \n", "a\tb c\n", "a é\u{0}\n"] {
            assert_eq!(merges(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn vocab_json_is_read_like_python_json() {
        let text = "{\"a\": 0,\n \"\\u0120the\": 7 , \"\u{120}\\\"\\/\":2}\n";
        let read = vocab(text).unwrap();
        assert_eq!(read, vec![(0, b"a".to_vec()), (7, b" the".to_vec()), (2, b" \"/".to_vec())]);
        assert_eq!(vocab(" {} "), Some(Vec::new()));
        for bad in [
            "",
            "[]",
            "{\"a\": 0,}",
            "{\"a\": 01}",
            "{\"a\": -1}",
            "{\"a\": 1.0}",
            "{\"a\": 1e3}",
            "{\"a\": true}",
            "{\"a\": 0} x",
            "{\"a\": 0, \"a\": 1}",
            "{\"a\": 0, \"b\": 0}",
            "{\"a b\": 0}",
            "{\"a\\n\": 0}",
            "{\"\\ud800\": 0}",
            "{\"\u{1}\": 0}",
            "{\"a\": 1234567890123456789}",
            "{\"a\" 0}",
            "{\"a\": 0",
            "{\"\\x\": 0}",
            "{\"\": 0}",
        ] {
            assert_eq!(vocab(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn merges_are_checked_against_the_vocab() {
        let tokens: Vec<&[u8]> = vec![b"a", b"b", b"ab"];
        assert_eq!(placed_merges("a b\n", &tokens).map(|p| p.parts), Some(vec![(0, 1)]));
        assert_eq!(placed_merges("b a\n", &tokens), None, "makes a token not in the vocab");
        assert_eq!(placed_merges("a c\n", &tokens), None, "a part not in the vocab");
        assert_eq!(placed_merges("a  b\n", &tokens), None, "malformed");
    }

    /// The unmade tokens are those of two or more bytes that no merge makes, by position.
    #[test]
    fn unmade_tokens_are_the_long_ones_no_merge_makes() {
        let tokens: Vec<&[u8]> = vec![b"<s>", b"a", b"b", b"ab", b"\xff\xfe", b"abb", b"c", b"ba"];
        let placed = placed_merges("a b\nab b\n", &tokens).unwrap();
        assert_eq!(placed.parts, vec![(1, 2), (3, 2)]);
        assert_eq!(placed.unmade(&tokens), vec![0, 4, 7]);
        assert_eq!(placed_merges("a b\nb a\nab b\n", &tokens).unwrap().unmade(&tokens), vec![0, 4]);
    }
}
