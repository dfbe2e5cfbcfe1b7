//! Piece-count tables: per-worker [`LocalCounts`] (open addressing, long keys in an [`Arena`]),
//! the [`Tally`] of one count in progress, and the owned, hash-sharded [`Counts`] they are merged
//! into. Each worker table owns its keys (copied into an append-only arena the first time a piece
//! is seen), so a block of input can be dropped as soon as it is counted; merging shards runs in
//! parallel instead of as one long serial tail. Workers drained into an empty table are only listed
//! (each piece once, in the order the keys lie in memory, see [`Counts::listed`]): a trainer reads
//! them so and never looks one up; the shard tables are filled when a lookup or a change needs them.

use std::sync::{Arc, Mutex};

use hashbrown::HashTable;
use rayon::prelude::*;

use crate::bytesmap::{bytes_eq, hash_short, pack_short, unpack_short, SHORT_MAX};
use crate::memory::{advise_huge, prefetch, CutMark, MappedFile};
use crate::scan::Splitter;

/// Number of hash shards (a power of two); the top bits of a key's hash pick its shard.
pub const SHARDS: usize = 64;
const SHARD_SHIFT: u32 = 64 - SHARDS.trailing_zeros();

/// Fixed seeds: the same bytes hash the same in every table, so hashes can be reused on merge.
fn hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(0x5EED_0001, 0x5EED_0002, 0x5EED_0003, 0x5EED_0004)
}

/// The hash of a piece in every table: a mix of the packed key for short pieces, else ahash.
/// The same in [`LocalCounts`] and [`Counts`], so it is computed once per distinct piece.
#[inline(always)]
pub fn piece_hash(state: &ahash::RandomState, piece: &[u8]) -> u64 {
    if piece.len() <= SHORT_MAX {
        hash_short(pack_short(piece))
    } else {
        state.hash_one(piece)
    }
}

/// The hash given to hashbrown for a piece hash `h`. Shards are picked by the top bits of `h`,
/// and hashbrown takes its 7-bit tag from the top bits too, so within a shard the tags would
/// hardly differ (many false matches); fold middle bits into the top instead.
#[inline(always)]
fn table_hash(h: u64) -> u64 {
    h ^ ((h >> 29) << 57)
}

/// Marks a key that refers to an arena record (a packed short key has its length, at most 7,
/// in the top byte).
const LONG: u64 = 1 << 63;

#[inline]
fn shard_of(hash: u64) -> usize {
    (hash >> SHARD_SHIFT) as usize
}

/// An entry of [`Counts`]: (piece hash, key, count). The key is a packed short piece (its bytes
/// then its length in byte 7, see `pack_short`) or `LONG | source << 47 | arena location`,
/// where source 0 is the shard's own arena and `k > 0` the `k-1`-th adopted worker arena.
type Entry = (u64, [u8; 8], u64);

/// The name of the first of `marks` whose file was found cut short (marks taken before a trainer's
/// build, which frees the maps as it reads them; see `Counts::cut_marks`).
pub fn first_cut_short(marks: &[CutMark]) -> Option<String> {
    marks.iter().find(|m| m.cut_short()).map(|m| m.name().to_owned())
}

/// The entries of a [`Counts`] in the order their keys lie in memory, for a consumer that reads
/// every key once (replay): short keys are held in the list itself, and each arena's long keys are
/// listed by location. In the table's order each long key was a cache and TLB miss somewhere in the
/// arenas (most of a stage 2's text, gigabytes at 10 GB of corpus); in this order the reads stream.
pub struct MemoryOrder {
    /// Short pieces: their packed key (bytes, length in byte 7) and count.
    pub short: Vec<([u8; 8], u64)>,
    /// Long keys in runs: an arena (a shard's own first, then the adopted ones, see
    /// [`Counts::arena_key`]) and some of its keys' locations with their counts, by location. The
    /// runs of an arena follow each other in location order, the arenas in theirs.
    pub long: Vec<(usize, Vec<(u64, u64)>)>,
}

impl MemoryOrder {
    /// How many entries it lists.
    pub fn len(&self) -> usize {
        self.short.len() + self.long.iter().map(|r| r.1.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Most worker arenas one [`Counts`] adopts (more are copied).
const MAX_ADOPTED: usize = (1 << 16) - 1;
const LOC_BITS: u32 = 47;

/// One shard of [`Counts`].
#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
    /// Long keys added by [`Counts::add`] / [`Counts::merge`].
    arena: Arena,
}

/// Bytes per arena chunk (a longer record gets a chunk of its own). Chunks never move, so a
/// record's location stays valid, and growing the arena never copies it. Small in tests, so that
/// their arenas have many chunks (freeing the chunks replay has passed is tested).
const ARENA_CHUNK: usize = if cfg!(test) { 1 << 12 } else { 1 << 24 };
const POS_BITS: u32 = ARENA_CHUNK.trailing_zeros();
/// Arena record header: hash (u64 LE), count (u64 LE), key length (u64 LE); the key follows, or
/// its address when the length has [`REFERS`] set.
const RECORD_HEADER: usize = 24;
/// The smallest record: a header and a key of more than [`SHORT_MAX`] bytes, or its address.
const MIN_RECORD: usize = RECORD_HEADER + 8;
/// Set in a record's length when the key is left where it lies, in a file the arena keeps mapped,
/// and the record holds its address (8 bytes) instead of its bytes.
const REFERS: u64 = 1 << 63;
/// Set in a record's length when the record was replaced by a later one (a referred key copied
/// on its first repeat, see [`LocalCounts::add_hashed`]): walks skip it.
const REPLACED: u64 = 1 << 62;
/// Keys at least this long are left in a kept file rather than copied (see [`Arena::refer_to`]):
/// a stage 2's lines, most of its text, whose copies were most of what its count wrote and held.
/// A shorter key is cheaper copied: its record stays beside the others, where reading it later
/// costs no page of the file.
pub const REFER_FROM: usize = 64;

/// Append-only storage of long keys with their hash and count. A record's location is
/// `chunk << POS_BITS | position` (a record starts inside the first `ARENA_CHUNK` bytes of its
/// chunk), below 2^47.
#[derive(Default)]
pub struct Arena {
    chunks: Vec<Vec<u8>>,
    /// Keys stored that an entry refers to, and their bytes: every key pushed, less those of a
    /// worker's keys that an earlier entry already had when the worker's arena was adopted (so a
    /// memory estimate needs no pass over every key). Freeing chunks leaves them as they were.
    keys: u64,
    key_bytes: u64,
    /// Bytes of the new keys of at least [`REFER_FROM`] bytes pushed so far, referred to or not
    /// (what referring to them would save: see [`Tally::long_key_bytes`]).
    long_key_bytes: u64,
    /// Files whose bytes records refer to ([`REFERS`]), with their addresses, by address; they
    /// stay mapped while the arena lives. A referred key is read only where it lies wholly inside
    /// one of them ([`Self::stored_key`]).
    files: Vec<(std::ops::Range<usize>, Arc<MappedFile>)>,
    /// While set, the addresses of one of `files`: new keys of at least [`REFER_FROM`] bytes
    /// lying wholly inside are referred to there.
    refer: Option<std::ops::Range<usize>>,
}

impl Arena {
    /// Refer to keys in `file` from now on instead of copying them (until [`Self::copy_keys`]);
    /// the arena keeps the map.
    fn refer_to(&mut self, file: &Arc<MappedFile>) {
        let bytes = file.bytes().as_ptr_range();
        let range = bytes.start as usize..bytes.end as usize;
        self.refer = Some(range.clone());
        // Live mappings never share an address (an empty file's map still takes a byte), so the
        // start identifies a kept file.
        if let Err(i) = self.files.binary_search_by_key(&range.start, |(r, _)| r.start) {
            self.files.insert(i, (range, file.clone()));
        }
    }

    /// The marks of the files whose bytes records refer to.
    fn cut_marks(&self) -> impl Iterator<Item = CutMark> + '_ {
        self.files.iter().map(|(_, f)| f.cut_mark())
    }

    /// Whether `address..address + len` lies wholly inside one of `files`.
    #[inline(always)]
    fn holds(&self, address: usize, len: usize) -> bool {
        let i = self.files.partition_point(|(r, _)| r.start <= address);
        i > 0 && address.checked_add(len).is_some_and(|end| end <= self.files[i - 1].0.end)
    }

    /// Copy every new key again.
    fn copy_keys(&mut self) {
        self.refer = None;
    }

    /// Whether `key` is to be referred to where it lies.
    #[inline(always)]
    fn refers(&self, key: &[u8]) -> bool {
        let at = key.as_ptr() as usize;
        key.len() >= REFER_FROM && self.refer.as_ref().is_some_and(|r| r.start <= at && at + key.len() <= r.end)
    }

    /// The key of the record at `pos` of `chunk` (one of this arena's chunks), and where the next
    /// record starts. A `pos` that is no record's start (a location from elsewhere) reads bytes of
    /// the chunk, or panics: the address of a referred key is read from the chunk too, so it is
    /// used only where it lies inside a file the arena keeps.
    #[inline(always)]
    fn stored_key<'a>(&'a self, chunk: &'a [u8], pos: usize) -> (&'a [u8], usize) {
        let word = read_u64(chunk, pos + 16);
        let len = (word & !(REFERS | REPLACED)) as usize;
        let at = pos + RECORD_HEADER;
        if word & REFERS == 0 {
            return (&chunk[at..at + len], at + len);
        }
        let address = read_u64(chunk, at) as usize;
        assert!(self.holds(address, len), "no referred key at this location");
        // SAFETY: `address..address + len` lies wholly inside the mapping of one of `self.files`
        // (checked above; a mapping's start is never null), which stays mapped while `self` lives
        // (the borrow of `self` bounds the slice) and whose bytes do not change (the contract of
        // `MappedFile::open`; dropping its pages keeps what reading them gives; a file cut short
        // reads as zeros from its cut, and its map says so: see `Counts::cut_short_file`).
        (unsafe { std::slice::from_raw_parts(address as *const u8, len) }, at + 8)
    }

