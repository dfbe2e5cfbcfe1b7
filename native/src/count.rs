//! Pre-tokenize and count pieces in parallel.
//!
//! Text is cut into work units at special tokens, document boundaries and, when the splitter
//! allows it, at safe cuts, so the pieces (and counts) never depend on thread count or chunk
//! size. Each rayon worker counts into hash tables whose keys borrow the input (no allocation per
//! piece); the tables are sharded by hash so the final merge into owned keys runs shard-parallel
//! instead of as one long serial tail.

use hashbrown::HashTable;
use rayon::prelude::*;

use crate::bytesmap::{bytes_eq, hash_short, pack_short, unpack_short, SHORT_MAX};
use crate::scan::Splitter;
use crate::specials::Specials;
use crate::unicode::{class_at, WS};

/// Number of hash shards (a power of two); the top bits of a key's hash pick its shard.
pub const SHARDS: usize = 64;
const SHARD_SHIFT: u32 = 64 - SHARDS.trailing_zeros();

/// Fixed seeds: the same bytes hash the same in every table, so hashes can be reused on merge.
fn hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(0x5EED_0001, 0x5EED_0002, 0x5EED_0003, 0x5EED_0004)
}

#[inline]
pub fn hash_bytes(state: &ahash::RandomState, key: &[u8]) -> u64 {
    state.hash_one(key)
}

#[inline]
fn shard_of(hash: u64) -> usize {
    (hash >> SHARD_SHIFT) as usize
}

/// One shard of owned counts: (hash, piece, count).
pub type OwnedShard = HashTable<(u64, Box<[u8]>, u64)>;
/// One shard of counts borrowing the text: (hash, piece, count).
type BorrowedShard<'a> = HashTable<(u64, &'a [u8], u64)>;

/// Counts whose keys borrow the text being counted.
struct LocalCounts<'a> {
    state: ahash::RandomState,
    /// Pieces of at most [`SHORT_MAX`] bytes, packed into the key itself: no pointer chase and a
    /// one-word comparison for the pieces that make up most of natural text.
    short: HashTable<(u64, u64)>,
    /// Longer pieces, keyed by a slice of the text, sharded like [`Counts`].
    shards: Vec<BorrowedShard<'a>>,
}

impl<'a> LocalCounts<'a> {
    fn new() -> Self {
        LocalCounts {
            state: hasher(),
            short: HashTable::new(),
            shards: (0..SHARDS).map(|_| HashTable::new()).collect(),
        }
    }

    #[inline(always)]
    fn add(&mut self, piece: &'a [u8]) {
        if piece.len() <= SHORT_MAX {
            let key = pack_short(piece);
            let h = hash_short(key);
            match self.short.find_mut(h, |e| e.0 == key) {
                Some(e) => e.1 += 1,
                None => {
                    self.short.insert_unique(h, (key, 1), |e| hash_short(e.0));
                }
            }
            return;
        }
        let h = hash_bytes(&self.state, piece);
        let table = &mut self.shards[shard_of(h)];
        match table.find_mut(h, |e| e.0 == h && bytes_eq(e.1, piece)) {
            Some(e) => e.2 += 1,
            None => {
                table.insert_unique(h, (h, piece, 1), |e| e.0);
            }
        }
    }
}

/// Owned piece counts, sharded by hash. Keys are unique across shards.
pub struct Counts {
    state: ahash::RandomState,
    pub shards: Vec<OwnedShard>,
}

impl Default for Counts {
    fn default() -> Self {
        Counts { state: hasher(), shards: (0..SHARDS).map(|_| HashTable::new()).collect() }
    }
}

impl Counts {
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn total(&self) -> u128 {
        self.iter().map(|(_, c)| c as u128).sum()
    }

    /// Add `count` to `piece` (copying the key on first sight).
    pub fn add(&mut self, piece: &[u8], count: u64) -> Result<(), String> {
        let h = hash_bytes(&self.state, piece);
        add_hashed(&mut self.shards[shard_of(h)], h, piece, count)
    }

    pub fn get(&self, piece: &[u8]) -> u64 {
        let h = hash_bytes(&self.state, piece);
        self.shards[shard_of(h)].find(h, |e| &*e.1 == piece).map_or(0, |e| e.2)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u64)> {
        self.shards.iter().flat_map(|s| s.iter().map(|e| (&*e.1, e.2)))
    }

