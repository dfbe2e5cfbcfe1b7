//! A `tokenizer.json`'s model read fast: its vocab object and merges array found in the document
//! and read by the rules of `tokenfiles.rs`, the rest of the document left to Python.
//!
//! Nearly all of a large `tokenizer.json` (7 MB for the released 200K SuperBPE tokenizer) is the
//! vocab and the merges; Python's JSON parse of them, and decoding 600K token strings afterwards,
//! was most of loading one. What is left, the skeleton, is small and Python parses it as before.
//!
//! Like `tokenfiles.rs`, this only accepts: anything unusual (a key written with an escape, a
//! repeated `model`, `vocab` or `merges`, a merge that does not fit the vocab) makes it answer
//! `None`, and Python reads the whole document itself, naming the problem. A vocab string not spelt
//! in the byte table is handed back as it is: HF writes special tokens into the model's vocab
//! verbatim, and Python, which knows the added tokens, judges them.

use std::ops::Range;

use crate::tokenfiles::{self, Json, Merges, Spelt};

/// The model's vocab and merges, and the document without them.
pub struct ModelParts {
    /// The document with the model's vocab written as `{}` and its merges as `[]`.
    pub skeleton: String,
    /// `(id, token)` in file order: distinct ids; the tokens spelt in the byte table as their
    /// bytes (distinct, non-empty), any other string (a special token written verbatim, for
    /// Python to judge) as it is.
    pub vocab: Vec<(u64, Spelt)>,
    /// The merges, each as the positions of its two parts among the vocab's tokens spelt in the
    /// byte table (`tokenfiles::table_tokens`), each making a token of the vocab.
    pub merges: Vec<(usize, usize)>,
}

/// The parts of a `tokenizer.json` text whose top-level `model` object has a `vocab` object (and
/// maybe a `merges` array), or `None` as the module says. The vocab and the merges are read at once,
/// the merges on a thread of their own: a thread started here, not one of rayon's, since tokenizers
/// are also loaded in forked worker processes, where rayon's pool is not.
pub fn model_parts(text: &str) -> Option<ModelParts> {
    let (vocab_span, merges_span) = model_spans(text)?;
    let read_merges = || merges_span.clone().map_or(Some(Vec::new()), |span| merge_items(&text[span]));
    let (vocab, merges) = std::thread::scope(|scope| {
        // Where no thread can be started, the merges are read after the vocab.
        let merges = std::thread::Builder::new().spawn_scoped(scope, read_merges);
        let vocab = tokenfiles::vocab_entries(&text[vocab_span.clone()], true);
        let merges = match merges {
            Ok(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => read_merges(),
        };
        (vocab, merges)
    });
    let (vocab, merges) = (vocab?, merges?);
    let merges = tokenfiles::place(&merges, &tokenfiles::table_tokens(&vocab))?.parts;
    let mut holes = vec![(vocab_span, "{}")];
    holes.extend(merges_span.map(|span| (span, "[]")));
    holes.sort_by_key(|(span, _)| span.start);
    let mut skeleton = String::with_capacity(text.len() - holes.iter().map(|(s, _)| s.len()).sum::<usize>() + 4);
    let mut at = 0;
    for (span, empty) in holes {
        skeleton.push_str(&text[at..span.start]);
        skeleton.push_str(empty);
        at = span.end;
    }
    skeleton.push_str(&text[at..]);
    Some(ModelParts { skeleton, vocab, merges })
}

/// Where the top-level `model`'s `vocab` and `merges` values lie (the vocab must be there).
fn model_spans(text: &str) -> Option<(Range<usize>, Option<Range<usize>>)> {
    let mut json = Json { text, at: 0 };
    let mut model = None;
    members(&mut json, |json, key| {
        if key != "model" {
            return skip_value(json);
        }
        if model.is_some() {
            return None;
        }
        model = Some(model_members(json)?);
        Some(())
    })?;
    json.skip_space();
    if json.at != text.len() {
        return None;
    }
    let (vocab, merges) = model?;
    Some((vocab?, merges))
}

type Span = Option<Range<usize>>;

/// The spans of a model object's `vocab` and `merges` values (either may be missing).
fn model_members(json: &mut Json) -> Option<(Span, Span)> {
    let (mut vocab, mut merges) = (None, None);
    members(json, |json, key| {
        let slot = match key {
            "vocab" => &mut vocab,
            "merges" => &mut merges,
            _ => return skip_value(json),
        };
        if slot.is_some() {
            return None;
        }
        let start = json.at;
        skip_value(json)?;
        *slot = Some(start..json.at);
        Some(())
    })?;
    Some((vocab, merges))
}

/// The members of the object at the cursor, each key handed to `member` with the cursor at its
/// value (which `member` must read past).
fn members<'a>(json: &mut Json<'a>, mut member: impl FnMut(&mut Json<'a>, &'a str) -> Option<()>) -> Option<()> {
    json.skip_space();
    json.items(b'{', b'}', |json| {
        let key = plain_key(json)?;
        json.skip_space();
        json.expect(b':')?;
        json.skip_space();
        member(json, key)
    })
}