    /// Bytes its chunks hold.
    fn heap_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.capacity() as u64).sum()
    }

    /// Store a new record; returns its location.
    #[inline]
    fn push(&mut self, h: u64, key: &[u8], count: u64) -> u64 {
        let refers = self.refers(key);
        let need = RECORD_HEADER + if refers { 8 } else { key.len() };
        let fits = self.chunks.last().is_some_and(|c| c.capacity() - c.len() >= need);
        if !fits {
            // Small pages: chunks are written in order, and a fresh huge page can cost the kernel
            // a compaction (a stage 2's arenas hold most of its text; that was a large part of
            // counting it).
            self.chunks.push(Vec::with_capacity(need.max(ARENA_CHUNK)));
        }
        self.keys += 1;
        self.key_bytes += key.len() as u64;
        if key.len() >= REFER_FROM {
            self.long_key_bytes += key.len() as u64;
        }
        let ci = self.chunks.len() - 1;
        let chunk = &mut self.chunks[ci];
        let pos = chunk.len();
        chunk.extend_from_slice(&h.to_le_bytes());
        chunk.extend_from_slice(&count.to_le_bytes());
        if refers {
            chunk.extend_from_slice(&(key.len() as u64 | REFERS).to_le_bytes());
            chunk.extend_from_slice(&(key.as_ptr() as u64).to_le_bytes());
        } else {
            chunk.extend_from_slice(&(key.len() as u64).to_le_bytes());
            chunk.extend_from_slice(key);
        }
        (ci as u64) << POS_BITS | pos as u64
    }

    /// Free the chunks wholly before the one holding `loc`, all of them for `u64::MAX` (their
    /// records are read no more; the others keep their places, and the totals stay).
    fn release_before(&mut self, loc: u64) {
        let end = ((loc >> POS_BITS) as usize).min(self.chunks.len());
        for chunk in &mut self.chunks[..end] {
            *chunk = Vec::new();
        }
    }

    #[inline(always)]
    fn prefetch(&self, loc: u64) {
        let chunk = &self.chunks[(loc >> POS_BITS) as usize];
        prefetch(&chunk[(loc & ((1 << POS_BITS) - 1)) as usize]);
    }

    /// When the record at `loc` refers to its key in a file: copy it to a new record with `n` more
    /// counts, mark the old one [`REPLACED`] and return the new location; else None.
    #[inline]
    fn copy_referred(&mut self, loc: u64, n: u64) -> Option<u64> {
        let pos = (loc & ((1 << POS_BITS) - 1)) as usize;
        let chunk = &self.chunks[(loc >> POS_BITS) as usize];
        if read_u64(chunk, pos + 16) & REFERS == 0 {
            return None;
        }
        let (h, count) = (read_u64(chunk, pos), read_u64(chunk, pos + 8));
        let key = self.key(loc);
        // SAFETY: the record refers, so the key lies in one of `self.files`, which `push` below
        // never unmaps or changes (it writes to `self.chunks` only).
        let key = unsafe { std::slice::from_raw_parts(key.as_ptr(), key.len()) };
        let refer = self.refer.take();
        let new = self.push(h, key, count + n);
        self.refer = refer;
        self.drop_record(loc);
        self.long_key_bytes -= key.len() as u64;
        Some(new)
    }

    /// Add `n` to the count of the record at `loc`.
    #[inline(always)]
    fn add_count(&mut self, loc: u64, n: u64) {
        let pos = (loc & ((1 << POS_BITS) - 1)) as usize;
        let count = &mut self.chunks[(loc >> POS_BITS) as usize][pos + 8..pos + 16];
        let c = u64::from_le_bytes(count.try_into().expect("8 bytes")) + n;
        count.copy_from_slice(&c.to_le_bytes());
    }

    /// The hash stored in the record at `loc`.
    #[inline(always)]
    fn hash_at(&self, loc: u64) -> u64 {
        read_u64(&self.chunks[(loc >> POS_BITS) as usize], (loc & ((1 << POS_BITS) - 1)) as usize)
    }

    /// Drop the record at `loc` from walks and totals: another record (of this arena or another)
    /// holds its piece.
    fn drop_record(&mut self, loc: u64) {
        let len = self.key(loc).len() as u64;
        let pos = (loc & ((1 << POS_BITS) - 1)) as usize;
        let chunk = &mut self.chunks[(loc >> POS_BITS) as usize];
        let word = read_u64(chunk, pos + 16) | REPLACED;
        chunk[pos + 16..pos + 24].copy_from_slice(&word.to_le_bytes());
        self.keys -= 1;
        self.key_bytes -= len;
    }

    /// The key stored at `loc`.
    #[inline(always)]
    fn key(&self, loc: u64) -> &[u8] {
        self.stored_key(&self.chunks[(loc >> POS_BITS) as usize], (loc & ((1 << POS_BITS) - 1)) as usize).0
    }

    /// Every record as (location, hash, key, count).
    fn records(&self) -> impl Iterator<Item = (u64, u64, &[u8], u64)> {
        self.records_in(0..self.chunks.len())
    }

    /// The records of the chunks in `chunks`, [`WALKS`] chunks at a time, a record of each in
    /// turn. A record is found from the length in the one before it, so a walk through one chunk
    /// waited for memory at every record; each walk fetches its next record before handing this
    /// one over, and the fetches of the walks overlap.
    fn records_in(&self, chunks: impl Iterator<Item = usize>) -> impl Iterator<Item = (u64, u64, &[u8], u64)> {
        let mut unwalked = chunks;
        // (chunk, position of its next record)
        let mut walks: Vec<(usize, usize)> = Vec::with_capacity(WALKS);
        let mut turn = 0;
        std::iter::from_fn(move || loop {
            while walks.len() < WALKS {
                let Some(ci) = unwalked.next() else { break };
                walks.push((ci, 0));
            }
            if walks.is_empty() {
                return None;
            }
            turn %= walks.len();
            let (ci, pos) = walks[turn];
            let chunk = &self.chunks[ci];
            if pos >= chunk.len() {
                walks.swap_remove(turn);
                continue;
            }
            let (h, count) = (read_u64(chunk, pos), read_u64(chunk, pos + 8));
            let (key, next) = self.stored_key(chunk, pos);
            if let Some(ahead) = chunk.get(next) {
                prefetch(ahead);
            }
            walks[turn].1 = next;
            turn += 1;
            if read_u64(chunk, pos + 16) & REPLACED != 0 {
                continue;
            }
            return Some(((ci as u64) << POS_BITS | pos as u64, h, key, count));
        })
    }
}

/// The first 16 bytes of `key`, zero-padded, as two numbers that order as the bytes do (keys with
/// the same prefix are then ordered by their bytes).
#[inline]
fn sort_prefix(key: &[u8]) -> [u64; 2] {
    let mut head = [0u8; 16];
    let n = key.len().min(16);
    head[..n].copy_from_slice(&key[..n]);
    let (high, low) = head.split_at(8);
    [u64::from_be_bytes(high.try_into().expect("8 bytes")), u64::from_be_bytes(low.try_into().expect("8 bytes"))]
}

/// Chunks [`Arena::records_in`] walks at once.
const WALKS: usize = 8;

#[inline(always)]
fn read_u64(s: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(s[at..at + 8].try_into().unwrap())
}

/// Index of a hash in a table of `1 << bits` slots (top bits: a multiplicative hash mixes them best).
#[inline(always)]
fn slot_of(h: u64, bits: u32) -> usize {
    (h >> (64 - bits)) as usize
}

/// One worker's counts: open addressing with linear probing over plain slots (no control
/// bytes), long keys with their hash and count in an arena.
pub struct LocalCounts {
    state: ahash::RandomState,
    /// Pieces of at most [`SHORT_MAX`] bytes packed into the key itself (never 0: the length
    /// is in the top byte), with their counts. Key 0 marks an empty slot.
    short: Vec<(u64, u64)>,
    short_bits: u32,
    short_len: usize,
    /// A direct-mapped cache of short pieces in front of `short`, small enough to stay in the
    /// CPU cache: most occurrences are of a few thousand pieces, and a hit here costs no miss in
    /// the big table. Entries are (key, count not yet in `short`); key 0 is empty.
    hot: Box<[(u64, u64)]>,
    /// Longer pieces: one word each, [`long_slot`] (their arena location and a tag of their hash);
    /// 0 marks an empty slot. A growth reads each hash from its record's header. Eight bytes a
    /// slot rather than sixteen (the full hash beside the location) halve the fresh memory each
    /// growth writes, which the kernel zeroes first: a stage 2 keeps millions of long pieces.
    long: Vec<u64>,
    long_bits: u32,
    long_len: usize,
    arena: Arena,
}

const INITIAL_BITS: u32 = 12;
/// Entries of the hot cache (16 bytes each).
const HOT: usize = 1 << 12;

