//! Applying one merge: every live occurrence of the pair, left to right within each piece, becomes
//! the new token, and the counts (and positions) of the pairs around it follow.
//!
//! A merge of many occurrences is applied on two threads: the first merges of a SuperBPE stage 2
//! visit millions of positions at random, one cache miss after another, while the other core would
//! have nothing to do. The symbols are split at a separator (`Symbols::halves`), each thread merges
//! the occurrences in its half and notes what they do to the pair counts (`Deltas`), and the notes
//! are added to the tables in position order, as one thread would have made the changes.

use std::collections::HashMap;

use smallvec::SmallVec;

use super::{PairMap, Trainer, PREFETCH_AHEAD};
use crate::bpe::{pair_key, unpack, PairHasher};
use crate::busy;
use crate::memory::prefetch;
use crate::symbols::{Half, Walk, NONE, SEP};

/// Occurrences from which a merge is applied on two threads (when no count runs beside it, see
/// `busy.rs`); below, splitting and joining the work costs more than the second core gains. Few in
/// tests, so that they cover it.
const PARALLEL_FROM: usize = if cfg!(test) { 4 } else { 1 << 14 };

/// Where a merge's changes to the pair counts go: straight into the trainer's tables, or noted for
/// them by a thread of two.
trait Changes {
    /// An occurrence of pair `key` in a piece counted `f` is gone.
    fn dec(&mut self, key: u64, f: i64);
    /// Pair `key`, which holds the new token, now occurs at `pos` in a piece counted `f`.
    fn inc(&mut self, key: u64, f: i64, pos: u32);
}

/// The trainer's pair tables during a merge making `new`, and the pairs it made that are warm.
struct Tables<'a> {
    pairs: &'a mut PairMap,
    created: &'a mut PairMap,
    new: u32,
    /// Most pairs a merge creates stay cold when there is a cold cut-off: they gather apart in
    /// `created` rather than go into (and then out of) the large table.
    gather: bool,
    fresh: &'a mut Vec<u64>,
}

impl Tables<'_> {
    /// The table a pair's count is kept in: pairs holding `new` are created by this merge, and with
    /// cold pairs about they gather in `created`.
    #[inline]
    fn table(&mut self, key: u64) -> &mut PairMap {
        let (l, r) = unpack(key);
        if self.gather && (l == self.new || r == self.new) {
            self.created
        } else {
            self.pairs
        }
    }

    /// Add a thread's notes (`merge_in_halves`) as `dec` and `inc` would have made them.
    fn add(&mut self, mut deltas: Deltas) {
        for key in std::mem::take(&mut deltas.made) {
            let d = deltas.pairs.remove(&key).expect("a made pair has its change");
            self.made(key, d.count, &d.positions);
        }
        for (key, d) in deltas.pairs {
            self.dec(key, -d.count);
        }
    }

    /// Pair `key`, which holds the new token, changes by `count` and now occurs at `positions` too.
    #[inline]
    fn made(&mut self, key: u64, count: i64, positions: &[u32]) {
        let gather = self.gather;
        let info = self.table(key).entry(key).or_default();
        let first = info.positions.is_empty() && info.len == 0;
        info.count += count;
        info.positions.extend_from_slice(positions);
        // Gathered pairs are all new; `merge` takes them from `created` afterwards.
        if !gather && first {
            self.fresh.push(key);
        }
    }
}

impl Changes for Tables<'_> {
    #[inline]
    fn dec(&mut self, key: u64, f: i64) {
        if let Some(info) = self.table(key).get_mut(&key) {
            info.count -= f;
        }
    }

    #[inline]
    fn inc(&mut self, key: u64, f: i64, pos: u32) {
        self.made(key, f, &[pos]);
    }
}

/// What one thread's occurrences of a merge did to one pair: its count's change, and for a pair the
/// merge made, where it now occurs.
#[derive(Default)]
struct Delta {
    count: i64,
    positions: SmallVec<[u32; 4]>,
}

/// A thread's changes to the pair counts, noted for `Tables::add`.
#[derive(Default)]
struct Deltas {
    pairs: HashMap<u64, Delta, std::hash::BuildHasherDefault<PairHasher>>,
    /// The pairs made, in the order they were first made.
    made: Vec<u64>,
}

