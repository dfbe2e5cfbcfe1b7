//! BPE trainer: the same merges as `superbpe.trainer.train_merges`, on compact state.
//!
//! Every unique piece is stored once as a run of u32 symbols in flat arrays, with `prev`/`next`
//! links so a merge rewrites an occurrence in O(1) even inside a whole-line SuperBPE piece. The
//! inverted index maps a pair to the *positions* where it was created (append-only, checked
//! lazily), so a merge visits only its occurrences, not whole pieces. Choosing uses a lazy max-heap
//! ordered like the python engine: highest count, then the greatest `(left bytes, right bytes)`.

use std::collections::HashMap;

use rayon::prelude::*;
use smallvec::SmallVec;

use crate::bytesmap::{hash_short, BytesMap};
use crate::count::{prefetch, Counts};
use crate::replay::{replay_all, Joins, Ranks, ReplayChunk, MAX_REPLAY};

const NONE: u32 = u32::MAX;
const DEAD: u32 = u32::MAX;

/// Which merged tokens may be created, and how the official recipe's choices are made (see
/// `MergeRules` in docs/DESIGN.md and `superbpe.compat`).
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub min_frequency: u64,
    pub max_token_bytes: Option<usize>,
    pub max_words_per_token: Option<usize>,
    pub forbidden_substrings: Vec<Vec<u8>>,
    /// Count ties go to the lowest (left, right) in HF's id order instead of the greatest bytes.
    pub tie_break_ids: bool,
    /// A chosen pair whose token exists is merged and recorded (no new id) instead of skipped.
    pub merge_duplicates: bool,
    /// A replayed merge whose pair never occurs (or whose part was dropped) is left out.
    pub drop_absent: bool,
}

impl Rules {
    /// Whether training must follow HF's bookkeeping (then every pair stays warm, see `with_rules`).
    fn official(&self) -> bool {
        self.tie_break_ids || self.merge_duplicates || self.drop_absent
    }
}

/// The tie-break key of a token for `Rules::tie_break_ids`: HF numbers the bytes by their GPT-2
/// byte-to-unicode character, then each new token in order; the key is big-endian and reversed so
/// the heap's "greatest key wins" picks the lowest ids.
fn hf_tie_key(id: usize) -> Vec<u8> {
    let rank = if id < 256 { byte_table_char(id as u8) } else { 0x144 + (id as u32 - 256) };
    (u32::MAX - rank).to_be_bytes().to_vec()
}