impl Default for LocalCounts {
    fn default() -> Self {
        LocalCounts {
            state: hasher(),
            short: vec![(0, 0); 1 << INITIAL_BITS],
            short_bits: INITIAL_BITS,
            short_len: 0,
            hot: vec![(0, 0); HOT].into_boxed_slice(),
            long: vec![0; 1 << INITIAL_BITS],
            long_bits: INITIAL_BITS,
            long_len: 0,
            arena: Arena::default(),
        }
    }
}

/// Grow when more than 5/8 of the slots are taken.
#[inline(always)]
fn too_full(len: usize, bits: u32) -> bool {
    len * 8 > (5usize << bits)
}

impl LocalCounts {
    /// Free the index of the long pieces before a merge into [`Counts`]: that merge reads the
    /// records in the arena, never the index, so the index need not sit beside the tables being
    /// built (it is a large part of the count's peak). Nothing can be added afterwards.
    fn drop_long_index(&mut self) {
        self.long = Vec::new();
    }

    /// The arena location of the long piece `key`, whose hash is `h`, if it holds it.
    #[inline]
    fn find_long(&self, h: u64, key: &[u8]) -> Option<u64> {
        let mask = (1usize << self.long_bits) - 1;
        let mut i = slot_of(h, self.long_bits);
        loop {
            let slot = self.long[i];
            if slot == 0 {
                return None;
            }
            if tagged(slot, h) && bytes_eq(self.arena.key(slot & LOC_MASK), key) {
                return Some(slot & LOC_MASK);
            }
            i = (i + 1) & mask;
        }
    }

    /// Fetch the slot where a lookup of hash `h` starts into the CPU cache.
    #[inline(always)]
    fn prefetch_long(&self, h: u64) {
        prefetch(&self.long[slot_of(h, self.long_bits)]);
    }

    /// How many distinct pieces it holds (the hot cache flushed).
    fn len(&self) -> usize {
        self.short_len + self.long_len
    }

    #[inline(always)]
    fn hash_of(&self, piece: &[u8]) -> u64 {
        piece_hash(&self.state, piece)
    }