impl Changes for Deltas {
    #[inline]
    fn dec(&mut self, key: u64, f: i64) {
        self.pairs.entry(key).or_default().count -= f;
    }

    #[inline]
    fn inc(&mut self, key: u64, f: i64, pos: u32) {
        let d = self.pairs.entry(key).or_default();
        // A pair is made when it first occurs at a position (only made pairs do).
        if d.positions.is_empty() {
            self.made.push(key);
        }
        d.count += f;
        d.positions.push(pos);
    }
}

impl Trainer {
    /// Replace every non-overlapping (l, r) occurrence, left to right within each piece, by
    /// `new`; returns the pairs containing `new` that are warm (see `cold_below`).
    pub(super) fn merge(&mut self, l: u32, r: u32, new: u32) -> Vec<u64> {
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
        let gather = self.cold_below > 0;
        // Tests take both threads whatever else runs, so that they cover it.
        let free = cfg!(test) || !busy::counting();
        let halves = (positions.len() >= PARALLEL_FROM && rayon::current_num_threads() > 1 && free)
            .then(|| self.merge_in_halves(positions, (l, r), new))
            .flatten();
        let mut tables = Tables { pairs: &mut self.pairs, created: &mut self.created, new, gather, fresh: &mut fresh };
        match halves {
            Some(halves) => halves.into_iter().for_each(|deltas| tables.add(deltas)),
            None => merge_occurrences(&mut self.syms, positions, &self.freq, (l, r), new, &mut tables),
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

    /// `merge`'s occurrences (sorted positions) on two threads, split at the separator before the
    /// piece of the middle one, each thread's changes noted. None when they all lie in one piece.
    fn merge_in_halves(&mut self, positions: &[u32], pair: (u32, u32), new: u32) -> Option<[Deltas; 2]> {
        let mut at = positions[positions.len() / 2];
        while self.syms.get(at) != SEP {
            at -= 1;
        }
        let split = positions.partition_point(|&p| p < at);
        if split == 0 {
            return None;
        }
        let freq = &self.freq[..];
        let (mut first, mut second) = self.syms.halves(at);
        let run = |half: &mut Half<'_>, positions: &[u32]| {
            let mut deltas = Deltas::default();
            merge_occurrences(half, positions, freq, pair, new, &mut deltas);
            deltas
        };
        let (a, b) = rayon::join(|| run(&mut first, &positions[..split]), || run(&mut second, &positions[split..]));
        Some([a, b])
    }
}

/// The occurrences of `pair` at `positions` (sorted) in `walk` merged into `new`, left to right,
/// the changes to the pair counts made in `changes`.
fn merge_occurrences<W: Walk, C: Changes>(
    walk: &mut W,
    positions: &[u32],
    freq: &[i64],
    (l, r): (u32, u32),
    new: u32,
    changes: &mut C,
) {
    for (i, &p) in positions.iter().enumerate() {
        // Occurrences are scattered over all pieces, so each visit was a cache miss on its
        // symbols, its page and its piece's count; fetch them a few occurrences ahead.
        if let Some(&ahead) = positions.get(i + 2 * PREFETCH_AHEAD) {
            walk.refs(ahead).into_iter().for_each(prefetch);
        }
        if let Some(&ahead) = positions.get(i + PREFETCH_AHEAD) {
            prefetch(&freq[walk.piece(ahead) as usize]);
        }
        if walk.get(p) != l {
            continue;
        }
        let q = walk.next(p);
        if q == NONE || walk.get(q) != r {
            continue;
        }
        let f = freq[walk.piece(p) as usize];
        let b = walk.prev(p);
        if b != NONE {
            let bs = walk.get(b);
            changes.dec(pair_key(bs, l), f);
            changes.inc(pair_key(bs, new), f, b);
        }
        let a = walk.merge_at(p, q, new);
        if a != NONE {
            let as_ = walk.get(a);
            changes.dec(pair_key(r, as_), f);
            changes.inc(pair_key(new, as_), f, p);
        }
    }
}
