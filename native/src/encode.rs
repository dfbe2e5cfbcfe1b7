//! Encoder: pieces to ids by merge rank (docs/DESIGN.md "Encoding").
//!
//! Inside a piece: if the piece's bytes are a token (and `whole_pieces` is on), that id; otherwise
//! start from single bytes and repeatedly merge the adjacent pair with the lowest merge rank,
//! leftmost on ties (HF's `ignore_merges: false` is `whole_pieces` off). A vocabulary may lack
//! single bytes (HF-trained ones keep only the bytes they saw): that is an error only for a text
//! that needs such a byte.
//!
//! Where the time goes, and what each part does about it:
//! - Looking pieces up: the vocabulary and the piece caches are [`PieceMap`]s (keys up to 15 bytes
//!   packed beside their value in a flat table). The scanner only notes where pieces are; they are
//!   keyed, hashed and looked up in runs (see [`RUN`]), and a piece found with its ids inline
//!   costs no branch of its own.
//! - Pieces that are not tokens repeat (rare words, identifiers), so their ids are cached, in the
//!   same table as the tokens and bytes it is seeded with: a short piece is one lookup, and one-byte
//!   pieces take no branch of their own (code has many, unpredictably). A cache is
//!   owned by one caller for a whole text (or a group of texts of a batch): it is taken from a small
//!   pool of slots with one uncontended `try_lock` per text instead of a lock per piece, and a caller
//!   that finds every slot busy encodes without one (same ids).
//! - Merging: a short piece is merged on the stack with a linear scan (fewer cache misses than a
//!   heap); its first round looks pairs of bytes up in a dense table. A long piece (a whole-line
//!   SuperBPE piece) uses a lazy min-heap over a linked list, O(n log n) instead of O(n²).
//! - A SuperBPE tokenizer's pieces that are not tokens are merged on two levels where that gives
//!   the same ids (`encode_levels.rs`): words first, each cached, then the merges that join them.
//!   Its per-caller state lives beside the caller's piece cache, taken with it once per text.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::mem::MaybeUninit;
use std::sync::Mutex;

use crate::batch::{thread_share, BatchIds};
use crate::bpe::{self, PairHasher};
use crate::encode_levels::{Levels, Plan, Request, Worker};
use crate::piecemap::{hash_packed, pack, pack_within, PieceMap, Probe, NO_KEY, PACKED_MAX};
use crate::scan::{Pieces, Splitter};

/// Pieces up to this many bytes are merged on the stack with the linear scan.
const SMALL_MAX: usize = 64;
/// A cache stops taking new pieces at this many (about 32 bytes each, plus long results).
const CACHE_MAX_ENTRIES: usize = 1 << 18;
/// How many pieces that are not tokens a cache is expected to take while encoding `bytes` of
/// text, at most [`CACHE_MAX_ENTRIES`]: they grow about as the text's size to the power 0.62
/// (GPT-2's vocabulary: 1 MB of C or of English adds 5-7K, 10 MB of C about 29K, 20 MB about
/// 46K). A seeded table with room for them does not grow while the text is encoded: growing takes
/// a table twice the size in fresh memory and places every key again, a sizeable share of a
/// first pass over a large batch.
fn expected_pieces(bytes: usize) -> usize {
    let megabytes = bytes as f64 / 1e6;
    ((7000.0 * megabytes.powf(0.62)) as usize).min(CACHE_MAX_ENTRIES)
}

/// Ids of cached results longer than [`INLINE_IDS`] live in an arena of at most this many ids.
const CACHE_MAX_ARENA: usize = 1 << 22;
/// Pieces longer than this are not cached (they rarely repeat).
const CACHE_MAX_PIECE: usize = 256;

/// A merge as one word: rank in the high half, merged id in the low half, so comparing two words
/// compares ranks; `NO_MERGE` (all ones) is above every real merge.
type Packed = u64;
const NO_MERGE: Packed = u64::MAX;

#[inline(always)]
fn packed(rank: u32, merged: u32) -> Packed {
    (rank as u64) << 32 | merged as u64
}

/// Ids a cached piece encodes to: up to this many inline, more in the cache's arena.
const INLINE_IDS: usize = 3;

/// Room a run's lookup keeps for the ids of arena pieces past their first [`INLINE_IDS`].
const ARENA_ROOM: usize = 256;

/// The ids first and their number last, so that the whole value is the four lanes
/// [`PieceCache::write_found`] stores at once.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Cached {
    /// The ids when `len <= INLINE_IDS`, else `ids[0]` is the offset of the ids in the arena.
    ids: [u32; INLINE_IDS],
    len: u32,
}

impl Cached {
    /// The inline ids, and one more lane (the count) that a cursor moving by `len` leaves behind.
    #[inline(always)]
    fn lanes(&self) -> [u32; INLINE_IDS + 1] {
        [self.ids[0], self.ids[1], self.ids[2], self.len]
    }
}

const _: () = assert!(INLINE_IDS == 3, "Cached::lanes names each inline id");

/// One caller's cache of pieces, and its two-level state. It is seeded, when first taken, with
/// every single byte and (with `whole_pieces`) every token of at most [`PACKED_MAX`] bytes, each
/// mapped to its id: then a short piece costs one lookup, whether it is a token or not.
#[derive(Default)]
struct PieceCache {
    map: PieceMap<Cached>,
    /// Whether `map` holds the seeds yet.
    seeded: bool,
    /// The number of entries past which no piece is added (seeds plus [`CACHE_MAX_ENTRIES`]).
    limit: usize,
    arena: Vec<u32>,
    /// Segment cache and scratch space of the two levels (empty when they are not used).
    levels: Worker,
    /// The room of a text's [`Waiting`] pieces, kept between texts.
    waiting: Vec<Waiting>,
    /// The ids of [`Encoder::with_ids`], kept between texts.
    ids: Vec<u32>,
}