    /// Add one occurrence of `piece`, whose [`Self::hash_of`] is `h`.
    #[inline(always)]
    fn add_hashed(&mut self, piece: &[u8], h: u64) {
        if piece.len() <= SHORT_MAX {
            let key = pack_short(piece);
            // The hot cache: a hit costs no access to the big table. A miss puts the piece
            // there and moves the entry it replaces (with its count so far) to the table.
            let e = &mut self.hot[h as usize & (HOT - 1)];
            if e.0 == key {
                e.1 += 1;
                return;
            }
            let (old, n) = std::mem::replace(e, (key, 1));
            if old != 0 {
                self.add_short(old, n);
            }
            return;
        }
        let mask = (1usize << self.long_bits) - 1;
        let mut i = slot_of(h, self.long_bits);
        loop {
            let slot = self.long[i];
            if slot == 0 {
                let loc = self.arena.push(h, piece, 1);
                self.long[i] = long_slot(h, loc);
                self.long_len += 1;
                if too_full(self.long_len, self.long_bits) {
                    self.grow_long();
                }
                return;
            }
            if tagged(slot, h) && bytes_eq(self.arena.key(slot & LOC_MASK), piece) {
                let loc = slot & LOC_MASK;
                // A first repeat of a key left in a file copies it: later ones compare with the
                // copy rather than bring the file's page in again (unique lines, most of a stage
                // 2's, never do).
                match self.arena.copy_referred(loc, 1) {
                    Some(copy) => self.long[i] = long_slot(h, copy),
                    None => self.arena.add_count(loc, 1),
                }
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Add `count` to the packed short key `key` in the table.
    #[inline]
    fn add_short(&mut self, key: u64, count: u64) {
        let mask = (1usize << self.short_bits) - 1;
        let mut i = slot_of(hash_short(key), self.short_bits);
        loop {
            let slot = &mut self.short[i];
            if slot.0 == key {
                slot.1 += count;
                return;
            }
            if slot.0 == 0 {
                *slot = (key, count);
                self.short_len += 1;
                if too_full(self.short_len, self.short_bits) {
                    self.grow_short();
                }
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Move the hot cache into the table.
    fn flush_hot(&mut self) {
        for k in 0..HOT {
            let (key, n) = std::mem::take(&mut self.hot[k]);
            if key != 0 {
                self.add_short(key, n);
            }
        }
    }

    #[cold]
    fn grow_short(&mut self) {
        let bits = self.short_bits + 1;
        let mask = (1usize << bits) - 1;
        let mut table: Vec<(u64, u64)> = zeroed(1 << bits);
        for &(key, count) in self.short.iter().filter(|e| e.0 != 0) {
            let mut i = slot_of(hash_short(key), bits);
            while table[i].0 != 0 {
                i = (i + 1) & mask;
            }
            table[i] = (key, count);
        }
        self.short = table;
        self.short_bits = bits;
    }

    /// Double the table, or quadruple it while it is small (up to 8 MiB): each growth
    /// rewrites the whole table into fresh memory, which costs page faults. Each piece's hash is
    /// read from its record, fetched [`GROW_AHEAD`] slots ahead (the records lie all over the
    /// arena).
    #[cold]
    fn grow_long(&mut self) {
        let bits = self.long_bits + if self.long_bits < 20 { 2 } else { 1 };
        let mask = (1usize << bits) - 1;
        let mut table: Vec<u64> = zeroed(1 << bits);
        let old = &self.long;
        old.iter().take(GROW_AHEAD).filter(|&&s| s != 0).for_each(|&s| self.arena.prefetch(s & LOC_MASK));
        for (k, &slot) in old.iter().enumerate() {
            if let Some(&ahead) = old.get(k + GROW_AHEAD).filter(|&&s| s != 0) {
                self.arena.prefetch(ahead & LOC_MASK);
            }
            if slot == 0 {
                continue;
            }
            let mut i = slot_of(self.arena.hash_at(slot & LOC_MASK), bits);
            while table[i] != 0 {
                i = (i + 1) & mask;
            }
            table[i] = slot;
        }
        self.long = table;
        self.long_bits = bits;
    }

    /// Count the pieces of `seg`. A long piece's slot is prefetched and the piece looked up
    /// [`DEPTH`] long pieces later: the table of long pieces is large (most of its lookups
    /// miss the cache), and the lookups are independent, so the misses overlap. Short pieces
    /// (a small, mostly cached table) are counted at once.
    pub(crate) fn count<'a>(&mut self, splitter: &Splitter, seg: &'a [u8]) -> Result<(), String> {
        let mut ring: [(&'a [u8], u64); DEPTH] = [(&[], 0); DEPTH];
        let mut n = 0usize;
        splitter.split(seg, &mut |piece: &'a [u8]| {
            let h = self.hash_of(piece);
            if piece.len() <= SHORT_MAX {
                self.add_hashed(piece, h);
                return;
            }
            prefetch(&self.long[slot_of(h, self.long_bits)]);
            let at = n % DEPTH;
            if n >= DEPTH / 2 {
                // Halfway: the slot is likely loaded; when it holds this hash, the lookup will
                // compare the key stored in the arena, so fetch that too.
                let (_, mh) = ring[(n - DEPTH / 2) % DEPTH];
                let slot = self.long[slot_of(mh, self.long_bits)];
                if slot != 0 && tagged(slot, mh) {
                    self.arena.prefetch(slot & LOC_MASK);
                }
            }
            if n >= DEPTH {
                let (p, ph) = ring[at];
                self.add_hashed(p, ph);
            }
            ring[at] = (piece, h);
            n += 1;
        })?;
        for k in n.saturating_sub(DEPTH)..n {
            let (p, ph) = ring[k % DEPTH];
            self.add_hashed(p, ph);
        }
        Ok(())
    }
}

/// How many long pieces ahead a slot is prefetched.
const DEPTH: usize = 8;
/// How many slots ahead a growth fetches the record whose hash it will read.
const GROW_AHEAD: usize = 16;

/// A zeroed table of `n` slots (a short-piece table's or a long-piece index's), backed by huge
/// pages where the system allows it: lookups in the big tables are random, and with 4 KiB pages
/// most of them also miss the TLB. Zero slots come from zeroed pages, never written here.
fn zeroed<T: Clone + Default>(n: usize) -> Vec<T> {
    let v = vec![T::default(); n];
    advise_huge(v.as_ptr() as usize, n * std::mem::size_of::<T>());
    v
}

/// Arena locations are below `2^LOC_BITS`.
const LOC_MASK: u64 = (1 << LOC_BITS) - 1;
/// The bits of a long-piece slot above the location: the low bits of the piece's hash (the slot's
/// place comes from the top ones), so that a lookup compares the key only of a slot whose tag
/// matches (one in 2^16 of the others). Two bits in tests, so that tags often match other keys.
const TAG_BITS: u32 = if cfg!(test) { 2 } else { 63 - LOC_BITS };
const TAG: u64 = ((1 << TAG_BITS) - 1) << LOC_BITS;

/// A long-piece index slot for the piece hashed `h` whose record is at `loc` (never 0).
#[inline(always)]
fn long_slot(h: u64, loc: u64) -> u64 {
    LONG | (h << LOC_BITS) & TAG | loc
}

/// Whether the occupied `slot`'s tag is that of hash `h`.
#[inline(always)]
fn tagged(slot: u64, h: u64) -> bool {
    (slot ^ h << LOC_BITS) & TAG == 0
}

/// A count in progress: one [`LocalCounts`] per worker thread, kept across calls so that
/// counting block after block needs no merge per block.
pub struct Tally {
    locals: Vec<Mutex<LocalCounts>>,
}

impl Tally {
    /// For up to `workers` threads (more are fine, they share).
    pub fn new(workers: usize) -> Tally {
        Tally { locals: (0..workers.max(1)).map(|_| Mutex::new(LocalCounts::default())).collect() }
    }

    /// Leave the keys of at least [`REFER_FROM`] bytes that lie in `file` where they are, until
    /// [`Self::copy_keys`]: the counts then keep `file` mapped, and must not outlive a change to
    /// it (see `MappedFile::open`). For counts handed straight to a trainer: a stage 2's count of
    /// web text otherwise copies most of the text into its arenas.
    pub fn refer_to(&self, file: &Arc<MappedFile>) {
        for local in &self.locals {
            local.lock().unwrap_or_else(|e| e.into_inner()).arena.refer_to(file);
        }
    }

    /// Copy every new key again (see [`Self::refer_to`]).
    pub fn copy_keys(&self) {
        for local in &self.locals {
            local.lock().unwrap_or_else(|e| e.into_inner()).arena.copy_keys();
        }
    }

    /// Bytes of the distinct keys of at least [`REFER_FROM`] bytes counted so far, whether left
    /// in a file or copied: what a file's pages kept mapped would stand in for.
    pub fn long_key_bytes(&self) -> u64 {
        self.locals.iter().map(|l| l.lock().unwrap_or_else(|e| e.into_inner()).arena.long_key_bytes).sum()
    }

    pub(crate) fn local(&self) -> std::sync::MutexGuard<'_, LocalCounts> {
        let i = rayon::current_thread_index().unwrap_or(0) % self.locals.len();
        self.locals[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add everything counted into `into` and start again from empty. Into empty counts the
    /// entries are only listed ([`Counts::listed`]); into others they are added to the tables.
    pub fn drain_into(&mut self, into: &mut Counts) -> Result<(), String> {
        let n = self.locals.len();
        let locals = std::mem::replace(self, Tally::new(n)).locals;
        let mut locals: Vec<LocalCounts> = locals
            .into_iter()
            .map(|m| {
                let mut local = m.into_inner().unwrap_or_else(|e| e.into_inner());
                local.flush_hot();
                local
            })
            .collect();
        if into.is_untouched() && locals.len() <= MAX_ADOPTED {
            *into = Counts::listed(locals);
            return Ok(());
        }
        locals.iter_mut().for_each(LocalCounts::drop_long_index);
        into.absorb(locals)
    }
}

/// A piece a later worker's record holds that an earlier worker has too: (the earlier worker,
/// its record's location, the later record's location, the later record's count).
type Shared = (usize, u64, u64, u64);

/// Long keys' (location, count) in a run by location (see [`MemoryOrder::long`]).
type Run = Vec<(u64, u64)>;
/// Runs in location order.
type Runs = Vec<Run>;

/// Walk the records of every `step`-th chunk of `arena` from `first` (each chunk's in the order
/// they lie) looking each piece up in the `earlier` workers' indexes: the pieces none of them
/// holds, as (location, count) by location (one run per chunk that keeps any), and the others
/// ([`Shared`]). Each lookup's slot is fetched [`DEPTH`] records ahead (the indexes outgrow the
/// CPU caches, and the lookups are independent).
fn walk_records(arena: &Arena, first: usize, step: usize, earlier: &[LocalCounts]) -> (Runs, Vec<Shared>) {
    let chunks = (first..arena.chunks.len()).step_by(step);
    // `records_in` takes a few chunks in turn: one list per chunk keeps each in location order.
    // Each is made as long as its chunk's records could be, so that it never moves: the pages of a
    // list are only taken as it is written, and a stage 2's lists, grown and copied together
    // afterwards, spent most of their time in fresh pages.
    let mut kept: Runs = chunks.clone().map(|c| Vec::with_capacity(arena.chunks[c].len() / MIN_RECORD)).collect();
    let mut shared = Vec::new();
    let mut settle = |(loc, h, key, count): (u64, u64, &[u8], u64)| match earlier
        .iter()
        .enumerate()
        .find_map(|(w, local)| local.find_long(h, key).map(|at| (w, at)))
    {
        Some((w, at)) => shared.push((w, at, loc, count)),
        None => kept[((loc >> POS_BITS) as usize - first) / step].push((loc, count)),
    };
    let mut ring = std::collections::VecDeque::with_capacity(DEPTH);
    for record in arena.records_in(chunks) {
        earlier.iter().for_each(|local| local.prefetch_long(record.1));
        if ring.len() == DEPTH {
            settle(ring.pop_front().expect("full"));
        }
        ring.push_back(record);
    }
    ring.into_iter().for_each(&mut settle);
    kept.retain(|run| !run.is_empty());
    kept.iter_mut().for_each(Vec::shrink_to_fit);
    (kept, shared)
}

/// Entries a thread of `Counts::absorb` holds before adding them to their shards (24 bytes each;
/// a few in tests, so that they add in many batches).
const ABSORB_BATCH: usize = if cfg!(test) { 64 } else { 1 << 19 };

/// Owned piece counts, sharded by hash. Keys are unique across shards. Long keys live in
/// arenas (a shard's own, or worker arenas adopted whole by [`Tally::drain_into`], so merging
/// the workers' counts copies no key), not in one allocation per key.
pub struct Counts {
    state: ahash::RandomState,
    shards: Vec<Shard>,
    adopted: Vec<Arena>,
    /// The memory order, once asked for and until the table changes: the memory estimate reads
    /// every key in it, and the build that follows reads them again (see [`Counts::memory_order`]).
    order: Mutex<Option<Arc<MemoryOrder>>>,
    /// Set while the entries are only listed, here, and the shard tables are empty: counts
    /// drained from workers into an empty table ([`Counts::listed`]) until a lookup or a change
    /// indexes them ([`Counts::index`]).
    listed: Option<Arc<MemoryOrder>>,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            state: hasher(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            adopted: Vec::new(),
            order: Mutex::new(None),
            listed: None,
        }
    }
}

/// The bytes of an entry key (see [`Entry`]).
#[inline(always)]
fn key_bytes<'a>(key: &'a [u8; 8], own: &'a Arena, adopted: &'a [Arena]) -> &'a [u8] {
    if key[7] & 0x80 == 0 {
        return &key[..key[7] as usize];
    }
    let r = u64::from_le_bytes(*key);
    let src = ((r & !LONG) >> LOC_BITS) as usize;
    let loc = r & ((1 << LOC_BITS) - 1);
    if src == 0 {
        own.key(loc)
    } else {
        adopted[src - 1].key(loc)
    }
}

/// Add `count` to the entry of `piece` (hash `h`) in `shard`; a new entry gets the key `make_key()`.
#[inline]
fn add_entry(
    shard: &mut Shard,
    adopted: &[Arena],
    h: u64,
    piece: &[u8],
    count: u64,
    make_key: impl FnOnce(&mut Arena) -> [u8; 8],
) -> Result<(), String> {
    let Shard { table, arena } = shard;
    let eq = |e: &Entry| e.0 == h && bytes_eq(key_bytes(&e.1, arena, adopted), piece);
    match table.entry(table_hash(h), eq, |e| table_hash(e.0)) {
        hashbrown::hash_table::Entry::Occupied(mut e) => {
            let e = &mut e.get_mut().2;
            *e = e.checked_add(count).ok_or_else(|| "piece count overflows 64 bits".to_string())?;
        }
        hashbrown::hash_table::Entry::Vacant(v) => {
            v.insert((h, make_key(arena), count));
        }
    }
    Ok(())
}

/// The entry key of `piece`, copying a long one into `arena`.
#[inline]
fn own_key(arena: &mut Arena, h: u64, piece: &[u8]) -> [u8; 8] {
    if piece.len() <= SHORT_MAX {
        pack_short(piece).to_le_bytes()
    } else {
        (LONG | arena.push(h, piece, 0)).to_le_bytes()
    }
}

impl Counts {
    pub fn len(&self) -> usize {
        self.listed.as_ref().map_or(0, |l| l.len()) + self.shards.iter().map(|s| s.table.len()).sum::<usize>()
    }

    /// The marks of the mapped files whose bytes keys are left in: a reader of the keys checks
    /// them once it is done, since a file cut short meanwhile read as zeros past its cut.
    pub fn cut_marks(&self) -> Vec<CutMark> {
        self.shards.iter().map(|s| &s.arena).chain(&self.adopted).flat_map(Arena::cut_marks).collect()
    }

    /// The name of a mapped file that keys are left in and that was found cut short.
    pub fn cut_short_file(&self) -> Option<String> {
        first_cut_short(&self.cut_marks())
    }

    /// Whether nothing was ever added (a fresh table).
    fn is_untouched(&self) -> bool {
        self.listed.is_none()
            && self.adopted.is_empty()
            && self.shards.iter().all(|s| s.table.is_empty() && s.arena.chunks.is_empty())
    }

    /// The workers' counts as one list of distinct entries, without the shard tables: a trainer
    /// reads every entry once in memory order and looks nothing up, and for a stage 2's tens of
    /// millions of distinct lines, filling the tables (and listing their order after) was the
    /// longest serial part of handing the count over. A piece several workers counted is kept by
    /// the first of them, with all their counts (a later worker's records are looked up in the
    /// earlier workers' indexes, the only lookups made); each worker's arena is adopted whole.
    /// The tables are filled when something needs them ([`Counts::index`]).
    fn listed(mut locals: Vec<LocalCounts>) -> Counts {
        let threads = rayon::current_num_threads().max(1);
        let mut runs: Vec<Runs> = (0..locals.len()).map(|_| Vec::new()).collect();
        // Later workers first: the counts they give an earlier worker's records are in by the
        // time that worker's records are listed.
        for w in (0..locals.len()).rev() {
            let (earlier, rest) = locals.split_at_mut(w);
            // Only the later workers, walked already, look pieces up in this one.
            rest[0].drop_long_index();
            let arena = &mut rest[0].arena;
            // Every `threads`-th chunk to each thread: chunks hold very different numbers of
            // records (the first windows' copied keys fill a chunk sooner than keys left in the
            // file), and with halves by chunk count the thread of the fuller half walked on alone.
            let walked: Vec<(Runs, Vec<Shared>)> =
                (0..threads).into_par_iter().map(|t| walk_records(arena, t, threads, earlier)).collect();
            let mut kept = Runs::new();
            for (part, shared) in walked {
                kept.extend(part);
                for (owner, at, loc, count) in shared {
                    earlier[owner].arena.add_count(at, count);
                    arena.drop_record(loc);
                }
            }
            // In chunk order (a run's first location says its chunk), as replay reads and frees them.
            kept.sort_unstable_by_key(|run| run[0].0);
            runs[w].extend(kept);
        }
        let long = runs.into_iter().enumerate().flat_map(|(w, r)| r.into_iter().map(move |run| (SHARDS + w, run)));
        let long = long.collect();
        let (first, rest) = locals.split_first_mut().expect("a tally has a worker");
        for local in rest {
            for &(key, count) in local.short.iter().filter(|e| e.0 != 0) {
                first.add_short(key, count);
            }
        }
        let short = first.short.iter().filter(|e| e.0 != 0).map(|&(key, count)| (key.to_le_bytes(), count)).collect();
        Counts {
            adopted: locals.into_iter().map(|l| l.arena).collect(),
            listed: Some(Arc::new(MemoryOrder { short, long })),
            ..Counts::default()
        }
    }

    /// Fill the shard tables from the list of entries, if the counts are only listed.
    pub fn index(&mut self) {
        let Some(listed) = self.listed.take() else { return };
        let threads = rayon::current_num_threads().clamp(1, SHARDS);
        let Counts { shards, adopted, .. } = self;
        let per_shard = listed.len().div_ceil(SHARDS) * 9 / 8;
        shards.par_iter_mut().for_each(|shard| shard.table.reserve(per_shard, |e| table_hash(e.0)));
        let locked: Vec<Mutex<&mut Shard>> = shards.iter_mut().map(Mutex::new).collect();
        let adopted = &*adopted;
        let share = |len: usize, t: usize| t * len / threads..(t + 1) * len / threads;
        (0..threads).into_par_iter().for_each(|t| {
            let shorts = listed.short[share(listed.short.len(), t)]
                .iter()
                .map(|&(key, count)| (hash_short(u64::from_le_bytes(key)), key, count));
            // Only adopted arenas hold listed keys (a listed table has no keys of its own).
            let longs = listed.long.iter().flat_map(|&(a, ref list)| {
                let (src, arena) = ((a - SHARDS + 1) as u64, &adopted[a - SHARDS]);
                list[share(list.len(), t)]
                    .iter()
                    .map(move |&(loc, count)| (arena.hash_at(loc), (LONG | src << LOC_BITS | loc).to_le_bytes(), count))
            });
            // Listed entries are distinct with their counts summed: no addition that could overflow.
            add_batched(shorts.chain(longs), &locked, adopted, t * SHARDS / threads).expect("distinct entries");
        });
        // The list is still the tables' memory order.
        *self.order.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(listed);
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn total(&self) -> u128 {
        self.iter().map(|(_, c)| c as u128).sum()
    }

    /// Add `count` to `piece` (copying the key on first sight).
    pub fn add(&mut self, piece: &[u8], count: u64) -> Result<(), String> {
        self.index();
        self.forget_order();
        let h = piece_hash(&self.state, piece);
        add_entry(&mut self.shards[shard_of(h)], &self.adopted, h, piece, count, |a| own_key(a, h, piece))
    }

    /// The count of `piece` (indexing listed counts first).
    pub fn get(&mut self, piece: &[u8]) -> u64 {
        self.index();
        let h = piece_hash(&self.state, piece);
        let shard = &self.shards[shard_of(h)];
        shard
            .table
            .find(table_hash(h), |e| e.0 == h && bytes_eq(key_bytes(&e.1, &shard.arena, &self.adopted), piece))
            .map_or(0, |e| e.2)
    }

    /// Bytes the table holds: its shards' slots or its list, and every arena (what dropping it
    /// gives back).
    pub fn heap_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<Entry>() as u64 + 1;
        let shards: u64 = self.shards.iter().map(|s| s.table.capacity() as u64 * entry + s.arena.heap_bytes()).sum();
        shards + self.list_bytes() + self.adopted.iter().map(Arena::heap_bytes).sum::<u64>()
    }

    /// Bytes of the list of entries of counts that are only listed (0 once indexed; part of
    /// [`Counts::heap_bytes`]).
    pub fn list_bytes(&self) -> u64 {
        self.listed.as_ref().map_or(0, |l| 16 * l.len() as u64)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u64)> {
        let listed = self.listed.as_deref().into_iter();
        let short = listed.clone().flat_map(|l| l.short.iter().map(|(key, count)| (&key[..key[7] as usize], *count)));
        let long = listed.flat_map(move |l| {
            l.long.iter().flat_map(move |&(a, ref list)| list.iter().map(move |&(loc, c)| (self.arena_key(a, loc), c)))
        });
        let tables = self
            .shards
            .iter()
            .flat_map(move |s| s.table.iter().map(move |e| (key_bytes(&e.1, &s.arena, &self.adopted), e.2)));
        short.chain(long).chain(tables)
    }

    /// Every entry in the order its key lies in memory (see [`MemoryOrder`]), kept until the
    /// table changes or a reader takes it ([`Counts::take_memory_order`]): listing and sorting the
    /// entries of a stage 2 is a large part of reading its keys once.
    pub fn memory_order(&self) -> Arc<MemoryOrder> {
        if let Some(listed) = &self.listed {
            return listed.clone();
        }
        let mut kept = self.order.lock().unwrap_or_else(|e| e.into_inner());
        kept.get_or_insert_with(|| Arc::new(self.list_memory_order())).clone()
    }

    /// [`Counts::memory_order`], no longer kept here: the last reader frees it when done (the
    /// build drops it after replay, before its own peak). Counts only listed keep it (it is their
    /// entries) until [`Counts::release_tables`].
    pub fn take_memory_order(&self) -> Arc<MemoryOrder> {
        if let Some(listed) = &self.listed {
            return listed.clone();
        }
        let kept = self.order.lock().unwrap_or_else(|e| e.into_inner()).take();
        kept.unwrap_or_else(|| Arc::new(self.list_memory_order()))
    }

    /// Drop a kept memory order: the table is about to change.
    fn forget_order(&mut self) {
        *self.order.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Lists each arena's keys chunk by chunk: each shard first counts its keys per chunk, so that
    /// it can write them straight into their chunk's place in the list, and then each chunk's keys
    /// are sorted by location (a chunk's keys fit the CPU cache; one sort of an arena's whole list
    /// missed it throughout, and lists gathered per shard first were copied once more).
    fn list_memory_order(&self) -> MemoryOrder {
        let arenas = SHARDS + self.adopted.len();
        // Chunk `c` of arena `a` is bucket `first_bucket[a] + c`.
        let mut first_bucket = vec![0usize; arenas + 1];
        for a in 0..arenas {
            first_bucket[a + 1] = first_bucket[a] + self.arena(a).chunks.len();
        }
        let buckets = first_bucket[arenas];
        let bucket_of = |s: usize, r: u64| {
            let src = ((r & !LONG) >> LOC_BITS) as usize;
            let arena = if src == 0 { s } else { SHARDS + src - 1 };
            first_bucket[arena] + ((r & LOC_MASK) >> POS_BITS) as usize
        };
        let tallies: Vec<(usize, Vec<usize>)> = self
            .shards
            .par_iter()
            .enumerate()
            .map(|(s, shard)| {
                let (mut short, mut per_bucket) = (0, vec![0usize; buckets]);
                for (_, key, _) in shard.table.iter() {
                    if key[7] & 0x80 == 0 {
                        short += 1;
                    } else {
                        per_bucket[bucket_of(s, u64::from_le_bytes(*key))] += 1;
                    }
                }
                (short, per_bucket)
            })
            .collect();
        let bucket_len = |b: usize| tallies.iter().map(|t| t.1[b]).sum::<usize>();
        let mut short = vec![([0u8; 8], 0u64); tallies.iter().map(|t| t.0).sum()];
        let mut long: Vec<Vec<(u64, u64)>> =
            (0..arenas).map(|a| vec![(0, 0); (first_bucket[a]..first_bucket[a + 1]).map(bucket_len).sum()]).collect();
        // Where each shard writes: its short keys, and its keys of each bucket (in bucket order,
        // within a bucket in shard order).
        let mut short_places = Vec::with_capacity(SHARDS);
        let mut rest = &mut short[..];
        for t in &tallies {
            let (mine, r) = rest.split_at_mut(t.0);
            short_places.push(mine);
            rest = r;
        }
        let mut long_places: Vec<Vec<std::slice::IterMut<(u64, u64)>>> =
            (0..SHARDS).map(|_| Vec::with_capacity(buckets)).collect();
        for (a, list) in long.iter_mut().enumerate() {
            let mut rest = &mut list[..];
            for b in first_bucket[a]..first_bucket[a + 1] {
                for (places, t) in long_places.iter_mut().zip(&tallies) {
                    let (mine, r) = rest.split_at_mut(t.1[b]);
                    places.push(mine.iter_mut());
                    rest = r;
                }
            }
        }
        self.shards.par_iter().zip(short_places).zip(long_places).enumerate().for_each(
            |(s, ((shard, short_place), mut places))| {
                let mut short_place = short_place.iter_mut();
                for &(_, key, count) in shard.table.iter() {
                    if key[7] & 0x80 == 0 {
                        *short_place.next().expect("counted") = (key, count);
                    } else {
                        let r = u64::from_le_bytes(key);
                        *places[bucket_of(s, r)].next().expect("counted") = (r & LOC_MASK, count);
                    }
                }
            },
        );
        let mut chunks: Vec<&mut [(u64, u64)]> = Vec::with_capacity(buckets);
        for (a, list) in long.iter_mut().enumerate() {
            let mut rest = &mut list[..];
            for b in first_bucket[a]..first_bucket[a + 1] {
                let (mine, r) = rest.split_at_mut(bucket_len(b));
                chunks.push(mine);
                rest = r;
            }
        }
        chunks.par_iter_mut().for_each(|c| c.sort_unstable_by_key(|e| e.0));
        MemoryOrder { short, long: long.into_iter().enumerate().filter(|r| !r.1.is_empty()).collect() }
    }

    /// The long key at `loc` of arena `arena`: shard `s`'s own arena is `s`, adopted arena `k` is
    /// `SHARDS + k` (as [`MemoryOrder::long`] lists them).
    #[inline(always)]
    pub fn arena_key(&self, arena: usize, loc: u64) -> &[u8] {
        self.arena(arena).key(loc)
    }

    /// Fetch the record of the long key at `loc` of `arena` into the CPU cache.
    #[inline(always)]
    pub fn prefetch_key(&self, arena: usize, loc: u64) {
        self.arena(arena).prefetch(loc)
    }

    fn arena(&self, arena: usize) -> &Arena {
        match arena.checked_sub(SHARDS) {
            None => &self.shards[arena].arena,
            Some(k) => &self.adopted[k],
        }
    }

    /// Free every shard's table (or the list), keeping the arenas: for a consumer that reads the
    /// keys in [`MemoryOrder`] and needs no lookups. The counts read as empty from then on.
    pub fn release_tables(&mut self) {
        self.listed = None;
        for shard in &mut self.shards {
            shard.table = HashTable::new();
        }
    }

    /// Free the keys a consumer reading in [`MemoryOrder`] has passed: every arena before `arena`
    /// and the chunks of `arena` before the one holding `loc`. Counts only listed read as empty
    /// from then on (their list would name freed keys).
    pub fn release_keys_before(&mut self, arena: usize, loc: u64) {
        self.forget_order();
        self.listed = None;
        for a in 0..arena.min(SHARDS + self.adopted.len()) {
            match a.checked_sub(SHARDS) {
                None => self.shards[a].arena.release_before(u64::MAX),
                Some(k) => self.adopted[k].release_before(u64::MAX),
            }
        }
        match arena.checked_sub(SHARDS) {
            None if arena < SHARDS => self.shards[arena].arena.release_before(loc),
            Some(k) if k < self.adopted.len() => self.adopted[k].release_before(loc),
            _ => {}
        }
    }

    /// How many entries have a long key (longer than a packed short piece), and those keys'
    /// bytes, without reading them: the arenas keep the totals (as they were counted; freeing keys
    /// a reader has passed leaves them).
    pub fn long_key_totals(&self) -> (u64, u64) {
        let arenas = self.shards.iter().map(|s| &s.arena).chain(&self.adopted);
        arenas.fold((0, 0), |(keys, bytes), a| (keys + a.keys, bytes + a.key_bytes))
    }

    /// The bytes of all keys, short and long (with 12 bytes per entry, what the `.counts` file of
    /// the table holds), without reading a long key.
    pub fn key_bytes(&self) -> u64 {
        let short: u64 =
            self.shards.iter().flat_map(|s| s.table.iter()).filter(|e| e.1[7] & 0x80 == 0).map(|e| e.1[7] as u64).sum();
        let listed: u64 = self.listed.iter().flat_map(|l| l.short.iter()).map(|e| e.0[7] as u64).sum();
        short + listed + self.long_key_totals().1
    }

    /// Entries sorted by bytes (the `.counts` file order), each with its first 16 bytes as
    /// [`sort_prefix`] gives them. A stage 2's tens of millions of keys lie
    /// all over memory: they are gathered in the order they lie there ([`Counts::memory_order`],
    /// which the build reuses) and sorted with their first 16 bytes beside them, so that most
    /// comparisons read no key (in place, nearly every step missed the caches).
    pub fn sorted_with_prefixes(&self) -> Vec<([u64; 2], &[u8], u64)> {
        let order = self.memory_order();
        let mut v: Vec<([u64; 2], &[u8], u64)> = Vec::with_capacity(order.len());
        v.extend(self.shards.iter().flat_map(|s| s.table.iter()).filter(|e| e.1[7] & 0x80 == 0).map(|e| {
            let k = &e.1[..e.1[7] as usize];
            (sort_prefix(k), k, e.2)
        }));
        v.extend(self.listed.iter().flat_map(|l| l.short.iter()).map(|(key, c)| {
            let k = &key[..key[7] as usize];
            (sort_prefix(k), k, *c)
        }));
        for &(arena, ref list) in &order.long {
            v.extend(list.iter().map(|&(loc, c)| {
                let k = self.arena_key(arena, loc);
                (sort_prefix(k), k, c)
            }));
        }
        v.par_sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        v
    }

    /// [`Counts::sorted_with_prefixes`] without the prefixes.
    pub fn sorted(&self) -> Vec<(&[u8], u64)> {
        self.sorted_with_prefixes().into_iter().map(|(_, k, c)| (k, c)).collect()
    }

    /// Add all of `other` into `self`, shard by shard in parallel (entry by entry when `other` is
    /// only listed: index it first for speed).
    pub fn merge(&mut self, other: &Counts) -> Result<(), String> {
        self.index();
        self.forget_order();
        if other.listed.is_some() {
            return other.iter().try_for_each(|(piece, count)| self.add(piece, count));
        }
        let adopted = &self.adopted;
        self.shards.par_iter_mut().zip(other.shards.par_iter()).try_for_each(|(mine, theirs)| {
            for e in theirs.table.iter() {
                let piece = key_bytes(&e.1, &theirs.arena, &other.adopted);
                add_entry(mine, adopted, e.0, piece, e.2, |a| own_key(a, e.0, piece))?;
            }
            Ok(())
        })
    }

    /// Add the workers' counts, shard by shard in parallel. Their arenas are adopted, so new
    /// long keys are not copied.
    fn absorb(&mut self, locals: Vec<LocalCounts>) -> Result<(), String> {
        self.index();
        self.forget_order();
        if self.adopted.len() + locals.len() > MAX_ADOPTED {
            // Far more worker arenas than any real count makes: copy the keys instead.
            for local in &locals {
                for &(key, count) in local.short.iter().filter(|e| e.0 != 0) {
                    let (buf, len) = unpack_short(key);
                    self.add(&buf[..len], count)?;
                }
                for (_, _, key, count) in local.arena.records() {
                    self.add(key, count)?;
                }
            }
            return Ok(());
        }
        // Each worker's entries go straight into the shard tables: no list of every entry is built
        // beside them (for a stage 2's millions of distinct lines that list was the peak of the
        // whole run). Threads split the worker's short table and its arena's chunks between them,
        // so every record is read once; a shard is locked only while a batch goes into it.
        let threads = rayon::current_num_threads().clamp(1, SHARDS);
        let Counts { shards, adopted, .. } = self;
        // Room for every incoming entry at once (pieces two workers share are counted twice, so
        // this errs high): grown one doubling at a time, each shard's table was rehashed a dozen
        // times over while a stage 2's tens of millions of pieces came in.
        let incoming = locals.iter().map(LocalCounts::len).sum::<usize>().div_ceil(SHARDS);
        shards.par_iter_mut().for_each(|shard| shard.table.reserve(incoming, |e| table_hash(e.0)));
        for local in locals {
            let LocalCounts { short, arena, .. } = local;
            adopted.push(arena);
            let src = adopted.len() as u64;
            let locked: Vec<Mutex<&mut Shard>> = shards.iter_mut().map(Mutex::new).collect();
            let (adopted_now, arena) = (&*adopted, &adopted[adopted.len() - 1]);
            let share = |len: usize, t: usize| t * len / threads..(t + 1) * len / threads;
            let known = (0..threads)
                .into_par_iter()
                .map(|t| {
                    let shorts = short[share(short.len(), t)]
                        .iter()
                        .filter(|e| e.0 != 0)
                        .map(|&(key, count)| (hash_short(key), key.to_le_bytes(), count));
                    let longs = arena
                        .records_in(share(arena.chunks.len(), t))
                        .map(|(loc, h, _, count)| (h, (LONG | src << LOC_BITS | loc).to_le_bytes(), count));
                    add_batched(shorts.chain(longs), &locked, adopted_now, t * SHARDS / threads)
                })
                .try_reduce(|| (0, 0), |a, b| Ok((a.0 + b.0, a.1 + b.1)))?;
            // The worker's keys that an entry had before are not referred to: they leave the totals.
            let arena = adopted.last_mut().expect("just adopted");
            arena.keys -= known.0;
            arena.key_bytes -= known.1;
        }
        Ok(())
    }
}

/// Add a worker's `entries` (with keys that are packed short pieces or in an adopted arena) to the
/// shards, a batch at a time: they wait in one list per shard, and a full batch goes in shard by
/// shard (from shard `first` on, so that threads start apart), each shard's table filled while it
/// is in the CPU cache: in the worker's order every insert was a miss in a different shard. Returns
/// how many of the long keys had an entry already, and their bytes.
fn add_batched(
    entries: impl Iterator<Item = Entry>,
    shards: &[Mutex<&mut Shard>],
    adopted: &[Arena],
    first: usize,
) -> Result<(u64, u64), String> {
    let mut waiting: Vec<Vec<Entry>> = vec![Vec::new(); SHARDS];
    let mut known = (0u64, 0u64);
    let mut flush = |waiting: &mut [Vec<Entry>]| -> Result<(), String> {
        for s in (first..first + SHARDS).map(|s| s % SHARDS) {
            if waiting[s].is_empty() {
                continue;
            }
            let mut shard = shards[s].lock().unwrap_or_else(|e| e.into_inner());
            for (h, key, count) in waiting[s].drain(..) {
                if let Some(len) = add_key(&mut shard, adopted, h, key, count)? {
                    if key[7] & 0x80 != 0 {
                        known = (known.0 + 1, known.1 + len as u64);
                    }
                }
            }
        }
        Ok(())
    };
    for (i, entry) in entries.enumerate() {
        waiting[shard_of(entry.0)].push(entry);
        if (i + 1) % ABSORB_BATCH == 0 {
            flush(&mut waiting)?;
        }
    }
    flush(&mut waiting)?;
    Ok(known)
}

/// Add `count` to the entry of the piece with key `key` (a packed short piece or a key in an
/// adopted arena) and hash `h`; a new entry keeps `key`. Returns the piece's length if it had an
/// entry already. The key's bytes are read only to compare with an entry of the same hash, so the
/// record of a new piece (most of a stage 2's) is not read again.
#[inline]
fn add_key(shard: &mut Shard, adopted: &[Arena], h: u64, key: [u8; 8], count: u64) -> Result<Option<usize>, String> {
    let Shard { table, arena } = shard;
    // `key` is never in a shard's own arena (source 0), so reading it with this shard's is right.
    let eq = |e: &Entry| e.0 == h && bytes_eq(key_bytes(&e.1, arena, adopted), key_bytes(&key, arena, adopted));
    match table.entry(table_hash(h), eq, |e| table_hash(e.0)) {
        hashbrown::hash_table::Entry::Occupied(mut e) => {
            let e = &mut e.get_mut().2;
            *e = e.checked_add(count).ok_or_else(|| "piece count overflows 64 bits".to_string())?;
            Ok(Some(key_bytes(&key, arena, adopted).len()))
        }
        hashbrown::hash_table::Entry::Vacant(v) => {
            v.insert((h, key, count));
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed table is asked of the allocator as zeroed memory: its pages are not written
    /// (so the huge-page advice comes before they are first touched).
    #[test]
    fn zeroed_tables_are_not_written() {
        let before = crate::memory::resident_bytes().expect("this test runs on Linux");
        let slots: Vec<[u64; 2]> = zeroed(1 << 24);
        let pairs: Vec<(u64, u64)> = zeroed(1 << 24);
        let grown = crate::memory::resident_bytes().unwrap().saturating_sub(before);
        assert!(grown < 64 << 20, "{grown} bytes resident for 512 MB of tables");
        assert_eq!((slots.len(), pairs.len()), (1 << 24, 1 << 24));
        assert!(slots.iter().step_by(1 << 12).all(|s| *s == [0, 0]) && pairs[(1 << 24) - 1] == (0, 0));
    }

    use std::collections::HashMap;

    /// The prefix sort orders as the bytes do: keys sharing their first 16 bytes, keys that are
    /// prefixes of others, zero bytes (the prefix's padding), short and long keys.
    #[test]
    fn sorted_orders_by_bytes() {
        let seed = &mut 0x50_47_ED_u64;
        let mut counts = Counts::default();
        let mut want = Vec::new();
        for i in 0..5_000u64 {
            let len = crate::test_below(seed, 40);
            let shared = if i % 3 == 0 { b"the same sixteen".as_slice() } else { b"" };
            let mut key: Vec<u8> = shared.to_vec();
            key.extend((0..len).map(|_| [0u8, 1, b'a', b'b', 255][crate::test_below(seed, 5)]));
            if counts.get(&key) == 0 {
                counts.add(&key, i + 1).unwrap();
                want.push((key, i + 1));
            }
        }
        want.sort();
        let got: Vec<(Vec<u8>, u64)> = counts.sorted().into_iter().map(|(k, c)| (k.to_vec(), c)).collect();
        assert_eq!(got, want);
    }

    /// A location inside a key rather than at a record's start reads that key's bytes as a
    /// record: one saying it refers to a key at some address is refused (a panic), never read,
    /// with or without files kept.
    #[test]
    fn a_location_inside_a_key_reads_no_address_from_it() {
        // From byte 16 on, the key reads as a referring record header followed by an address:
        // 8 bytes at address 16, inside no mapping.
        let mut piece = b"0123456789abcdef".to_vec();
        piece.extend_from_slice(&(8 | REFERS).to_le_bytes());
        piece.extend_from_slice(&16u64.to_le_bytes());
        piece.extend_from_slice(b"tail");
        let path = std::env::temp_dir().join(format!("superbpe-forged-test-{}", std::process::id()));
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test's own file, unchanged while mapped.
        let map = Arc::new(unsafe { MappedFile::open(&file, path.to_str().unwrap()) }.unwrap().unwrap());
        for keep_file in [false, true] {
            let mut counts = Counts::default();
            counts.add(&piece, 3).unwrap();
            let order = counts.memory_order();
            let (arena, ref locs) = order.long[0];
            let loc = locs[0].0;
            if keep_file {
                counts.shards[arena].arena.refer_to(&map);
                counts.shards[arena].arena.copy_keys();
            }
            assert_eq!(counts.arena_key(arena, loc), &piece[..]);
            let forged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                counts.arena_key(arena, loc + RECORD_HEADER as u64).to_vec()
            }));
            assert!(forged.is_err(), "a forged address was read");
        }
        drop((map, file));
        std::fs::remove_file(&path).unwrap();
    }

    /// Keys left in a mapped file (`Tally::refer_to`) count as copied keys do: the same entries,
    /// counts, sorted list, key totals and memory order, a key's first repeat copied and later
    /// ones added to the copy. Their records hold an address instead of the key, and the counts
    /// keep the file mapped after its owner lets go of it.
    #[test]
    fn keys_left_in_a_file_count_as_copies() {
        let mut text = Vec::new();
        for i in 0..3000 {
            // Lines of 64 bytes or more (left in the file), a fifth of them repeated, and short pieces.
            text.extend(format!("line {} {}\n{}\n", i % 2500, "word ".repeat(12 + i % 2500 % 5), i % 7).bytes());
        }
        let path = std::env::temp_dir().join(format!("superbpe-refer-test-{}", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test's own file, unchanged while mapped (removed only once unmapped or
        // unlinked, which keeps the mapping's bytes).
        let map = Arc::new(unsafe { MappedFile::open(&file, path.to_str().unwrap()) }.unwrap().unwrap());
        let splitter = crate::scan::Splitter::new(r"[^\n]+|\n", false).unwrap();
        let bytes = map.bytes();
        let half = bytes[..bytes.len() / 2].iter().rposition(|&b| b == b'\n').unwrap() + 1;
        let count = |refer: bool| {
            let mut tally = Tally::new(2);
            if refer {
                tally.refer_to(&map);
            }
            for (w, part) in [&bytes[..half], &bytes[half..]].into_iter().enumerate() {
                tally.locals[w].lock().unwrap().count(&splitter, part).unwrap();
            }
            tally.copy_keys();
            let mut counts = Counts::default();
            tally.drain_into(&mut counts).unwrap();
            counts
        };
        let (copied, referred) = (count(false), count(true));
        let as_map = |c: &Counts| c.iter().map(|(k, v)| (k.to_vec(), v)).collect::<HashMap<Vec<u8>, u64>>();
        let want = as_map(&copied);
        assert_eq!(want.len(), 2500 + 7 + 1);
        assert_eq!(want[format!("line 5 {}", "word ".repeat(12)).as_bytes()], 2);
        let sorted = |c: &Counts| c.sorted().into_iter().map(|(k, v)| (k.to_vec(), v)).collect::<Vec<_>>();
        assert_eq!(sorted(&referred), sorted(&copied));
        assert_eq!(referred.long_key_totals(), copied.long_key_totals());
        assert_eq!(referred.memory_order().len(), copied.memory_order().len());
        assert!(referred.heap_bytes() + 80_000 < copied.heap_bytes(), "keys were copied");
        drop((map, file));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(as_map(&referred), want);
    }

    /// Three workers' counts (short and long pieces, many shared) drained into a table that
    /// already holds some of them, and into an empty one (which only lists them until a lookup
    /// or a change indexes it): every piece ends with the sum of all its counts, the same totals,
    /// order and sorted list either way.
    #[test]
    fn drained_workers_add_up() {
        let splitter = crate::scan::Splitter::new(r"\S+|\s+", false).unwrap();
        let before: Vec<String> = (0..500).map(|i| format!("pre{}-{}", i % 90, "x".repeat(i % 13))).collect();
        for into_empty in [false, true] {
            let mut want: HashMap<Vec<u8>, u64> = HashMap::new();
            let mut into = Counts::default();
            let add_before = |into: &mut Counts, want: &mut HashMap<Vec<u8>, u64>| {
                for piece in &before {
                    into.add(piece.as_bytes(), 2).unwrap();
                    *want.entry(piece.as_bytes().to_vec()).or_default() += 2;
                }
            };
            if !into_empty {
                add_before(&mut into, &mut want);
            }
            let mut tally = Tally::new(3);
            for (w, worker) in tally.locals.iter().enumerate() {
                let mut local = worker.lock().unwrap();
                for i in 0..4000 {
                    let text = format!(
                        "pre{}-{} w{} {} ",
                        (i * 7 + w) % 90,
                        "x".repeat(i % 13),
                        i % (300 + 50 * w),
                        "long".repeat(i % 5)
                    );
                    local.count(&splitter, text.as_bytes()).unwrap();
                    // The pattern's pieces: maximal runs of spaces and of anything else.
                    let bytes = text.as_bytes();
                    let mut start = 0;
                    for end in 1..=bytes.len() {
                        if end == bytes.len() || (bytes[end] == b' ') != (bytes[start] == b' ') {
                            *want.entry(bytes[start..end].to_vec()).or_default() += 1;
                            start = end;
                        }
                    }
                }
            }
            tally.drain_into(&mut into).unwrap();
            assert_eq!(into.listed.is_some(), into_empty);
            let got: HashMap<Vec<u8>, u64> = into.iter().map(|(k, v)| (k.to_vec(), v)).collect();
            assert_eq!(into.len(), got.len());
            assert_eq!(got, want);
            let order = into.memory_order();
            assert_eq!(order.len(), want.len());
            assert!(in_place_order(&order));
            let from_order: HashMap<Vec<u8>, u64> = order
                .short
                .iter()
                .map(|(k, c)| (k[..k[7] as usize].to_vec(), *c))
                .chain(long_entries(&order).map(|(a, loc, c)| (into.arena_key(a, loc).to_vec(), c)))
                .collect();
            assert_eq!(from_order, want);
            // The keys of later workers that an earlier one (or the table before) had leave the totals.
            let long: Vec<usize> = want.keys().map(Vec::len).filter(|&n| n > SHORT_MAX).collect();
            assert_eq!(into.long_key_totals(), (long.len() as u64, long.iter().sum::<usize>() as u64));
            assert_eq!(into.key_bytes(), want.keys().map(|k| k.len() as u64).sum::<u64>());
            let mut sorted: Vec<(Vec<u8>, u64)> = want.clone().into_iter().collect();
            sorted.sort();
            assert_eq!(into.sorted().into_iter().map(|(k, c)| (k.to_vec(), c)).collect::<Vec<_>>(), sorted);
            if into_empty {
                // Merged into indexed counts as they are, then indexed: the same entries.
                let mut copy = Counts::default();
                copy.merge(&into).unwrap();
                assert!(copy.listed.is_none());
                let key = b"pre5-xxxxx".as_slice();
                assert_eq!(into.get(key), want[key]);
                assert!(into.listed.is_none() && Arc::ptr_eq(&order, &into.memory_order()));
                add_before(&mut into, &mut want);
                add_before(&mut copy, &mut HashMap::new());
                for c in [&into, &copy] {
                    assert_eq!(c.iter().map(|(k, v)| (k.to_vec(), v)).collect::<HashMap<_, _>>(), want);
                }
            }
        }
    }

    /// Long pieces counted by two workers across many growths of their indexes (whose tags, two
    /// bits in tests, often match other pieces): each piece is found again, and the pieces both
    /// workers met are summed when they are drained.
    #[test]
    fn long_pieces_are_found_across_growths() {
        let splitter = crate::scan::Splitter::new(r"\S+|\s+", false).unwrap();
        let mut tally = Tally::new(2);
        let mut want: HashMap<Vec<u8>, u64> = HashMap::new();
        for (w, worker) in tally.locals.iter().enumerate() {
            let mut local = worker.lock().unwrap();
            for round in 0..3 {
                for i in (w * 10_000..30_000 + w * 10_000).filter(|i| (i + round) % 3 != 0) {
                    let piece = format!("long-piece-{i}");
                    local.count(&splitter, piece.as_bytes()).unwrap();
                    *want.entry(piece.into_bytes()).or_default() += 1;
                }
            }
            assert!(local.long_bits >= INITIAL_BITS + 4, "grew {} bits", local.long_bits - INITIAL_BITS);
            assert_eq!(local.long_len, 30_000);
        }
        let mut into = Counts::default();
        tally.drain_into(&mut into).unwrap();
        let got: HashMap<Vec<u8>, u64> = into.iter().map(|(k, v)| (k.to_vec(), v)).collect();
        assert_eq!(got.len(), 40_000);
        assert_eq!(got, want);
    }

    /// The memory order is listed once and kept while the table stands; a change forgets it (the
    /// next one lists the new entry), and a reader that takes it leaves none behind.
    #[test]
    fn memory_order_is_kept_until_the_table_changes() {
        let mut counts = Counts::default();
        counts.add(b"a long piece of text", 2).unwrap();
        let first = counts.memory_order();
        assert!(Arc::ptr_eq(&first, &counts.memory_order()));
        counts.add(b"abc", 1).unwrap();
        let second = counts.memory_order();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!((first.len(), second.len()), (1, 2));
        let taken = counts.take_memory_order();
        assert!(Arc::ptr_eq(&taken, &second));
        assert!(!Arc::ptr_eq(&taken, &counts.take_memory_order()));
    }

    /// Memory order lists every entry once with its count (keys held by the shards' own arenas and
    /// by adopted worker arenas, some in both), each arena's keys by location; freeing the keys
    /// passed leaves the rest readable.
    #[test]
    fn memory_order_lists_every_entry_once_in_place_order() {
        let splitter = crate::scan::Splitter::new(r"\S+|\s+", false).unwrap();
        let mut counts = Counts::default();
        for i in 0..3000 {
            counts.add(format!("own-{}-{}", i % 700, "y".repeat(i % 9)).as_bytes(), 1).unwrap();
        }
        let tally = Tally::new(2);
        for (w, worker) in tally.locals.iter().enumerate() {
            let mut local = worker.lock().unwrap();
            for i in 0..3000 {
                let text = format!("own-{}-{} w{}-{} s{} ", i % 700, "y".repeat(i % 9), w, "z".repeat(i % 40), i % 5);
                local.count(&splitter, text.as_bytes()).unwrap();
            }
        }
        let mut tally = tally;
        tally.drain_into(&mut counts).unwrap();
        let want: HashMap<Vec<u8>, u64> = counts.iter().map(|(k, v)| (k.to_vec(), v)).collect();
        let order = counts.memory_order();
        assert_eq!(order.len(), want.len());
        let mut got: HashMap<Vec<u8>, u64> = HashMap::new();
        for (key, count) in &order.short {
            assert!(got.insert(key[..key[7] as usize].to_vec(), *count).is_none());
        }
        assert!(in_place_order(&order));
        for (arena, loc, count) in long_entries(&order) {
            assert!(got.insert(counts.arena_key(arena, loc).to_vec(), count).is_none());
        }
        assert_eq!(got, want);
        assert!(order.long.iter().any(|r| r.0 < SHARDS) && order.long.iter().any(|r| r.0 >= SHARDS));
        // Free what a reader of the first adopted arena's first half has passed; the rest reads the same.
        let first_adopted: Vec<(u64, u64)> =
            long_entries(&order).filter(|e| e.0 == SHARDS).map(|(_, loc, c)| (loc, c)).collect();
        let (arena, (mid, _)) = (SHARDS, first_adopted[first_adopted.len() / 2]);
        counts.release_tables();
        counts.release_keys_before(arena, mid);
        for (a, loc, count) in long_entries(&order).filter(|e| e.0 > arena || (e.0 == arena && e.1 >= mid)) {
            assert_eq!(want[counts.arena_key(a, loc)], count);
        }
    }

    /// Every long entry of `order` as (arena, location, count), run after run.
    fn long_entries(order: &MemoryOrder) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        order.long.iter().flat_map(|&(a, ref run)| run.iter().map(move |&(loc, c)| (a, loc, c)))
    }

    /// Whether the runs of `order` list arenas in order and each arena's keys by location, none empty.
    fn in_place_order(order: &MemoryOrder) -> bool {
        let places: Vec<(usize, u64)> = long_entries(order).map(|(a, loc, _)| (a, loc)).collect();
        places.windows(2).all(|w| w[0] < w[1]) && order.long.iter().all(|r| !r.1.is_empty())
    }
}
