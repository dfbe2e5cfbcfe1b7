//! Pre-tokenize and count pieces in parallel.
//!
//! Text is cut into work units at special tokens, document boundaries and, when the splitter
//! allows it, at safe cuts, so the pieces (and counts) never depend on thread count, chunk or
//! block size. Each rayon worker counts into its own [`LocalCounts`], which lives as long as the
//! whole count (a [`Tally`]) and owns its keys: a key is copied into an append-only arena the first
//! time it is seen, so a block of input can be dropped as soon as it is counted
//! ([`CountSpec::count_stream`] reads files in blocks instead of mapping them whole). At the end
//! the worker tables are merged into [`Counts`], sharded by hash so the merge runs shard-parallel
//! instead of as one long serial tail.

use std::io::Read;
use std::sync::Mutex;

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
/// record's location stays valid, and growing the arena never copies it.
const ARENA_CHUNK: usize = 1 << 24;
const POS_BITS: u32 = ARENA_CHUNK.trailing_zeros();
/// Arena record header: hash (u64 LE), count (u64 LE), key length (u64 LE); the key follows.
const RECORD_HEADER: usize = 24;

/// Append-only storage of long keys with their hash and count. A record's location is
/// `chunk << POS_BITS | position` (a record starts inside the first `ARENA_CHUNK` bytes of its
/// chunk), below 2^47.
#[derive(Default)]
pub struct Arena {
    chunks: Vec<Vec<u8>>,
}

impl Arena {
    /// Store a new record; returns its location.
    #[inline]
    fn push(&mut self, h: u64, key: &[u8], count: u64) -> u64 {
        let need = RECORD_HEADER + key.len();
        let fits = self.chunks.last().is_some_and(|c| c.capacity() - c.len() >= need);
        if !fits {
            let chunk = Vec::with_capacity(need.max(ARENA_CHUNK));
            advise_huge(chunk.as_ptr() as usize, chunk.capacity());
            self.chunks.push(chunk);
        }
        let ci = self.chunks.len() - 1;
        let chunk = &mut self.chunks[ci];
        let pos = chunk.len();
        chunk.extend_from_slice(&h.to_le_bytes());
        chunk.extend_from_slice(&count.to_le_bytes());
        chunk.extend_from_slice(&(key.len() as u64).to_le_bytes());
        chunk.extend_from_slice(key);
        (ci as u64) << POS_BITS | pos as u64
    }

    #[inline(always)]
    fn prefetch(&self, loc: u64) {
        let chunk = &self.chunks[(loc >> POS_BITS) as usize];
        prefetch(&chunk[(loc & ((1 << POS_BITS) - 1)) as usize]);
    }

    #[inline(always)]
    fn record_mut(&mut self, loc: u64) -> &mut [u8] {
        &mut self.chunks[(loc >> POS_BITS) as usize][(loc & ((1 << POS_BITS) - 1)) as usize..]
    }

    /// The key stored at `loc`.
    #[inline(always)]
    fn key(&self, loc: u64) -> &[u8] {
        let rec = &self.chunks[(loc >> POS_BITS) as usize][(loc & ((1 << POS_BITS) - 1)) as usize..];
        let len = read_u64(rec, 16) as usize;
        &rec[RECORD_HEADER..RECORD_HEADER + len]
    }