/// A cache keeps the room of [`Encoder::with_ids`] up to this many ids (a long text's room is
/// given back).
const IDS_KEPT: usize = 1 << 16;

/// Pieces are looked up in runs of this many: each piece is keyed and hashed as the scanner
/// gives it (a block's pieces at once), and a run's pieces are looked up in one loop, short
/// enough to stay inlined and in registers (the scanner's call per piece into one long lookup
/// cost more than the lookup).
const RUN: usize = 64;

/// The scanner's pieces noted in runs of [`RUN`] (each keyed and hashed, its line of the table
/// asked for), each run looked up when full: a line has the rest of its run to come.
struct RunSink<'e, 'c> {
    encoder: &'e Encoder,
    text: &'e [u8],
    out: &'c mut Vec<u32>,
    cache: &'c mut PieceCache,
    /// Room for a run (`RUN` entries), of which the first `n` are noted.
    run: &'c mut [Waiting],
    n: usize,
}

impl RunSink<'_, '_> {
    /// Look up the run's pieces noted so far, and start the next run.
    fn flush(&mut self) {
        self.encoder.look_up_run(self.text, &mut self.run[..self.n], self.out, self.cache);
        self.n = 0;
    }
}

/// The run entry of the piece at `at` of `len` bytes of `text`: keyed and hashed, and its line of
/// the cache's table (`probe`) asked for, which has the rest of the run to come.
#[inline(always)]
fn keyed(text: &[u8], probe: Probe<'_, Cached>, at: usize, len: usize) -> Waiting {
    let (k0, k1) = key_in(text, at, len);
    let hash = hash_packed(k0, k1);
    probe.prefetch(hash);
    Waiting { at, len, k0, k1, hash }
}

impl<'a> Pieces<'a> for RunSink<'_, '_> {
    #[inline(always)]
    fn piece(&mut self, piece: &'a [u8]) {
        // Pieces are slices of the text, so their offset is an address difference.
        let at = piece.as_ptr() as usize - self.text.as_ptr() as usize;
        // `n` is below RUN (a power of two), so the mask changes nothing and spares a check.
        self.run[self.n % RUN] = keyed(self.text, self.cache.map.probe(), at, piece.len());
        self.n += 1;
        if self.n == RUN {
            self.flush();
        }
    }

    /// A block's pieces with the run's count, the text and the table in registers: noted one by
    /// one, they went to memory and back between pieces (the scanner cannot tell that noting a
    /// piece leaves them alone). `from` and the ends count from the start of `s`, which is a
    /// line of the text, not the text, when the splitter cuts it into line units.
    #[inline(always)]
    fn ends(&mut self, s: &'a [u8], from: usize, ends: u64) {
        let base = s.as_ptr() as usize - self.text.as_ptr() as usize;
        let from = base + from;
        let (mut at, mut rest, mut n, text) = (from, ends, self.n, self.text);
        let mut probe = self.cache.map.probe();
        while rest != 0 {
            let next = from + rest.trailing_zeros() as usize;
            self.run[n % RUN] = keyed(text, probe, at, next - at);
            n += 1;
            if n == RUN {
                self.n = n;
                self.flush();
                (n, probe) = (0, self.cache.map.probe());
            }
            at = next;
            rest &= rest - 1;
        }
        self.n = n;
    }
}

const _: () = assert!(RUN.is_power_of_two());

/// A piece of a run: where it is in the text, then its packed key and hash.
#[derive(Clone, Copy, Default)]
struct Waiting {
    at: usize,
    len: usize,
    /// The packed key; `k1` is [`NO_KEY`] for a piece longer than [`PACKED_MAX`].
    k0: u64,
    k1: u64,
    hash: u64,
}

impl PieceCache {
    /// Append the cached ids of `piece` to `out`; false when it is not cached.
    #[inline(always)]
    fn extend(&self, piece: &[u8], out: &mut Vec<u32>) -> bool {
        self.extend_found(self.map.get(piece), out)
    }

    /// [`Self::extend`] for a piece given by its packed key.
    #[inline(always)]
    fn extend_packed(&self, k0: u64, k1: u64, out: &mut Vec<u32>) -> bool {
        self.extend_found(self.map.get_packed(k0, k1), out)
    }

    #[inline(always)]
    fn extend_found(&self, found: Option<Cached>, out: &mut Vec<u32>) -> bool {
        let Some(c) = found else { return false };
        let n = c.len as usize;
        if n <= INLINE_IDS {
            out.extend_from_slice(&c.ids[..n]);
        } else {
            let at = c.ids[0] as usize;
            out.extend_from_slice(&self.arena[at..at + n]);
        }
        true
    }

    /// The ids of a run of keyed pieces of `text`, in order, appended to `out`: the pieces found
    /// with their ids inline in one tight loop, each other one by `slow`.
    #[inline(always)]
    fn look_up_run(
        &mut self,
        text: &[u8],
        run: &[Waiting],
        out: &mut Vec<u32>,
        mut slow: impl FnMut(&mut Self, &[u8], &Waiting, &mut Vec<u32>),
    ) {
        let mut i = 0;
        while i < run.len() {
            i += self.append_found(&run[i..], out);
            if let Some(w) = run.get(i) {
                slow(self, &text[w.at..w.at + w.len], w, out);
                i += 1;
            }
        }
    }

    /// Append the ids of the pieces at the start of `run` that are cached with their ids inline,
    /// up to the first that is not; returns how many pieces that was.
    #[inline(always)]
    fn append_found(&self, run: &[Waiting], out: &mut Vec<u32>) -> usize {
        out.reserve(run.len() * INLINE_IDS + 1 + ARENA_ROOM);
        let len = out.len();
        let (pieces, ids) = self.write_found(run, out.spare_capacity_mut());
        // SAFETY: `write_found` wrote the first `ids` elements of the spare capacity: for each
        // piece it writes INLINE_IDS + 1 elements from its cursor, then moves the cursor by at
        // most INLINE_IDS, so every element below the final cursor was written.
        unsafe { out.set_len(len + ids) };
        pieces
    }