/// The code point GPT-2's byte-to-unicode table gives byte `b`: printable Latin-1 bytes keep
/// theirs, the other 68 get 256, 257, ... in byte order.
fn byte_table_char(b: u8) -> u32 {
    let visible = |x: u8| (0x21..=0x7E).contains(&x) || (0xA1..=0xAC).contains(&x) || x >= 0xAE;
    if visible(b) {
        b as u32
    } else {
        256 + (0..b).filter(|&x| !visible(x)).count() as u32
    }
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
pub(crate) fn pair_key(l: u32, r: u32) -> u64 {
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

impl Node {
    /// Symbol `k` of a piece of `len` symbols whose first node is at `start`, linked to its neighbours.
    #[inline(always)]
    fn linked(sym: u32, start: u32, k: usize, len: usize, word: u32) -> Node {
        let p = start + k as u32;
        Node { sym, prev: if k == 0 { NONE } else { p - 1 }, next: if k + 1 == len { NONE } else { p + 1 }, word }
    }
}

/// A pair's weighted count and the positions where it may occur (stale ones are skipped): those
/// of the initial state are `Trainer::initial[first..first + len]`, later ones are `positions`.
/// (Most pairs are never merged; one shared array spares them an allocation each.)
#[derive(Default)]
struct PairInfo {
    count: i64,
    first: u32,
    len: u32,
    /// Most pairs made by merges occur a few times only: up to four positions live in the entry
    /// itself, sparing an allocation (and its release) per pair.
    positions: SmallVec<[u32; 4]>,
}

/// Hasher for pair keys: one multiply-mix of the u64 (ahash's general path cost more than the
/// lookups it serves).
#[derive(Default, Clone, Copy)]
pub struct PairHasher(u64);

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

/// Digits of the radix sort: 11 bits keeps the 2048 write streams of a pass in cache.
const DIGIT: u32 = 11;
const BUCKETS: usize = 1 << DIGIT;

/// Where the destination of `radix_sort`'s scatter starts, shared by the threads that fill
/// disjoint slots of it.
struct Slots(*mut (u64, u64));
// SAFETY: every thread writes only the slots its own bucket offsets reserve (see `radix_sort`).
unsafe impl Sync for Slots {}

impl Slots {
    /// # Safety
    /// `i` is within the destination and no other thread writes slot `i`.
    #[inline(always)]
    unsafe fn put(&self, i: usize, item: (u64, u64)) {
        // SAFETY: as the caller promises.
        unsafe { *self.0.add(i) = item };
    }
}

/// Stable LSD radix sort of `(key, value)` items by key (below `1 << key_bits`). Items travel
/// together (one write stream per bucket, not two); each pass counts and scatters consecutive
/// parts of the input on parallel threads.
fn radix_sort(items: &mut Vec<(u64, u64)>, key_bits: u32) {
    let parts = if items.len() < 1 << 16 { 1 } else { rayon::current_num_threads().clamp(1, 8) };
    radix_sort_in_parts(items, key_bits, parts);
}

fn radix_sort_in_parts(items: &mut Vec<(u64, u64)>, key_bits: u32, parts: usize) {
    let n = items.len();
    let part_len = n.div_ceil(parts).max(1);
    let mut other: Vec<(u64, u64)> = vec![(0, 0); n];
    let mut shift = 0;
    while shift < key_bits {
        let digit = |key: u64| (key >> shift) as usize & (BUCKETS - 1);
        let mut offsets: Vec<[usize; BUCKETS]> = items
            .par_chunks(part_len)
            .map(|part| {
                let mut counts = [0usize; BUCKETS];
                for &(k, _) in part {
                    counts[digit(k)] += 1;
                }
                counts
            })
            .collect();
        // Each part's first slot per digit: digits in order, and parts in order within a digit.
        let mut sum = 0;
        for d in 0..BUCKETS {
            for part in offsets.iter_mut() {
                (part[d], sum) = (sum, sum + part[d]);
            }
        }
        let out = Slots(other.as_mut_ptr());
        items.par_chunks(part_len).zip(offsets.par_iter_mut()).for_each(|(part, offsets)| {
            for &item in part {
                let d = digit(item.0);
                // SAFETY: the slot is below n and reserved for this part and digit alone.
                unsafe { out.put(offsets[d], item) };
                offsets[d] += 1;
            }
        });
        std::mem::swap(items, &mut other);
        shift += DIGIT;
    }
}

/// The number of pairs kept warm when a state has many (see `cold_threshold`).
pub const WARM_PAIRS: usize = 1 << 16;

/// Pairs below this count start cold (see `Trainer::cold_below`): keep about the busiest
/// `warm_pairs` warm. A merge list rarely reaches that far down, and if it does, a thaw costs one
/// re-index of the pairs.
fn cold_threshold(runs: &[(u64, u32, u32, i64)], warm_pairs: usize) -> i64 {
    let warm_pairs = warm_pairs.max(1);
    if runs.len() <= warm_pairs.saturating_mul(2) {
        return 0;
    }
    let mut counts: Vec<i64> = runs.iter().map(|run| run.3).collect();
    let k = counts.len() - warm_pairs;
    *counts.select_nth_unstable(k).1
}

fn distinct_runs(sorted: &[(u64, u64)]) -> usize {
    sorted.windows(2).filter(|w| w[0].0 != w[1].0).count() + usize::from(!sorted.is_empty())
}

/// How many occurrences ahead `merge` asks for the piece count (and twice that for the node).
const PREFETCH_AHEAD: usize = 8;

/// The symbol arrays and the pair table.
pub struct Trainer {
    /// One node per symbol, fields together so a merge touches one cache line per position.
    nodes: Vec<Node>,
    freq: Vec<i64>,
    pairs: PairMap,
    /// While a merge runs with cold pairs about, the pairs it creates gather here (a small table
    /// that stays in cache) and only the warm ones move into `pairs` (see `merge`).
    created: PairMap,
    /// Every pair's initial positions, grouped by pair (see `PairInfo`).
    initial: Vec<u32>,
    /// Pairs counted below this are cold: kept out of `pairs` and the heap, those of the initial
    /// state and those a merge creates alike (most pairs of whole-line pieces are rare). A pair's
    /// count only grows in the merge that makes the later of its two tokens, so a cold pair stays
    /// below `cold_below`, and cannot be the best until the best count falls below that; then
    /// `thaw` re-indexes every pair. 0 when all pairs are warm.
    cold_below: i64,
    pub tokens: Vec<Vec<u8>>,
    /// The (left, right) token ids of merge i (token 256 + i).
    pub parts: Vec<(u32, u32)>,
    token_ids: BytesMap<u32>,
    /// Tie-break keys per token when ties go by HF ids (`Rules::tie_break_ids`), else None.
    hf_keys: Option<Vec<Vec<u8>>>,
}

impl Trainer {
    /// Build the state from piece counts; pieces shorter than 2 bytes or with count 0 are dropped.
    pub fn new(counts: &Counts) -> Result<Trainer, String> {
        Trainer::with_replay(counts, &[])
    }

    /// `with_replay`, or for the official recipe's rules (`Rules::official`) the replay HF does:
    /// merge by merge on a table of every pair, leaving out absent merges when `drop_absent`.
    pub fn with_rules(counts: &Counts, replay: &[(Vec<u8>, Vec<u8>)], rules: &Rules) -> Result<Trainer, String> {
        if !rules.official() {
            return Trainer::with_replay(counts, replay);
        }
        // All pairs warm: a pair is in `pairs` from when it occurs until it is merged (as in HF's
        // queue, which `drop_absent` asks about), and a duplicate merge adds to existing pairs.
        let mut t = Trainer::with_replay_warm(counts, &[], usize::MAX)?;
        t.replay_one_by_one(replay, rules.drop_absent)?;
        Ok(t)
    }

    /// Apply earlier merges in order through `merge`, as HF's extend step does.
    fn replay_one_by_one(&mut self, replay: &[(Vec<u8>, Vec<u8>)], drop_absent: bool) -> Result<(), String> {
        for (i, (lb, rb)) in replay.iter().enumerate() {
            let (Some(l), Some(r)) = (self.token_id(lb), self.token_id(rb)) else {
                if drop_absent {
                    continue;
                }
                return Err(format!("replay merge {i}: a part is not a token yet"));
            };
            if drop_absent && !self.pairs.contains_key(&pair_key(l, r)) {
                continue;
            }
            let token = [lb.as_slice(), rb.as_slice()].concat();
            if self.token_ids.contains(&token) {
                return Err(format!("replay merge {i}: token already exists"));
            }
            let new = self.add_token(l, r, token);
            self.merge(l, r, new);
        }
        Ok(())
    }

    /// Build the state with earlier merges already applied, in order; each keeps id 256 + its
    /// index whether or not its pair occurs. Parts must be tokens and results new (validated in
    /// Python; checked again here). Replay is lowest-rank-first BPE of each piece, in parallel
    /// (see `bpe.rs` for why that equals applying the merges one after another).
    pub fn with_replay(counts: &Counts, replay: &[(Vec<u8>, Vec<u8>)]) -> Result<Trainer, String> {
        Trainer::with_replay_warm(counts, replay, WARM_PAIRS)
    }

    /// `with_replay`, keeping about `warm_pairs` pairs warm (tests use tiny values to exercise thawing).
    pub(crate) fn with_replay_warm(
        counts: &Counts,
        replay: &[(Vec<u8>, Vec<u8>)],
        warm_pairs: usize,
    ) -> Result<Trainer, String> {
        let mut t = Trainer {
            nodes: Vec::new(),
            freq: Vec::new(),
            pairs: PairMap::default(),
            created: PairMap::default(),
            initial: Vec::new(),
            cold_below: 0,
            tokens: (0..=255u8).map(|b| vec![b]).collect(),
            parts: Vec::new(),
            token_ids: BytesMap::default(),
            hf_keys: None,
        };
        for (i, tok) in t.tokens.iter().enumerate() {
            t.token_ids.insert(tok, i as u32);
        }
        if replay.len() > MAX_REPLAY {
            return Err(format!("{} merges to replay; the native trainer takes at most {MAX_REPLAY}", replay.len()));
        }
        let mut ranks = Ranks::default();
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
        if ranks.is_empty() {
            t.nodes.reserve_exact(entries.iter().map(|(p, _)| p.len()).sum());
            for (piece, count) in &entries {
                t.push_piece(piece.iter().map(|&b| b as u32), piece.len(), *count)?;
            }
        } else {
            let chunks = replay_all(&entries, &ranks, &Joins::of(replay));
            t.push_replayed(&entries, &chunks)?;
        }
        t.index_pairs(warm_pairs);
        Ok(t)
    }

    /// Lay out the replayed pieces (those of at least 2 symbols) as linked nodes, chunks in
    /// parallel: each chunk's first node and piece follow from the sizes of the chunks before it.
    fn push_replayed(&mut self, entries: &[(&[u8], u64)], chunks: &[ReplayChunk]) -> Result<(), String> {
        let sizes: Vec<(usize, usize)> = chunks
            .iter()
            .map(|c| c.lens.iter().filter(|&&len| len >= 2).fold((0, 0), |(n, w), &len| (n + len as usize, w + 1)))
            .collect();
        let (total_nodes, total_pieces) = sizes.iter().fold((0, 0), |(n, w), s| (n + s.0, w + s.1));
        if total_nodes >= NONE as usize || total_pieces >= NONE as usize {
            return Err("corpus too large for the native trainer (more than 4G symbols)".into());
        }
        if entries.iter().any(|&(_, count)| i64::try_from(count).is_err()) {
            return Err("piece count too large".into());
        }
        self.nodes = Vec::with_capacity(total_nodes);
        self.freq = Vec::with_capacity(total_pieces);
        let mut node_slots = &mut self.nodes.spare_capacity_mut()[..total_nodes];
        let mut freq_slots = &mut self.freq.spare_capacity_mut()[..total_pieces];
        let mut jobs = Vec::with_capacity(chunks.len());
        let (mut first_node, mut first_piece) = (0usize, 0usize);
        for (chunk, &(n, w)) in chunks.iter().zip(&sizes) {
            let (nodes, rest) = std::mem::take(&mut node_slots).split_at_mut(n);
            node_slots = rest;
            let (freq, rest) = std::mem::take(&mut freq_slots).split_at_mut(w);
            freq_slots = rest;
            jobs.push((chunk, nodes, freq, first_node, first_piece));
            (first_node, first_piece) = (first_node + n, first_piece + w);
        }
        jobs.into_par_iter().for_each(|(chunk, nodes, freq, first_node, first_piece)| {
            let (mut at, mut node, mut piece) = (0, 0, 0);
            for (&(_, count), &len) in entries[chunk.first..].iter().zip(&chunk.lens) {
                let len = len as usize;
                if len >= 2 {
                    freq[piece].write(count as i64);
                    let (w, start) = ((first_piece + piece) as u32, (first_node + node) as u32);
                    for (k, &sym) in chunk.syms[at..at + len].iter().enumerate() {
                        nodes[node + k].write(Node::linked(sym, start, k, len, w));
                    }
                    (node, piece) = (node + len, piece + 1);
                }
                at += len;
            }
        });
        // SAFETY: the jobs wrote every slot below the totals (each chunk exactly its own sizes).
        unsafe {
            self.nodes.set_len(total_nodes);
            self.freq.set_len(total_pieces);
        }
        Ok(())
    }

    /// Append one piece's symbols (at least 2) as linked nodes; pairs are counted afterwards.
    fn push_piece(&mut self, syms: impl Iterator<Item = u32>, len: usize, count: u64) -> Result<(), String> {
        if self.nodes.len() + len >= NONE as usize || self.freq.len() >= NONE as usize {
            return Err("corpus too large for the native trainer (more than 4G symbols)".into());
        }
        let w = self.freq.len() as u32;
        let f = i64::try_from(count).map_err(|_| "piece count too large".to_string())?;
        self.freq.push(f);
        let start = self.nodes.len() as u32;
        for (k, sym) in syms.enumerate() {
            self.nodes.push(Node::linked(sym, start, k, len, w));
        }
        Ok(())
    }

    /// Build the pair table from the nodes (into an empty `pairs`): every adjacent pair,
    /// radix-sorted by key so each pair's table entry is made once with its positions ascending
    /// (inserting occurrence by occurrence into the hash map cost a cache miss each and dominated
    /// SuperBPE's stage 2). Pairs below the threshold for `warm_pairs` stay out (cold).
    fn index_pairs(&mut self, warm_pairs: usize) {
        let bits = 64 - (self.tokens.len() as u64).leading_zeros();
        // The piece rides along with each position, so counting needs no lookup in `nodes`.
        let mut items: Vec<(u64, u64)> = Vec::with_capacity(self.nodes.len());
        for (p, node) in self.nodes.iter().enumerate() {
            if node.next != NONE && node.sym != DEAD {
                let key = (node.sym as u64) << bits | self.nodes[node.next as usize].sym as u64;
                items.push((key, (node.word as u64) << 32 | p as u64));
            }
        }
        radix_sort(&mut items, 2 * bits);
        let mut runs: Vec<(u64, u32, u32, i64)> = Vec::with_capacity(distinct_runs(&items));
        let mut i = 0;
        while i < items.len() {
            let key = items[i].0;
            let mut j = i;
            let mut count = 0i64;
            while j < items.len() && items[j].0 == key {
                count += self.freq[(items[j].1 >> 32) as usize];
                j += 1;
            }
            let (l, r) = (key >> bits, key & ((1 << bits) - 1));
            runs.push((pair_key(l as u32, r as u32), i as u32, (j - i) as u32, count));
            i = j;
        }
        self.cold_below = cold_threshold(&runs, warm_pairs);
        self.pairs.reserve(runs.iter().filter(|run| run.3 >= self.cold_below).count());
        for (key, first, len, count) in runs {
            if count >= self.cold_below {
                self.pairs.insert(key, PairInfo { count, first, len, positions: SmallVec::new() });
            }
        }
        self.initial = items.into_iter().map(|(_, place)| place as u32).collect();
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
        if let Some(keys) = &mut self.hf_keys {
            keys.push(hf_tie_key(id as usize));
        }
        id
    }

    /// What the heap orders equal counts by: token bytes, or HF id keys (`Rules::tie_break_ids`).
    fn tie_keys(&self) -> &[Vec<u8>] {
        self.hf_keys.as_deref().unwrap_or(&self.tokens)
    }

    /// The heap of every warm pair that occurs.
    fn full_heap(&self) -> Heap {
        let mut heap = Heap::default();
        for (&k, info) in &self.pairs {
            if info.count > 0 {
                heap.v.push(Entry { count: info.count, key: k });
            }
        }
        heap.heapify(self.tie_keys());
        heap
    }

    /// The table a pair's count is kept in during a merge making `new`: pairs holding `new` are
    /// created by this merge, and with cold pairs about they gather in `created`.
    #[inline]
    fn table_for(&mut self, key: u64, new: u32, gather: bool) -> &mut PairMap {
        let (l, r) = unpack(key);
        if gather && (l == new || r == new) {
            &mut self.created
        } else {
            &mut self.pairs
        }
    }

    #[inline]
    fn dec(&mut self, key: u64, f: i64, new: u32, gather: bool) {
        if let Some(info) = self.table_for(key, new, gather).get_mut(&key) {
            info.count -= f;
        }
    }

    #[inline]
    fn inc(&mut self, key: u64, f: i64, pos: u32, new: u32, gather: bool, fresh: &mut Vec<u64>) {
        let info = self.table_for(key, new, gather).entry(key).or_default();
        // Gathered pairs are all new; `merge` takes them from `created` afterwards.
        if !gather && info.positions.is_empty() && info.len == 0 {
            fresh.push(key);
        }
        info.count += f;
        info.positions.push(pos);
    }

    /// Replace every non-overlapping (l, r) occurrence, left to right within each piece, by
    /// `new`; returns the pairs containing `new` that are warm (see `cold_below`).
    fn merge(&mut self, l: u32, r: u32, new: u32) -> Vec<u64> {
        let key = pair_key(l, r);
        let (initial, mut positions) = match self.pairs.get_mut(&key) {
            Some(info) => (info.first as usize..(info.first + info.len) as usize, std::mem::take(&mut info.positions)),
            None => return Vec::new(),
        };
        let all = std::mem::take(&mut self.initial);
        let positions: &[u32] = if positions.is_empty() {
            &all[initial]
        } else {
            positions.extend_from_slice(&all[initial]);
            if !positions.is_sorted() {
                positions.sort_unstable();
            }
            positions.dedup();
            &positions
        };
        let mut fresh = Vec::new();
        // Most pairs a merge creates stay cold when there is a cold cut-off: gather them apart
        // rather than insert each into (and then remove it from) the large table.
        let gather = self.cold_below > 0;
        for (i, &p) in positions.iter().enumerate() {
            // Occurrences are scattered over all pieces, so each visit was a cache miss on its node
            // and another on its piece's count; fetch both a few occurrences ahead.
            if let Some(&ahead) = positions.get(i + 2 * PREFETCH_AHEAD) {
                prefetch(&self.nodes[ahead as usize]);
            }
            if let Some(&ahead) = positions.get(i + PREFETCH_AHEAD) {
                prefetch(&self.freq[self.nodes[ahead as usize].word as usize]);
            }
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
                self.dec(pair_key(bs, l), f, new, gather);
                self.inc(pair_key(bs, new), f, b, new, gather, &mut fresh);
            }
            let a = qnode.next;
            if a != NONE {
                let as_ = self.nodes[a as usize].sym;
                self.dec(pair_key(r, as_), f, new, gather);
                self.inc(pair_key(new, as_), f, p, new, gather, &mut fresh);
                self.nodes[a as usize].prev = p;
            }
            self.nodes[pu].sym = new;
            self.nodes[pu].next = a;
            self.nodes[q as usize].sym = DEAD;
        }
        self.initial = all;
        self.pairs.remove(&key);
        if gather {
            for (k, info) in self.created.drain() {
                if info.count >= self.cold_below {
                    fresh.push(k);
                    self.pairs.insert(k, info);
                }
            }
            return fresh;
        }
        fresh.retain(|k| match self.pairs.get(k) {
            Some(info) if info.count > 0 => true,
            _ => {
                self.pairs.remove(k);
                false
            }
        });
        fresh
    }

    /// Make every pair warm: re-index all pairs of the current symbols (exact counts and
    /// positions) and rebuild the heap from them. Returns whether any pair was cold.
    fn thaw(&mut self, heap: &mut Heap) -> bool {
        if self.cold_below == 0 {
            return false;
        }
        self.pairs = PairMap::default();
        self.index_pairs(usize::MAX);
        heap.v = self
            .pairs
            .iter()
            .filter(|(_, info)| info.count > 0)
            .map(|(&key, info)| Entry { count: info.count, key })
            .collect();
        heap.heapify(self.tie_keys());
        true
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
        if rules.tie_break_ids && self.hf_keys.is_none() {
            self.hf_keys = Some((0..self.tokens.len()).map(hf_tie_key).collect());
        }
        let mut heap = self.full_heap();
        let mut chosen = 0usize;
        while self.tokens.len() - 256 < num_merges {
            let Some(top) = heap.peek() else {
                if self.thaw(&mut heap) {
                    continue;
                }
                break;
            };
            let actual = self.count_of(top.key);
            if actual != top.count {
                if actual > 0 {
                    heap.replace_top(Entry { count: actual, key: top.key }, self.tie_keys());
                } else {
                    heap.pop(self.tie_keys());
                }
                continue;
            }
            // A cold pair counts less than `cold_below`, so only below that can one be the best.
            if actual < self.cold_below && self.thaw(&mut heap) {
                continue;
            }
            if (actual as u64) < rules.min_frequency {
                break;
            }
            heap.pop(self.tie_keys());
            let (l, r) = unpack(top.key);
            let token = [self.tokens[l as usize].as_slice(), &self.tokens[r as usize]].concat();
            if !rules.allows(&token) {
                continue;
            }
            if let Some(existing) = self.token_id(&token) {
                if !rules.merge_duplicates {
                    continue;
                }
                // HF records the merge and merges into the existing token. Pairs holding it may
                // exist already and just grew, so their heap entries are rebuilt (this is rare).
                self.parts.push((l, r));
                self.merge(l, r, existing);
                heap = self.full_heap();
            } else {
                let new = self.add_token(l, r, token);
                for k in self.merge(l, r, new) {
                    heap.push(Entry { count: self.count_of(k), key: k }, self.tie_keys());
                }
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
    fn hf_ids_break_ties_by_lowest_ids() {
        // GPT-2's byte table: space is U+0120 and newline U+010A, so both rank after every letter.
        assert_eq!((byte_table_char(b' '), byte_table_char(b'\n'), byte_table_char(b'a')), (0x120, 0x10A, 0x61));
        let rules = Rules { min_frequency: 1, tie_break_ids: true, ..Default::default() };
        // "ab", "cd" and " x" tie at 5: HF takes (a, b) first, then (c, d); (" ", x) comes last.
        let m = train(&[("ab", 5), ("cd", 5), (" x", 5)], 3, &rules);
        assert_eq!(m, vec![b"ab".to_vec(), b"cd".to_vec(), b" x".to_vec()]);
    }

    #[test]
    fn official_replay_drops_absent_merges_and_their_dependents() {
        let rules = Rules { drop_absent: true, ..Default::default() };
        let replay: Vec<(Vec<u8>, Vec<u8>)> = [("x", "y"), ("a", "b"), ("xy", "z"), ("ab", "ab")]
            .iter()
            .map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec()))
            .collect();
        let mut t = Trainer::with_rules(&counts(&[("abab", 3), ("cd", 2)]), &replay, &rules).unwrap();
        t.choose(3, &rules, 1000, |_| Ok::<_, ()>(false)).unwrap();
        let m: Vec<Vec<u8>> = t.merges().map(|(l, r)| [l, r].concat()).collect();
        assert_eq!(m, vec![b"ab".to_vec(), b"abab".to_vec(), b"cd".to_vec()]);
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

    /// The radix sort is a stable sort by key, in one part or several (threads).
    #[test]
    fn radix_sort_is_a_stable_sort_by_key() {
        let seed = &mut 0x1234_5678_9ABC_DEF1u64;
        for (n, key_bits) in [(0, 8), (1, 1), (1000, 5), (70_000, 30), (200_000, 34)] {
            let items: Vec<(u64, u64)> =
                (0..n).map(|i| (crate::test_random(seed) & ((1 << key_bits) - 1), i as u64)).collect();
            let mut expected = items.clone();
            expected.sort_by_key(|item| item.0);
            for parts in [1, 2, 3, 8] {
                let mut got = items.clone();
                radix_sort_in_parts(&mut got, key_bits, parts);
                assert_eq!(got, expected, "n {n}, {parts} parts");
            }
        }
    }

    fn below(seed: &mut u64, n: usize) -> usize {
        (crate::test_random(seed) % n as u64) as usize
    }

    /// Keeping only a few pairs warm (thawing the rest when the best count falls below theirs)
    /// must choose exactly the merges of a table that holds every pair, with and without replay
    /// and rules.
    #[test]
    fn cold_pairs_change_no_merge() {
        let seed = &mut 0x9E37_79B9_7F4A_7C15u64;
        let mut below = |n: usize| below(seed, n);
        for round in 0..150 {
            let mut c = Counts::default();
            for _ in 0..1 + below(30) {
                let len = 1 + below(25);
                let piece: Vec<u8> = (0..len).map(|_| b"ab c.d"[below(6)]).collect();
                let count = 1 + below(5) as u64;
                c.add(&piece, count).unwrap();
            }
            let rules = match round % 3 {
                0 => Rules::default(),
                1 => Rules { min_frequency: 2, ..Default::default() },
                _ => Rules {
                    max_words_per_token: Some(2),
                    forbidden_substrings: vec![b". ".to_vec()],
                    ..Default::default()
                },
            };
            let n = below(60);
            let mut full = Trainer::with_replay_warm(&c, &[], usize::MAX).unwrap();
            full.choose(n, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            let all: Vec<(Vec<u8>, Vec<u8>)> = full.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
            let cut = below(all.len() + 1);
            let mut reference = Trainer::with_replay_warm(&c, &all[..cut], usize::MAX).unwrap();
            reference.choose(n, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            for warm in [0, 1, 2, 5] {
                for replay in [&all[..0], &all[..cut]] {
                    let expected = if replay.is_empty() { &full } else { &reference };
                    let mut t = Trainer::with_replay_warm(&c, replay, warm).unwrap();
                    t.choose(n, &rules, 7, |_| Ok::<_, ()>(false)).unwrap();
                    assert!(t.merges().eq(expected.merges()), "round {round}, warm {warm}, replay {}", replay.len());
                }
            }
        }
    }

    /// The same over many pieces, so replay runs in several chunks laid out in parallel.
    #[test]
    fn replay_over_many_chunks_equals_sequential_merging() {
        let seed = &mut 0x5DEE_CE66_D1CE_4E5Bu64;
        let mut c = Counts::default();
        for _ in 0..20_000 {
            let len = 1 + below(seed, 12);
            let piece: Vec<u8> = (0..len).map(|_| b"abcde fg."[below(seed, 9)]).collect();
            c.add(&piece, 1 + below(seed, 4) as u64).unwrap();
        }
        let rules = Rules::default();
        let mut full = Trainer::new(&c).unwrap();
        full.choose(300, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        let all: Vec<(Vec<u8>, Vec<u8>)> = full.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
        let mut t = Trainer::with_replay(&c, &all[..200]).unwrap();
        t.choose(300, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        assert!(t.merges().eq(full.merges()));
    }

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
