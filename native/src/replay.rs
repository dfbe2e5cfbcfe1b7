//! Replay: earlier merges applied to every piece before a stage chooses its own.
//!
//! A SuperBPE stage 2 replays the ~25K stage-1 merges into ~700K whole-line pieces (25 MB on
//! kernel_docs). Each piece is cut where no merge can join two bytes (`joins.rs`); the parts (words,
//! mostly) repeat across lines, so each is merged once per thread and then looked up
//! (`SegmentCache`). Lookups, five million of them, are what replay costs, so the cache is built to
//! make one a single probe of a flat table: keys up to 15 bytes packed into two words, results of
//! up to two symbols stored in the entry itself. The pieces are read in the order they lie in
//! memory (`Counts::memory_order`), so that reading them streams instead of missing the cache at
//! every long key.

use std::sync::Mutex;

use rayon::prelude::*;

use crate::bpe::{self, Ranks};
use crate::bytesmap::{hash_short, pack_short, BytesMap, SHORT_MAX};
use crate::joins::{for_each_run, Joins};
use crate::memory::{huge_vec, prefetch};
use crate::pairs::PairSketch;
use crate::tables::{Counts, MemoryOrder};

/// Longest segment whose key is packed (15 bytes in two words; longer ones are rare).
pub(crate) const PACKED_MAX: usize = 2 * SHORT_MAX + 1;

/// `segment` (at most `PACKED_MAX` bytes) as two words that identify it: up to 7 bytes are
/// `pack_short` and a zero; longer ones are their first 8 bytes and the packed rest with the top
/// bit set (so the two forms never meet).
#[inline(always)]
pub(crate) fn pack_segment(segment: &[u8]) -> [u64; 2] {
    if segment.len() <= SHORT_MAX {
        [pack_short(segment), 0]
    } else {
        let head = u64::from_le_bytes(segment[..8].try_into().unwrap());
        [head, pack_short(&segment[8..]) | 1 << 63]
    }
}

#[inline(always)]
pub(crate) fn hash_segment(key: [u64; 2]) -> u64 {
    hash_short(key[0] ^ key[1].wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A segment's replayed symbols: one or two in place (`[a, ONE]`, `[a, b]`), or more as
/// `[start, MANY | len]` in the cache's arena. Symbols are token ids below `MANY`.
pub(crate) type Syms = [u32; 2];
const ONE: u32 = u32::MAX;
pub(crate) const MANY: u32 = 1 << 31;

/// Most merges a replay can hold: every token id must stay below `MANY`.
pub const MAX_REPLAY: usize = MANY as usize - 256;

/// An empty slot of `PackedTable` (no token id is `u32::MAX`, so no result looks like it).
const EMPTY: Syms = [u32::MAX, u32::MAX];

/// Packed segments and their results: open addressing with linear probing in one flat array, at
/// most half full. Unlike a general hash map, the slot a key will probe first is known from its
/// hash alone, so `replay_piece` fetches the slots of a piece's segments before it probes any: the
/// table outgrows the CPU caches, and one miss at a time was what replay waited on.
#[derive(Default)]
struct PackedTable {
    slots: Vec<([u64; 2], Syms)>,
    len: usize,
}

impl PackedTable {
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

    #[inline(always)]
    fn get(&self, key: [u64; 2], hash: u64) -> Option<Syms> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash);
        loop {
            let (k, syms) = self.slots[i];
            if syms == EMPTY {
                return None;
            }
            if k == key {
                return Some(syms);
            }
            i = (i + 1) & mask;
        }
    }

    /// Add a key that is not in the table.
    fn insert_new(&mut self, key: [u64; 2], hash: u64, syms: Syms) {
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash);
        while self.slots[i].1 != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = (key, syms);
        self.len += 1;
    }

    fn grow(&mut self) {
        let size = (2 * self.slots.len()).max(1 << 12);
        // Huge pages: a thread's table reaches tens of megabytes on a stage 2 of gigabytes, and
        // with small pages nearly every lookup missed the TLB besides the cache.
        let old = std::mem::replace(&mut self.slots, huge_vec(size, std::iter::repeat(([0, 0], EMPTY))));
        self.len = 0;
        for (key, syms) in old.into_iter().filter(|e| e.1 != EMPTY) {
            self.insert_new(key, hash_segment(key), syms);
        }
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &([u64; 2], Syms)> {
        self.slots.iter().filter(|e| e.1 != EMPTY)
    }
}