/// A key without escapes (a key with one is refused: it could spell `model` another way).
fn plain_key<'a>(json: &mut Json<'a>) -> Option<&'a str> {
    json.expect(b'"')?;
    let start = json.at;
    let len = json.text.as_bytes()[start..].iter().position(|&b| b == b'"' || b == b'\\')?;
    json.at = start + len;
    json.expect(b'"')?;
    Some(&json.text[start..start + len])
}

/// Move past the value at the cursor, without checking more than where it ends (Python parses the
/// skeleton, which holds every value skipped here).
fn skip_value(json: &mut Json) -> Option<()> {
    let mut depth = 0usize;
    loop {
        json.skip_space();
        match json.peek()? {
            b'"' => skip_string(json)?,
            b'{' | b'[' => {
                json.at += 1;
                depth += 1;
                continue;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                json.at += 1;
            }
            b',' | b':' if depth > 0 => {
                json.at += 1;
                continue;
            }
            _ => {
                let rest = &json.text.as_bytes()[json.at..];
                let len = rest.iter().position(|&b| b",:{}[]\" \t\n\r".contains(&b)).unwrap_or(rest.len());
                if len == 0 {
                    return None;
                }
                json.at += len;
            }
        }
        if depth == 0 {
            return Some(());
        }
    }
}

/// Move past the string at the cursor (its escapes stepped over, not decoded).
fn skip_string(json: &mut Json) -> Option<()> {
    json.expect(b'"')?;
    loop {
        let rest = &json.text.as_bytes()[json.at..];
        let stop = memchr::memchr2(b'"', b'\\', rest)?;
        json.at += stop + 1;
        if rest[stop] == b'"' {
            return Some(());
        }
        json.next()?;
    }
}

/// The merges of a `model.merges` array: items `"left right"` (one space between two table
/// strings) or `["left", "right"]`, as Python's reader takes them.
fn merge_items(text: &str) -> Option<Merges> {
    let mut merges = Vec::new();
    Json::whole(text, |json| {
        json.items(b'[', b']', |json| {
            merges.push(merge_item(json)?);
            Some(())
        })
    })?;
    Some(merges)
}

