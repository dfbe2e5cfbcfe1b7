//! Cold boundaries: a stage's replayed pieces cut where none of the merges it will choose can reach,
//! then deduplicated.
//!
//! A SuperBPE stage 2 on English web text holds every distinct line, nearly all of them seen once:
//! ~190M symbols on 1.2 GB. Yet most adjacent symbols there (word bigrams) pair rarely, and a merge
//! across a boundary needs its pair to be the most frequent one left. Cutting is exact because:
//!
//! - Every occurrence of a pair (X, Y) stands on a boundary of one *kind*: the initial pair (the
//!   last initial symbol of X, the first of Y), fixed by X's and Y's merge trees (each token has one
//!   pair of parts when merges never repeat a token). So the pair never counts more than that
//!   initial pair did.
//! - Cut every piece at the boundaries whose initial pair counts below θ. A pair across such a
//!   boundary counts below θ in the whole pieces and 0 in the cut ones; every other pair counts the
//!   same in both. Overlapping occurrences of one pair (a run of X X X) stand on boundaries of one
//!   kind, so no cut splits a run and merging left to right is unchanged.
//! - Hence, while the best pair counts θ or more, whole and cut pieces choose the same merge, and
//!   by induction the same merges. The first time the best count falls below θ, the whole pieces
//!   could differ: the trainer cuts again at a lower θ (`Trainer::recut`), from the replayed pieces
//!   kept whole, with the merges chosen so far applied by lowest-rank BPE (`bpe.rs`: equal to
//!   applying them one after another).
//!
//! Cut pieces repeat (short phrases between rare bigrams), so each distinct one is laid out once
//! with its summed count: an order of magnitude fewer symbols to lay out, index and merge. θ is the
//! count of the k-th most frequent initial pair, k a multiple of the merges still to choose (the
//! merges' counts reach down to about the pair at 1.7 times their number on English).

use rayon::prelude::*;

use super::Trainer;
use crate::bpe::{pair_key, Ranks};
use crate::memory::prefetch;
use crate::pairs::spread;
use crate::replay::{ChunkSyms, ReplayChunk};
use crate::symbols::{MAX_PIECE, MAX_SLOTS};

/// θ is first the count of the pair at this many times the merges still to choose, by count.
pub const HOT_PER_MERGE: usize = 2;
/// Each cut after the first takes θ at this many times the rank of the one before.
const RANK_STEP: usize = 4;

/// How far ahead the table passes fetch the slot they will touch (their tables outgrow the caches).
const AHEAD: usize = 16;

/// What cutting again needs: the replayed pieces whole, their pairs' counts, and where θ stands.
pub(super) struct Cut {
    originals: Vec<ReplayChunk>,
    /// Every initial pair and its count.
    counts: Vec<(u64, i64)>,
    /// The rank the current θ was taken at.
    rank: usize,
    /// Tokens that existed before choosing began (bytes and replayed merges); those after were
    /// chosen, and a new cut applies them.
    replayed_tokens: usize,
}

impl Cut {
    /// Bytes held (for `Trainer::corpus_heap`).
    pub(super) fn heap_bytes(&self) -> u64 {
        let chunks: usize = self
            .originals
            .iter()
            .map(|c| {
                c.lens.capacity() * 4
                    + c.counts.capacity() * 8
                    + match &c.syms {
                        ChunkSyms::Narrow(v) => v.capacity() * 2,
                        ChunkSyms::Wide(v) => v.capacity() * 4,
                    }
            })
            .sum();
        (chunks + self.counts.capacity() * 16) as u64
    }
}

/// The `rank`-th highest of the pairs' counts (1-based), or 0 when there are not that many pairs
/// (cut nothing). Asked once per cut, so the counts are not kept sorted.
fn threshold(counts: &[(u64, i64)], rank: usize) -> i64 {
    if rank == 0 || rank > counts.len() {
        return 0;
    }
    let mut values: Vec<i64> = counts.iter().map(|e| e.1).collect();
    *values.select_nth_unstable_by(rank - 1, |a, b| b.cmp(a)).1
}

/// Every piece of a chunk: its symbols (widened) and count.
fn for_each_piece(chunk: &ReplayChunk, mut visit: impl FnMut(&[u32], i64)) {
    let mut buf = Vec::new();
    let mut at = 0usize;
    for (&len, &f) in chunk.lens.iter().zip(&chunk.counts) {
        let len = len as usize;
        buf.clear();
        match &chunk.syms {
            ChunkSyms::Narrow(v) => buf.extend(v[at..at + len].iter().map(|&s| s as u32)),
            ChunkSyms::Wide(v) => buf.extend_from_slice(&v[at..at + len]),
        }
        visit(&buf, f);
        at += len;
    }
}

/// The pairs that must stay joined, as a bit filter: a pair's bit is set when it is hot; a rare
/// pair may share a set bit, which only leaves its boundaries uncut (safe, just less cut). The hot
/// pairs are about twice the merges to choose whatever the corpus size (~25K for 12K merges, a few
/// percent of the bits), and the filter fits in a core's cache, where a set of the pairs did not.
struct HotFilter(Vec<u64>);

