//! Applying one merge: every live occurrence of the pair, left to right within each piece, becomes
//! the new token, and the counts (and positions) of the pairs around it follow.

use super::{PairMap, Trainer, PREFETCH_AHEAD};
use crate::bpe::{pair_key, unpack};
use crate::memory::prefetch;
use crate::symbols::NONE;

impl Trainer {
    /// The table a pair's count is kept in during a merge making `new`: pairs holding `new` are
    /// created by this merge, and with cold pairs about they gather in `created`.
    #[inline]
    pub(super) fn table_for(&mut self, key: u64, new: u32, gather: bool) -> &mut PairMap {
        let (l, r) = unpack(key);
        if gather && (l == new || r == new) {
            &mut self.created
        } else {
            &mut self.pairs
        }
    }

    #[inline]
    pub(super) fn dec(&mut self, key: u64, f: i64, new: u32, gather: bool) {
        if let Some(info) = self.table_for(key, new, gather).get_mut(&key) {
            info.count -= f;
        }
    }

    #[inline]
    pub(super) fn inc(&mut self, key: u64, f: i64, pos: u32, new: u32, gather: bool, fresh: &mut Vec<u64>) {
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
}
