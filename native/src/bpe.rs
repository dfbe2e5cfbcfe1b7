//! Rank-based BPE of one symbol sequence, shared by the encoder and by replay in the trainer.
//!
//! Repeatedly merge the adjacent pair with the lowest rank, the leftmost on ties. `rank(l, r)`
//! gives `(rank, merged id)` or `None` when the pair never merges.
//!
//! Replay uses this too: applying merges 0..n in order to every occurrence (left to right) gives
//! the same symbols as lowest-rank-first merging, because a pair created by merge i contains
//! token i and so has a rank above i, and every pair ranked below i is gone by then. That makes
//! replay a per-piece job that runs in parallel instead of n passes over the whole table.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::bytesmap::hash_short;

const NONE: u32 = u32::MAX;

/// A pair of token ids as one key: left in the high half, right in the low half.
#[inline]
pub fn pair_key(l: u32, r: u32) -> u64 {
    ((l as u64) << 32) | r as u64
}

/// The (left, right) ids of a pair key.
#[inline]
pub fn unpack(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
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

/// `(rank, merged id)` of each merged pair, keyed by `pair_key`.
pub type Ranks = HashMap<u64, (u32, u32), std::hash::BuildHasherDefault<PairHasher>>;

/// Scan all pairs each round: best for short sequences (no allocation beyond two vectors).
pub fn merge_linear<F: Fn(u32, u32) -> Option<(u32, u32)>>(mut ids: Vec<u32>, rank: F) -> Vec<u32> {
    merge_tail_linear(&mut ids, 0, &mut Vec::new(), |l, r| rank(l, r).unwrap_or((NONE, 0)));
    ids
}

/// Rank-based BPE of `ids[start..]` in place by a linear scan (`ranks` is scratch space, so a
/// caller merging many short sequences allocates nothing); `rank` gives (rank, merged id), rank
/// `u32::MAX` for a pair that never merges. Lowest rank first, leftmost on ties. The sequence is
/// at the end of `ids`, so removing a token moves only its own tail.
#[inline(always)]
pub fn merge_tail_linear<F: Fn(u32, u32) -> (u32, u32)>(
    ids: &mut Vec<u32>,
    start: usize,
    ranks: &mut Vec<(u32, u32)>,
    rank: F,
) {
    // ranks[i]: rank and result of merging ids[start + i] and the token after it.
    ranks.clear();
    ranks.extend(ids[start..].windows(2).map(|w| rank(w[0], w[1])));
    while !ranks.is_empty() {
        let mut best = 0;
        for (i, r) in ranks.iter().enumerate() {
            if r.0 < ranks[best].0 {
                best = i;
            }
        }
        let (found, merged) = ranks[best];
        if found == NONE {
            return;
        }
        let at = start + best;
        ids[at] = merged;
        ids.remove(at + 1);
        ranks.remove(best);
        if best > 0 {
            ranks[best - 1] = rank(ids[at - 1], merged);
        }
        if best < ranks.len() {
            ranks[best] = rank(merged, ids[at + 1]);
        }
    }
}

/// The same merges with a lazy min-heap of (rank, position) over a linked list: O(n log n).
pub fn merge_heap<F: Fn(u32, u32) -> Option<(u32, u32)>>(mut sym: Vec<u32>, rank: F) -> Vec<u32> {
    let n = sym.len();
    if n < 2 {
        return sym;
    }
    let mut next: Vec<u32> = (1..=n as u32).collect();
    next[n - 1] = NONE;
    let mut prev: Vec<u32> = (0..n as u32).map(|i| i.wrapping_sub(1)).collect();
    prev[0] = NONE;
    let mut heap: BinaryHeap<Reverse<(u32, u32)>> = BinaryHeap::with_capacity(n);
    for i in 0..n - 1 {
        if let Some((r, _)) = rank(sym[i], sym[i + 1]) {
            heap.push(Reverse((r, i as u32)));
        }
    }
    while let Some(Reverse((r, p))) = heap.pop() {
        let pu = p as usize;
        if sym[pu] == NONE {
            continue;
        }
        let q = next[pu];
        if q == NONE {
            continue;
        }
        let Some((current, merged)) = rank(sym[pu], sym[q as usize]) else { continue };
        if current != r {
            continue;
        }
        sym[pu] = merged;
        sym[q as usize] = NONE;
        let after = next[q as usize];
        next[pu] = after;
        if after != NONE {
            prev[after as usize] = p;
            if let Some((r2, _)) = rank(merged, sym[after as usize]) {
                heap.push(Reverse((r2, p)));
            }
        }
        let before = prev[pu];
        if before != NONE {
            if let Some((r2, _)) = rank(sym[before as usize], merged) {
                heap.push(Reverse((r2, before)));
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    let mut p = 0u32;
    while p != NONE {
        out.push(sym[p as usize]);
        p = next[p as usize];
    }
    out
}

/// Linear scan up to this many symbols, heap above (measured on replaying 20K merges into
/// whole-line stage-2 pieces: 16 beat 48 by ~20%).
pub const LINEAR_MAX: usize = 16;

/// Whichever of the two suits the length.
pub fn merge<F: Fn(u32, u32) -> Option<(u32, u32)>>(mut ids: Vec<u32>, rank: F) -> Vec<u32> {
    merge_tail(&mut ids, 0, &mut Vec::new(), rank);
    ids
}

/// `merge` of `ids[start..]` in place, whichever way suits its length; `ranks` is the linear
/// scan's scratch, so a caller merging many short sequences (replay's words and short pieces)
/// allocates nothing for them.
#[inline(always)]
pub fn merge_tail<F: Fn(u32, u32) -> Option<(u32, u32)>>(
    ids: &mut Vec<u32>,
    start: usize,
    ranks: &mut Vec<(u32, u32)>,
    rank: F,
) {
    if ids.len() - start <= LINEAR_MAX {
        merge_tail_linear(ids, start, ranks, |l, r| rank(l, r).unwrap_or((NONE, 0)));
    } else {
        let tail = ids.split_off(start);
        ids.extend(merge_heap(tail, rank));
    }
}
