//! BPE trainer: the same merges as `superbpe.trainer.train_merges`, on compact state.
//!
//! Every unique piece is stored once as a run of u32 symbols in flat arrays, with `prev`/`next`
//! links so a merge rewrites an occurrence in O(1) even inside a whole-line SuperBPE piece. The
//! inverted index maps a pair to the *positions* where it was created (append-only, checked
//! lazily), so a merge visits only its occurrences, not whole pieces. Choosing uses a lazy max-heap
//! ordered like the python engine: highest count, then the greatest `(left bytes, right bytes)`.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::bpe;
use crate::bytesmap::{hash_short, BytesMap};
use crate::count::Counts;

const NONE: u32 = u32::MAX;
const DEAD: u32 = u32::MAX;

/// Which merged tokens may be created (see `MergeRules` in docs/DESIGN.md).
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub min_frequency: u64,
    pub max_token_bytes: Option<usize>,
    pub max_words_per_token: Option<usize>,
    pub forbidden_substrings: Vec<Vec<u8>>,
}

impl Rules {
    pub fn allows(&self, token: &[u8]) -> bool {
        if self.max_token_bytes.is_some_and(|m| token.len() > m) {
            return false;
        }
        if let Some(m) = self.max_words_per_token {
            let words = token.split(|&b| b == b' ').filter(|w| !w.is_empty()).count();
            if words > m {
                return false;
            }
        }
        !self.forbidden_substrings.iter().any(|f| memchr::memmem::find(token, f).is_some())
    }
}

#[inline]
fn pair_key(l: u32, r: u32) -> u64 {
    ((l as u64) << 32) | r as u64
}

