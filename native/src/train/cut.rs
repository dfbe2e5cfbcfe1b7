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
//! - Cut every piece at the boundaries whose initial pair counts below θ: replay sums the initial
//!   pairs' counts by bucket (`pairs.rs`), and a pair in a bucket below θ counts below θ (a rare
//!   pair sharing a hot bucket is only left uncut). A pair across such a
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
//! count of the k-th highest bucket, k a multiple of the merges still to choose (the merges' counts
//! reach down to about the pair at 1.7 times their number on English, and the buckets of the
//! frequent pairs are nearly their own counts).

use rayon::prelude::*;

use super::Trainer;
use crate::bpe::{pair_key, Ranks};
use crate::joins::cut_mask;
use crate::memory::prefetch;
use crate::pairs::{spread, PairSketch};
use crate::replay::{ChunkSyms, ReplayChunk};
use crate::symbols::{MAX_PIECE, MAX_SLOTS};

/// θ is first the count of the bucket at this many times the merges still to choose, by count.
pub const HOT_PER_MERGE: usize = 2;
/// Each cut after the first takes θ at this many times the rank of the one before.
const RANK_STEP: usize = 4;

/// How far ahead the table passes fetch the slot they will touch (their tables outgrow the caches).
const AHEAD: usize = 16;

/// How a build cuts its replayed pieces: for choosing about `to_choose` merges, the replayed pairs
/// counted in `2^sketch_bits` buckets (when not given, as many as `PairSketch::bits_for` the counts).
#[derive(Clone, Copy)]
pub(super) struct CutPlan {
    pub(super) to_choose: usize,
    pub(super) sketch_bits: Option<u32>,
}

/// What cutting again needs: the replayed pieces whole, their pairs' counts by bucket, and where
/// θ stands.
pub(super) struct Cut {
    originals: Vec<ReplayChunk>,
    /// Every initial pair's count, summed by bucket.
    sketch: PairSketch,
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
        chunks as u64 + self.sketch.heap_bytes()
    }
}

/// A replayed symbol as a chunk holds it: two bytes when every id fits (`ChunkSyms`). The cut reads
/// the chunks in place rather than widening each piece into a buffer first.
trait Symbol: Copy {
    fn id(self) -> u32;
}

impl Symbol for u16 {
    #[inline(always)]
    fn id(self) -> u32 {
        self as u32
    }
}

impl Symbol for u32 {
    #[inline(always)]
    fn id(self) -> u32 {
        self
    }
}

/// The pairs that must stay joined, as one bit per bucket of the pair sketch: set when the bucket
/// counts θ or more. A rare pair that shares such a bucket stays joined too (safe, just less cut).
/// The bits (at most 2^20) fit in a core's cache, where a set of the pairs did not.
struct HotFilter<'a> {
    bits: Vec<u64>,
    sketch: &'a PairSketch,
}

impl HotFilter<'_> {
    /// The buckets of `sketch` at `theta` or more; every bucket when `theta` is 0 (nothing is cut).
    fn of(sketch: &PairSketch, theta: i64) -> HotFilter<'_> {
        let mut bits = vec![0u64; sketch.buckets().div_ceil(64)];
        for b in 0..sketch.buckets() {
            if theta <= 0 || sketch.at_least(b, theta) {
                bits[b >> 6] |= 1 << (b & 63);
            }
        }
        HotFilter { bits, sketch }
    }

    /// The positions `at..at + 64` of `syms` where the pair ending there is not hot, as
    /// `cut_mask` bits.
    #[inline(always)]
    fn cuts<T: Symbol>(&self, syms: &[T], at: usize) -> u64 {
        cut_mask(syms, at, |a, b| {
            let bit = self.sketch.bucket(pair_key(a.id(), b.id()));
            self.bits[bit >> 6] >> (bit & 63) & 1 == 0
        })
    }
}

/// Distinct cut pieces with their summed counts, in one table per thread (a piece two threads both
/// met is laid out twice, each with its share of the count: pieces are independent, so the merges
/// are the same). Pieces of up to eight symbols below 2^16, nearly all of them, are keys in the
/// slot itself, so finding one again reads no other memory.
#[derive(Default)]
struct Distinct {
    slots: Vec<Slot>,
    syms: Vec<u32>,
    len: usize,
}

