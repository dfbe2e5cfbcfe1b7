//! The encoder's lookup tables from piece bytes to ids: the vocabulary and the piece caches.
//!
//! Nearly every piece an encoder meets is at most 15 bytes (identifiers, words with their space,
//! punctuation runs, indentation). Such a key is packed into two words — the first eight bytes, and
//! the rest with the length in the top byte — and lives in a flat open-addressed table whose entry
//! holds the key beside its value: a lookup is one multiply-hash and usually one cache line, with no
//! pointer chase and no byte comparison loop. Longer keys go to a hashbrown table of boxed keys.
//! A packed key's top word is never zero (its length byte is at least 1), so zero marks an empty slot.
//!
//! The slots come in pairs that share one 64-byte line, and a key's probe starts at the first slot
//! of a pair: a lookup reads both slots of that line without a branch between them, so a key one
//! slot past its home costs no second line and no mispredicted branch. A caller may hash keys
//! ahead ([`hash_packed`]) and look them up later ([`PieceMap::get_hashed`]).

use hashbrown::HashTable;

use crate::bytesmap::bytes_eq;
use crate::memory::huge_vec;

/// Longest key stored packed.
pub const PACKED_MAX: usize = 15;

/// A top word no packed key has (its length byte would be 255) and that is not the empty slot's:
/// a key that is never found, for a piece too long to pack.
pub const NO_KEY: u64 = u64::MAX;

/// Up to 7 bytes as one little-endian word (two overlapping loads; the overlap holds the same bytes).
#[inline(always)]
fn load_upto7(p: &[u8]) -> u64 {
    let n = p.len();
    debug_assert!(n <= 7);
    if n >= 4 {
        let lo = u32::from_le_bytes(p[..4].try_into().unwrap()) as u64;
        let hi = u32::from_le_bytes(p[n - 4..].try_into().unwrap()) as u64;
        lo | hi << (8 * (n - 4))
    } else if n >= 2 {
        let lo = u16::from_le_bytes(p[..2].try_into().unwrap()) as u64;
        let hi = u16::from_le_bytes(p[n - 2..].try_into().unwrap()) as u64;
        lo | hi << (8 * (n - 2))
    } else if n == 1 {
        p[0] as u64
    } else {
        0
    }
}

/// `piece` (1 to [`PACKED_MAX`] bytes) as two words: bytes 0..8, then bytes 8.. with the length on top.
#[inline(always)]
pub fn pack(piece: &[u8]) -> (u64, u64) {
    let n = piece.len();
    debug_assert!((1..=PACKED_MAX).contains(&n));
    if n <= 7 {
        (load_upto7(piece), (n as u64) << 56)
    } else {
        let lo = u64::from_le_bytes(piece[..8].try_into().unwrap());
        (lo, load_upto7(&piece[8..]) | (n as u64) << 56)
    }
}

/// [`pack`] of `text[at..at + n]` (n from 1 to [`PACKED_MAX`]) where `text` has 16 bytes from
/// `at`: two whole-word loads masked to the piece, with no branch on its length (piece lengths
/// vary unpredictably, so the branches of `pack` mispredicted often).
#[inline(always)]
pub fn pack_within(text: &[u8], at: usize, n: usize) -> (u64, u64) {
    debug_assert!((1..=PACKED_MAX).contains(&n) && at + 16 <= text.len());
    let w0 = u64::from_le_bytes(text[at..at + 8].try_into().unwrap());
    let w1 = u64::from_le_bytes(text[at + 8..at + 16].try_into().unwrap());
    let (m0, m1) = PACK_MASKS[n & PACKED_MAX];
    (w0 & m0, (w1 & m1) | (n as u64) << 56)
}

/// The masks of [`pack_within`] for each length: the piece's bytes in the first word, and in the
/// second.
const PACK_MASKS: [(u64, u64); PACKED_MAX + 1] = {
    let mut masks = [(0, 0); PACKED_MAX + 1];
    let mut n = 0;
    while n <= PACKED_MAX {
        masks[n] = (low_bytes(if n < 8 { n } else { 8 }), low_bytes(n.saturating_sub(8)));
        n += 1;
    }
    masks
};

/// A word with its low `m` bytes set (m from 0 to 8).
const fn low_bytes(m: usize) -> u64 {
    if m >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * m)) - 1
    }
}

