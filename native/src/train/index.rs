//! The pair index: every warm pair's count and the positions where it occurs, built from the
//! laid-out symbols in parallel (positions counted per left symbol, scattered, then each left
//! symbol's group ordered by right symbol with a counting sort that also weighs each pair).

use rayon::prelude::*;
use smallvec::SmallVec;

use super::{PairInfo, Trainer, PREFETCH_AHEAD};
use crate::bpe::pair_key;
use crate::memory::{advise_huge, prefetch};
use crate::symbols::Symbols;

/// Where the pair index's positions are scattered, shared by the threads that fill disjoint
/// slots of it.
struct Slots(*mut u32);

// SAFETY: every thread writes only the slots its own bucket offsets reserve (see `index_pairs`).
unsafe impl Sync for Slots {}

impl Slots {
    /// # Safety
    /// `i` is within the destination and no other thread writes slot `i`.
    #[inline(always)]
    unsafe fn put(&self, i: usize, p: u32) {
        // SAFETY: as the caller promises.
        unsafe { *self.0.add(i) = p };
    }
}

/// One pair's run of positions in the index while it is built: `(key, first, len, count)`.
type Run = (u64, u32, u32, i64);

/// Per-job scratch of `index_pairs`: dense per-right-symbol tables (reset after each bucket) and
/// the largest counts this job has seen.
struct BucketScratch {
    count: Vec<u32>,
    weight: Vec<i64>,
    touched: Vec<u32>,
    rights: Vec<u32>,
    tmp: Vec<u32>,
    /// The `keep` largest counts seen, smallest on top: a count below that smallest is below the
    /// `keep`-th largest of all pairs, so its pair is cold and its run need not be kept.
    top: std::collections::BinaryHeap<std::cmp::Reverse<i64>>,
    keep: usize,
    runs_seen: usize,
}

impl BucketScratch {
    fn new(tokens: usize, keep: usize) -> BucketScratch {
        BucketScratch {
            count: vec![0; tokens],
            weight: vec![0; tokens],
            touched: Vec::new(),
            rights: Vec::new(),
            tmp: Vec::new(),
            top: Default::default(),
            keep,
            runs_seen: 0,
        }
    }

    /// Whether a run counting `count` may be warm; records it among the largest.
    fn may_be_warm(&mut self, count: i64) -> bool {
        self.runs_seen += 1;
        if self.top.len() < self.keep {
            self.top.push(std::cmp::Reverse(count));
            return true;
        }
        let smallest = self.top.peek().map_or(i64::MIN, |r| r.0);
        if count < smallest {
            return false;
        }
        self.top.pop();
        self.top.push(std::cmp::Reverse(count));
        true
    }
}

impl Trainer {
    /// Build the pair table from the symbols (into an empty `pairs`), warm pairs only. Positions
    /// are counted per left symbol and scattered into one array (grouped by left symbol, ascending),
    /// then each left symbol's group is ordered by right symbol with a counting sort, which also
    /// weighs each pair. Pairs below the threshold for `warm_pairs` stay out (cold) and their
    /// positions are dropped. (A radix sort of 16-byte (key, place) items, plus its scratch copy,
    /// was the peak of a large stage 2.)
    pub(super) fn index_pairs(&mut self, warm_pairs: usize) {
        let v = self.tokens.len();
        let parts = if self.syms.len() < 1 << 16 { 1 } else { rayon::current_num_threads().clamp(1, 8) };
        let ranges = self.syms.ranges(parts);
        let syms = &self.syms;
        let mut offsets: Vec<Vec<u32>> = ranges
            .par_iter()
            .map(|range| {
                let mut counts = vec![0u32; v];
                syms.pairs_in(range.clone(), |_, l, _, _| counts[l as usize] += 1);
                counts
            })
            .collect();
        // Each part's first slot per left symbol: symbols in order, and parts in order within one
        // (so each group's positions ascend). Totals stay below `MAX_SLOTS`, so u32 holds them.
        let mut starts = Vec::with_capacity(v + 1);
        let mut sum = 0u32;
        for l in 0..v {
            starts.push(sum);
            for part in offsets.iter_mut() {
                (part[l], sum) = (sum, sum + part[l]);
            }
        }
        starts.push(sum);
        let total = sum as usize;
        let mut positions: Vec<u32> = Vec::with_capacity(total);
        // Scattered into at random: huge pages spare each write a TLB miss.
        advise_huge(positions.as_ptr() as usize, total * 4);
        let out = Slots(positions.as_mut_ptr());
        ranges.par_iter().zip(offsets.par_iter_mut()).for_each(|(range, offsets)| {
            syms.pairs_in(range.clone(), |p, l, _, _| {
                // SAFETY: the slot is below `total` and reserved for this part and left symbol alone.
                unsafe { out.put(offsets[l as usize] as usize, p) };
                offsets[l as usize] += 1;
            });
        });
        // SAFETY: the parts wrote every slot below `total` (each exactly its own counts).
        unsafe { positions.set_len(total) };
        drop(offsets);
        let mut groups: Vec<Group<'_>> = Vec::new();
        let mut rest = positions.as_mut_slice();
        for l in 0..v {
            let (group, tail) = std::mem::take(&mut rest).split_at_mut((starts[l + 1] - starts[l]) as usize);
            rest = tail;
            if !group.is_empty() {
                groups.push((l as u32, starts[l], group));
            }
        }
        let keep = warm_pairs.max(1);
        let freq = &self.freq;
        let found: Vec<(Vec<Run>, Vec<i64>, usize)> = balanced(groups, parts)
            .into_par_iter()
            .map(|bin| {
                let (mut runs, mut scratch) = (Vec::new(), BucketScratch::new(v, keep));
                for (l, start, group) in bin {
                    sort_group(syms, freq, l, start, group, &mut scratch, &mut runs);
                }
                (runs, scratch.top.into_iter().map(|r| r.0).collect(), scratch.runs_seen)
            })
            .collect();
        // The `keep`-th largest count overall is among the jobs' largest (each kept its own top).
        let all_runs: usize = found.iter().map(|f| f.2).sum();
        self.cold_below = if all_runs > keep {
            let mut tops: Vec<i64> = found.iter().flat_map(|f| f.1.iter().copied()).collect();
            let k = tops.len() - keep;
            *tops.select_nth_unstable(k).1
        } else {
            0
        };
        // Keep the warm runs' positions only, moved down in place.
        let mut runs: Vec<Run> = found.into_iter().flat_map(|f| f.0).filter(|run| run.3 >= self.cold_below).collect();
        runs.sort_unstable_by_key(|run| run.1);
        self.pairs.reserve(runs.len());
        let mut w = 0usize;
        for (key, first, len, count) in runs {
            positions.copy_within(first as usize..(first + len) as usize, w);
            self.pairs.insert(key, PairInfo { count, first: w as u32, len, positions: SmallVec::new() });
            w += len as usize;
        }
        positions.truncate(w);
        positions.shrink_to_fit();
        self.initial = positions;
    }
}