/// Most symbols a key held in its slot has.
const INLINE: usize = 8;

/// A distinct piece: its symbols packed in 16-bit lanes (`len <= INLINE`, all below 2^16), or
/// their start in `Distinct::syms` and the piece's hash; its summed count; and its length (0: an
/// empty slot) beside the hash's top half, which turns away nearly every other piece at once.
#[derive(Clone, Copy, Default)]
struct Slot {
    key: [u64; 2],
    count: i64,
    meta: u64,
}

/// Most slots in use, as a fraction (numerator, denominator): the tables outgrow the caches, and a
/// smaller one misses them less.
const MAX_LOAD: (usize, usize) = (7, 10);

/// `syms` in 16-bit lanes when they are at most `INLINE` symbols below 2^16.
#[inline(always)]
fn pack<T: Symbol>(syms: &[T]) -> Option<[u64; 2]> {
    if syms.len() > INLINE || syms.iter().any(|&s| s.id() >= 1 << 16) {
        return None;
    }
    let mut key = [0u64; 2];
    for (k, &s) in syms.iter().enumerate() {
        key[k / 4] |= (s.id() as u64) << (16 * (k % 4));
    }
    Some(key)
}

/// The hash of a piece held in the arena (longer than `INLINE`, or with a wider symbol).
#[inline(always)]
fn hash_syms<T: Symbol>(syms: &[T]) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64 ^ syms.len() as u64;
    for &s in syms {
        h = (h ^ s.id() as u64).wrapping_mul(0x0100_0000_01B3).rotate_left(23);
    }
    spread(h)
}

/// The hash of a piece of `len` symbols packed into `key`: two multiplies, where hashing symbol
/// by symbol chained one multiply per symbol. The length tells apart pieces that end in symbol 0.
#[inline(always)]
fn hash_packed(key: [u64; 2], len: usize) -> u64 {
    spread(key[0] ^ key[1].wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(32) ^ len as u64)
}

/// A slot's `meta`: the hash's top half, whether the key is inline, and the length (at least 2,
/// so never 0).
#[inline(always)]
fn meta(hash: u64, len: usize, inline: bool) -> u64 {
    hash & !0xFFFF_FFFF | (inline as u64) << 31 | len as u64
}

#[inline(always)]
fn meta_len(meta: u64) -> usize {
    (meta & 0x7FFF_FFFF) as usize
}

/// The hash a slot's piece was filed under.
#[inline(always)]
fn slot_hash(slot: &Slot) -> u64 {
    if slot.meta >> 31 & 1 == 1 {
        hash_packed(slot.key, meta_len(slot.meta))
    } else {
        slot.key[1]
    }
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

    /// Add `part`, a slot as `Waiting` files it (a piece in the arena has its symbols in `flat`).
    fn add(&mut self, part: &Slot, flat: &[u32]) {
        if (self.len + 1) * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.grow();
        }
        let inline = part.meta >> 31 & 1 == 1;
        let len = meta_len(part.meta);
        let mask = self.slots.len() - 1;
        let mut i = self.home(slot_hash(part));
        loop {
            let slot = self.slots[i];
            if slot.meta == 0 {
                let mut new = *part;
                if !inline {
                    new.key[0] = self.syms.len() as u64;
                    self.syms.extend_from_slice(&flat[part.key[0] as usize..][..len]);
                }
                self.slots[i] = new;
                self.len += 1;
                return;
            }
            if slot.meta == part.meta {
                let same = if inline {
                    slot.key == part.key
                } else {
                    slot.key[1] == part.key[1]
                        && self.syms[slot.key[0] as usize..][..len] == flat[part.key[0] as usize..][..len]
                };
                if same {
                    self.slots[i].count += part.count;
                    return;
                }
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let size = (2 * self.slots.len()).max(1 << 6);
        // Small pages, although pieces land on random slots: the table doubles its way up from
        // nothing, and fresh huge pages for each size (a kernel compaction each, when the page
        // cache holds the corpus) cost more than the TLB misses they spare.
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); size]);
        let mask = size - 1;
        for e in old.into_iter().filter(|e| e.meta != 0) {
            let mut i = slot_hash(&e) as usize & mask;
            while self.slots[i].meta != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = e;
        }
    }

    /// Each distinct piece's symbols and count.
    fn for_each(&self, mut visit: impl FnMut(&[u32], i64)) {
        let mut buf = [0u32; INLINE];
        for e in self.slots.iter().filter(|e| e.meta != 0) {
            let len = meta_len(e.meta);
            if e.meta >> 31 & 1 == 1 {
                for (k, b) in buf[..len].iter_mut().enumerate() {
                    *b = (e.key[k / 4] >> (16 * (k % 4))) as u32 & 0xFFFF;
                }
                visit(&buf[..len], e.count);
            } else {
                visit(&self.syms[e.key[0] as usize..][..len], e.count);
            }
        }
    }
}

