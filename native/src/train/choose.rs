//! Choosing merges: a lazy max-heap of pair counts (stale entries are refreshed when they surface),
//! ordered by count, then by the tie-break keys (token bytes, or HF ids under the official rules).

use super::rules::hf_tie_key;
use super::{PairMap, Rules, Trainer};
use crate::bpe::unpack;

impl Trainer {
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
                if self.recut(0) {
                    heap = self.full_heap();
                    continue;
                }
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
            // Pairs across a cut count less than `cut_below` (see `cut.rs`), so only below that
            // can one be the best.
            if actual < self.cut_below && self.recut(actual) {
                heap = self.full_heap();
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