/// Per-thread memo of replayed segments (see the module doc); the encoder's two-level path
/// (`encode_levels.rs`) keeps its words in one too.
#[derive(Default)]
pub struct SegmentCache {
    packed: PackedTable,
    long: BytesMap<Syms>,
    arena: Vec<u32>,
    /// Scratch for merging the segments it misses (`bpe::merge_tail`).
    ranks: Vec<(u32, u32)>,
    /// The symbols of the last chunk of pieces its thread replayed, to size the next one by.
    last_chunk_symbols: usize,
}

impl SegmentCache {
    /// How many segments it holds.
    pub(crate) fn len(&self) -> usize {
        self.packed.len + self.long.len()
    }

    /// Fetch the slot a packed key will probe first into the CPU cache.
    #[inline(always)]
    pub(crate) fn prefetch(&self, hash: u64) {
        self.packed.prefetch(hash);
    }

    /// The result for `segment`, whose packed key and hash (when it has one) are `packed`.
    #[inline(always)]
    pub(crate) fn get(&self, segment: &[u8], packed: Option<([u64; 2], u64)>) -> Option<Syms> {
        match packed {
            Some((key, hash)) => self.packed.get(key, hash),
            None => self.long.get(segment).copied(),
        }
    }

    /// Add a segment it does not hold; every id must be below `MANY`.
    pub(crate) fn insert(&mut self, segment: &[u8], packed: Option<([u64; 2], u64)>, ids: &[u32]) {
        let syms = match *ids {
            [a] => [a, ONE],
            [a, b] => [a, b],
            _ => {
                let start = self.arena.len() as u32;
                self.arena.extend_from_slice(ids);
                [start, MANY | ids.len() as u32]
            }
        };
        match packed {
            Some((key, hash)) => self.packed.insert_new(key, hash, syms),
            None => {
                self.long.insert_new(segment, syms);
            }
        }
    }

    #[inline(always)]
    pub(crate) fn copy(&self, syms: Syms, out: &mut Vec<u32>) {
        match syms {
            [a, ONE] => out.push(a),
            [start, meta] if meta & MANY != 0 => {
                let start = start as usize;
                out.extend_from_slice(&self.arena[start..start + (meta & !MANY) as usize]);
            }
            [a, b] => out.extend_from_slice(&[a, b]),
        }
    }
}

/// A segment of a piece: its byte range, and its packed key and hash when the cache holds it packed.
type Segment = (u32, u32, Option<([u64; 2], u64)>);

/// The symbols of `piece` after replay: BPE of each segment between positions no merge joins.
/// Segments of three bytes or more that repeat across pieces (words inside whole-line SuperBPE
/// pieces) are merged once per thread and then copied; a whole piece is merged on the spot.
pub fn replay_piece<F: Fn(u32, u32) -> Option<(u32, u32)>>(
    piece: &[u8],
    joins: &Joins,
    cache: &mut SegmentCache,
    rank: &F,
    out: &mut Vec<u32>,
) {
    let mut segments = Vec::new();
    cut(piece, joins, cache, &mut segments);
    resolve(piece, &segments, cache, rank, out);
}