/// Parts of cut pieces waiting to be added to one partition's table, filed as slots: a part of at
/// most `INLINE` symbols below 2^16 packed in its slot already, a longer one with its start in
/// `flat` (where its symbols are) and its hash.
#[derive(Default)]
struct Waiting {
    parts: Vec<Slot>,
    flat: Vec<u32>,
}

/// Parts a thread holds before adding them to their partitions' tables (about ten megabytes of
/// them; a few in tests, so that they are added in many batches).
const WAITING_PARTS: usize = if cfg!(test) { 64 } else { 1 << 18 };
/// Replayed symbols per partition, as a power of two (few in tests, so that they have many).
const PARTITION_SYMBOLS_BITS: u32 = if cfg!(test) { 4 } else { 20 };

/// How many partitions (a power of two, by the hash's top bits) the distinct parts of `symbols`
/// replayed symbols are kept in: a few megabytes of table each, so that adding a batch of parts to
/// one partition's table hits the CPU caches (one table per thread outgrows them by far on a
/// stage 2 of gigabytes).
fn partitions(symbols: usize) -> usize {
    (symbols >> PARTITION_SYMBOLS_BITS).next_power_of_two().clamp(1, 1 << 10)
}

/// One thread's distinct parts, by partition, and the parts waiting to be added to them.
struct Parts {
    tables: Vec<Distinct>,
    waiting: Vec<Waiting>,
    held: usize,
    /// The hash's bits below a partition's number (64 with one partition).
    shift: u32,
}

impl Parts {
    fn new(partitions: usize) -> Parts {
        Parts {
            tables: (0..partitions).map(|_| Distinct::default()).collect(),
            waiting: (0..partitions).map(|_| Waiting::default()).collect(),
            held: 0,
            shift: 64 - partitions.trailing_zeros(),
        }
    }

    /// File `part` (at least 2 symbols), counted `f`, with its partition's waiting parts.
    #[inline(always)]
    fn wait<T: Symbol>(&mut self, part: &[T], f: i64) {
        let packed = pack(part);
        let hash = match packed {
            Some(key) => hash_packed(key, part.len()),
            None => hash_syms(part),
        };
        // `shift` is 64 with one partition (a shift by 64 overflows).
        let w = &mut self.waiting[hash.checked_shr(self.shift).unwrap_or(0) as usize];
        let key = packed.unwrap_or_else(|| {
            let at = w.flat.len() as u64;
            w.flat.extend(part.iter().map(|s| s.id()));
            [at, hash]
        });
        w.parts.push(Slot { key, count: f, meta: meta(hash, part.len(), packed.is_some()) });
        self.held += 1;
    }

    /// The pieces of `syms` (`chunk.lens` symbols each) cut at every boundary whose pair is not in
    /// `hot`, parts of at least two symbols filed.
    fn cut_chunk<T: Symbol>(&mut self, chunk: &ReplayChunk, syms: &[T], hot: &HotFilter) {
        let mut at = 0usize;
        for (&len, &f) in chunk.lens.iter().zip(&chunk.counts) {
            let piece = &syms[at..at + len as usize];
            at += len as usize;
            // The runs between cuts as `for_each_run` finds them, written out so that filing a
            // part is inlined here rather than called once per run.
            let mut start = 0;
            for block in (0..piece.len()).step_by(64) {
                let mut bits = hot.cuts(piece, block);
                while bits != 0 {
                    let end = block + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if end - start >= 2 {
                        self.wait(&piece[start..end], f);
                    }
                    start = end;
                }
            }
            if piece.len() - start >= 2 {
                self.wait(&piece[start..], f);
            }
        }
    }

