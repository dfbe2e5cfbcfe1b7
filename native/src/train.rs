//! BPE trainer: the same merges as `superbpe.trainer.train_merges`, on compact state.
//!
//! Every unique piece is stored once as a run of u32 symbols in one flat array (`symbols.rs`:
//! about 4 bytes per symbol, a merge rewrites an occurrence in O(1) even inside a whole-line
//! SuperBPE piece). The inverted index maps a pair to the *positions* where it was created
//! (append-only, checked lazily), so a merge visits only its occurrences, not whole pieces; only
//! warm pairs keep positions. Choosing uses a lazy max-heap ordered like the python engine: highest
//! count, then the greatest `(left bytes, right bytes)`.

use std::collections::HashMap;

use rayon::prelude::*;
use smallvec::SmallVec;

use crate::bytesmap::{hash_short, BytesMap};
use crate::count::{prefetch, Counts, SHARDS};
use crate::replay::{replay_counts, segment_caches, Joins, Ranks, ReplayChunk, MAX_REPLAY};
use crate::symbols::{Symbols, DEAD, MAX_PIECE, NONE, SEP};

/// Most merges a trainer makes: token ids stay below `symbols::DEAD`.
pub const MAX_MERGES: usize = DEAD as usize - 256;

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
    pub(crate) fn official(&self) -> bool {
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

/// The number of pairs kept warm when a state has many (see `Trainer::cold_below`).
pub const WARM_PAIRS: usize = 1 << 16;

/// How many progress reports replay makes (at most).
const REPLAY_REPORTS: usize = 20;

/// How many occurrences ahead `merge` and the index ask for a piece's count (and twice that for
/// its symbols).
const PREFETCH_AHEAD: usize = 8;

/// Where the pair index's positions are scattered, shared by the threads that fill disjoint
/// slots of it.
struct Slots(*mut u32);
// SAFETY: every thread writes only the slots its own bucket offsets reserve (see `index_pairs`).
unsafe impl Sync for Slots {}

impl Slots {
    /// # Safety
    /// `i` is within the destination and no other thread writes slot `i`.
    #[inline(always)]
    unsafe fn put(&self, i: usize, p: u32) {
        // SAFETY: as the caller promises.
        unsafe { *self.0.add(i) = p };
    }
}

/// One pair's run of positions in the index while it is built: `(key, first, len, count)`.
type Run = (u64, u32, u32, i64);

/// Per-job scratch of `index_pairs`: dense per-right-symbol tables (reset after each bucket) and
/// the largest counts this job has seen.
struct BucketScratch {
    count: Vec<u32>,
    weight: Vec<i64>,
    touched: Vec<u32>,
    rights: Vec<u32>,
    tmp: Vec<u32>,
    /// The `keep` largest counts seen, smallest on top: a count below that smallest is below the
    /// `keep`-th largest of all pairs, so its pair is cold and its run need not be kept.
    top: std::collections::BinaryHeap<std::cmp::Reverse<i64>>,
    keep: usize,
    runs_seen: usize,
}

impl BucketScratch {
    fn new(tokens: usize, keep: usize) -> BucketScratch {
        BucketScratch {
            count: vec![0; tokens],
            weight: vec![0; tokens],
            touched: Vec::new(),
            rights: Vec::new(),
            tmp: Vec::new(),
            top: Default::default(),
            keep,
            runs_seen: 0,
        }
    }

    /// Whether a run counting `count` may be warm; records it among the largest.
    fn may_be_warm(&mut self, count: i64) -> bool {
        self.runs_seen += 1;
        if self.top.len() < self.keep {
            self.top.push(std::cmp::Reverse(count));
            return true;
        }
        let smallest = self.top.peek().map_or(i64::MIN, |r| r.0);
        if count < smallest {
            return false;
        }
        self.top.pop();
        self.top.push(std::cmp::Reverse(count));
        true
    }
}

/// Memory of a trainer's corpus-sized structures (see `Trainer::corpus_heap`).
#[derive(Debug, Clone, Copy)]
pub struct CorpusHeap {
    /// Bytes that grow in proportion to the text: symbols, piece counts, positions.
    pub linear: u64,
    /// Pairs in the pair tables, and the entries they have room for (a hash table's room grows in
    /// steps; each entry takes `PAIR_ENTRY_BYTES` and about 8/7 of a bucket).
    pub pair_entries: u64,
    pub pair_slots: u64,
}

/// What the allocator adds to each small allocation (glibc: a 16-byte chunk header and rounding).
const ALLOCATION_HEADER: u64 = 16;

/// Bytes of one pair-table bucket: key, `PairInfo` and the hash table's control byte.
pub const PAIR_ENTRY_BYTES: u64 = (std::mem::size_of::<(u64, PairInfo)>() + 1) as u64;

/// The symbol arrays and the pair table.
pub struct Trainer {
    /// Every piece's symbols (see `symbols.rs`).
    syms: Symbols,
    /// Each piece's count, by piece (layout order).
    freq: Vec<i64>,
    pairs: PairMap,
    /// While a merge runs with cold pairs about, the pairs it creates gather here (a small table
    /// that stays in cache) and only the warm ones move into `pairs` (see `merge`).
    created: PairMap,
    /// The warm pairs' initial positions, grouped by pair (see `PairInfo`).
    initial: Vec<u32>,
    /// Pairs counted below this are cold: kept out of `pairs` and the heap, those of the initial
    /// state and those a merge creates alike (most pairs of whole-line pieces are rare), and their
    /// positions are not stored. A pair's count only grows in the merge that makes the later of
    /// its two tokens, so a cold pair stays below `cold_below`, and cannot be the best until the
    /// best count falls below that; then `thaw` re-indexes every pair. 0 when all pairs are warm.
    cold_below: i64,
    pub tokens: Vec<Vec<u8>>,
    /// The (left, right) token ids of merge i (token 256 + i).
    pub parts: Vec<(u32, u32)>,
    token_ids: BytesMap<u32>,
    /// Tie-break keys per token when ties go by HF ids (`Rules::tie_break_ids`), else None.
    hf_keys: Option<Vec<Vec<u8>>>,
}

/// What building a trainer reports as it goes: `(phase, done, total)`, e.g. `("replay", pieces
/// replayed, all pieces)`; returning an error stops the build.
pub type BuildProgress<'a> = dyn FnMut(&str, u64, u64) -> Result<(), String> + 'a;

/// The counts a trainer is built from: borrowed, or handed over so the build can free them once
/// replayed (a stage 2's table of distinct lines is as large as the symbols made from it).
pub enum Source<'a> {
    Borrowed(&'a Counts),
    Owned(Counts),
}

impl Source<'_> {
    fn get(&self) -> &Counts {
        match self {
            Source::Borrowed(c) => c,
            Source::Owned(c) => c,
        }
    }

    /// Free the shards in `range` of handed-over counts once they are replayed: the replayed symbols
    /// then grow into that memory instead of adding to the whole table at the peak.
    fn release(&mut self, range: std::ops::Range<usize>) {
        if let Source::Owned(c) = self {
            c.release_shards(range);
            // The replay threads allocate from other malloc arenas than the ones the tables were
            // freed into, so give the pages back rather than hope they are reused.
            release_free_memory();
        }
    }
}