    /// The loop of [`Self::append_found`], writing into `room` (at least
    /// `INLINE_IDS * run.len() + 1` long): returns how many pieces it took and how many ids it
    /// wrote, all of `room[..ids]`. A piece's value is written whole (its ids and one lane
    /// more, in one store) whatever its number of ids, and the cursor moves by that number:
    /// pieces of one, two and three ids alternate unpredictably, and a branch on the count
    /// mispredicted often. The cursor stays in a register (moving a `Vec`'s length per piece
    /// made each piece wait for the last). A piece of more ids is copied from the arena while
    /// the room past that takes them: runs of indentation and upper-case names in C are such
    /// pieces, a few in a hundred, and leaving the loop for each cost more than the copy.
    #[inline(always)]
    fn write_found(&self, run: &[Waiting], room: &mut [MaybeUninit<u32>]) -> (usize, usize) {
        assert!(room.len() > INLINE_IDS * run.len(), "room for the ids of a run");
        // The room past what inline ids can take, for the ids of arena pieces beyond INLINE_IDS.
        let mut spare = room.len() - INLINE_IDS * run.len() - 1;
        let dst = room.as_mut_ptr();
        let mut written = 0;
        let probe = self.map.probe();
        for (i, w) in run.iter().enumerate() {
            let Some(c) = probe.get(w.k0, w.k1, w.hash) else { return (i, written) };
            let n = c.len as usize;
            // Invariant: written <= INLINE_IDS * i + (the spare room spent so far).
            if n > INLINE_IDS {
                if n - INLINE_IDS > spare {
                    return (i, written);
                }
                spare -= n - INLINE_IDS;
                let at = c.ids[0] as usize;
                let ids = &self.arena[at..at + n];
                // SAFETY: by the invariant, with this piece's excess now spent,
                // `written + n <= INLINE_IDS * (i + 1) + (room.len() - INLINE_IDS * run.len() - 1)
                // < room.len()`: the ids land in `room`, which does not overlap the arena.
                unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), dst.add(written).cast::<u32>(), n) };
                written += n;
                continue;
            }
            // SAFETY: by the invariant, `written + INLINE_IDS + 1 <= INLINE_IDS * (i + 1) + 1 +
            // (room.len() - INLINE_IDS * run.len() - 1) <= room.len()`: the lanes land in `room`.
            // Writing a `u32` into a `MaybeUninit<u32>` needs no alignment beyond the unaligned
            // write's.
            unsafe { dst.add(written).cast::<[u32; INLINE_IDS + 1]>().write_unaligned(c.lanes()) };
            written += n;
        }
        (run.len(), written)
    }

    fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        if self.map.len() >= self.limit {
            return;
        }
        let mut c = Cached { ids: [0; INLINE_IDS], len: ids.len() as u32 };
        if ids.len() <= INLINE_IDS {
            c.ids[..ids.len()].copy_from_slice(ids);
        } else {
            if self.arena.len() + ids.len() > CACHE_MAX_ARENA {
                return;
            }
            c.ids[0] = self.arena.len() as u32;
            self.arena.extend_from_slice(ids);
        }
        self.map.insert(piece, c);
    }
}

pub struct Encoder {
    splitter: Splitter,
    vocab: PieceMap<u32>,
    /// The id of each single byte; `MISSING` where the vocabulary has none.
    byte_ids: [u32; 256],
    /// Whether any byte is `MISSING` (only then is the output checked for it).
    lacks_bytes: bool,
    /// Map a piece that is itself a token straight to its id (see the module doc).
    whole_pieces: bool,
    /// (left id, right id) -> packed (rank, merged id)
    ranks: HashMap<u64, Packed, BuildHasherDefault<PairHasher>>,
    /// The merge of two single-byte tokens, indexed by the two bytes: the first round of every
    /// merge without a hash lookup.
    byte_pairs: Box<[Packed]>,
    /// The pool of piece caches (see the module doc).
    caches: Vec<Mutex<PieceCache>>,
    /// Two-level BPE of SuperBPE pieces where it is exact (`encode_levels.rs`), else one level.
    levels: Plan,
}

/// The id of a byte the vocabulary lacks: no merge has it as a part, so it survives BPE unchanged
/// and `encode_ordinary` reports it.
const MISSING: u32 = u32::MAX;

impl Encoder {
    /// `vocab`: bytes -> id; `merges` in rank order. Every merge's two parts and its result must be
    /// in `vocab` (an error names the first merge that breaks this).
    /// Two levels where they are exact (`Request::Auto`).
    pub fn new(
        vocab: Vec<(Vec<u8>, u32)>,
        merges: &[(Vec<u8>, Vec<u8>)],
        splitter: Splitter,
        whole_pieces: bool,
    ) -> Result<Encoder, String> {
        Encoder::with_levels(vocab, merges, splitter, whole_pieces, Request::Auto)
    }

