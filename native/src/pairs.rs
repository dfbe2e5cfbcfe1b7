//! Pair counts in one flat table, filled as replay writes each piece's symbols.
//!
//! Cutting a stage's pieces (`train/cut.rs`) needs every initial pair's count: one update per
//! symbol, ~190M on 1.2 GB of English, into a table that outgrows the CPU caches (on English about
//! as long as the rest of replay). Counted while replay still holds each piece's symbols, so the
//! replayed chunks are not read again, in one table per thread, each update's slot fetched a few
//! updates ahead (a general hash map cannot be asked for a slot before it is probed).

use crate::memory::{advise_huge, prefetch};

/// A key's bits mixed, for table slots (pair keys are two small ids side by side).
#[inline(always)]
pub fn spread(key: u64) -> u64 {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

const EMPTY: u64 = u64::MAX;
/// Updates wait in a buffer this long, so that each one's slot is fetched before it is made.
const BATCH: usize = 1024;
const AHEAD: usize = 16;
/// Most slots in use, as a fraction (numerator, denominator).
const MAX_LOAD: (usize, usize) = (7, 10);

/// Pair key -> summed count; open addressing, at most `MAX_LOAD` full (linear probing stays short
/// there, and a corpus with many rare pairs, such as code, needs half the table of a half-full one).
/// No pair key is `u64::MAX`.
pub struct PairTable {
    slots: Vec<(u64, i64)>,
    len: usize,
    pending: Vec<(u64, i64)>,
}

impl Default for PairTable {
    fn default() -> PairTable {
        PairTable { slots: empty_slots(1 << 12), len: 0, pending: Vec::with_capacity(BATCH) }
    }
}

/// `size` empty slots, on huge pages when large: every update lands on a random slot, and with
/// small pages each was also a TLB miss.
fn empty_slots(size: usize) -> Vec<(u64, i64)> {
    let mut slots = Vec::with_capacity(size);
    advise_huge(slots.as_ptr() as usize, size * std::mem::size_of::<(u64, i64)>());
    slots.resize(size, (EMPTY, 0));
    slots
}

impl PairTable {
    /// Add `f` to each adjacent pair of `syms`.
    #[inline]
    pub fn add_pairs(&mut self, syms: &[u32], f: i64) {
        for w in syms.windows(2) {
            self.pending.push((crate::bpe::pair_key(w[0], w[1]), f));
            if self.pending.len() == BATCH {
                self.flush();
            }
        }
    }

    /// Make the waiting updates.
    fn flush(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for (i, &(key, f)) in pending.iter().enumerate() {
            if let Some(&(ahead, _)) = pending.get(i + AHEAD) {
                prefetch(&self.slots[self.home(ahead)]);
            }
            self.add(key, f);
        }
        self.pending = pending;
        self.pending.clear();
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (spread(key) >> 16) as usize & (self.slots.len() - 1)
    }

    #[inline(always)]
    fn add(&mut self, key: u64, f: i64) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let slot = &mut self.slots[i];
            if slot.0 == key {
                slot.1 += f;
                return;
            }
            if slot.0 == EMPTY {
                *slot = (key, f);
                self.len += 1;
                if self.len * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
                    self.grow();
                }
                return;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let size = 2 * self.slots.len();
        let old = std::mem::replace(&mut self.slots, empty_slots(size));
        self.len = 0;
        for (key, f) in old.into_iter().filter(|e| e.0 != EMPTY) {
            self.add(key, f);
        }
    }

    /// Bytes a table holding `pairs` pairs takes (a power of two of slots, at most `MAX_LOAD` full).
    pub fn bytes_for(pairs: u64) -> u64 {
        (pairs * MAX_LOAD.1 as u64).div_ceil(MAX_LOAD.0 as u64).next_power_of_two().max(1 << 12) * 16
    }

    /// Every pair and its count, the tables of all threads summed.
    pub fn merged(tables: Vec<PairTable>) -> Vec<(u64, i64)> {
        let mut tables = tables;
        tables.iter_mut().for_each(PairTable::flush);
        tables.sort_by_key(|t| std::cmp::Reverse(t.len));
        let mut tables = tables.into_iter();
        let Some(mut all) = tables.next() else { return Vec::new() };
        for t in tables {
            for (key, f) in t.slots.into_iter().filter(|e| e.0 != EMPTY) {
                all.add(key, f);
            }
        }
        all.slots.into_iter().filter(|e| e.0 != EMPTY).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Against a plain map, across growth, batches and several tables merged.
    #[test]
    fn counts_every_pair_across_tables() {
        let seed = &mut 0x1234_5678_9ABC_DEF1u64;
        let mut want: HashMap<u64, i64> = HashMap::new();
        let mut tables: Vec<PairTable> = (0..3).map(|_| PairTable::default()).collect();
        for n in 0..20_000 {
            let len = 1 + crate::test_below(seed, 9);
            let syms: Vec<u32> = (0..len).map(|_| crate::test_below(seed, 300) as u32).collect();
            let f = 1 + crate::test_below(seed, 3) as i64;
            tables[n % 3].add_pairs(&syms, f);
            for w in syms.windows(2) {
                *want.entry(crate::bpe::pair_key(w[0], w[1])).or_default() += f;
            }
        }
        let got: HashMap<u64, i64> = PairTable::merged(tables).into_iter().collect();
        assert_eq!(got, want);
    }
}