/// `piece`'s segments into `segments`, each packed one's cache slot fetched so that `resolve`,
/// called a piece later, finds it in the CPU cache (the table outgrows it; the lookups were what
/// replay waited on).
#[inline(always)]
fn cut(piece: &[u8], joins: &Joins, cache: &SegmentCache, segments: &mut Vec<Segment>) {
    segments.clear();
    let push = |start: usize, end: usize| {
        let len = end - start;
        let packed = ((3..=PACKED_MAX).contains(&len) && len < piece.len()).then(|| {
            let key = pack_segment(&piece[start..end]);
            let hash = hash_segment(key);
            cache.packed.prefetch(hash);
            (key, hash)
        });
        segments.push((start as u32, end as u32, packed));
    };
    for_each_run(piece.len(), |at| joins.cuts(piece, at), push);
}

/// The replayed symbols of `piece`, cut into `segments` by `cut`, appended to `out`.
#[inline(always)]
fn resolve<F: Fn(u32, u32) -> Option<(u32, u32)>>(
    piece: &[u8],
    segments: &[Segment],
    cache: &mut SegmentCache,
    rank: &F,
    out: &mut Vec<u32>,
) {
    for &(start, end, packed) in segments {
        let segment = &piece[start as usize..end as usize];
        match segment.len() {
            1 => out.push(segment[0] as u32),
            // Two bytes merge (one id) or not, whatever else was replayed.
            2 => match rank(segment[0] as u32, segment[1] as u32) {
                Some((_, merged)) => out.push(merged),
                None => out.extend([segment[0] as u32, segment[1] as u32]),
            },
            n => {
                // A whole piece is met once (the pieces are distinct): merged, never cached.
                let word = n < piece.len();
                match word.then(|| cache.get(segment, packed)).flatten() {
                    Some(syms) => cache.copy(syms, out),
                    None => {
                        let at = out.len();
                        out.extend(segment.iter().map(|&b| b as u32));
                        bpe::merge_tail(out, at, &mut cache.ranks, rank);
                        if word {
                            cache.insert(segment, packed, &out[at..]);
                        }
                    }
                }
            }
        }
    }
}

/// Replayed pieces of at least 2 symbols: `lens[i]` symbols each, in `syms`, counted `counts[i]`.
pub struct ReplayChunk {
    pub lens: Vec<u32>,
    pub syms: ChunkSyms,
    pub counts: Vec<i64>,
}

impl ReplayChunk {
    /// An empty chunk with room for `pieces` pieces of `symbols` symbols in all (the size of the
    /// chunk before it: a chunk grown from nothing copied its symbols a dozen times over).
    fn with_capacity(narrow: bool, pieces: usize, symbols: usize) -> ReplayChunk {
        let syms = if narrow {
            ChunkSyms::Narrow(Vec::with_capacity(symbols))
        } else {
            ChunkSyms::Wide(Vec::with_capacity(symbols))
        };
        ReplayChunk { lens: Vec::with_capacity(pieces), syms, counts: Vec::with_capacity(pieces) }
    }
}

/// A chunk's symbols, two bytes each when every replayed id fits (`fits_narrow`): the replayed
/// chunks and the counts they come from are held together at the end of replay, which is a stage
/// 2's peak, so halving the chunks lowers it.
pub enum ChunkSyms {
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

impl ChunkSyms {
    pub(crate) fn len(&self) -> usize {
        match self {
            ChunkSyms::Narrow(v) => v.len(),
            ChunkSyms::Wide(v) => v.len(),
        }
    }

    /// Whether ids below `tokens` fit in two bytes.
    pub fn fits_narrow(tokens: usize) -> bool {
        tokens <= 1 << 16
    }

    fn extend(&mut self, syms: &[u32]) {
        match self {
            // Every id is below the token count `fits_narrow` was asked about.
            ChunkSyms::Narrow(v) => v.extend(syms.iter().map(|&s| s as u16)),
            ChunkSyms::Wide(v) => v.extend_from_slice(syms),
        }
    }