    /// As `new`, with the levels chosen as `request` says.
    pub fn with_levels(
        vocab: Vec<(Vec<u8>, u32)>,
        merges: &[(Vec<u8>, Vec<u8>)],
        splitter: Splitter,
        whole_pieces: bool,
        request: Request,
    ) -> Result<Encoder, String> {
        let map: PieceMap<u32> = PieceMap::of_entries(&vocab);
        let mut byte_ids = [MISSING; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = map.get(&[b as u8]).unwrap_or(MISSING);
        }
        let lacks_bytes = byte_ids.contains(&MISSING);
        let mut ranks: HashMap<u64, Packed, BuildHasherDefault<PairHasher>> = HashMap::default();
        for (rank, [li, ri, mi]) in map.merge_values(merges).into_iter().enumerate() {
            let (left, right) = (&merges[rank].0, &merges[rank].1);
            let shown = || format!("merge #{rank} (b\"{}\", b\"{}\")", left.escape_ascii(), right.escape_ascii());
            // A part that is not a token: this encoder, starting from the bytes' ids, could never
            // apply the merge, where one starting from bytes does (a byte the vocab lacks), so the
            // two would give different ids; refused as the Tokenizer and the file readers refuse it.
            let (Some(li), Some(ri)) = (li, ri) else {
                let part = if li.is_none() { left } else { right };
                return Err(format!("{} joins b\"{}\", which is not in the vocabulary", shown(), part.escape_ascii()));
            };
            let Some(mi) = mi else {
                return Err(format!("{}: the token it makes is not in the vocabulary", shown()));
            };
            ranks.entry(bpe::pair_key(li, ri)).or_insert(packed(rank as u32, mi));
        }
        let mut byte_pairs = vec![NO_MERGE; 1 << 16].into_boxed_slice();
        for (i, slot) in byte_pairs.iter_mut().enumerate() {
            let (l, r) = (byte_ids[i >> 8], byte_ids[i & 0xFF]);
            if l != MISSING && r != MISSING {
                *slot = ranks.get(&bpe::pair_key(l, r)).copied().unwrap_or(NO_MERGE);
            }
        }
        let levels = match request {
            Request::One => Plan::One("one level was asked for".into()),
            _ => {
                let entries: Vec<(u64, (u32, u32))> =
                    ranks.iter().map(|(&k, &p)| (k, ((p >> 32) as u32, p as u32))).collect();
                Levels::plan(merges, &entries, request)
            }
        };
        let slots = std::thread::available_parallelism().map_or(1, |n| n.get()) + 1;
        Ok(Encoder {
            splitter,
            vocab: map,
            byte_ids,
            lacks_bytes,
            whole_pieces,
            ranks,
            byte_pairs,
            caches: (0..slots).map(|_| Mutex::new(PieceCache::default())).collect(),
            levels,
        })
    }

    pub fn splitter(&self) -> &Splitter {
        &self.splitter
    }

    /// The levels chosen at construction.
    pub fn plan(&self) -> &Plan {
        &self.levels
    }

    /// Run `f` with a piece cache no other thread is using, or with none when all are busy. A
    /// thread of a rayon pool tries the slot of its index first, so a pool's threads do not meet.
    /// A cache seeded here gets room for the pieces `text_bytes` of text are expected to add
    /// (the bytes this caller is about to encode with it).
    fn with_cache<R>(&self, text_bytes: usize, f: impl FnOnce(Option<&mut PieceCache>) -> R) -> R {
        let n = self.caches.len();
        let first = rayon::current_thread_index().map_or(0, |i| i + 1);
        for k in 0..n {
            if let Ok(mut cache) = self.caches[(first + k) % n].try_lock() {
                if !cache.seeded {
                    self.seed(&mut cache, text_bytes);
                }
                return f(Some(&mut cache));
            }
        }
        f(None)
    }

    /// Fill a new cache with its seeds (see [`PieceCache`]): the vocabulary's short tokens (copied
    /// slot by slot, a pass over its table, where that table has room for the pieces
    /// `text_bytes` of text are expected to add), then every byte the vocabulary has.
    fn seed(&self, cache: &mut PieceCache, text_bytes: usize) {
        let one = |id: u32| Cached { len: 1, ids: [id, 0, 0] };
        let more = expected_pieces(text_bytes);
        cache.map = if self.whole_pieces {
            self.vocab.map_packed(one, more)
        } else {
            PieceMap::with_capacity((1 << 10) + more)
        };
        for (b, &id) in self.byte_ids.iter().enumerate() {
            if id != MISSING {
                cache.map.insert(&[b as u8], one(id));
            }
        }
        cache.arena.clear();
        cache.limit = cache.map.len() + CACHE_MAX_ENTRIES;
        cache.seeded = true;
    }

    /// Ids of text with no special tokens in it.
    pub fn encode_ordinary(&self, text: &[u8], out: &mut Vec<u32>) -> Result<(), String> {
        self.encode_ordinary_of_share(text, out, text.len())
    }

    /// [`Self::encode_ordinary`] for a caller that encodes about `share` bytes in all on this
    /// thread (its share of a batch, one text after another): a cache seeded now gets room for
    /// the pieces of all of them, not of this text alone.
    pub fn encode_ordinary_of_share(&self, text: &[u8], out: &mut Vec<u32>, share: usize) -> Result<(), String> {
        self.with_cache(share.max(text.len()), |mut cache| self.encode_with(text, out, &mut cache))
    }

    /// `f` of the ids of `text` (no special tokens in it), encoded into room the piece cache
    /// keeps: a caller that copies the ids out anyway (into a Python list or array) allocates
    /// nothing per text. `f` runs while the cache is held.
    pub fn with_ids<R>(&self, text: &[u8], f: impl FnOnce(&[u32]) -> R) -> Result<R, String> {
        self.with_cache(text.len(), |cache| {
            let Some(cache) = cache else {
                let mut ids = Vec::new();
                self.encode_with(text, &mut ids, &mut None)?;
                return Ok(f(&ids));
            };
            let mut ids = std::mem::take(&mut cache.ids);
            ids.clear();
            let encoded = self.encode_with(text, &mut ids, &mut Some(&mut *cache));
            let result = encoded.map(|()| f(&ids));
            if ids.capacity() <= IDS_KEPT {
                cache.ids = ids;
            }
            result
        })
    }