const FILTER_BITS: u32 = 20;

impl HotFilter {
    fn of(keys: impl Iterator<Item = u64>) -> HotFilter {
        let mut bits = vec![0u64; 1 << (FILTER_BITS - 6)];
        for key in keys {
            let b = HotFilter::bit(key);
            bits[b >> 6] |= 1 << (b & 63);
        }
        HotFilter(bits)
    }

    /// Every pair hot: nothing is cut.
    fn all() -> HotFilter {
        HotFilter(vec![u64::MAX; 1 << (FILTER_BITS - 6)])
    }

    #[inline(always)]
    fn bit(key: u64) -> usize {
        (spread(key) >> (64 - FILTER_BITS)) as usize
    }

    #[inline(always)]
    fn holds(&self, key: u64) -> bool {
        let b = HotFilter::bit(key);
        self.0[b >> 6] >> (b & 63) & 1 == 1
    }
}

/// Distinct cut pieces with their summed counts, in one table per thread (a piece two threads both
/// met is laid out twice, each with its share of the count: pieces are independent, so the merges
/// are the same). Pieces of up to four symbols below 2^16 are keys in the slot itself.
#[derive(Default)]
struct Distinct {
    slots: Vec<Slot>,
    syms: Vec<u32>,
    len: usize,
}

/// A distinct piece: its hash, its symbols packed (`len <= 4`, all below 2^16) or their start in
/// `Distinct::syms`, its length (0: empty slot) and summed count.
#[derive(Clone, Copy, Default)]
struct Slot {
    hash: u64,
    key: u64,
    len: u32,
    packed: bool,
    count: i64,
}

/// `syms` as one word when they are at most four symbols below 2^16.
#[inline(always)]
fn pack(syms: &[u32]) -> Option<u64> {
    if syms.len() > 4 || syms.iter().any(|&s| s >= 1 << 16) {
        return None;
    }
    Some(syms.iter().fold(0u64, |k, &s| k << 16 | s as u64))
}

#[inline(always)]
fn hash_syms(syms: &[u32]) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64 ^ syms.len() as u64;
    for &s in syms {
        h = (h ^ s as u64).wrapping_mul(0x0100_0000_01B3).rotate_left(23);
    }
    spread(h)
}

impl Distinct {
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        hash as usize & (self.slots.len() - 1)
    }

    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        if !self.slots.is_empty() {
            prefetch(&self.slots[self.home(hash)]);
        }
    }

    fn add(&mut self, piece: &[u32], hash: u64, f: i64) {
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let packed = pack(piece);
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash);
        loop {
            let slot = self.slots[i];
            if slot.len == 0 {
                let key = match packed {
                    Some(k) => k,
                    None => {
                        self.syms.extend_from_slice(piece);
                        (self.syms.len() - piece.len()) as u64
                    }
                };
                self.slots[i] = Slot { hash, key, len: piece.len() as u32, packed: packed.is_some(), count: f };
                self.len += 1;
                return;
            }
            if slot.hash == hash && slot.len as usize == piece.len() {
                let same = match packed {
                    Some(k) => slot.packed && slot.key == k,
                    None => !slot.packed && self.syms[slot.key as usize..slot.key as usize + piece.len()] == *piece,
                };
                if same {
                    self.slots[i].count += f;
                    return;
                }
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let size = (2 * self.slots.len()).max(1 << 12);
        // Small pages, although pieces land on random slots: the table doubles its way up from
        // nothing, and fresh huge pages for each size (a kernel compaction each, when the page
        // cache holds the corpus) cost more than the TLB misses they spare.
        let slots = vec![Slot::default(); size];
        let old = std::mem::replace(&mut self.slots, slots);
        let mask = size - 1;
        for e in old.into_iter().filter(|e| e.len != 0) {
            let mut i = e.hash as usize & mask;
            while self.slots[i].len != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = e;
        }
    }

    /// Each distinct piece's symbols (into `buf`) and count.
    fn for_each(&self, mut visit: impl FnMut(&[u32], i64)) {
        let mut buf = [0u32; 4];
        for e in self.slots.iter().filter(|e| e.len != 0) {
            let len = e.len as usize;
            if e.packed {
                for (k, b) in buf[..len].iter_mut().enumerate() {
                    *b = (e.key >> (16 * (len - 1 - k))) as u32 & 0xFFFF;
                }
                visit(&buf[..len], e.count);
            } else {
                visit(&self.syms[e.key as usize..e.key as usize + len], e.count);
            }
        }
    }
}