#[inline]
fn unpack(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

/// A symbol of a piece: its token id, its neighbours (positions, NONE at the ends), its piece.
#[derive(Clone, Copy)]
struct Node {
    sym: u32,
    next: u32,
    prev: u32,
    word: u32,
}

/// A pair's weighted count and the positions where it may occur (stale ones are skipped).
#[derive(Default)]
struct PairInfo {
    count: i64,
    positions: Vec<u32>,
}

/// Hasher for pair keys: one multiply-mix of the u64 (ahash's general path cost more than the
/// lookups it serves).
#[derive(Default, Clone, Copy)]
struct PairHasher(u64);

impl std::hash::Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = hash_short(self.0 ^ b as u64);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = hash_short(key);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type PairMap = HashMap<u64, PairInfo, std::hash::BuildHasherDefault<PairHasher>>;

/// The symbol arrays and the pair table.
pub struct Trainer {
    /// One node per symbol, fields together so a merge touches one cache line per position.
    nodes: Vec<Node>,
    freq: Vec<i64>,
    pairs: PairMap,
    pub tokens: Vec<Vec<u8>>,
    /// The (left, right) token ids of merge i (token 256 + i).
    pub parts: Vec<(u32, u32)>,
    token_ids: BytesMap<u32>,
}

impl Trainer {
    /// Build the state from piece counts; pieces shorter than 2 bytes or with count 0 are dropped.
    pub fn new(counts: &Counts) -> Result<Trainer, String> {
        Trainer::with_replay(counts, &[])
    }

    /// Build the state with earlier merges already applied, in order; each keeps id 256 + its
    /// index whether or not its pair occurs. Parts must be tokens and results new (validated in
    /// Python; checked again here). Replay is lowest-rank-first BPE of each piece, in parallel
    /// (see `bpe.rs` for why that equals applying the merges one after another).
    pub fn with_replay(counts: &Counts, replay: &[(Vec<u8>, Vec<u8>)]) -> Result<Trainer, String> {
        let mut t = Trainer {
            nodes: Vec::new(),
            freq: Vec::new(),
            pairs: PairMap::default(),
            tokens: (0..=255u8).map(|b| vec![b]).collect(),
            parts: Vec::new(),
            token_ids: BytesMap::default(),
        };
        for (i, tok) in t.tokens.iter().enumerate() {
            t.token_ids.insert(tok, i as u32);
        }
        let mut ranks: HashMap<u64, (u32, u32), std::hash::BuildHasherDefault<PairHasher>> = HashMap::default();
        for (i, (lb, rb)) in replay.iter().enumerate() {
            let (Some(l), Some(r)) = (t.token_id(lb), t.token_id(rb)) else {
                return Err(format!("replay merge {i}: a part is not a token yet"));
            };
            let token = [lb.as_slice(), rb.as_slice()].concat();
            if t.token_ids.contains(&token) {
                return Err(format!("replay merge {i}: token already exists"));
            }
            let new = t.add_token(l, r, token);
            ranks.insert(pair_key(l, r), (i as u32, new));
        }
        // Piece order only changes memory layout, never the merges (pieces are independent).
        let entries: Vec<(&[u8], u64)> = counts.iter().filter(|(p, c)| p.len() >= 2 && *c > 0).collect();
        let seqs: Vec<Vec<u32>> = if ranks.is_empty() {
            Vec::new() // pieces are used as they are, below
        } else {
            entries
                .par_iter()
                .map(|(piece, _)| {
                    let ids: Vec<u32> = piece.iter().map(|&b| b as u32).collect();
                    bpe::merge(ids, |l, r| ranks.get(&pair_key(l, r)).copied())
                })
                .collect()
        };
        if seqs.is_empty() {
            t.nodes.reserve_exact(entries.iter().map(|(p, _)| p.len()).sum());
            for (piece, count) in &entries {
                t.push_piece(piece.iter().map(|&b| b as u32), piece.len(), *count)?;
            }
            return Ok(t);
        }
        let total: usize = seqs.iter().filter(|s| s.len() >= 2).map(|s| s.len()).sum();
        if total >= NONE as usize || entries.len() >= NONE as usize {
            return Err("corpus too large for the native trainer (more than 4G symbols)".into());
        }
        t.nodes.reserve_exact(total);
        for ((_, count), seq) in entries.iter().zip(&seqs) {
            if seq.len() >= 2 {
                t.push_piece(seq.iter().copied(), seq.len(), *count)?;
            }
        }
        Ok(t)
    }

    /// Append one piece's symbols (at least 2) and count its pairs.
    fn push_piece(&mut self, syms: impl Iterator<Item = u32>, len: usize, count: u64) -> Result<(), String> {
        if self.nodes.len() + len >= NONE as usize {
            return Err("corpus too large for the native trainer (more than 4G symbols)".into());
        }
        let w = self.freq.len() as u32;
        let f = i64::try_from(count).map_err(|_| "piece count too large".to_string())?;
        self.freq.push(f);
        let start = self.nodes.len() as u32;
        let mut last = NONE;
        for (k, sym) in syms.enumerate() {
            let p = start + k as u32;
            self.nodes.push(Node {
                sym,
                prev: if k == 0 { NONE } else { p - 1 },
                next: if k + 1 == len { NONE } else { p + 1 },
                word: w,
            });
            if k > 0 {
                let info = self.pairs.entry(pair_key(last, sym)).or_default();
                info.count += f;
                info.positions.push(p - 1);
            }
            last = sym;
        }
        Ok(())
    }

    /// Id of an existing token.
    pub fn token_id(&self, token: &[u8]) -> Option<u32> {
        self.token_ids.get(token).copied()
    }

    /// Add the token made by merging `l` and `r` (its bytes must be new) and return its id.
    fn add_token(&mut self, l: u32, r: u32, token: Vec<u8>) -> u32 {
        let id = self.tokens.len() as u32;
        self.parts.push((l, r));
        self.token_ids.insert(&token, id);
        self.tokens.push(token);
        id
    }

    #[inline]
    fn dec(&mut self, key: u64, f: i64) {
        if let Some(info) = self.pairs.get_mut(&key) {
            info.count -= f;
        }
    }

    #[inline]
    fn inc(&mut self, key: u64, f: i64, pos: u32, fresh: &mut Vec<u64>) {
        let info = self.pairs.entry(key).or_default();
        if info.positions.is_empty() {
            fresh.push(key);
        }
        info.count += f;
        info.positions.push(pos);
    }

    /// Replace every non-overlapping (l, r) occurrence, left to right within each piece, by
    /// `new`; returns the pairs containing `new` that now have a positive count.
    fn merge(&mut self, l: u32, r: u32, new: u32) -> Vec<u64> {
        let key = pair_key(l, r);
        let mut positions = match self.pairs.get_mut(&key) {
            Some(info) => std::mem::take(&mut info.positions),
            None => return Vec::new(),
        };
        if !positions.is_sorted() {
            positions.sort_unstable();
        }
        positions.dedup();
        let mut fresh = Vec::new();
        for &p in &positions {
            let pu = p as usize;
            let node = self.nodes[pu];
            if node.sym != l || node.next == NONE {
                continue;
            }
            let q = node.next;
            let qnode = self.nodes[q as usize];
            if qnode.sym != r {
                continue;
            }
            let f = self.freq[node.word as usize];
            let b = node.prev;
            if b != NONE {
                let bs = self.nodes[b as usize].sym;
                self.dec(pair_key(bs, l), f);
                self.inc(pair_key(bs, new), f, b, &mut fresh);
            }
            let a = qnode.next;
            if a != NONE {
                let as_ = self.nodes[a as usize].sym;
                self.dec(pair_key(r, as_), f);
                self.inc(pair_key(new, as_), f, p, &mut fresh);
                self.nodes[a as usize].prev = p;
            }
            self.nodes[pu].sym = new;
            self.nodes[pu].next = a;
            self.nodes[q as usize].sym = DEAD;
        }
        self.pairs.remove(&key);
        fresh.retain(|k| match self.pairs.get(k) {
            Some(info) if info.count > 0 => true,
            _ => {
                self.pairs.remove(k);
                false
            }
        });
        fresh
    }

    fn count_of(&self, key: u64) -> i64 {
        self.pairs.get(&key).map_or(0, |i| i.count)
    }

    /// Choose merges until `num_merges` tokens were merged in total (replayed ones included),
    /// no pair qualifies, or `callback` (called every `every` chosen merges with the number of
    /// merges so far) returns `Ok(true)`. Returns the chosen merges as token ids and whether the
    /// callback stopped the run.
    pub fn choose<E>(
        &mut self,
        num_merges: usize,
        rules: &Rules,
        every: usize,
        mut callback: impl FnMut(&Trainer) -> Result<bool, E>,
    ) -> Result<bool, E> {
        let mut heap = Heap::default();
        for (&k, info) in &self.pairs {
            if info.count > 0 {
                heap.v.push(Entry { count: info.count, key: k });
            }
        }
        heap.heapify(&self.tokens);
        let mut chosen = 0usize;
        while self.tokens.len() - 256 < num_merges {
            let Some(top) = heap.peek() else { break };
            let actual = self.count_of(top.key);
            if actual != top.count {
                if actual > 0 {
                    heap.replace_top(Entry { count: actual, key: top.key }, &self.tokens);
                } else {
                    heap.pop(&self.tokens);
                }
                continue;
            }
            if (actual as u64) < rules.min_frequency {
                break;
            }
            heap.pop(&self.tokens);
            let (l, r) = unpack(top.key);
            let token = [self.tokens[l as usize].as_slice(), &self.tokens[r as usize]].concat();
            if self.token_ids.contains(&token) || !rules.allows(&token) {
                continue;
            }
            let new = self.add_token(l, r, token);
            for k in self.merge(l, r, new) {
                heap.push(Entry { count: self.count_of(k), key: k }, &self.tokens);
            }
            chosen += 1;
            if chosen.is_multiple_of(every) && callback(self)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The merges so far as byte pairs, in order.
    pub fn merges(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.merges_from(0)
    }

    /// The merges after the first `start` (none if there are fewer), without walking the skipped ones.
    pub fn merges_from(&self, start: usize) -> impl Iterator<Item = (&[u8], &[u8])> {
        let rest = self.parts.get(start..).unwrap_or(&[]);
        rest.iter().map(|&(l, r)| (self.tokens[l as usize].as_slice(), self.tokens[r as usize].as_slice()))
    }
}

/// A heap entry: count bound and pair key.
#[derive(Clone, Copy, Debug)]
struct Entry {
    count: i64,
    key: u64,
}

/// Binary max-heap whose order needs the token bytes (for the tie-break), so it is hand-rolled.
#[derive(Default)]
struct Heap {
    v: Vec<Entry>,
}

#[inline]
fn better(a: &Entry, b: &Entry, tokens: &[Vec<u8>]) -> bool {
    if a.count != b.count {
        return a.count > b.count;
    }
    let (al, ar) = unpack(a.key);
    let (bl, br) = unpack(b.key);
    (&tokens[al as usize], &tokens[ar as usize]) > (&tokens[bl as usize], &tokens[br as usize])
}

impl Heap {
    fn peek(&self) -> Option<Entry> {
        self.v.first().copied()
    }

    fn heapify(&mut self, tokens: &[Vec<u8>]) {
        for i in (0..self.v.len() / 2).rev() {
            self.sift_down(i, tokens);
        }
    }

    fn push(&mut self, e: Entry, tokens: &[Vec<u8>]) {
        self.v.push(e);
        let mut i = self.v.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if better(&self.v[i], &self.v[parent], tokens) {
                self.v.swap(i, parent);
                i = parent;
            } else {
                break;
            }
        }
    }

    fn pop(&mut self, tokens: &[Vec<u8>]) {
        let last = self.v.pop();
        if let (Some(last), false) = (last, self.v.is_empty()) {
            self.v[0] = last;
            self.sift_down(0, tokens);
        }
    }

    fn replace_top(&mut self, e: Entry, tokens: &[Vec<u8>]) {
        self.v[0] = e;
        self.sift_down(0, tokens);
    }

    fn sift_down(&mut self, mut i: usize, tokens: &[Vec<u8>]) {
        let n = self.v.len();
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && better(&self.v[r], &self.v[l], tokens) { r } else { l };
            if better(&self.v[c], &self.v[i], tokens) {
                self.v.swap(c, i);
                i = c;
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(items: &[(&str, u64)]) -> Counts {
        let mut c = Counts::default();
        for (p, n) in items {
            c.add(p.as_bytes(), *n).unwrap();
        }
        c
    }

    fn train(items: &[(&str, u64)], n: usize, rules: &Rules) -> Vec<Vec<u8>> {
        let mut t = Trainer::new(&counts(items)).unwrap();
        t.choose(n, rules, 1000, |_| Ok::<_, ()>(false)).unwrap();
        t.merges().map(|(l, r)| [l, r].concat()).collect()
    }

    #[test]
    fn highest_count_then_greatest_bytes() {
        let rules = Rules { min_frequency: 1, ..Default::default() };
        // "ab" and "cd" tie at 5: (c, d) is greater than (a, b).
        let m = train(&[("ab", 5), ("cd", 5), ("xyz", 1)], 2, &rules);
        assert_eq!(m, vec![b"cd".to_vec(), b"ab".to_vec()]);
    }

    #[test]
    fn overlapping_pairs_merge_left_to_right() {
        let rules = Rules { min_frequency: 1, ..Default::default() };
        let m = train(&[("aaaaa", 1)], 3, &rules);
        assert_eq!(m, vec![b"aa".to_vec(), b"aaaa".to_vec(), b"aaaaa".to_vec()]);
    }

    #[test]
    fn rules_skip_tokens_without_costing_ids() {
        let rules = Rules { min_frequency: 1, max_token_bytes: Some(2), ..Default::default() };
        let m = train(&[("abc", 10), ("xy", 1)], 5, &rules);
        assert_eq!(m, vec![b"bc".to_vec(), b"xy".to_vec()]);
        let words = Rules { min_frequency: 1, max_words_per_token: Some(1), ..Default::default() };
        assert!(!words.allows(b"a b"));
        assert!(words.allows(b" ab "));
    }

    #[test]
    fn min_frequency_stops() {
        let rules = Rules { min_frequency: 3, ..Default::default() };
        assert_eq!(train(&[("ab", 5), ("cd", 2)], 10, &rules), vec![b"ab".to_vec()]);
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;

    /// Replay through per-piece BPE must equal choosing the same merges one by one.
    #[test]
    fn replay_equals_sequential_merging() {
        let mut c = Counts::default();
        for (p, n) in [("aaaaaa", 3), ("abababa", 2), ("banana band", 4), ("a", 9), ("xyz", 1)] {
            c.add(p.as_bytes(), n).unwrap();
        }
        let rules = Rules { min_frequency: 1, ..Default::default() };
        let mut full = Trainer::new(&c).unwrap();
        full.choose(12, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        let all: Vec<(Vec<u8>, Vec<u8>)> = full.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
        for cut in 0..=all.len() {
            let mut t = Trainer::with_replay(&c, &all[..cut]).unwrap();
            t.choose(12, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            let got: Vec<(Vec<u8>, Vec<u8>)> = t.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
            assert_eq!(got, all, "replaying {cut} merges");
        }
    }
}