    fn encode_with(&self, text: &[u8], out: &mut Vec<u32>, cache: &mut Option<&mut PieceCache>) -> Result<(), String> {
        let start = out.len();
        match cache.as_deref_mut() {
            Some(cache) => self.encode_in_runs(text, out, cache)?,
            None => self.splitter.split(text, &mut |piece| self.encode_uncached(piece, out))?,
        }
        if self.lacks_bytes && out[start..].contains(&MISSING) {
            let byte = text.iter().find(|&&b| self.byte_ids[b as usize] == MISSING).copied().unwrap_or(0);
            return Err(missing_byte_message(byte));
        }
        Ok(())
    }

    /// The pieces of `text` with a cache, looked up in runs of [`RUN`] (see [`Waiting`]): each
    /// piece is keyed as the scanner gives it ([`RunSink`]), and each full run is looked up.
    fn encode_in_runs(&self, text: &[u8], out: &mut Vec<u32>, cache: &mut PieceCache) -> Result<(), String> {
        let mut run = std::mem::take(&mut cache.waiting);
        run.resize(RUN, Waiting::default());
        let mut sink = RunSink { encoder: self, text, out, cache, run: &mut run, n: 0 };
        let split = self.splitter.split(text, &mut sink);
        if split.is_ok() {
            sink.flush();
        }
        cache.waiting = run;
        split
    }

    /// Look up a run of keyed pieces ([`PieceCache::look_up_run`], the encoder's way for the
    /// pieces not found inline).
    #[inline(never)]
    fn look_up_run(&self, text: &[u8], run: &mut [Waiting], out: &mut Vec<u32>, cache: &mut PieceCache) {
        cache.look_up_run(text, run, out, |cache, piece, w, out| self.encode_piece(piece, w.k0, w.k1, out, cache));
    }

    /// Encode many texts in parallel; returns ids and the end offset of each text's ids.
    pub fn encode_batch(&self, texts: &[&[u8]]) -> Result<(Vec<u32>, Vec<u64>), String> {
        let ids = self.encode_batch_ids(texts)?;
        let ends = ids.ends().collect();
        Ok((ids.into_ids(), ends))
    }

    /// [`Self::encode_batch`] before the ids are joined (see [`BatchIds`]), for a caller that
    /// joins them in another width. Each group of texts is encoded with one piece cache.
    pub fn encode_batch_ids(&self, texts: &[&[u8]]) -> Result<BatchIds, String> {
        let share = thread_share(texts.iter().map(|t| t.len()).sum(), rayon::current_num_threads());
        BatchIds::encode(texts, |_, group, ids| {
            self.with_cache(share, |mut cache| {
                let mut lens = Vec::with_capacity(group.len());
                for t in group {
                    let before = ids.len();
                    self.encode_with(t, ids, &mut cache)?;
                    lens.push(ids.len() - before);
                }
                Ok(lens)
            })
        })
    }

    /// Ids of one piece the run's lookup did not settle; `(k0, k1)` is its packed key when it has
    /// at most [`PACKED_MAX`] bytes, else `k1` is [`NO_KEY`].
    #[cold]
    fn encode_piece(&self, piece: &[u8], k0: u64, k1: u64, out: &mut Vec<u32>, cache: &mut PieceCache) {
        if k1 != NO_KEY {
            // One lookup: the seeded cache holds the short tokens (with `whole_pieces`) and the
            // bytes, so a miss is a piece to merge, or a byte the vocabulary lacks.
            if cache.extend_packed(k0, k1, out) {
                return;
            }
            if piece.len() == 1 {
                out.push(self.byte_ids[piece[0] as usize]);
                return;
            }
        } else {
            if self.whole_pieces {
                if let Some(id) = self.vocab.get(piece) {
                    out.push(id);
                    return;
                }
            }
            if piece.len() > CACHE_MAX_PIECE {
                return self.merge(piece, out, Some(&mut cache.levels));
            }
            if cache.extend(piece, out) {
                return;
            }
        }
        let start = out.len();
        self.merge(piece, out, Some(&mut cache.levels));
        cache.insert(piece, &out[start..]);
    }

    /// Ids of one piece without a cache (every slot of the pool is taken).
    fn encode_uncached(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() == 1 {
            out.push(self.byte_ids[piece[0] as usize]);
            return;
        }
        if self.whole_pieces {
            if let Some(id) = self.vocab.get(piece) {
                out.push(id);
                return;
            }
        }
        self.merge(piece, out, None)
    }

    #[inline(always)]
    fn rank(&self, l: u32, r: u32) -> Packed {
        self.ranks.get(&bpe::pair_key(l, r)).copied().unwrap_or(NO_MERGE)
    }

    /// BPE of a piece that is not a token: on two levels when the plan says so (with the caller's
    /// two-level state `worker`, or one of the plan's own), else on the stack for short pieces and
    /// with the heap for long ones.
    fn merge(&self, piece: &[u8], out: &mut Vec<u32>, worker: Option<&mut Worker>) {
        if let Plan::Two(levels) = &self.levels {
            match worker {
                Some(w) => levels.encode_in(piece, &self.byte_ids, out, w),
                None => levels.encode(piece, &self.byte_ids, out),
            }
            return;
        }
        if piece.len() <= SMALL_MAX {
            self.merge_small(piece, out);
        } else {
            self.merge_heap(piece, out);
        }
    }