    fn shrink_to_fit(&mut self) {
        match self {
            ChunkSyms::Narrow(v) => v.shrink_to_fit(),
            ChunkSyms::Wide(v) => v.shrink_to_fit(),
        }
    }

    /// Symbols `at..at + out.len()`, widened, into `out`.
    pub fn copy_to(&self, at: usize, out: &mut [std::mem::MaybeUninit<u32>]) {
        let end = at + out.len();
        match self {
            ChunkSyms::Narrow(v) => {
                for (o, &s) in out.iter_mut().zip(&v[at..end]) {
                    o.write(s as u32);
                }
            }
            ChunkSyms::Wide(v) => {
                for (o, &s) in out.iter_mut().zip(&v[at..end]) {
                    o.write(s);
                }
            }
        }
    }
}

/// One segment cache per thread, for `replay_counts` (kept across the shards of one corpus).
pub fn segment_caches() -> Vec<Mutex<SegmentCache>> {
    (0..rayon::current_num_threads().max(1)).map(|_| Mutex::default()).collect()
}

/// One pair sketch of `2^bits` buckets per thread, for `replay_counts` to count the replayed pairs in.
pub fn pair_sketches(bits: u32) -> Vec<Mutex<PairSketch>> {
    (0..rayon::current_num_threads().max(1)).map(|_| Mutex::new(PairSketch::with_bits(bits))).collect()
}

/// A run of pieces to replay, part of a [`MemoryOrder`]: short pieces, or long keys of one arena.
#[derive(Clone, Copy)]
pub enum Part<'a> {
    Short(&'a [([u8; 8], u64)]),
    Long { arena: usize, entries: &'a [(u64, u64)] },
}

impl Part<'_> {
    pub fn len(&self) -> usize {
        match self {
            Part::Short(e) => e.len(),
            Part::Long { entries, .. } => entries.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The part's pieces (keys of `counts`) with their counts, in order; each long key's record
    /// is fetched `KEYS_AHEAD` keys before it is read (they lie in order, a few hundred bytes
    /// apart, so the hardware's own prefetch sees only the nearest).
    pub fn pieces<'a>(&self, counts: &'a Counts) -> Box<dyn Iterator<Item = (&'a [u8], u64)> + 'a>
    where
        Self: 'a,
    {
        match *self {
            Part::Short(entries) => Box::new(entries.iter().map(|(key, count)| (&key[..key[7] as usize], *count))),
            Part::Long { arena, entries } => {
                entries.iter().take(KEYS_AHEAD).for_each(|e| counts.prefetch_key(arena, e.0));
                Box::new(entries.iter().enumerate().map(move |(i, &(loc, count))| {
                    if let Some(ahead) = entries.get(i + KEYS_AHEAD) {
                        counts.prefetch_key(arena, ahead.0);
                    }
                    (counts.arena_key(arena, loc), count)
                }))
            }
        }
    }
}

/// `order` in parts of at most `size` pieces, in its order (short pieces, then each arena by
/// location), for [`replay_counts`].
pub fn parts(order: &MemoryOrder, size: usize) -> Vec<Part<'_>> {
    let size = size.max(1);
    let short = order.short.chunks(size).map(Part::Short);
    let long = order
        .long
        .iter()
        .flat_map(move |&(arena, ref list)| list.chunks(size).map(move |entries| Part::Long { arena, entries }));
    short.chain(long).collect()
}

/// How many long keys ahead [`Part::pieces`] fetches a record.
const KEYS_AHEAD: usize = 8;

/// Replay the pieces of `parts` (of `counts`) that have at least 2 bytes and a non-zero count, in
/// parallel (one flat buffer per chunk of pieces, not a vector per piece), with one segment cache
/// per thread (from `segment_caches`). Pieces that replay to one symbol drop out (they make no
/// pair). With `pairs` (from `pair_sketches`), the replayed pairs are counted there too, times their
/// piece's count.
pub fn replay_counts(
    counts: &Counts,
    parts: &[Part<'_>],
    ranks: &Ranks,
    joins: &Joins,
    caches: &[Mutex<SegmentCache>],
    pairs: Option<&[Mutex<PairSketch>]>,
) -> Result<Vec<ReplayChunk>, String> {
    // Replayed ids are below 256 plus the number of merges replayed.
    let narrow = ChunkSyms::fits_narrow(256 + ranks.len());
    let rank = |l: u32, r: u32| ranks.get(&crate::bpe::pair_key(l, r)).copied();
    let per_part: Vec<Result<Vec<ReplayChunk>, String>> = parts
        .par_iter()
        .map(|part| {
            let slot = rayon::current_thread_index().unwrap_or(0) % caches.len();
            let mut cache = caches[slot].lock().unwrap_or_else(|e| e.into_inner());
            let mut sketch = pairs.map(|p| p[slot % p.len()].lock().unwrap_or_else(|e| e.into_inner()));
            replay_pieces(&mut part.pieces(counts), narrow, joins, &mut cache, &rank, sketch.as_deref_mut())
        })
        .collect();
    let mut all = Vec::new();
    for chunks in per_part {
        all.extend(chunks?);
    }
    Ok(all)
}

/// Replay `pieces` into chunks of `CHUNK` pieces (see `replay_counts`).
fn replay_pieces<F: Fn(u32, u32) -> Option<(u32, u32)>>(
    pieces: &mut dyn Iterator<Item = (&[u8], u64)>,
    narrow: bool,
    joins: &Joins,
    cache: &mut SegmentCache,
    rank: &F,
    mut sketch: Option<&mut PairSketch>,
) -> Result<Vec<ReplayChunk>, String> {
    const CHUNK: usize = 4096;
    let mut chunks = Vec::new();
    // Room for a chunk like this thread's last, and then some: a chunk that outgrows its buffer
    // is copied, and room it does not use is given back untouched.
    let room = |symbols: usize| symbols + symbols / 4;
    let mut out = ReplayChunk::with_capacity(narrow, CHUNK, room(cache.last_chunk_symbols));
    let mut sym = Vec::new();
    // Each piece is cut (its cache slots fetched) one piece before it is resolved.
    let (mut next, mut current) = (Vec::new(), Vec::new());
    let mut pieces = pieces.filter(|(p, c)| p.len() >= 2 && *c > 0).peekable();
    if let Some(&(first, _)) = pieces.peek() {
        cut(first, joins, cache, &mut next);
    }
    while let Some((piece, count)) = pieces.next() {
        std::mem::swap(&mut next, &mut current);
        if let Some(&(following, _)) = pieces.peek() {
            cut(following, joins, cache, &mut next);
        }
        sym.clear();
        resolve(piece, &current, cache, rank, &mut sym);
        if sym.len() < 2 {
            continue;
        }
        let count = i64::try_from(count).map_err(|_| "piece count too large".to_string())?;
        if let Some(sketch) = sketch.as_deref_mut() {
            sketch.add_pairs(&sym, count);
        }
        out.counts.push(count);
        out.lens.push(u32::try_from(sym.len()).map_err(|_| "piece too long".to_string())?);
        out.syms.extend(&sym);
        if out.lens.len() == CHUNK {
            out.syms.shrink_to_fit();
            cache.last_chunk_symbols = out.syms.len();
            let next = ReplayChunk::with_capacity(narrow, CHUNK, room(out.syms.len()));
            chunks.push(std::mem::replace(&mut out, next));
        }
    }
    if !out.lens.is_empty() {
        out.lens.shrink_to_fit();
        out.counts.shrink_to_fit();
        out.syms.shrink_to_fit();
        chunks.push(out);
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use crate::bpe::pair_key;
    use crate::tables::Counts;
    use crate::train::{Rules, Trainer};

    fn below(seed: &mut u64, n: usize) -> usize {
        (crate::test_random(seed) % n as u64) as usize
    }

    /// Cutting pieces where no merge joins the bytes, and caching the parts (short, packed and
    /// long keys; results of one, two and more symbols), must not change replay: compare with
    /// lowest-rank BPE of whole pieces, on merges learned elsewhere.
    #[test]
    fn segmented_replay_equals_whole_piece_bpe() {
        fn text(seed: &mut u64, len: usize) -> Vec<u8> {
            (0..len).map(|_| b"ab c.\n"[below(seed, 6)]).collect()
        }
        let seed = &mut 0x2545_F491_4F6C_DD1Du64;
        let mut kinds = [0usize; 4];
        for _ in 0..300 {
            let mut source = Counts::default();
            for _ in 0..1 + below(seed, 20) {
                let len = 1 + below(seed, 30);
                source.add(&text(seed, len), 1).unwrap();
            }
            let mut learner = Trainer::new(&source).unwrap();
            learner.choose(below(seed, 40), &Rules::default(), usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            let merges: Vec<(Vec<u8>, Vec<u8>)> = learner.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
            let ranks: HashMap<u64, (u32, u32)> = learner
                .parts
                .iter()
                .enumerate()
                .map(|(i, &(l, r))| (pair_key(l, r), (i as u32, 256 + i as u32)))
                .collect();
            let rank = |l: u32, r: u32| ranks.get(&pair_key(l, r)).copied();
            // Segments found 64 bytes at a time where the CPU can, and pair by pair.
            let joins = [Joins::of(&merges), Joins::of(&merges).narrow()];
            let mut cache = SegmentCache::default();
            for _ in 0..30 {
                let len = 1 + below(seed, 200);
                let piece = text(seed, len);
                // Twice: the second replay reads what the first put in the cache. Pieces reach past
                // 64 bytes, where segment ends are found a block at a time.
                for joins in joins.iter().chain(&joins) {
                    let mut got = Vec::new();
                    replay_piece(&piece, joins, &mut cache, &rank, &mut got);
                    let whole = bpe::merge(piece.iter().map(|&b| b as u32).collect(), rank);
                    assert_eq!(got, whole, "piece {:?}", String::from_utf8_lossy(&piece));
                }
            }
            for (_, syms) in cache.packed.iter() {
                kinds[match syms[1] {
                    ONE => 0,
                    m if m & MANY != 0 => 2,
                    _ => 1,
                }] += 1;
            }
            kinds[3] += cache.long.len();
        }
        assert!(kinds.iter().all(|&n| n > 0), "one symbol, two, more, long keys: {kinds:?}");
    }

    /// The flat table finds every key it was given, across its growths, and no other.
    #[test]
    fn packed_table_finds_what_it_holds_across_growth() {
        let mut table = PackedTable::default();
        let key = |i: u64| [i.wrapping_mul(0x9E37_79B9_7F4A_7C15), i];
        for i in 0..50_000u64 {
            let k = key(i);
            assert_eq!(table.get(k, hash_segment(k)), None);
            table.insert_new(k, hash_segment(k), [i as u32, ONE]);
        }
        assert_eq!(table.len, 50_000);
        assert!(table.slots.len() >= 100_000 && table.slots.len().is_power_of_two());
        for i in 0..60_000u64 {
            let k = key(i);
            assert_eq!(table.get(k, hash_segment(k)), (i < 50_000).then_some([i as u32, ONE]), "key {i}");
        }
    }

    #[test]
    fn packed_keys_tell_segments_apart() {
        let segments: Vec<Vec<u8>> =
            (0..=PACKED_MAX).flat_map(|n| [vec![0u8; n], vec![0xFF; n], (0..n as u8).collect()]).collect();
        for (i, a) in segments.iter().enumerate() {
            for b in &segments[i + 1..] {
                if a != b {
                    assert_ne!(pack_segment(a), pack_segment(b), "{a:?} vs {b:?}");
                }
            }
        }
    }
}