    /// Entries sorted by bytes (the `.counts` file order).
    pub fn sorted(&self) -> Vec<(&[u8], u64)> {
        let mut v: Vec<(&[u8], u64)> = self.iter().collect();
        v.par_sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// Add all of `other` into `self`, shard by shard in parallel.
    pub fn merge(&mut self, other: &Counts) -> Result<(), String> {
        self.shards.par_iter_mut().zip(other.shards.par_iter()).try_for_each(|(mine, theirs)| {
            for (h, k, c) in theirs.iter() {
                add_hashed(mine, *h, k, *c)?;
            }
            Ok(())
        })
    }

    fn absorb(&mut self, locals: Vec<LocalCounts<'_>>) -> Result<(), String> {
        let mut by_shard: Vec<Vec<BorrowedShard<'_>>> = (0..SHARDS).map(|_| Vec::new()).collect();
        let mut short_by_shard: Vec<Vec<(u64, u64, u64)>> = (0..SHARDS).map(|_| Vec::new()).collect();
        for local in locals {
            for (key, count) in local.short {
                let (buf, len) = unpack_short(key);
                let h = hash_bytes(&self.state, &buf[..len]);
                short_by_shard[shard_of(h)].push((h, key, count));
            }
            for (i, table) in local.shards.into_iter().enumerate() {
                by_shard[i].push(table);
            }
        }
        self.shards.par_iter_mut().zip(by_shard.into_par_iter().zip(short_by_shard)).try_for_each(
            |(mine, (tables, shorts))| {
                for (h, key, c) in shorts {
                    let (buf, len) = unpack_short(key);
                    add_hashed(mine, h, &buf[..len], c)?;
                }
                for table in tables {
                    for (h, k, c) in table {
                        add_hashed(mine, h, k, c)?;
                    }
                }
                Ok(())
            },
        )
    }
}

#[inline]
fn add_hashed(table: &mut OwnedShard, h: u64, piece: &[u8], count: u64) -> Result<(), String> {
    match table.find_mut(h, |e| &*e.1 == piece) {
        Some(e) => {
            e.2 = e.2.checked_add(count).ok_or_else(|| "piece count overflows 64 bits".to_string())?;
        }
        None => {
            table.insert_unique(h, (h, piece.into(), count), |e| e.0);
        }
    }
    Ok(())
}

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

/// The first cut at or after `from` (not at 0 or the end) in `seg` that cannot change pieces:
/// after any "\n" with line units, else after a "\n" that is not the end of a longer whitespace
/// run (see [`ws_before`]) and before a non-space that is not "/" (o200k's `[\r\n/]*` tail
/// would carry a piece such as " .\n/" across the cut). Only valid when `splitter.cuttable()`.
fn next_cut(splitter: &Splitter, seg: &[u8], from: usize) -> Option<usize> {
    let line_units = splitter.line_units();
    let mut p = from.max(1) - 1;
    while let Some(off) = memchr::memchr(b'\n', &seg[p..]) {
        let cut = p + off + 1;
        if cut >= seg.len() {
            return None;
        }
        if line_units || (seg[cut] != b'/' && class_at(seg, cut).0 != WS && !ws_before(seg, cut - 1)) {
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

/// How a corpus is pre-tokenized: the splitter plus the special tokens.
pub struct CountSpec {
    pub splitter: Splitter,
    pub specials: Specials,
    pub chunk_bytes: usize,
}

impl CountSpec {
    /// Cut the ordinary (non-special) text of `docs` into work units of about `chunk_bytes`.
    fn units<'a>(&self, docs: &[&'a [u8]]) -> Vec<Vec<&'a [u8]>> {
        let target = self.chunk_bytes.max(1);
        let cuttable = self.splitter.cuttable();
        let mut units: Vec<Vec<&'a [u8]>> = Vec::new();
        let mut current: Vec<&'a [u8]> = Vec::new();
        let mut size = 0;
        for doc in docs {
            self.specials.ordinary(doc, |mut seg: &'a [u8]| {
                while cuttable && seg.len() > target {
                    match next_cut(&self.splitter, seg, target) {
                        Some(cut) => {
                            let (head, tail) = seg.split_at(cut);
                            current.push(head);
                            units.push(std::mem::take(&mut current));
                            size = 0;
                            seg = tail;
                        }
                        None => break,
                    }
                }
                current.push(seg);
                size += seg.len();
                if size >= target {
                    units.push(std::mem::take(&mut current));
                    size = 0;
                }
            });
        }
        if !current.is_empty() {
            units.push(current);
        }
        units
    }

    /// Count the pieces of independent documents (files, JSON lines) into `into`.
    pub fn count_docs(&self, docs: &[&[u8]], into: &mut Counts) -> Result<(), String> {
        let units = self.units(docs);
        let locals: Vec<LocalCounts<'_>> = units
            .par_iter()
            .try_fold(LocalCounts::new, |mut local, unit| {
                for seg in unit {
                    self.splitter.split(seg, &mut |piece| local.add(piece))?;
                }
                Ok::<_, String>(local)
            })
            .collect::<Result<_, _>>()?;
        into.absorb(locals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{builtin_pattern, Builtin};

    fn spec(b: Builtin, line_units: bool, specials: &[&str], chunk: usize) -> CountSpec {
        CountSpec {
            splitter: Splitter::new(&builtin_pattern(b), line_units).unwrap(),
            specials: Specials::new(&specials.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>()),
            chunk_bytes: chunk,
        }
    }

    fn count(s: &CountSpec, text: &str) -> Vec<(Vec<u8>, u64)> {
        let mut c = Counts::default();
        s.count_docs(&[text.as_bytes()], &mut c).unwrap();
        c.sorted().into_iter().map(|(k, v)| (k.to_vec(), v)).collect()
    }

    #[test]
    fn counts_do_not_depend_on_chunk_size() {
        let text = "Hello world.\nHello  there\n  indented\nx<|e|>y world\n\nHello \nA\u{3000}\nB .\n//x\n".repeat(37);
        for b in crate::scan::ALL_BUILTINS {
            let big = count(&spec(b, b == Builtin::Superbpe, &["<|e|>"], 1 << 20), &text);
            for chunk in [1, 2, 7, 64, 300] {
                assert_eq!(count(&spec(b, b == Builtin::Superbpe, &["<|e|>"], chunk), &text), big, "{b:?} {chunk}");
            }
        }
    }

    #[test]
    fn specials_are_not_counted() {
        let got = count(&spec(Builtin::Gpt2, false, &["<|e|>"], 100), "a<|e|>a");
        assert_eq!(got, vec![(b"a".to_vec(), 2)]);
    }
}