    /// Add each partition's waiting parts to its table, fetching each one's slot a few parts ahead.
    fn add_waiting(&mut self) {
        for (distinct, w) in self.tables.iter_mut().zip(self.waiting.iter_mut()) {
            for k in 0..w.parts.len() {
                if let Some(ahead) = w.parts.get(k + AHEAD) {
                    distinct.prefetch(slot_hash(ahead));
                }
                distinct.add(&w.parts[k], &w.flat);
            }
            w.parts.clear();
            w.flat.clear();
        }
        self.held = 0;
    }
}

/// The pieces of `chunks` cut at every boundary whose pair is not in `hot`, parts of at least two
/// symbols only, deduplicated per thread and partition.
fn cut_pieces(chunks: &[ReplayChunk], hot: &HotFilter) -> Vec<Distinct> {
    let symbols: usize = chunks.iter().map(|c| c.syms.len()).sum();
    let partitions = partitions(symbols);
    let per = chunks.len().div_ceil(rayon::current_num_threads().clamp(1, 8)).max(1);
    chunks
        .par_chunks(per)
        .map(|group| {
            let mut parts = Parts::new(partitions);
            for chunk in group {
                match &chunk.syms {
                    ChunkSyms::Narrow(v) => parts.cut_chunk(chunk, v, hot),
                    ChunkSyms::Wide(v) => parts.cut_chunk(chunk, v, hot),
                }
                if parts.held >= WAITING_PARTS {
                    parts.add_waiting();
                }
            }
            parts.add_waiting();
            parts.tables
        })
        .flatten()
        .collect()
}

impl Trainer {
    /// Take over replayed pieces and lay them out cut for choosing about `to_choose` merges, or
    /// whole when their pairs are too few to leave any rare (then nothing can be gained).
    pub(super) fn lay_out_cut(
        &mut self,
        chunks: Vec<ReplayChunk>,
        sketch: PairSketch,
        to_choose: usize,
    ) -> Result<(), String> {
        // A later cut may lay every piece out whole: it must fit as the whole pieces would now.
        let slots: usize = 1 + chunks.iter().flat_map(|c| c.lens.iter()).map(|&len| len as usize + 1).sum::<usize>();
        if slots >= MAX_SLOTS || chunks.iter().any(|c| c.lens.iter().any(|&len| len as usize > MAX_PIECE)) {
            return self.lay_out_replayed(chunks);
        }
        let rank = HOT_PER_MERGE.saturating_mul(to_choose.max(1));
        let theta = sketch.threshold(rank);
        if theta <= 1 {
            return self.lay_out_replayed(chunks);
        }
        self.cut = Some(Box::new(Cut { originals: chunks, sketch, rank, replayed_tokens: self.tokens.len() }));
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
        let hot = HotFilter::of(&cut.sketch, theta);
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
            let theta = cut.sketch.threshold(rank);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Against a plain map, across growth: pieces held inline (up to `INLINE` symbols below 2^16)
    /// and in the arena (longer, or with a wider symbol), met many times each.
    #[test]
    fn distinct_sums_the_counts_of_each_piece() {
        let seed = &mut 0x0DDB_1A5E_5BAD_5EEDu64;
        let pieces: Vec<Vec<u32>> = (0..30_000)
            .map(|_| {
                let len = 2 + crate::test_below(seed, 14);
                let wide = crate::test_below(seed, 10) == 0;
                (0..len).map(|_| crate::test_below(seed, if wide { 1 << 17 } else { 40 }) as u32).collect()
            })
            .collect();
        let (mut distinct, mut want) = (Distinct::default(), HashMap::new());
        for _ in 0..100_000 {
            let piece = &pieces[crate::test_below(seed, pieces.len())];
            let f = 1 + crate::test_below(seed, 5) as i64;
            let mut parts = Parts::new(1);
            parts.wait(piece, f);
            distinct.add(&parts.waiting[0].parts[0], &parts.waiting[0].flat);
            *want.entry(piece.clone()).or_insert(0) += f;
        }
        let mut got = HashMap::new();
        distinct.for_each(|syms, f| assert!(got.insert(syms.to_vec(), f).is_none(), "{syms:?} twice"));
        assert_eq!(got, want);
        assert_eq!(distinct.len, want.len());
        assert!(want.keys().any(|p| p.len() > INLINE) && want.keys().any(|p| p.iter().any(|&s| s >= 1 << 16)));
    }
}