/// Give memory freed by the allocator back to the system, so what was freed (e.g. the counts)
/// no longer counts in the peak when the next large arrays are touched.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused memory of the allocator's arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Trainer {
    /// Build the state from piece counts; pieces shorter than 2 bytes or with count 0 are dropped.
    pub fn new(counts: &Counts) -> Result<Trainer, String> {
        Trainer::with_replay(counts, &[])
    }

    /// `with_replay`, or for the official recipe's rules (`Rules::official`) the replay HF does:
    /// merge by merge on a table of every pair, leaving out absent merges when `drop_absent`.
    pub fn with_rules(
        counts: Source<'_>,
        replay: &[(Vec<u8>, Vec<u8>)],
        rules: &Rules,
        progress: &mut BuildProgress<'_>,
    ) -> Result<Trainer, String> {
        if !rules.official() {
            return Trainer::build(counts, replay, WARM_PAIRS, progress);
        }
        // All pairs warm: a pair is in `pairs` from when it occurs until it is merged (as in HF's
        // queue, which `drop_absent` asks about), and a duplicate merge adds to existing pairs.
        let mut t = Trainer::build(counts, &[], usize::MAX, progress)?;
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
        Trainer::build(Source::Borrowed(counts), replay, WARM_PAIRS, &mut |_, _, _| Ok(()))
    }

    /// `with_replay` from borrowed or handed-over counts, reporting progress (see `BuildProgress`).
    pub fn with_replay_progress(
        counts: Source<'_>,
        replay: &[(Vec<u8>, Vec<u8>)],
        progress: &mut BuildProgress<'_>,
    ) -> Result<Trainer, String> {
        Trainer::build(counts, replay, WARM_PAIRS, progress)
    }

    /// `with_replay`, keeping about `warm_pairs` pairs warm (tests use tiny values to exercise thawing).
    #[cfg(test)]
    pub(crate) fn with_replay_warm(
        counts: &Counts,
        replay: &[(Vec<u8>, Vec<u8>)],
        warm_pairs: usize,
    ) -> Result<Trainer, String> {
        Trainer::build(Source::Borrowed(counts), replay, warm_pairs, &mut |_, _, _| Ok(()))
    }

    /// A trainer with the 256 byte tokens and nothing else.
    fn bare() -> Trainer {
        let mut t = Trainer {
            syms: Symbols::default(),
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
        t
    }

    /// Add the tokens of the merges to replay, in order (each keeps id 256 + its index), and return
    /// their ranks.
    fn add_replayed(&mut self, replay: &[(Vec<u8>, Vec<u8>)]) -> Result<Ranks, String> {
        if replay.len() > MAX_REPLAY {
            return Err(format!("{} merges to replay; the native trainer takes at most {MAX_REPLAY}", replay.len()));
        }
        let mut ranks = Ranks::default();
        for (i, (lb, rb)) in replay.iter().enumerate() {
            let (Some(l), Some(r)) = (self.token_id(lb), self.token_id(rb)) else {
                return Err(format!("replay merge {i}: a part is not a token yet"));
            };
            let token = [lb.as_slice(), rb.as_slice()].concat();
            if self.token_ids.contains(&token) {
                return Err(format!("replay merge {i}: token already exists"));
            }
            let new = self.add_token(l, r, token);
            ranks.insert(pair_key(l, r), (i as u32, new));
        }
        Ok(ranks)
    }

    /// The symbols a build on `counts` would replay to (`symbol_count` of the built trainer),
    /// without laying them out or indexing their pairs.
    pub fn replayed_symbols(counts: &Counts, replay: &[(Vec<u8>, Vec<u8>)]) -> Result<u64, String> {
        let ranks = Trainer::bare().add_replayed(replay)?;
        if ranks.is_empty() {
            return Ok(counts.iter().filter(|(p, c)| p.len() >= 2 && *c > 0).map(|(p, _)| p.len() as u64).sum());
        }
        let chunks = replay_counts(counts, 0..SHARDS, &ranks, &Joins::of(replay), &segment_caches())?;
        Ok(chunks.iter().flat_map(|c| c.lens.iter()).map(|&len| len as u64).sum())
    }

    fn build(
        mut source: Source<'_>,
        replay: &[(Vec<u8>, Vec<u8>)],
        warm_pairs: usize,
        progress: &mut BuildProgress<'_>,
    ) -> Result<Trainer, String> {
        let mut t = Trainer::bare();
        let ranks = t.add_replayed(replay)?;
        // Piece order only changes memory layout, never the merges (pieces are independent).
        let total = source.get().len() as u64;
        progress("replay", 0, total)?;
        if ranks.is_empty() {
            let counts = source.get();
            let entries = || counts.iter().filter(|(p, c)| p.len() >= 2 && *c > 0);
            t.freq = entries()
                .map(|(_, c)| i64::try_from(c).map_err(|_| "piece count too large".to_string()))
                .collect::<Result<_, _>>()?;
            t.syms = Symbols::from_pieces(entries().map(|(p, _)| p.iter().map(|&b| b as u32)))?;
        } else {
            let joins = Joins::of(replay);
            let caches = segment_caches();
            let mut chunks = Vec::new();
            // A few shards at a time, to report progress between them.
            let (mut shard, mut done) = (0, 0u64);
            while shard < SHARDS {
                let end = (shard + SHARDS.div_ceil(REPLAY_REPORTS)).min(SHARDS);
                chunks.extend(replay_counts(source.get(), shard..end, &ranks, &joins, &caches)?);
                done += (shard..end).map(|s| source.get().shard_iter(s).count() as u64).sum::<u64>();
                source.release(shard..end);
                progress("replay", done, total)?;
                shard = end;
            }
            drop(caches);
            // The counts are not needed from here on: an owned table goes before the symbols come.
            drop(source);
            release_free_memory();
            t.lay_out_replayed(chunks)?;
            // The replayed chunks were freed in pieces; give their pages back before the index
            // is built on top (else they count in the peak).
            release_free_memory();
        }
        progress("index", 0, t.syms.len() as u64)?;
        t.index_pairs(warm_pairs);
        // The index's scratch and the cold pairs' positions are gone: their pages go back too.
        release_free_memory();
        progress("index", t.syms.len() as u64, t.syms.len() as u64)?;
        Ok(t)
    }

    /// Lay out the replayed pieces (those of at least 2 symbols), chunks in parallel, each chunk
    /// freed once it is copied.
    fn lay_out_replayed(&mut self, chunks: Vec<ReplayChunk>) -> Result<(), String> {
        let sizes: Vec<(usize, usize)> =
            chunks.iter().map(|c| (c.lens.iter().map(|&len| len as usize + 1).sum(), c.lens.len())).collect();
        if chunks.iter().any(|c| c.lens.iter().any(|&len| len as usize > MAX_PIECE)) {
            return Err(format!("a piece of more than {MAX_PIECE} symbols is too long for the native trainer"));
        }
        self.freq = chunks.iter().flat_map(|c| c.counts.iter().copied()).collect();
        self.syms = Symbols::from_batches(chunks, &sizes, |chunk, out| {
            let (mut at, mut slot) = (0, 0);
            for &len in &chunk.lens {
                let len = len as usize;
                chunk.syms.copy_to(at, &mut out[slot..slot + len]);
                out[slot + len].write(SEP);
                (at, slot) = (at + len, slot + len + 1);
            }
        })?;
        Ok(())
    }

    /// Build the pair table from the symbols (into an empty `pairs`), warm pairs only. Positions
    /// are counted per left symbol and scattered into one array (grouped by left symbol, ascending),
    /// then each left symbol's group is ordered by right symbol with a counting sort, which also
    /// weighs each pair. Pairs below the threshold for `warm_pairs` stay out (cold) and their
    /// positions are dropped. (A radix sort of 16-byte (key, place) items, plus its scratch copy,
    /// was the peak of a large stage 2.)
    fn index_pairs(&mut self, warm_pairs: usize) {
        let v = self.tokens.len();
        let parts = if self.syms.len() < 1 << 16 { 1 } else { rayon::current_num_threads().clamp(1, 8) };
        let ranges = self.syms.ranges(parts);
        let syms = &self.syms;
        let mut offsets: Vec<Vec<u32>> = ranges
            .par_iter()
            .map(|range| {
                let mut counts = vec![0u32; v];
                syms.pairs_in(range.clone(), |_, l, _, _| counts[l as usize] += 1);
                counts
            })
            .collect();
        // Each part's first slot per left symbol: symbols in order, and parts in order within one
        // (so each group's positions ascend). Totals stay below `MAX_SLOTS`, so u32 holds them.
        let mut starts = Vec::with_capacity(v + 1);
        let mut sum = 0u32;
        for l in 0..v {
            starts.push(sum);
            for part in offsets.iter_mut() {
                (part[l], sum) = (sum, sum + part[l]);
            }
        }
        starts.push(sum);
        let total = sum as usize;
        let mut positions: Vec<u32> = Vec::with_capacity(total);
        let out = Slots(positions.as_mut_ptr());
        ranges.par_iter().zip(offsets.par_iter_mut()).for_each(|(range, offsets)| {
            syms.pairs_in(range.clone(), |p, l, _, _| {
                // SAFETY: the slot is below `total` and reserved for this part and left symbol alone.
                unsafe { out.put(offsets[l as usize] as usize, p) };
                offsets[l as usize] += 1;
            });
        });
        // SAFETY: the parts wrote every slot below `total` (each exactly its own counts).
        unsafe { positions.set_len(total) };
        drop(offsets);
        let mut groups: Vec<(u32, u32, &mut [u32])> = Vec::new();
        let mut rest = positions.as_mut_slice();
        for l in 0..v {
            let (group, tail) = std::mem::take(&mut rest).split_at_mut((starts[l + 1] - starts[l]) as usize);
            rest = tail;
            if !group.is_empty() {
                groups.push((l as u32, starts[l], group));
            }
        }
        let keep = warm_pairs.max(1);
        let freq = &self.freq;
        let found: Vec<(Vec<Run>, Vec<i64>, usize)> = groups
            .into_par_iter()
            .fold(
                || (Vec::new(), BucketScratch::new(v, keep)),
                |(mut runs, mut scratch), (l, start, group)| {
                    sort_group(syms, freq, l, start, group, &mut scratch, &mut runs);
                    (runs, scratch)
                },
            )
            .map(|(runs, scratch)| (runs, scratch.top.into_iter().map(|r| r.0).collect(), scratch.runs_seen))
            .collect();
        // The `keep`-th largest count overall is among the jobs' largest (each kept its own top).
        let all_runs: usize = found.iter().map(|f| f.2).sum();
        self.cold_below = if all_runs > keep {
            let mut tops: Vec<i64> = found.iter().flat_map(|f| f.1.iter().copied()).collect();
            let k = tops.len() - keep;
            *tops.select_nth_unstable(k).1
        } else {
            0
        };
        // Keep the warm runs' positions only, moved down in place.
        let mut runs: Vec<Run> = found.into_iter().flat_map(|f| f.0).filter(|run| run.3 >= self.cold_below).collect();
        runs.sort_unstable_by_key(|run| run.1);
        self.pairs.reserve(runs.len());
        let mut w = 0usize;
        for (key, first, len, count) in runs {
            positions.copy_within(first as usize..(first + len) as usize, w);
            self.pairs.insert(key, PairInfo { count, first: w as u32, len, positions: SmallVec::new() });
            w += len as usize;
        }
        positions.truncate(w);
        positions.shrink_to_fit();
        self.initial = positions;
    }

    /// Live symbols of all pieces with at least 2 (those that made a pair).
    pub fn symbol_count(&self) -> usize {
        self.syms.len() - 1 - self.freq.len()
    }

    /// What the structures that grow with the corpus hold (`memory.rs` measures sample trainers
    /// with it where no formula of the counts is known).
    pub fn corpus_heap(&self) -> CorpusHeap {
        let (mut spilled, mut entries, mut slots) = (0u64, 0u64, 0u64);
        for pairs in [&self.pairs, &self.created] {
            // A spilled list is an allocation of its own: its capacity plus the allocator's header.
            spilled += pairs
                .values()
                .filter(|info| info.positions.spilled())
                .map(|info| info.positions.capacity() as u64 * 4 + ALLOCATION_HEADER)
                .sum::<u64>();
            entries += pairs.len() as u64;
            slots += pairs.capacity() as u64;
        }
        CorpusHeap {
            linear: self.syms.heap_bytes() as u64
                + self.freq.capacity() as u64 * 8
                + self.initial.capacity() as u64 * 4
                + spilled,
            pair_entries: entries,
            pair_slots: slots,
        }
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
            // Occurrences are scattered over all pieces, so each visit was a cache miss on its
            // symbols, its page and its piece's count; fetch them a few occurrences ahead.
            if let Some(&ahead) = positions.get(i + 2 * PREFETCH_AHEAD) {
                prefetch(self.syms.slot_ref(ahead));
                prefetch(self.syms.page_ref(ahead));
            }
            if let Some(&ahead) = positions.get(i + PREFETCH_AHEAD) {
                prefetch(&self.freq[self.syms.piece(ahead) as usize]);
            }
            if self.syms.get(p) != l {
                continue;
            }
            let q = self.syms.next(p);
            if q == NONE || self.syms.get(q) != r {
                continue;
            }
            let f = self.freq[self.syms.piece(p) as usize];
            let b = self.syms.prev(p);
            if b != NONE {
                let bs = self.syms.get(b);
                self.dec(pair_key(bs, l), f, new, gather);
                self.inc(pair_key(bs, new), f, b, new, gather, &mut fresh);
            }
            let a = self.syms.merge_at(p, q, new);
            if a != NONE {
                let as_ = self.syms.get(a);
                self.dec(pair_key(r, as_), f, new, gather);
                self.inc(pair_key(new, as_), f, p, new, gather, &mut fresh);
            }
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

/// Order one left symbol's positions (`group`, ascending, starting at `start` in the index) by
/// right symbol, stably, and add each pair's run `(key, first, len, count)` to `runs` unless it is
/// surely cold (see `BucketScratch`).
fn sort_group(
    syms: &Symbols,
    freq: &[i64],
    l: u32,
    start: u32,
    group: &mut [u32],
    scratch: &mut BucketScratch,
    runs: &mut Vec<Run>,
) {
    let n = group.len();
    scratch.rights.clear();
    scratch.tmp.clear();
    // Right symbol and piece of each position; these reads are scattered, so fetch ahead.
    for i in 0..n {
        if let Some(&ahead) = group.get(i + 2 * PREFETCH_AHEAD) {
            prefetch(syms.slot_ref(ahead));
            prefetch(syms.page_ref(ahead));
        }
        let p = group[i];
        scratch.rights.push(syms.get(syms.next(p)));
        scratch.tmp.push(syms.piece(p));
    }
    for i in 0..n {
        if let Some(&ahead) = scratch.tmp.get(i + PREFETCH_AHEAD) {
            prefetch(&freq[ahead as usize]);
        }
        let r = scratch.rights[i] as usize;
        if scratch.count[r] == 0 {
            scratch.touched.push(r as u32);
        }
        scratch.count[r] += 1;
        scratch.weight[r] += freq[scratch.tmp[i] as usize];
    }
    scratch.touched.sort_unstable();
    let mut at = 0u32;
    let touched = std::mem::take(&mut scratch.touched);
    for &r in &touched {
        let (len, count) = (scratch.count[r as usize], scratch.weight[r as usize]);
        if scratch.may_be_warm(count) {
            runs.push((pair_key(l, r), start + at, len, count));
        }
        scratch.count[r as usize] = at;
        scratch.weight[r as usize] = 0;
        at += len;
    }
    for (&p, &r) in group.iter().zip(&scratch.rights) {
        let slot = &mut scratch.count[r as usize];
        scratch.tmp[*slot as usize] = p;
        *slot += 1;
    }
    group.copy_from_slice(&scratch.tmp);
    for &r in &touched {
        scratch.count[r as usize] = 0;
    }
    scratch.touched = touched;
    scratch.touched.clear();
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
        let c = counts(&[("abab", 3), ("cd", 2)]);
        let mut t = Trainer::with_rules(Source::Borrowed(&c), &replay, &rules, &mut |_, _, _| Ok(())).unwrap();
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

#[cfg(test)]
mod source_tests {
    use super::*;

    /// Counts handed over (and freed after replay) build the same trainer as borrowed ones.
    #[test]
    fn owned_counts_choose_the_same_merges() {
        let mut c = Counts::default();
        for (p, n) in [("hello world\n", 3), ("hello there world\n", 2), ("a", 5), ("wow wow\n", 4)] {
            c.add(p.as_bytes(), n).unwrap();
        }
        let replay = vec![(b"l".to_vec(), b"l".to_vec()), (b"o".to_vec(), b" ".to_vec())];
        let mut borrowed = Trainer::with_replay(&c, &replay).unwrap();
        borrowed.choose(30, &Rules::default(), usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        let mut owned = Trainer::with_replay_progress(Source::Owned(c), &replay, &mut |_, _, _| Ok(())).unwrap();
        owned.choose(30, &Rules::default(), usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        assert!(owned.merges().eq(borrowed.merges()));
        assert!(owned.parts.len() > replay.len());
    }
}