    /// Lowest rank first, leftmost on ties, by scanning the pairs' ranks each round.
    fn merge_small(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        debug_assert!((1..=SMALL_MAX).contains(&n));
        let mut ids = [0u32; SMALL_MAX];
        // ranks[i]: the merge of ids[i] and ids[i + 1].
        let mut ranks = [NO_MERGE; SMALL_MAX];
        for (i, &b) in piece.iter().enumerate() {
            ids[i] = self.byte_ids[b as usize];
        }
        for (i, w) in piece.windows(2).enumerate() {
            ranks[i] = self.byte_pairs[(w[0] as usize) << 8 | w[1] as usize];
        }
        let mut len = n;
        while len > 1 {
            let (mut best, mut at) = (NO_MERGE, 0);
            for (i, &r) in ranks[..len - 1].iter().enumerate() {
                if r < best {
                    (best, at) = (r, i);
                }
            }
            if best == NO_MERGE {
                break;
            }
            ids[at] = best as u32;
            ids.copy_within(at + 2..len, at + 1);
            if at + 2 < len {
                ranks.copy_within(at + 2..len - 1, at + 1);
            }
            len -= 1;
            if at + 1 < len {
                ranks[at] = self.rank(ids[at], ids[at + 1]);
            }
            if at > 0 {
                ranks[at - 1] = self.rank(ids[at - 1], ids[at]);
            }
        }
        out.extend_from_slice(&ids[..len]);
    }

    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        let ids: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let rank = |l: u32, r: u32| {
            let p = self.rank(l, r);
            (p != NO_MERGE).then_some(((p >> 32) as u32, p as u32))
        };
        out.extend_from_slice(&bpe::merge_heap(ids, rank));
    }
}

/// The packed key of `text[at..at + len]` (see [`pack`]), or `(0, NO_KEY)` for a piece longer
/// than [`PACKED_MAX`].
#[inline(always)]
fn key_in(text: &[u8], at: usize, len: usize) -> (u64, u64) {
    if len > PACKED_MAX {
        (0, NO_KEY)
    } else if at + 16 <= text.len() {
        pack_within(text, at, len)
    } else {
        pack(&text[at..at + len])
    }
}