    /// Every record as (location, hash, key, count), in insertion order (sequential reads).
    fn records(&self) -> impl Iterator<Item = (u64, u64, &[u8], u64)> {
        self.chunks.iter().enumerate().flat_map(|(ci, chunk)| {
            let mut pos = 0;
            std::iter::from_fn(move || {
                if pos >= chunk.len() {
                    return None;
                }
                let (h, count, len) =
                    (read_u64(chunk, pos), read_u64(chunk, pos + 8), read_u64(chunk, pos + 16) as usize);
                let key = &chunk[pos + RECORD_HEADER..pos + RECORD_HEADER + len];
                let loc = (ci as u64) << POS_BITS | pos as u64;
                pos += RECORD_HEADER + len;
                Some((loc, h, key, count))
            })
        })
    }
}

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
    /// Longer pieces: (hash, [`LONG`] | arena location); 0 marks an empty slot.
    long: Vec<(u64, u64)>,
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
            long: vec![(0, 0); 1 << INITIAL_BITS],
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
            let (sh, loc) = self.long[i];
            if loc == 0 {
                let loc = self.arena.push(h, piece, 1);
                self.long[i] = (h, LONG | loc);
                self.long_len += 1;
                if too_full(self.long_len, self.long_bits) {
                    self.grow_long();
                }
                return;
            }
            if sh == h {
                let rec = self.arena.record_mut(loc & !LONG);
                let len = read_u64(rec, 16) as usize;
                if bytes_eq(&rec[RECORD_HEADER..RECORD_HEADER + len], piece) {
                    let c = read_u64(rec, 8) + 1;
                    rec[8..16].copy_from_slice(&c.to_le_bytes());
                    return;
                }
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
        let mut table = zeroed_table(1 << bits);
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

    /// Double the table, or quadruple it while it is small (up to 16 MiB): each growth
    /// rewrites the whole table into fresh memory, which costs page faults.
    #[cold]
    fn grow_long(&mut self) {
        let bits = self.long_bits + if self.long_bits < 20 { 2 } else { 1 };
        let mask = (1usize << bits) - 1;
        let mut table = zeroed_table(1 << bits);
        for &(h, loc) in self.long.iter().filter(|e| e.1 != 0) {
            let mut i = slot_of(h, bits);
            while table[i].1 != 0 {
                i = (i + 1) & mask;
            }
            table[i] = (h, loc);
        }
        self.long = table;
        self.long_bits = bits;
    }

    /// Count the pieces of `seg`. A long piece's slot is prefetched and the piece looked up
    /// [`DEPTH`] long pieces later: the table of long pieces is large (most of its lookups
    /// miss the cache), and the lookups are independent, so the misses overlap. Short pieces
    /// (a small, mostly cached table) are counted at once.
    fn count<'a>(&mut self, splitter: &Splitter, seg: &'a [u8]) -> Result<(), String> {
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
                let (sh, loc) = self.long[slot_of(mh, self.long_bits)];
                if sh == mh && loc != 0 {
                    self.arena.prefetch(loc & !LONG);
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

/// A zeroed table of `n` slots, backed by huge pages where the system allows it: lookups in
/// the big tables are random, and with 4 KiB pages most of them also miss the TLB.
fn zeroed_table(n: usize) -> Vec<(u64, u64)> {
    let v = vec![(0u64, 0u64); n];
    advise_huge(v.as_ptr() as usize, n * std::mem::size_of::<(u64, u64)>());
    v
}

/// Ask for transparent huge pages on the 2 MiB-aligned part of `[addr, addr + len)`, before
/// it is first touched (the memory of a fresh large allocation is not mapped yet).
fn advise_huge(addr: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = addr.next_multiple_of(HUGE);
        let end = (addr + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside one live allocation of ours; MADV_HUGEPAGE only
            // changes how it is backed, never its contents (errors are ignored: it is a hint).
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, len);
}

/// Hint the CPU to load the cache line of `r` (a no-op where there is no prefetch instruction).
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults, even on a bad address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(r as *const T as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
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

    fn local(&self) -> std::sync::MutexGuard<'_, LocalCounts> {
        let i = rayon::current_thread_index().unwrap_or(0) % self.locals.len();
        self.locals[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add everything counted into `into` and start again from empty.
    pub fn drain_into(&mut self, into: &mut Counts) -> Result<(), String> {
        let n = self.locals.len();
        let locals = std::mem::replace(self, Tally::new(n)).locals;
        let locals: Vec<LocalCounts> = locals
            .into_iter()
            .map(|m| {
                let mut local = m.into_inner().unwrap_or_else(|e| e.into_inner());
                local.flush_hot();
                local
            })
            .collect();
        into.absorb(locals)
    }
}

/// Owned piece counts, sharded by hash. Keys are unique across shards. Long keys live in
/// arenas (a shard's own, or worker arenas adopted whole by [`Tally::drain_into`], so merging
/// the workers' counts copies no key), not in one allocation per key.
pub struct Counts {
    state: ahash::RandomState,
    shards: Vec<Shard>,
    adopted: Vec<Arena>,
}

impl Default for Counts {
    fn default() -> Self {
        Counts { state: hasher(), shards: (0..SHARDS).map(|_| Shard::default()).collect(), adopted: Vec::new() }
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
    let found = table.find_mut(table_hash(h), |e| e.0 == h && bytes_eq(key_bytes(&e.1, arena, adopted), piece));
    match found {
        Some(e) => {
            e.2 = e.2.checked_add(count).ok_or_else(|| "piece count overflows 64 bits".to_string())?;
        }
        None => {
            let key = make_key(arena);
            table.insert_unique(table_hash(h), (h, key, count), |e| table_hash(e.0));
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
        self.shards.iter().map(|s| s.table.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn total(&self) -> u128 {
        self.iter().map(|(_, c)| c as u128).sum()
    }

    /// Add `count` to `piece` (copying the key on first sight).
    pub fn add(&mut self, piece: &[u8], count: u64) -> Result<(), String> {
        let h = piece_hash(&self.state, piece);
        add_entry(&mut self.shards[shard_of(h)], &self.adopted, h, piece, count, |a| own_key(a, h, piece))
    }

    pub fn get(&self, piece: &[u8]) -> u64 {
        let h = piece_hash(&self.state, piece);
        let shard = &self.shards[shard_of(h)];
        shard
            .table
            .find(table_hash(h), |e| e.0 == h && bytes_eq(key_bytes(&e.1, &shard.arena, &self.adopted), piece))
            .map_or(0, |e| e.2)
    }

    /// The entries of shard `s` (below `SHARDS`); the shards together hold every entry once.
    pub fn shard_iter(&self, s: usize) -> impl Iterator<Item = (&[u8], u64)> {
        let shard = &self.shards[s];
        shard.table.iter().map(move |e| (key_bytes(&e.1, &shard.arena, &self.adopted), e.2))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u64)> {
        self.shards
            .iter()
            .flat_map(move |s| s.table.iter().map(move |e| (key_bytes(&e.1, &s.arena, &self.adopted), e.2)))
    }

    /// Entries sorted by bytes (the `.counts` file order).
    pub fn sorted(&self) -> Vec<(&[u8], u64)> {
        let mut v: Vec<(&[u8], u64)> = self.iter().collect();
        v.par_sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// Add all of `other` into `self`, shard by shard in parallel.
    pub fn merge(&mut self, other: &Counts) -> Result<(), String> {
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
        let mut by_shard: Vec<Vec<Entry>> = (0..SHARDS).map(|_| Vec::new()).collect();
        // A lower bound of each shard's new size (the largest single contribution), to pre-size it.
        let mut at_least = vec![0usize; SHARDS];
        for local in locals {
            let mut sizes = vec![0usize; SHARDS];
            for &(key, count) in local.short.iter().filter(|e| e.0 != 0) {
                let h = hash_short(key);
                by_shard[shard_of(h)].push((h, key.to_le_bytes(), count));
                sizes[shard_of(h)] += 1;
            }
            let src = self.adopted.len() as u64 + 1;
            for (loc, h, _, count) in local.arena.records() {
                by_shard[shard_of(h)].push((h, (LONG | src << LOC_BITS | loc).to_le_bytes(), count));
                sizes[shard_of(h)] += 1;
            }
            self.adopted.push(local.arena);
            for (m, s) in at_least.iter_mut().zip(sizes) {
                *m = (*m).max(s);
            }
        }
        let adopted = &self.adopted;
        self.shards.par_iter_mut().zip(by_shard.into_par_iter().zip(at_least)).try_for_each(
            |(shard, (entries, at_least))| {
                shard.table.reserve(at_least.saturating_sub(shard.table.len()), |e| table_hash(e.0));
                let none = Arena::default();
                for (h, key, count) in entries {
                    // A short key or one in an adopted arena: a new entry keeps the key as is.
                    let piece = key_bytes(&key, &none, adopted);
                    add_entry(shard, adopted, h, piece, count, move |_| key)?;
                }
                Ok(())
            },
        )
    }
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

/// The last cut at or before `upto` (and after 0) in `seg` that cannot change pieces, by the
/// rule of [`next_cut`]; `upto` must be less than `seg.len()`. Only valid when `splitter.cuttable()`.
fn prev_cut(splitter: &Splitter, seg: &[u8], upto: usize) -> Option<usize> {
    let line_units = splitter.line_units();
    let mut end = upto.min(seg.len());
    while let Some(nl) = memchr::memrchr(b'\n', &seg[..end]) {
        let cut = nl + 1;
        if cut < seg.len()
            && (line_units || (seg[cut] != b'/' && class_at(seg, cut).0 != WS && !ws_before(seg, cut - 1)))
        {
            return Some(cut);
        }
        end = nl;
    }
    None
}

/// Default size of the blocks [`CountSpec::count_stream`] reads.
pub const DEFAULT_BLOCK_BYTES: usize = 256 << 20;

/// Why a count failed.
#[derive(Debug)]
pub enum CountError {
    Msg(String),
    /// Invalid UTF-8 at this byte offset of the input.
    Utf8(u64),
    Io(std::io::Error),
}

impl From<String> for CountError {
    fn from(s: String) -> Self {
        CountError::Msg(s)
    }
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

    /// Count the pieces of independent documents (files, JSON lines) into `tally`. Nothing
    /// borrows `docs` afterwards.
    pub fn count_into(&self, docs: &[&[u8]], tally: &Tally) -> Result<(), String> {
        self.units(docs).par_iter().try_for_each(|unit| {
            let mut local = tally.local();
            for seg in unit {
                local.count(&self.splitter, seg)?;
            }
            Ok(())
        })
    }

    /// Count the pieces of independent documents (files, JSON lines) into `into`.
    pub fn count_docs(&self, docs: &[&[u8]], into: &mut Counts) -> Result<(), String> {
        let mut tally = Tally::new(rayon::current_num_threads());
        self.count_into(docs, &tally)?;
        tally.drain_into(into)
    }

    /// The last position `c` where `text`, a prefix of a longer text, can be cut so that
    /// counting `text[..c]` and the rest separately gives the counts of the whole: the end of a
    /// special token, or (when the splitter allows) a safe cut, that no continuation of the text
    /// can change. 0 when there is none.
    ///
    /// Special tokens are found leftmost first, longest among those starting at the same place,
    /// so a match starting at `s` is final once every special starting at `s` fits in `text`
    /// (`s + max_len <= text.len()`); a later match may still change, so cuts are only made up
    /// to `text.len() - max_len`, where no special token of the whole text can straddle them.
    pub fn last_cut(&self, text: &[u8]) -> usize {
        let limit = text.len().saturating_sub(self.specials.max_len());
        let mut after_special = 0;
        self.specials.matches(text, |start, end| {
            if start <= limit && end > after_special {
                after_special = end;
            }
        });
        if self.splitter.cuttable() && limit > after_special {
            // `seg` runs from the last final special token to the text end; no special token
            // of the whole text starts inside it before `limit`.
            let seg = &text[after_special..];
            if let Some(cut) = prev_cut(&self.splitter, seg, limit - after_special) {
                return after_special + cut;
            }
        }
        after_special
    }

    /// Count a whole stream (e.g. a file) read in blocks of about `block` bytes: each block is
    /// counted up to its [`Self::last_cut`] and the rest is carried into the next one, so only
    /// about a block of text is held at a time and the counts are those of the whole text. A
    /// block with no cut (a document longer than the block, or a pattern that allows no safe
    /// cuts) grows until it has one or the stream ends. Strict UTF-8 (`replace` false) reports
    /// the stream offset of the first invalid byte; else invalid bytes become U+FFFD as in
    /// `String::from_utf8_lossy` of the whole stream. Text is only decoded up to the last "\n"
    /// read, so no character (or invalid sequence) is ever split between blocks.
    pub fn count_stream<R: Read + Send>(
        &self,
        mut reader: R,
        tally: &Tally,
        replace: bool,
        block: usize,
    ) -> Result<(), CountError> {
        let block = block.max(1);
        let mut buf: Vec<u8> = Vec::new();
        // The next block is read into `spare` while `buf` is counted.
        let mut spare: Vec<u8> = Vec::new();
        // buf[..decoded] is valid UTF-8 (not counted yet); buf[decoded..] is raw input.
        let mut decoded = 0usize;
        // Offset in the stream of buf[decoded] (strict mode: buf holds the raw bytes).
        let mut offset = 0u64;
        let mut eof = read_more(&mut reader, &mut buf, block)?;
        loop {
            // Decode what was read. An incomplete character at the end waits for the next
            // block; invalid bytes are an error, or (replace) are decoded up to the last "\n"
            // read, which no invalid sequence can extend past.
            if let Err(e) = std::str::from_utf8(&buf[decoded..]) {
                let valid = e.valid_up_to();
                if !replace && (e.error_len().is_some() || eof) {
                    return Err(CountError::Utf8(offset + valid as u64));
                }
                offset += valid as u64;
                decoded += valid;
                if replace && (e.error_len().is_some() || eof) {
                    let upto = if eof {
                        buf.len()
                    } else {
                        memchr::memrchr(b'\n', &buf[decoded..]).map_or(decoded, |nl| decoded + nl + 1)
                    };
                    let fixed = String::from_utf8_lossy(&buf[decoded..upto]).into_owned().into_bytes();
                    let n = fixed.len();
                    buf.splice(decoded..upto, fixed);
                    decoded += n;
                }
            } else {
                offset += (buf.len() - decoded) as u64;
                decoded = buf.len();
            }
            let cut = if eof { decoded } else { self.last_cut(&buf[..decoded]) };
            if eof {
                return Ok(self.count_into(&[&buf[..cut]], tally)?);
            }
            // Count up to the cut while the next block is read behind the carried tail. Read at
            // least a block, and as much again as is pending, so a document longer than a block
            // costs a geometric number of passes.
            let carry = buf.len() - cut;
            let want = block.max(carry);
            spare.clear();
            spare.resize(carry, 0);
            let (counted, read) = rayon::join(
                || if cut > 0 { self.count_into(&[&buf[..cut]], tally) } else { Ok(()) },
                || read_more(&mut reader, &mut spare, want),
            );
            counted?;
            eof = read?;
            spare[..carry].copy_from_slice(&buf[cut..]);
            std::mem::swap(&mut buf, &mut spare);
            decoded -= cut;
        }
    }

    /// Count a whole text that is already in memory (e.g. a memory-mapped file), window by
    /// window of about `block` bytes, cut like [`Self::count_stream`]; after each window
    /// `release(upto)` is called: `data[..upto]` is counted and no longer needed (so a mapping's
    /// pages can be dropped). Strict UTF-8 only: the first invalid byte
    /// is reported by its offset. Counts are those of the whole text for every block size.
    pub fn count_windows<F: FnMut(usize)>(
        &self,
        data: &[u8],
        tally: &Tally,
        block: usize,
        mut release: F,
    ) -> Result<(), CountError> {
        let block = block.max(1);
        // data[..valid] is known to be valid UTF-8.
        let mut valid = 0usize;
        let mut start = 0usize;
        let mut end = self.window_end(data, start, block, &mut valid)?;
        while start < data.len() {
            // Count this window while the next one is validated and cut (serial work that
            // would otherwise leave the other workers waiting).
            let (counted, next) = rayon::join(
                || self.count_into(&[&data[start..end]], tally),
                || if end < data.len() { self.window_end(data, end, block, &mut valid) } else { Ok(end) },
            );
            counted?;
            (start, end) = (end, next?);
            release(start);
        }
        Ok(())
    }

    /// The end of the window of `data` that starts at `start` (a cut): about `block` bytes
    /// on, at the window's [`Self::last_cut`], the window growing until it has one. Validates
    /// UTF-8 up to there (`valid` tracks how far it is known to be valid).
    fn window_end(&self, data: &[u8], start: usize, block: usize, valid: &mut usize) -> Result<usize, CountError> {
        let mut size = block;
        loop {
            let end = start.saturating_add(size).min(data.len());
            if *valid < end {
                match std::str::from_utf8(&data[*valid..end]) {
                    Ok(_) => *valid = end,
                    Err(e) if e.error_len().is_none() && end < data.len() => *valid += e.valid_up_to(),
                    Err(e) => return Err(CountError::Utf8((*valid + e.valid_up_to()) as u64)),
                }
            }
            if end == data.len() && *valid == end {
                return Ok(end);
            }
            let cut = self.last_cut(&data[start..(*valid).min(end)]);
            if cut > 0 {
                return Ok(start + cut);
            }
            // No cut in this window (a long document): try one twice as large.
            size = size.saturating_mul(2);
        }
    }
}

/// Append up to `want` bytes from `reader` to `buf` (without zero-filling the space first);
/// returns whether the stream ended.
fn read_more<R: Read>(reader: &mut R, buf: &mut Vec<u8>, want: usize) -> Result<bool, CountError> {
    buf.reserve(want);
    let n = reader.by_ref().take(want as u64).read_to_end(buf).map_err(CountError::Io)?;
    Ok(n < want)
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

    fn custom_spec(pattern: &str, line_units: bool, specials: &[&str], chunk: usize) -> CountSpec {
        CountSpec {
            splitter: Splitter::new(pattern, line_units).unwrap(),
            specials: Specials::new(&specials.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>()),
            chunk_bytes: chunk,
        }
    }

    fn count_streamed(
        s: &CountSpec,
        text: &[u8],
        block: usize,
        replace: bool,
    ) -> Result<Vec<(Vec<u8>, u64)>, CountError> {
        let mut tally = Tally::new(2);
        s.count_stream(text, &tally, replace, block)?;
        let mut c = Counts::default();
        tally.drain_into(&mut c)?;
        Ok(c.sorted().into_iter().map(|(k, v)| (k.to_vec(), v)).collect())
    }

    fn count_windowed(s: &CountSpec, text: &[u8], block: usize) -> Result<Vec<(Vec<u8>, u64)>, CountError> {
        let mut tally = Tally::new(2);
        let mut released = 0;
        s.count_windows(text, &tally, block, |upto| {
            assert!(upto <= text.len() && upto >= released);
            released = upto;
        })?;
        assert_eq!(released, text.len());
        let mut c = Counts::default();
        tally.drain_into(&mut c)?;
        Ok(c.sorted().into_iter().map(|(k, v)| (k.to_vec(), v)).collect())
    }

    /// A corpus with specials at every offset modulo small block sizes, a document far longer
    /// than the blocks, multi-byte characters, whitespace runs before newlines and text after
    /// the last newline.
    fn block_corpus() -> String {
        let mut t = String::new();
        for i in 0..40 {
            t.push_str(&"ab ".repeat(i % 7));
            t.push_str("Hello world.\n  x\u{e9}\u{4e2d}\u{1F600} 12345 \n\nfoo//bar \n");
            t.push_str(if i % 3 == 0 { "<|e|>" } else { "<|e|><|e" });
            t.push_str("y\n");
        }
        t.push_str(&"long line without any newline at all ".repeat(20));
        t.push('\n');
        t.push_str(&"word \u{e9}t\u{e9} ".repeat(30));
        t.push_str("<|e|>tail with no newline");
        t
    }

    #[test]
    fn counts_do_not_depend_on_block_size() {
        let text = block_corpus();
        let mut specs: Vec<(String, CountSpec)> = Vec::new();
        for b in crate::scan::ALL_BUILTINS {
            for lu in [false, true] {
                specs.push((format!("{b:?} {lu}"), spec(b, lu, &["<|e|>", "<|e|><|e"], 64)));
            }
        }
        specs.push(("custom".into(), custom_spec(r"\s+\S|[a-z]+", false, &["<|e|>"], 64)));
        specs.push(("custom lines".into(), custom_spec(r"[a-z]+\s", true, &["<|e|>"], 64)));
        specs.push(("no specials".into(), custom_spec(r"\p{L}+", false, &[], 64)));
        for (name, s) in &specs {
            let whole = count(s, &text);
            for block in [1, 2, 3, 5, 7, 16, 61, 200, 1 << 20] {
                let got = count_streamed(s, text.as_bytes(), block, false).unwrap();
                assert_eq!(got, whole, "{name} block {block}");
                assert_eq!(count_windowed(s, text.as_bytes(), block).unwrap(), whole, "{name} windows {block}");
            }
        }
    }

    #[test]
    fn stream_reports_invalid_utf8_offset() {
        let s = spec(Builtin::Gpt2, false, &["<|e|>"], 64);
        // A valid 4-byte character straddles many block edges; the bad byte is at 31.
        let mut text = "ab\u{1F600}cd\n<|e|>\u{e9}\u{4e2d}x y\nz".as_bytes().to_vec();
        let bad = text.len();
        text.extend_from_slice(b"\xff tail\n");
        for block in [1, 2, 3, 4, 5, 8, 1 << 20] {
            match count_streamed(&s, &text, block, false) {
                Err(CountError::Utf8(at)) => assert_eq!(at, bad as u64, "block {block}"),
                other => panic!("block {block}: {other:?}"),
            }
            match count_windowed(&s, &text, block) {
                Err(CountError::Utf8(at)) => assert_eq!(at, bad as u64, "windows {block}"),
                other => panic!("windows {block}: {other:?}"),
            }
        }
        // A truncated character at the very end.
        let trunc = b"ok\n\xe4\xb8".to_vec();
        for block in [1, 2, 4, 1 << 20] {
            assert!(matches!(count_streamed(&s, &trunc, block, false), Err(CountError::Utf8(3))));
            assert!(matches!(count_windowed(&s, &trunc, block), Err(CountError::Utf8(3))));
        }
        // errors="replace": the same as decoding the whole text at once.
        let mut mixed = text.clone();
        mixed.extend_from_slice(b"\xe4\xb8 q\n\xc3<|e|>\xf0\x9f\x98");
        let lossy = String::from_utf8_lossy(&mixed).into_owned();
        let whole = count(&s, &lossy);
        for block in [1, 2, 3, 5, 1 << 20] {
            assert_eq!(count_streamed(&s, &mixed, block, true).unwrap(), whole, "block {block}");
        }
    }

    #[test]
    fn specials_are_not_counted() {
        let got = count(&spec(Builtin::Gpt2, false, &["<|e|>"], 100), "a<|e|>a");
        assert_eq!(got, vec![(b"a".to_vec(), 2)]);
    }
}