/// The hash of a packed key, for [`PieceMap::get_hashed`].
#[inline(always)]
pub fn hash_packed(k0: u64, k1: u64) -> u64 {
    // One multiply, its high half folded down: a slot index (the low bits) then depends on every
    // byte of the key, not only on its low bytes.
    let h = (k0 ^ k1.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 32)
}

/// A table grows before it holds more than one packed key per this many slots. At up to one in
/// two, a key was past its home pair often enough that walking on to it was a good part of a
/// lookup's time (a second line, and a branch that mispredicts); the table is twice the memory
/// for it, but its hot lines are as many.
const SLOTS_PER_KEY: usize = 4;
/// A table of at least this many bytes holds up to one key per [`BIG_SLOTS_PER_KEY`] slots instead.
/// That large, its lines are beyond the CPU caches at either fill, while each doubling is fresh
/// memory the kernel zeroes and a rehash: a fresh encoder's piece cache on a large corpus spent a
/// fifth of its first pass on that, once per thread. A piece cache seeded with a vocabulary of 50K
/// tokens is this large, and then takes the pieces of a 20 MB batch without growing.
const BIG_TABLE_BYTES: usize = 8 << 20;
const BIG_SLOTS_PER_KEY: usize = 2;

/// Whether `keys` packed keys are more than a table of `slots` slots of `slot_bytes` holds.
fn full(keys: usize, slots: usize, slot_bytes: usize) -> bool {
    let per_key = if slots * slot_bytes >= BIG_TABLE_BYTES { BIG_SLOTS_PER_KEY } else { SLOTS_PER_KEY };
    keys * per_key > slots
}

#[derive(Clone, Copy, Default)]
struct Slot<V> {
    k0: u64,
    /// 0 when the slot is empty.
    k1: u64,
    value: V,
}

/// Two slots on one cache line (see the module doc).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Pair<V>([Slot<V>; 2]);

/// Byte strings to copyable values, packed keys inline (see the module doc).
pub struct PieceMap<V: Copy + Default> {
    /// Made by `huge_vec`: a table is megabytes of fresh memory (a cache's first copy of the
    /// vocabulary's, then each growth), and faulting it in 4 KiB pages was a good part of a first
    /// pass over short texts.
    pairs: Vec<Pair<V>>,
    /// The number of slots minus one (a power of two minus one).
    mask: usize,
    packed: usize,
    state: ahash::RandomState,
    long: HashTable<(u64, Box<[u8]>, V)>,
}

impl<V: Copy + Default> Default for PieceMap<V> {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl<V: Copy + Default> PieceMap<V> {
    /// A map that holds `n` packed keys before it grows.
    pub fn with_capacity(n: usize) -> Self {
        let slot_bytes = std::mem::size_of::<Pair<V>>() / 2;
        let mut slots = (n * SLOTS_PER_KEY).next_power_of_two().max(16);
        while slots > 16 && !full(n, slots / 2, slot_bytes) {
            slots /= 2;
        }
        PieceMap {
            pairs: huge_vec(slots / 2, std::iter::repeat(Pair::default())),
            mask: slots - 1,
            packed: 0,
            state: ahash::RandomState::with_seeds(7, 11, 13, 17),
            long: HashTable::new(),
        }
    }

    /// How many slots its table has.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.mask + 1
    }

    pub fn len(&self) -> usize {
        self.packed + self.long.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of `key` (never found for the empty key).
    #[inline(always)]
    pub fn get(&self, key: &[u8]) -> Option<V> {
        if key.len() > PACKED_MAX {
            let h = self.state.hash_one(key);
            return self.long.find(h, |e| e.0 == h && bytes_eq(&e.1, key)).map(|e| e.2);
        }
        if key.is_empty() {
            return None;
        }
        let (k0, k1) = pack(key);
        self.get_packed(k0, k1)
    }

    /// The value of the packed key `(k0, k1)` (see [`pack`]).
    #[inline(always)]
    pub fn get_packed(&self, k0: u64, k1: u64) -> Option<V> {
        self.get_hashed(k0, k1, hash_packed(k0, k1)).copied()
    }

    /// The value of a packed key with its hash known, in place: both slots of its home pair are
    /// compared without a branch between them, and only a key past its home pair walks on. (A
    /// reference, not a copy: a copied value went through the stack, and reading part of it back
    /// waited for the whole store.)
    #[inline(always)]
    pub fn get_hashed(&self, k0: u64, k1: u64, hash: u64) -> Option<&V> {
        self.probe().get(k0, k1, hash)
    }

    /// A view for many lookups in a row (see [`Probe`]).
    #[inline(always)]
    pub fn probe(&self) -> Probe<'_, V> {
        Probe { map: self, pairs: &self.pairs, pair_mask: self.pairs.len() - 1 }
    }