/// The merge item at the cursor, in either spelling, of two non-empty table strings.
fn merge_item(json: &mut Json) -> Option<(Vec<u8>, Vec<u8>)> {
    let (left, right) = match json.peek()? {
        b'"' => {
            let (mut left, space) = json.spelt_string(true)?;
            let right = left.split_off(space?);
            (left, right)
        }
        b'[' => {
            json.at += 1;
            json.skip_space();
            let left = json.table_string()?;
            json.skip_space();
            json.expect(b',')?;
            json.skip_space();
            let right = json.table_string()?;
            json.skip_space();
            json.expect(b']')?;
            (left, right)
        }
        _ => return None,
    };
    (!left.is_empty() && !right.is_empty()).then_some((left, right))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"version": "1.0", "added_tokens": [{"id": 3, "content": "<s>"}],
 "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a\"[}]"}},
 "model": {"type": "BPE", "dropout": null, "vocab": {"a": 0, "b": 1, "ab": 2, "<s>": 3, "<a \u00e9>": 4},
  "merges": [["a", "b"]], "ignore_merges": false}, "extra": [1, -2.5e3, true, {"x": []}]}"#;

    #[test]
    fn the_model_is_cut_out_of_the_document() {
        let parts = model_parts(DOC).unwrap();
        let table = |id: u64, token: &[u8]| (id, Spelt::Table(token.to_vec()));
        let want = [table(0, b"a"), table(1, b"b"), table(2, b"ab"), table(3, b"<s>")];
        assert_eq!(parts.vocab[..4], want[..]);
        // A string with a character outside the byte table (the space) is kept as text, its
        // escapes decoded.
        assert_eq!(parts.vocab[4], (4, Spelt::Text("<a \u{e9}>".to_string())));
        assert_eq!(parts.merges, vec![(0, 1)]);
        let want = DOC
            .replace(r#"{"a": 0, "b": 1, "ab": 2, "<s>": 3, "<a \u00e9>": 4}"#, "{}")
            .replace(r#"[["a", "b"]]"#, "[]");
        assert_eq!(parts.skeleton, want);
    }

    #[test]
    fn merges_are_read_in_both_spellings() {
        let read = |items: &str| merge_items(items);
        let ab = (b"a".to_vec(), b"b".to_vec());
        let space_t = (b" ".to_vec(), b"t".to_vec());
        assert_eq!(read(r#"["a b", ["\u0120", "t"]]"#), Some(vec![ab.clone(), space_t]));
        assert_eq!(read(r#" [ "a\u0020b" ] "#), Some(vec![ab]));
        assert_eq!(read("[]"), Some(Vec::new()));
        for bad in [
            r#"["a"]"#,
            r#"["a b c"]"#,
            r#"["a  b"]"#,
            r#"[" b"]"#,
            r#"["a "]"#,
            r#"[["a"]]"#,
            r#"[["a", "b", "c"]]"#,
            r#"[["a b", "c"]]"#,
            r#"[["", "b"]]"#,
            r#"["a b",]"#,
            r#"[1]"#,
            r#"["a b"] x"#,
        ] {
            assert_eq!(read(bad), None, "{bad}");
        }
    }

    #[test]
    fn anything_unusual_is_left_to_python() {
        let model = |m: &str| format!(r#"{{"model": {m}}}"#);
        assert!(model_parts(&model(r#"{"vocab": {"a": 0}}"#)).is_some());
        for bad in [
            model(r#"{"merges": []}"#),
            model(r#"{"vocab": {"a": 0}, "vocab": {"a": 0}}"#),
            model(r#"{"vocab": {"a": 0}, "merges": [], "merges": []}"#),
            model(r#"{"vocab": {"a": 0}, "merges": ["a a"]}"#),
            model(r#"{"vocab": {"a": 0, "b": 1}, "merges": ["a b"]}"#),
            model(r#"{"vocab": {"a b": 0}, "merges": ["a b"]}"#),
            model(r#"{"vocab": {"": 0}}"#),
            model(r#"{"vocab": {"\ud800": 0}}"#),
            model(r#"{"vocab": []}"#),
            model("[]"),
            r#"{"model": {"vocab": {}}, "model": {"vocab": {}}}"#.to_string(),
            r#"{"\u006dodel": {"vocab": {}}}"#.to_string(),
            r#"{"model": {"vocab": {}}} x"#.to_string(),
            r#"{"model": {"vocab": {}}, "x": ]}"#.to_string(),
            "{\"model\": {\"vocab\": {}}".to_string(),
        ] {
            assert!(model_parts(&bad).is_none(), "{bad}");
        }
    }
}