/// The error for a text that needs a byte the vocabulary lacks (the python engine says the same).
pub fn missing_byte_message(byte: u8) -> String {
    format!("text needs byte 0x{byte:02x}, which has no token in the vocabulary")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{builtin_pattern, Builtin};

    /// Each text's ids from the reference path (no piece cache).
    fn uncached(e: &Encoder, texts: &[Vec<u8>]) -> Vec<Vec<u32>> {
        let encode = |t: &Vec<u8>| {
            let mut out = Vec::new();
            e.encode_with(t, &mut out, &mut None).unwrap();
            out
        };
        texts.iter().map(encode).collect()
    }

    /// Byte-valued ids, then one per merge, then one per part of a merge no merge makes (a token a
    /// merge joins that is not a byte nor made, which an encoder requires in the vocabulary).
    fn vocab_of(merges: &[(&str, &str)]) -> Vec<(Vec<u8>, u32)> {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        for (l, r) in merges {
            vocab.push(([l.as_bytes(), r.as_bytes()].concat(), vocab.len() as u32));
        }
        for part in merges.iter().flat_map(|(l, r)| [l.as_bytes(), r.as_bytes()]) {
            if !vocab.iter().any(|(t, _)| t == part) {
                vocab.push((part.to_vec(), vocab.len() as u32));
            }
        }
        vocab
    }

    fn encoder(merges: &[(&str, &str)]) -> Encoder {
        encoder_with(merges, true)
    }

    fn encoder_with(merges: &[(&str, &str)], whole_pieces: bool) -> Encoder {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        for (l, r) in merges {
            vocab.push(([l.as_bytes(), r.as_bytes()].concat(), vocab.len() as u32));
        }
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        Encoder::new(vocab, &m, Splitter::new(&builtin_pattern(Builtin::Superbpe), false).unwrap(), whole_pieces)
            .unwrap()
    }

    #[test]
    fn a_missing_byte_is_an_error_only_when_needed() {
        let vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).filter(|&b| b != 0xC0).map(|b| (vec![b], b as u32)).collect();
        let splitter = Splitter::new(&builtin_pattern(Builtin::Superbpe), false).unwrap();
        let e = Encoder::new(vocab, &[], splitter, false).unwrap();
        let mut out = Vec::new();
        e.encode_ordinary(b"fine text", &mut out).unwrap();
        assert_eq!(out.len(), 9);
        let err = e.encode_ordinary(b"bad \xC0 byte", &mut out).unwrap_err();
        assert!(err.contains("0xc0"), "{err}");
    }

    /// A merge whose part is not a token is refused, naming the merge and the part, as is one whose
    /// result is not: a vocabulary that lacks a byte a merge joins (HF-trained ones keep only the
    /// bytes they saw) is one.
    #[test]
    fn a_merge_whose_part_or_result_is_not_a_token_is_refused() {
        let make = |skip: &[u8], extra: &[&[u8]], merges: &[(&[u8], &[u8])]| {
            let mut vocab: Vec<(Vec<u8>, u32)> =
                (0..=255u8).filter(|b| !skip.contains(b)).map(|b| (vec![b], b as u32)).collect();
            vocab.extend(extra.iter().enumerate().map(|(i, t)| (t.to_vec(), 256 + i as u32)));
            let m: Vec<(Vec<u8>, Vec<u8>)> = merges.iter().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
            let splitter = Splitter::new(&builtin_pattern(Builtin::Superbpe), false).unwrap();
            Encoder::new(vocab, &m, splitter, true).err()
        };
        assert_eq!(make(&[], &[b"ab", b"abc"], &[(b"a", b"b"), (b"ab", b"c")]), None);
        let left = make(b"\xC0", &[b"ab", b"\xC0b"], &[(b"a", b"b"), (b"\xC0", b"b")]).unwrap();
        assert_eq!(left, r#"merge #1 (b"\xc0", b"b") joins b"\xc0", which is not in the vocabulary"#);
        let right = make(&[], &[b"ab", b"abc"], &[(b"a", b"b"), (b"a", b"bc")]).unwrap();
        assert_eq!(right, r#"merge #1 (b"a", b"bc") joins b"bc", which is not in the vocabulary"#);
        let made = make(&[], &[b"ab"], &[(b"a", b"b"), (b"ab", b"c")]).unwrap();
        assert_eq!(made, r#"merge #1 (b"ab", b"c"): the token it makes is not in the vocabulary"#);
    }

    /// The stack merge, the heap merge and the shared reference `bpe::merge_linear` agree on random
    /// pieces of every short length, with merges that compete for the same bytes.
    #[test]
    fn small_heap_and_reference_agree() {
        let e = encoder(&[("a", "a"), ("b", "c"), ("aa", "a"), ("a", "bc"), ("aa", "bc"), ("c", "a"), ("bc", "bc")]);
        let state = &mut 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..3000 {
            let len = 1 + crate::test_below(state, SMALL_MAX);
            let text: Vec<u8> = (0..len).map(|_| b"abc"[crate::test_below(state, 3)]).collect();
            let (mut small, mut heap) = (Vec::new(), Vec::new());
            e.merge_small(&text, &mut small);
            e.merge_heap(&text, &mut heap);
            let ids: Vec<u32> = text.iter().map(|&b| b as u32).collect();
            let reference = bpe::merge_linear(ids, |l, r| {
                let p = e.rank(l, r);
                (p != NO_MERGE).then_some(((p >> 32) as u32, p as u32))
            });
            assert_eq!(small, reference, "{:?}", String::from_utf8_lossy(&text));
            assert_eq!(heap, reference, "{:?}", String::from_utf8_lossy(&text));
        }
    }

    /// A batch gives the ids of encoding each text alone, whatever the grouping, and a second pass
    /// (cached pieces) gives the same ids as the first; the seeded caches give the ids of the
    /// vocabulary and the merges, with whole pieces or without.
    #[test]
    fn batch_and_cache_change_no_ids() {
        for whole_pieces in [true, false] {
            batch_and_cache_agree(whole_pieces);
        }
    }

    /// A cache seeded for a large share of a batch starts in a larger table, and gives the ids it
    /// would have given from the vocabulary's size.
    #[test]
    fn a_cache_seeded_for_a_large_share_has_room_and_gives_the_same_ids() {
        for whole_pieces in [false, true] {
            let e = encoder_with(&[("a", "a"), ("b", "c"), ("aa", "a"), (" ", "a"), (" a", "bc")], whole_pieces);
            let state = &mut 0x9E37_79B9_7F4A_7C15u64;
            let texts: Vec<Vec<u8>> = (0..200)
                .map(|_| (0..crate::test_below(state, 200)).map(|_| b"abc \n,1"[crate::test_below(state, 7)]).collect())
                .collect();
            let alone = uncached(&e, &texts);
            let (small, large) = (e.vocab.slots(), 64 << 20);
            assert!(expected_pieces(large) > 4 * small, "room for more pieces than the vocabulary's table");
            for (t, expected) in texts.iter().zip(&alone) {
                let mut out = Vec::new();
                e.encode_ordinary_of_share(t, &mut out, large).unwrap();
                assert_eq!(&out, expected);
            }
            // Room for the share's pieces: a table is at most half full.
            let seeded: Vec<usize> =
                e.caches.iter().map(|c| c.lock().unwrap()).filter(|c| c.seeded).map(|c| c.map.slots()).collect();
            let room = 2 * expected_pieces(large);
            assert!(!seeded.is_empty() && seeded.iter().all(|&n| n >= room), "{seeded:?} slots, {room} wanted");
        }
    }

    fn batch_and_cache_agree(whole_pieces: bool) {
        // "abc" is a token that BPE of its bytes does not make ("b" + "c" comes first), so whole
        // pieces change ids.
        let e = encoder_with(
            &[("a", "a"), ("b", "c"), ("aa", "a"), (" ", "a"), (" a", "bc"), ("a", "b"), ("ab", "c")],
            whole_pieces,
        );
        let state = &mut 0x2545_F491_4F6C_DD1Du64;
        let texts: Vec<Vec<u8>> = (0..400)
            .map(|_| {
                let len = crate::test_below(state, 300);
                (0..len).map(|_| b"abc \n,1"[crate::test_below(state, 7)]).collect()
            })
            .collect();
        let slices: Vec<&[u8]> = texts.iter().map(|t| t.as_slice()).collect();
        let alone = uncached(&e, &texts);
        for _ in 0..2 {
            let (ids, ends) = e.encode_batch(&slices).unwrap();
            let mut start = 0;
            for (expected, &end) in alone.iter().zip(&ends) {
                assert_eq!(&ids[start..end as usize], expected.as_slice());
                start = end as usize;
            }
            for (t, expected) in texts.iter().zip(&alone) {
                let mut out = Vec::new();
                e.encode_ordinary(t, &mut out).unwrap();
                assert_eq!(&out, expected);
            }
        }
    }

    /// A SuperBPE-like merge list on two levels: per document, in batches (groups sharing a piece
    /// cache and its two-level state), without a cache and with every slot of the pool taken, the
    /// ids are those of one level.
    #[test]
    fn two_levels_in_every_path_equal_one_level() {
        let merges = [("a", "b"), ("ab", "c"), (" ", "a"), (" a", "bc"), ("abc", " "), (" abc", " abc"), ("c", "a")];
        let vocab = vocab_of(&merges);
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        let make = |request| {
            let splitter = Splitter::new(&builtin_pattern(Builtin::SuperbpePaper), false).unwrap();
            Encoder::with_levels(vocab.clone(), &m, splitter, false, request).unwrap()
        };
        let (two, one) = (make(Request::Auto), make(Request::One));
        assert!(matches!(two.plan(), Plan::Two(l) if l.transition() == 4));
        assert!(matches!(one.plan(), Plan::One(_)));
        let state = &mut 0x5851_F42D_4C95_7F2Du64;
        let texts: Vec<Vec<u8>> = (0..300)
            .map(|_| {
                let len = crate::test_below(state, 200);
                (0..len).map(|_| b"abc  \n."[crate::test_below(state, 7)]).collect()
            })
            .collect();
        let slices: Vec<&[u8]> = texts.iter().map(|t| t.as_slice()).collect();
        let want: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| {
                let mut out = Vec::new();
                one.encode_ordinary(t, &mut out).unwrap();
                out
            })
            .collect();
        for _ in 0..2 {
            let (ids, ends) = two.encode_batch(&slices).unwrap();
            let mut start = 0;
            for (expected, &end) in want.iter().zip(&ends) {
                assert_eq!(&ids[start..end as usize], expected.as_slice());
                start = end as usize;
            }
            for (t, expected) in texts.iter().zip(&want) {
                let mut out = Vec::new();
                two.encode_ordinary(t, &mut out).unwrap();
                assert_eq!(&out, expected);
                out.clear();
                two.encode_with(t, &mut out, &mut None).unwrap();
                assert_eq!(&out, expected);
            }
        }
        let held: Vec<_> = two.caches.iter().map(|c| c.lock().unwrap()).collect();
        for (t, expected) in texts.iter().zip(&want) {
            let mut out = Vec::new();
            two.encode_ordinary(t, &mut out).unwrap();
            assert_eq!(&out, expected);
        }
        drop(held);
    }

    #[test]
    fn lowest_rank_first_leftmost_on_ties() {
        let e = encoder(&[("a", "a"), ("aa", "a")]);
        let mut out = Vec::new();
        e.merge_small(b"aaaa", &mut out);
        assert_eq!(out, vec![256, 256]);
        out.clear();
        e.merge_small(b"aaaaa", &mut out);
        assert_eq!(out, vec![256, 257]);
    }

    /// The runs of keyed lookups give the ids of the piece-by-piece path without a cache, on
    /// every built-in scanner and on random text with non-ASCII bytes, pieces longer than a packed
    /// key, pieces whose ids are more than fit inline, pieces at a text's very end, texts of many
    /// runs and empty texts; the first pass (misses, inserts, a growing cache) and the second
    /// (hits) alike.
    #[test]
    fn runs_of_lookups_equal_piece_by_piece() {
        let merges: Vec<(&str, &str)> = vec![
            ("a", "b"),
            ("ab", "c"),
            (" ", "a"),
            (" a", "bc"),
            ("é", "a"),
            ("\n", "\n"),
            ("x", "x"),
            ("xx", "xx"),
            ("xxxx", "xxxx"),
            ("1", "2"),
            ("b", "b"),
            ("bb", "bb"),
            ("c", "a"),
        ];
        let alphabet: Vec<&[u8]> =
            vec![b"a", b"b", b"c", b"x", b" ", b"\n", b"1", b"2", b".", b"'s", "é".as_bytes(), "日".as_bytes(), b"  "];
        let vocab = vocab_of(&merges);
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        let state = &mut 0x3C6E_F372_FE94_F82Bu64;
        let texts: Vec<Vec<u8>> = (0..200)
            .map(|i| {
                let parts = if i % 10 == 0 { 0 } else { crate::test_below(state, 2 * RUN * 3) };
                (0..parts).flat_map(|_| alphabet[crate::test_below(state, alphabet.len())].to_vec()).collect()
            })
            .collect();
        for kind in [Builtin::Gpt2, Builtin::Cl100k, Builtin::O200k, Builtin::Superbpe] {
            for whole_pieces in [true, false] {
                let splitter = Splitter::new(&builtin_pattern(kind), false).unwrap();
                let e = Encoder::new(vocab.clone(), &m, splitter, whole_pieces).unwrap();
                let want = uncached(&e, &texts);
                for _ in 0..2 {
                    for (t, expected) in texts.iter().zip(&want) {
                        let mut out = vec![7];
                        e.encode_ordinary(t, &mut out).unwrap();
                        assert_eq!(&out[1..], expected.as_slice(), "{kind:?} {:?}", String::from_utf8_lossy(t));
                    }
                }
            }
        }
    }

    /// Runs of cached pieces with more ids than fit inline, more of them than a run's spare room
    /// takes (each such piece here has 12 ids past the inline ones, 32 in a run of 64), are
    /// copied from the arena in the run's loop or, past that room, one by one: the same ids.
    #[test]
    fn runs_of_many_id_pieces_equal_piece_by_piece() {
        let e = encoder(&[("a", "b")]);
        let texts: Vec<Vec<u8>> = [3, RUN, 5 * RUN + 7]
            .iter()
            .map(|&n| (0..n).flat_map(|i| [b"ab".as_slice(), &[b".,;:!?-+*/%&=~"[i % 14]; 15]].concat()).collect())
            .collect();
        let want = uncached(&e, &texts);
        assert!(want[2].len() > 5 * RUN * 16, "pieces of 15 ids");
        for _ in 0..3 {
            for (t, expected) in texts.iter().zip(&want) {
                let mut out = Vec::new();
                e.encode_ordinary(t, &mut out).unwrap();
                assert_eq!(&out, expected);
            }
        }
    }

    /// `with_ids` hands over the ids `encode_ordinary` gives, text after text (the kept room is
    /// cleared between them, and a room grown past `IDS_KEPT` is given back), and with every
    /// cache taken.
    #[test]
    fn with_ids_equals_encode_ordinary() {
        let e = encoder(&[("a", "b"), ("ab", "c"), (" ", "a"), ("c", "a")]);
        let long: Vec<u8> = b"abc ca, ".iter().copied().cycle().take(IDS_KEPT * 3).collect();
        let texts: Vec<&[u8]> = vec![b"abc abc", b"", b"ca ca ca ab", &long, b"x", &long[..100]];
        let check = || {
            for t in &texts {
                let mut want = Vec::new();
                e.encode_ordinary(t, &mut want).unwrap();
                assert_eq!(e.with_ids(t, |ids| ids.to_vec()).unwrap(), want);
            }
        };
        check();
        let held: Vec<_> = e.caches.iter().map(|c| c.lock().unwrap()).collect();
        check();
        drop(held);
    }
}