    /// Look for a key from slot `i` on (the pairs before it held neither it nor an empty slot).
    #[cold]
    fn walk(&self, k0: u64, k1: u64, mut i: usize) -> Option<&V> {
        loop {
            let s = self.slot(i & self.mask);
            if s.k1 == k1 && s.k0 == k0 {
                return Some(&s.value);
            }
            if s.k1 == 0 {
                return None;
            }
            i += 1;
        }
    }

    /// The first slot of the home pair of `hash`.
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        hash as usize & self.mask & !1
    }

    #[inline(always)]
    fn slot(&self, i: usize) -> &Slot<V> {
        &self.pairs[i / 2].0[i % 2]
    }

    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut Slot<V> {
        &mut self.pairs[i / 2].0[i % 2]
    }

    /// The same packed keys with their values mapped by `f`, in a table with room for `more` keys
    /// besides them before it grows. Where this table's size has that room, in the same slots (no
    /// key is hashed again: copying a table is a pass over its slots); else each key is placed
    /// afresh in the larger table, which spares the caller growing it (a fresh table and every key
    /// placed again) once filled. Long keys are left out.
    pub fn map_packed<W: Copy + Default>(&self, f: impl Fn(V) -> W, more: usize) -> PieceMap<W> {
        let keys = self.packed + more;
        if !full(keys, self.mask + 1, std::mem::size_of::<Pair<W>>() / 2) {
            let map = |s: &Slot<V>| Slot { k0: s.k0, k1: s.k1, value: f(s.value) };
            let pairs = huge_vec(self.pairs.len(), self.pairs.iter().map(|p| Pair([map(&p.0[0]), map(&p.0[1])])));
            return PieceMap {
                pairs,
                mask: self.mask,
                packed: self.packed,
                state: self.state.clone(),
                long: HashTable::new(),
            };
        }
        let mut mapped = PieceMap::with_capacity(keys);
        for s in occupied(&self.pairs) {
            mapped.put(s.k0, s.k1, f(s.value));
        }
        mapped
    }

    /// Insert or replace; the empty key is ignored (no piece is empty).
    pub fn insert(&mut self, key: &[u8], value: V) {
        if key.len() > PACKED_MAX {
            let h = self.state.hash_one(key);
            match self.long.find_mut(h, |e| e.0 == h && bytes_eq(&e.1, key)) {
                Some(e) => e.2 = value,
                None => {
                    self.long.insert_unique(h, (h, key.into(), value), |e| e.0);
                }
            }
            return;
        }
        if key.is_empty() {
            return;
        }
        if self.full_at(self.packed + 1) {
            self.grow();
        }
        let (k0, k1) = pack(key);
        self.put(k0, k1, value);
    }

    /// A map of `entries` (a later entry of a key replaces an earlier one), sized for them at once,
    /// each packed key's home pair fetched a few entries before it is written: a large
    /// vocabulary's table outgrows the CPU caches, and inserting it one miss at a time was a good
    /// part of building an encoder.
    pub fn of_entries<K: AsRef<[u8]>>(entries: &[(K, V)]) -> Self {
        const AHEAD: usize = 16;
        let mut map = Self::with_capacity(entries.len());
        let keys = packed_keys(&entries.iter().map(|(key, _)| key.as_ref()).collect::<Vec<_>>());
        keys.iter().take(AHEAD).flatten().for_each(|k| map.probe().prefetch(k.2));
        for (i, (key, value)) in entries.iter().enumerate() {
            if let Some(Some(ahead)) = keys.get(i + AHEAD) {
                map.probe().prefetch(ahead.2);
            }
            match keys[i] {
                // `with_capacity` made room for every entry: no growth.
                Some((k0, k1, hash)) => map.put_hashed(k0, k1, hash, *value),
                None => map.insert(key.as_ref(), *value),
            }
        }
        map
    }

    /// The value of each of `keys`, each slot fetched `AHEAD` lookups before it is read: a large
    /// vocabulary's table outgrows the CPU caches, and looking up every merge's parts and result one
    /// miss at a time was most of building an encoder.
    pub fn get_many(&self, keys: &[&[u8]]) -> Vec<Option<V>> {
        const AHEAD: usize = 16;
        let packed = packed_keys(keys);
        let probe = self.probe();
        packed.iter().take(AHEAD).flatten().for_each(|k| probe.prefetch(k.2));
        (0..keys.len())
            .map(|i| {
                if let Some(Some(ahead)) = packed.get(i + AHEAD) {
                    probe.prefetch(ahead.2);
                }
                match packed[i] {
                    Some((k0, k1, hash)) => probe.get(k0, k1, hash).copied(),
                    None => self.get(keys[i]),
                }
            })
            .collect()
    }

    /// The values of each merge's left part, right part and the token it makes ([`Self::get_many`]).
    pub fn merge_values(&self, merges: &[(Vec<u8>, Vec<u8>)]) -> Vec<[Option<V>; 3]> {
        // The tokens the merges make, side by side in one buffer (not an allocation each).
        let (mut joined, mut ends) = (Vec::new(), Vec::with_capacity(merges.len()));
        for (l, r) in merges {
            joined.extend_from_slice(l);
            joined.extend_from_slice(r);
            ends.push(joined.len());
        }
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let made: Vec<&[u8]> = starts.zip(&ends).map(|(start, &end)| &joined[start..end]).collect();
        let lefts = self.get_many(&merges.iter().map(|m| &m.0[..]).collect::<Vec<_>>());
        let rights = self.get_many(&merges.iter().map(|m| &m.1[..]).collect::<Vec<_>>());
        lefts.into_iter().zip(rights).zip(self.get_many(&made)).map(|((l, r), m)| [l, r, m]).collect()
    }

    fn put(&mut self, k0: u64, k1: u64, value: V) {
        self.put_hashed(k0, k1, hash_packed(k0, k1), value)
    }

    fn put_hashed(&mut self, k0: u64, k1: u64, hash: u64, value: V) {
        let mut i = self.home(hash);
        loop {
            let s = self.slot_mut(i);
            if s.k1 == 0 {
                *s = Slot { k0, k1, value };
                self.packed += 1;
                return;
            }
            if s.k1 == k1 && s.k0 == k0 {
                s.value = value;
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    fn full_at(&self, keys: usize) -> bool {
        full(keys, self.mask + 1, std::mem::size_of::<Pair<V>>() / 2)
    }

    fn grow(&mut self) {
        let bigger = (self.mask + 1) * 2;
        let old = std::mem::replace(&mut self.pairs, huge_vec(bigger / 2, std::iter::repeat(Pair::default())));
        self.mask = bigger - 1;
        self.packed = 0;
        for s in occupied(&old) {
            self.put(s.k0, s.k1, s.value);
        }
    }
}

/// The slots of `pairs` that hold a key.
fn occupied<V: Copy>(pairs: &[Pair<V>]) -> impl Iterator<Item = &Slot<V>> {
    pairs.iter().flat_map(|p| p.0.iter()).filter(|s| s.k1 != 0)
}

/// Each key packed with its hash (see [`pack`]), or `None` for a key that is empty or too long to pack.
fn packed_keys(keys: &[&[u8]]) -> Vec<Option<(u64, u64, u64)>> {
    keys.iter()
        .map(|key| {
            (1..=PACKED_MAX).contains(&key.len()).then(|| {
                let (k0, k1) = pack(key);
                (k0, k1, hash_packed(k0, k1))
            })
        })
        .collect()
}

/// The map's lookups with its slots and their mask in locals: a loop that writes ids between
/// lookups would otherwise read the table's address and size back from the map for every key
/// (the compiler cannot tell that the writes leave them alone), and check each index.
#[derive(Clone, Copy)]
pub struct Probe<'a, V: Copy + Default> {
    map: &'a PieceMap<V>,
    pairs: &'a [Pair<V>],
    /// `pairs.len() - 1`; the number of pairs is a power of two.
    pair_mask: usize,
}

/// What one pair of a probe says of a key ([`Probe::in_pair`]).
enum Step<'a, V> {
    Found(&'a V),
    Absent,
    On,
}

impl<'a, V: Copy + Default> Probe<'a, V> {
    /// [`PieceMap::get_hashed`]. The home pair, then the pair after it, are each looked at
    /// inline; only a key further on walks on out of line. In a half-full table (a seeded piece
    /// cache encoding code) about one lookup in twenty finds its key past the home pair, nearly
    /// always in the next one, and calling out for those cost more than the compare.
    #[inline(always)]
    pub fn get(self, k0: u64, k1: u64, hash: u64) -> Option<&'a V> {
        let at = self.home_pair(hash);
        match self.in_pair(at, k0, k1) {
            Step::Found(v) => Some(v),
            Step::Absent => None,
            Step::On => match self.in_pair((at + 1) & self.pair_mask, k0, k1) {
                Step::Found(v) => Some(v),
                Step::Absent => None,
                Step::On => self.map.walk(k0, k1, at * 2 + 4),
            },
        }
    }

    /// What pair `at` says of a key: it holds it, or has an empty slot (the key is in no later
    /// one), or neither. Which of the two slots holds the key is chosen without a branch: it
    /// varies from key to key, so a branch on it mispredicted often.
    #[inline(always)]
    fn in_pair(self, at: usize, k0: u64, k1: u64) -> Step<'a, V> {
        let pair = &self.pairs[at].0;
        let off_a = (pair[0].k0 ^ k0) | (pair[0].k1 ^ k1);
        let off_b = (pair[1].k0 ^ k0) | (pair[1].k1 ^ k1);
        // One test of both (`in_a || in_b` compiled to a branch on each).
        if off_a.min(off_b) == 0 {
            return Step::Found(&pair[usize::from(off_b == 0)].value);
        }
        if pair[0].k1 == 0 || pair[1].k1 == 0 {
            return Step::Absent;
        }
        Step::On
    }

    /// Ask the CPU for the line of the home pair of a key with this hash (a hint).
    #[inline(always)]
    pub fn prefetch(self, hash: u64) {
        crate::memory::prefetch(&self.pairs[self.home_pair(hash)]);
    }

    /// The index of the home pair of `hash` (its first slot is [`PieceMap::home`]).
    #[inline(always)]
    fn home_pair(self, hash: u64) -> usize {
        let at = (hash as usize >> 1) & self.pair_mask;
        debug_assert_eq!(at * 2, self.map.home(hash));
        // Tells the compiler what the indexing that follows needs, so it checks nothing: the
        // number of pairs is a power of two (`with_capacity` and `grow` make it so, and nothing
        // else changes it), and `at` is masked by that number minus one.
        if at >= self.pairs.len() {
            unreachable!("a pair index past the table");
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn packing_is_injective_per_length() {
        let a: Vec<u8> = (1..=15).collect();
        for n in 1..=15 {
            for m in 1..=15 {
                let (x, y) = (pack(&a[..n]), pack(&a[..m]));
                assert_eq!(x == y, n == m, "{n} {m}");
            }
            let mut b = a[..n].to_vec();
            b[n - 1] ^= 0x80;
            assert_ne!(pack(&a[..n]), pack(&b));
            assert_ne!(pack(&a[..n]).1, 0);
        }
    }

    #[test]
    fn packing_within_a_text_is_packing() {
        let text: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) ^ 0xA5).collect();
        for at in 0..=text.len() - 16 {
            for n in 1..=PACKED_MAX {
                assert_eq!(pack_within(&text, at, n), pack(&text[at..at + n]), "{at} {n}");
            }
        }
    }

    #[test]
    fn mapped_packed_keys_keep_their_values() {
        let mut map: PieceMap<u32> = PieceMap::default();
        let keys: Vec<Vec<u8>> = (1..=20u8).map(|n| (0..n).map(|i| i.wrapping_mul(31) ^ n).collect()).collect();
        for (i, k) in keys.iter().enumerate() {
            map.insert(k, i as u32);
        }
        // In the same slots, and in a table made larger for keys to come.
        let roomy = map.map_packed(|v| u64::from(v) + 7, 1000);
        assert!(roomy.mask > map.mask && !roomy.full_at(PACKED_MAX + 1000));
        let mut mapped = map.map_packed(|v| u64::from(v) + 7, 0);
        assert_eq!(mapped.mask, map.mask);
        for (i, k) in keys.iter().enumerate() {
            let want = (k.len() <= PACKED_MAX).then_some(i as u64 + 7);
            assert_eq!(mapped.get(k), want, "{k:?}");
            assert_eq!(roomy.get(k), want, "{k:?}");
        }
        assert_eq!((mapped.len(), roomy.len()), (PACKED_MAX, PACKED_MAX));
        // The copy grows and takes new keys like any map.
        for (i, k) in keys.iter().enumerate() {
            mapped.insert(&[k.as_slice(), b"x"].concat(), i as u64);
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(mapped.get(&[k.as_slice(), b"x"].concat()), Some(i as u64));
        }
    }

    #[test]
    fn agrees_with_a_hashmap() {
        let state = &mut 0x2545_F491_4F6C_DD1Du64;
        let mut map: PieceMap<u32> = PieceMap::default();
        let mut model: HashMap<Vec<u8>, u32> = HashMap::new();
        for step in 0..20_000u32 {
            let len = crate::test_below(state, 24);
            let key: Vec<u8> = (0..len).map(|_| b"ab\x00\xff"[crate::test_below(state, 4)]).collect();
            if crate::test_below(state, 3) == 0 {
                map.insert(&key, step);
                if !key.is_empty() {
                    model.insert(key.clone(), step);
                }
            }
            assert_eq!(map.get(&key), model.get(&key).copied(), "{key:?}");
        }
        assert_eq!(map.len(), model.len());
    }

    /// A map built from entries at once holds what inserting them one by one holds: short, long
    /// and empty keys, a key given twice keeping its later value.
    #[test]
    fn built_at_once_equals_inserted_one_by_one() {
        let state = &mut 0x9E37_79B9_7F4A_7C15u64;
        let entries: Vec<(Vec<u8>, u32)> = (0..5_000u32)
            .map(|step| {
                let len = crate::test_below(state, 24);
                ((0..len).map(|_| b"ab\x00\xff"[crate::test_below(state, 4)]).collect(), step)
            })
            .collect();
        let built = PieceMap::of_entries(&entries);
        let mut inserted = PieceMap::default();
        for (key, value) in &entries {
            inserted.insert(key, *value);
        }
        assert_eq!(built.len(), inserted.len());
        assert!(entries.iter().any(|(k, _)| k.is_empty()) && entries.iter().any(|(k, _)| k.len() > PACKED_MAX));
        for (key, _) in &entries {
            assert_eq!(built.get(key), inserted.get(key), "{key:?}");
        }
    }

    /// Keys that share a home pair are found in it, in the pair after it (looked at inline) and
    /// further on (walked to); a key that is absent is not found whether the probe stops at the
    /// home pair, at the next one or further on.
    #[test]
    fn keys_past_their_home_pair_are_found_and_absent_ones_are_not() {
        let mut map: PieceMap<u32> = PieceMap::with_capacity(8);
        let slots = map.mask + 1;
        let home = 2 * 3;
        let hash = (home as u64) | 1 << 40;
        let key = |i: u64| (i + 1, 1 << 56 | i);
        for placed in 0..=7u64 {
            // `placed` keys with the same home lie from it on.
            for i in 0..placed {
                assert_eq!(map.probe().get(key(i).0, key(i).1, hash), Some(&(i as u32)), "key {i} of {placed}");
            }
            assert_eq!(map.probe().get(key(99).0, key(99).1, hash), None, "absent, {placed} placed");
            if placed < 7 {
                map.put_hashed(key(placed).0, key(placed).1, hash, placed as u32);
            }
        }
        assert!(slots >= 16 && map.slot(home + 6).k1 != 0, "the last key lies in the fourth pair");
    }

    /// Past `BIG_TABLE_BYTES` a table fills to one key per two slots, whether it grew there one
    /// insert at a time or was sized at once, and finds every key it took on the way.
    #[test]
    fn big_tables_fill_to_half() {
        let keys: Vec<[u8; 8]> = (0..400_000u64).map(|i| (i * 0x9E37_79B9 + 1).to_le_bytes()).collect();
        let mut grown: PieceMap<u32> = PieceMap::default();
        for (i, key) in keys.iter().enumerate() {
            grown.insert(key, i as u32);
        }
        let sized: PieceMap<u32> = PieceMap::with_capacity(keys.len());
        assert_eq!(grown.mask + 1, 1 << 20);
        assert_eq!(sized.mask + 1, 1 << 20);
        assert!(PieceMap::<u32>::with_capacity(100_000).mask < 1 << 19, "a small table stays a quarter full");
        assert!(keys.iter().enumerate().all(|(i, key)| grown.get(key) == Some(i as u32)));
    }
}
