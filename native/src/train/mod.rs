//! BPE trainer: the same merges as `superbpe.engines.python_trainer.train_merges`, on compact state.
//!
//! Every unique piece is stored once as a run of u32 symbols in one flat array (`symbols.rs`:
//! about 4 bytes per symbol, a merge rewrites an occurrence in O(1) even inside a whole-line
//! SuperBPE piece). The inverted index maps a pair to the *positions* where it was created
//! (append-only, checked lazily), so a merge visits only its occurrences, not whole pieces; only
//! warm pairs keep positions. Choosing uses a lazy max-heap ordered like the python engine: highest
//! count, then the greatest `(left bytes, right bytes)`.
//!
//! The trainer's parts, one concern per file: `rules.rs` (which tokens may be made, the official
//! tie-break keys), `index.rs` (the pair index built from the symbols), `merge.rs` (applying one
//! merge to every occurrence and updating pair counts), `choose.rs` (the lazy heap and the loop that
//! picks merges). This file holds the state and the driver: building it from counts, with replay.

mod choose;
mod cut;
mod index;
mod merge;
mod rules;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::bpe::{pair_key, PairHasher, Ranks};
use crate::bytesmap::BytesMap;
use crate::joins::Joins;
use crate::pairs::PairSketch;
use crate::replay::{self, pair_sketches, replay_counts, segment_caches, Part, ReplayChunk, MAX_REPLAY};
use crate::symbols::{Symbols, DEAD, MAX_PIECE, SEP};
use crate::tables::Counts;

use cut::CutPlan;
use rules::hf_tie_key;
pub use rules::Rules;

/// Most merges a trainer makes: token ids stay below `symbols::DEAD`.
pub const MAX_MERGES: usize = DEAD as usize - 256;

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

type PairMap = HashMap<u64, PairInfo, std::hash::BuildHasherDefault<PairHasher>>;

/// The number of pairs kept warm when a state has many (see `Trainer::cold_below`).
pub const WARM_PAIRS: usize = 1 << 16;

/// How many progress reports replay makes (at most).
const REPLAY_REPORTS: usize = 20;
/// Pieces in one part of replay's parallel work (see `replay::parts`).
const PART_PIECES: usize = 1 << 14;

/// How many occurrences ahead `merge` and the index ask for a piece's count (and twice that for
/// its symbols).
const PREFETCH_AHEAD: usize = 8;

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
    /// The replayed pieces are laid out cut at the boundaries whose initial pair counts below
    /// this (see `cut.rs`): while the best pair counts at least this, the merges are those of the
    /// whole pieces. 0 when the pieces are whole.
    cut_below: i64,
    /// What cutting again lower needs (None when the pieces are whole).
    cut: Option<Box<cut::Cut>>,
    /// About how many pairs the index keeps warm (see `index_pairs`).
    warm_pairs: usize,
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

    /// Free the tables of handed-over counts, keeping their keys (replay reads the keys in memory
    /// order and looks nothing up).
    fn release_tables(&mut self) {
        if let Source::Owned(c) = self {
            c.release_tables();
            release_free_memory();
        }
    }

    /// Free the keys of handed-over counts that replay has passed (see
    /// `Counts::release_keys_before`): the replayed symbols then grow into that memory instead of
    /// adding to the whole table at the peak.
    fn release_keys_before(&mut self, arena: usize, loc: u64) {
        if let Source::Owned(c) = self {
            c.release_keys_before(arena, loc);
            // The replay threads allocate from other malloc arenas than the ones the keys were
            // freed into, so give the pages back rather than hope they are reused.
            release_free_memory();
        }
    }
}