/// A left symbol's group of positions: `(left symbol, its first slot in the index, its positions)`.
type Group<'a> = (u32, u32, &'a mut [u32]);

/// `groups` dealt into `bins` lists of about equal positions, largest group first into the bin with
/// the fewest so far. A few left symbols (the commonest tokens) hold a large share of a stage's
/// positions, and most of them have low ids: split evenly by number of groups, one thread took most
/// of the work while the other waited. Which bin a group lands in changes no run and no count.
fn balanced(mut groups: Vec<Group<'_>>, bins: usize) -> Vec<Vec<Group<'_>>> {
    groups.sort_unstable_by_key(|g| std::cmp::Reverse(g.2.len()));
    let mut dealt: Vec<(usize, Vec<Group<'_>>)> = (0..bins.max(1)).map(|_| (0, Vec::new())).collect();
    for group in groups {
        let bin = dealt.iter_mut().min_by_key(|b| b.0).expect("at least one bin");
        bin.0 += group.2.len();
        bin.1.push(group);
    }
    dealt.into_iter().map(|b| b.1).filter(|b| !b.is_empty()).collect()
}

/// Order one left symbol's positions (`group`, ascending, starting at `start` in the index) by
/// right symbol, stably, and add each pair's run `(key, first, len, count)` to `runs` unless it is
/// surely cold (see `BucketScratch`).
fn sort_group(
    syms: &Symbols,
    freq: &[i64],
    l: u32,
    start: u32,
    group: &mut [u32],
    scratch: &mut BucketScratch,
    runs: &mut Vec<Run>,
) {
    let n = group.len();
    scratch.rights.clear();
    scratch.tmp.clear();
    // Right symbol and piece of each position; these reads are scattered, so fetch ahead.
    for i in 0..n {
        if let Some(&ahead) = group.get(i + 2 * PREFETCH_AHEAD) {
            syms.refs(ahead).into_iter().for_each(prefetch);
        }
        let p = group[i];
        scratch.rights.push(syms.get(syms.next(p)));
        scratch.tmp.push(syms.piece(p));
    }
    // This loop's steps are a few cycles each, so its piece counts are fetched much further ahead.
    for i in 0..n {
        if let Some(&ahead) = scratch.tmp.get(i + 8 * PREFETCH_AHEAD) {
            prefetch(&freq[ahead as usize]);
        }
        let r = scratch.rights[i] as usize;
        if scratch.count[r] == 0 {
            scratch.touched.push(r as u32);
        }
        scratch.count[r] += 1;
        scratch.weight[r] += freq[scratch.tmp[i] as usize];
    }
    scratch.touched.sort_unstable();
    let mut at = 0u32;
    let touched = std::mem::take(&mut scratch.touched);
    for &r in &touched {
        let (len, count) = (scratch.count[r as usize], scratch.weight[r as usize]);
        if scratch.may_be_warm(count) {
            runs.push((pair_key(l, r), start + at, len, count));
        }
        scratch.count[r as usize] = at;
        scratch.weight[r as usize] = 0;
        at += len;
    }
    for (&p, &r) in group.iter().zip(&scratch.rights) {
        let slot = &mut scratch.count[r as usize];
        scratch.tmp[*slot as usize] = p;
        *slot += 1;
    }
    group.copy_from_slice(&scratch.tmp);
    for &r in &touched {
        scratch.count[r as usize] = 0;
    }
    scratch.touched = touched;
    scratch.touched.clear();
}