/// The pieces of `chunks` cut at every boundary whose pair is not in `hot`, parts of at least two
/// symbols only, deduplicated per thread.
fn cut_pieces(chunks: &[ReplayChunk], hot: &HotFilter) -> Vec<Distinct> {
    let per = chunks.len().div_ceil(rayon::current_num_threads().clamp(1, 8)).max(1);
    chunks
        .par_chunks(per)
        .map(|group| {
            let mut distinct = Distinct::default();
            // The parts of one chunk, (start in `flat`, length, count, hash), added in a second
            // pass that fetches each one's slot a few parts ahead.
            let mut parts: Vec<(u32, u32, i64, u64)> = Vec::new();
            let mut flat: Vec<u32> = Vec::new();
            for chunk in group {
                parts.clear();
                flat.clear();
                for_each_piece(chunk, |syms, f| {
                    let mut start = 0;
                    for i in 1..=syms.len() {
                        if i < syms.len() && hot.holds(pair_key(syms[i - 1], syms[i])) {
                            continue;
                        }
                        if i - start >= 2 {
                            let part = &syms[start..i];
                            parts.push((flat.len() as u32, part.len() as u32, f, hash_syms(part)));
                            flat.extend_from_slice(part);
                        }
                        start = i;
                    }
                });
                for k in 0..parts.len() {
                    if let Some(ahead) = parts.get(k + AHEAD) {
                        distinct.prefetch(ahead.3);
                    }
                    let (at, len, f, hash) = parts[k];
                    distinct.add(&flat[at as usize..(at + len) as usize], hash, f);
                }
            }
            distinct
        })
        .collect()
}

impl Trainer {
    /// Take over replayed pieces and lay them out cut for choosing about `to_choose` merges, or
    /// whole when their pairs are too few to leave any rare (then nothing can be gained).
    pub(super) fn lay_out_cut(
        &mut self,
        chunks: Vec<ReplayChunk>,
        counts: Vec<(u64, i64)>,
        to_choose: usize,
    ) -> Result<(), String> {
        // A later cut may lay every piece out whole: it must fit as the whole pieces would now.
        let slots: usize = 1 + chunks.iter().flat_map(|c| c.lens.iter()).map(|&len| len as usize + 1).sum::<usize>();
        if slots >= MAX_SLOTS || chunks.iter().any(|c| c.lens.iter().any(|&len| len as usize > MAX_PIECE)) {
            return self.lay_out_replayed(chunks);
        }
        let rank = HOT_PER_MERGE.saturating_mul(to_choose.max(1));
        let theta = threshold(&counts, rank);
        if theta <= 1 {
            return self.lay_out_replayed(chunks);
        }
        self.cut = Some(Box::new(Cut { originals: chunks, counts, rank, replayed_tokens: self.tokens.len() }));
        self.cut_at(theta)
    }

    /// Lay out the kept pieces cut below `theta` (whole at 0, which ends cutting), with the merges
    /// chosen since replay applied.
    fn cut_at(&mut self, theta: i64) -> Result<(), String> {
        let Some(cut) = self.cut.take() else { return Ok(()) };
        let mut ranks = Ranks::default();
        for (id, &(l, r)) in self.parts.iter().enumerate().skip(cut.replayed_tokens - 256) {
            ranks.insert(pair_key(l, r), ((id + 256 - cut.replayed_tokens) as u32, (id + 256) as u32));
        }
        let hot = if theta <= 0 {
            HotFilter::all()
        } else {
            HotFilter::of(cut.counts.iter().filter(|e| e.1 >= theta).map(|e| e.0))
        };
        let tables = cut_pieces(&cut.originals, &hot);
        drop(hot);
        let rank = |l: u32, r: u32| ranks.get(&pair_key(l, r)).copied();
        // Each thread's distinct pieces become one chunk, laid out like replay's (in parallel,
        // without a vector per piece), the merges chosen so far applied.
        let chunks: Vec<ReplayChunk> = tables
            .into_par_iter()
            .map(|t| {
                let (mut lens, mut flat, mut counts) =
                    (Vec::with_capacity(t.len), Vec::new(), Vec::with_capacity(t.len));
                t.for_each(|syms, f| {
                    let at = flat.len();
                    if ranks.is_empty() {
                        flat.extend_from_slice(syms);
                    } else {
                        flat.extend(crate::bpe::merge(syms.to_vec(), rank));
                    }
                    if flat.len() - at >= 2 {
                        lens.push((flat.len() - at) as u32);
                        counts.push(f);
                    } else {
                        flat.truncate(at);
                    }
                });
                ReplayChunk { lens, syms: ChunkSyms::Wide(flat), counts }
            })
            .collect();
        self.lay_out_replayed(chunks)?;
        self.cut_below = theta.max(0);
        if theta > 0 {
            self.cut = Some(cut);
        }
        Ok(())
    }

    /// The best pair counts `best`, below the cut's θ (0 when no pair is left): cut again lower,
    /// re-index and say so (false when nothing is cut).
    pub(super) fn recut(&mut self, best: i64) -> bool {
        let Some(cut) = &mut self.cut else { return false };
        let mut rank = cut.rank;
        let theta = loop {
            rank = rank.saturating_mul(RANK_STEP);
            let theta = threshold(&cut.counts, rank);
            if theta < self.cut_below.min(best.max(1)) || theta == 0 {
                break theta;
            }
        };
        cut.rank = rank;
        // `lay_out_cut` made sure that even the whole pieces fit, which is all that can fail.
        self.cut_at(theta).expect("cut pieces fit where the whole ones do");
        self.reindex();
        true
    }
}