/// Each thread's pair sketch, out of its lock.
fn unlocked(sketches: Vec<std::sync::Mutex<PairSketch>>) -> Vec<PairSketch> {
    sketches.into_iter().map(|p| p.into_inner().unwrap_or_else(|e| e.into_inner())).collect()
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

    /// `with_replay` for a run that will choose up to `num_merges` merges in all (its replayed
    /// pieces are then cut where those merges cannot reach, see `cut.rs`), or for the official
    /// recipe's rules (`Rules::official`) the replay HF does: merge by merge on a table of every
    /// pair, leaving out absent merges when `drop_absent`.
    pub fn with_rules(
        counts: Source<'_>,
        replay: &[(Vec<u8>, Vec<u8>)],
        rules: &Rules,
        num_merges: usize,
        progress: &mut BuildProgress<'_>,
    ) -> Result<Trainer, String> {
        if !rules.official() {
            let to_choose = num_merges.saturating_sub(replay.len());
            return Trainer::build(
                counts,
                replay,
                WARM_PAIRS,
                Some(CutPlan { to_choose, sketch_bits: None }),
                progress,
            );
        }
        // All pairs warm: a pair is in `pairs` from when it occurs until it is merged (as in HF's
        // queue, which `drop_absent` asks about), and a duplicate merge adds to existing pairs.
        // Never cut: `drop_absent` asks whether a pair occurs at all.
        let mut t = Trainer::build(counts, &[], usize::MAX, None, progress)?;
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
        Trainer::build(Source::Borrowed(counts), replay, WARM_PAIRS, None, &mut |_, _, _| Ok(()))
    }

    /// `with_replay` from borrowed or handed-over counts, reporting progress (see `BuildProgress`).
    pub fn with_replay_progress(
        counts: Source<'_>,
        replay: &[(Vec<u8>, Vec<u8>)],
        progress: &mut BuildProgress<'_>,
    ) -> Result<Trainer, String> {
        Trainer::build(counts, replay, WARM_PAIRS, None, progress)
    }

    /// `with_replay`, keeping about `warm_pairs` pairs warm (tests use tiny values to exercise thawing).
    #[cfg(test)]
    pub(crate) fn with_replay_warm(
        counts: &Counts,
        replay: &[(Vec<u8>, Vec<u8>)],
        warm_pairs: usize,
    ) -> Result<Trainer, String> {
        Trainer::build(Source::Borrowed(counts), replay, warm_pairs, None, &mut |_, _, _| Ok(()))
    }

    /// `with_replay`, cut for choosing `to_choose` merges (tests use few to cut high and often), its
    /// pairs counted in `2^sketch_bits` buckets when given (few make rare pairs share hot buckets).
    #[cfg(test)]
    pub(crate) fn with_replay_cut(
        counts: &Counts,
        replay: &[(Vec<u8>, Vec<u8>)],
        to_choose: usize,
        sketch_bits: Option<u32>,
        warm_pairs: usize,
    ) -> Result<Trainer, String> {
        let plan = CutPlan { to_choose, sketch_bits };
        Trainer::build(Source::Borrowed(counts), replay, warm_pairs, Some(plan), &mut |_, _, _| Ok(()))
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
            cut_below: 0,
            cut: None,
            warm_pairs: WARM_PAIRS,
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

    /// The symbols a build on `counts` would replay to (`symbol_count` of the built trainer)
    /// and about how many distinct pairs they make (0 without merges to replay), without laying
    /// them out or indexing their pairs.
    pub fn replayed(counts: &Counts, replay: &[(Vec<u8>, Vec<u8>)]) -> Result<(u64, u64), String> {
        let ranks = Trainer::bare().add_replayed(replay)?;
        if ranks.is_empty() {
            let symbols = counts.iter().filter(|(p, c)| p.len() >= 2 && *c > 0).map(|(p, _)| p.len() as u64).sum();
            return Ok((symbols, 0));
        }
        let sketches = pair_sketches(PairSketch::bits_for(counts.heap_bytes()));
        let order = counts.take_memory_order();
        let parts = replay::parts(&order, PART_PIECES);
        let chunks = replay_counts(counts, &parts, &ranks, &Joins::of(replay), &segment_caches(), Some(&sketches))?;
        let symbols = chunks.iter().flat_map(|c| c.lens.iter()).map(|&len| len as u64).sum();
        Ok((symbols, PairSketch::merged(unlocked(sketches)).distinct_pairs()))
    }

    /// `cut`: lay replayed pieces out cut as it says (see `cut.rs`).
    fn build(
        mut source: Source<'_>,
        replay: &[(Vec<u8>, Vec<u8>)],
        warm_pairs: usize,
        cut: Option<CutPlan>,
        progress: &mut BuildProgress<'_>,
    ) -> Result<Trainer, String> {
        let mut t = Trainer::bare();
        t.warm_pairs = warm_pairs;
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
            // Cutting needs to know which replayed pairs may be hot: replay counts them by bucket
            // as it goes.
            let pairs = cut.map(|c| {
                pair_sketches(c.sketch_bits.unwrap_or_else(|| PairSketch::bits_for(source.get().heap_bytes())))
            });
            let mut chunks = Vec::new();
            // Listed already when the memory estimate read the keys in this order.
            let order = source.get().take_memory_order();
            source.release_tables();
            let parts = replay::parts(&order, PART_PIECES);
            // A few parts at a time, to report progress and free the keys passed between them.
            let per_report = order.len().div_ceil(REPLAY_REPORTS).max(1);
            let (mut at, mut done) = (0, 0u64);
            while at < parts.len() {
                let (mut end, mut pieces) = (at, 0);
                while end < parts.len() && (end == at || pieces < per_report) {
                    pieces += parts[end].len();
                    end += 1;
                }
                chunks.extend(replay_counts(source.get(), &parts[at..end], &ranks, &joins, &caches, pairs.as_deref())?);
                if let Part::Long { arena, entries } = parts[end - 1] {
                    source.release_keys_before(arena, entries[entries.len() - 1].0);
                }
                done += pieces as u64;
                progress("replay", done, total)?;
                at = end;
            }
            drop(parts);
            drop(order);
            drop(caches);
            // The counts are not needed from here on: an owned table goes before the symbols come.
            drop(source);
            release_free_memory();
            match (cut, pairs) {
                (Some(CutPlan { to_choose: n, .. }), Some(pairs)) => {
                    let symbols: u64 = chunks.iter().flat_map(|c| c.lens.iter()).map(|&len| len as u64).sum();
                    progress("cut", 0, symbols)?;
                    t.lay_out_cut(chunks, PairSketch::merged(unlocked(pairs)), n)?;
                    progress("cut", symbols, symbols)?;
                }
                _ => t.lay_out_replayed(chunks)?,
            }
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

    /// Index the symbols afresh (after they were laid out again).
    fn reindex(&mut self) {
        self.pairs = PairMap::default();
        self.created = PairMap::default();
        self.initial = Vec::new();
        self.index_pairs(self.warm_pairs);
        release_free_memory();
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
        // SAFETY: a chunk's part has its size, `len + 1` slots per piece, and the closure writes
        // them all in order: `copy_to` writes every slot of the `len` it is given, then `SEP`.
        self.syms = unsafe {
            Symbols::from_batches(chunks, &sizes, |chunk, out| {
                let (mut at, mut slot) = (0, 0);
                for &len in &chunk.lens {
                    let len = len as usize;
                    chunk.syms.copy_to(at, &mut out[slot..slot + len]);
                    out[slot + len].write(SEP);
                    (at, slot) = (at + len, slot + len + 1);
                }
            })
        }?;
        Ok(())
    }

    /// Whether the pieces are laid out cut (see `cut.rs`).
    #[cfg(test)]
    pub(crate) fn is_cut(&self) -> bool {
        self.cut.is_some()
    }

    /// Live symbols of all pieces with at least 2 (those that made a pair).
    pub fn symbol_count(&self) -> usize {
        self.syms.len() - 1 - self.freq.len()
    }

    /// What the structures that grow with the corpus hold (`memory/estimate.rs` measures sample trainers
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
                + self.cut.as_ref().map_or(0, |c| c.heap_bytes())
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
