//! Pair counts summed by bucket, filled as replay writes each piece's symbols.
//!
//! Cutting a stage's pieces (`train/cut.rs`) must know which initial pairs may count θ or more: it
//! cuts only where a pair counts less. Exact counts took one update per replayed symbol into a
//! table of every distinct pair, gigabytes on English web text, and nearly every update missed the
//! CPU caches. Here a pair's count is added to its bucket's counter, which sums every pair hashed
//! there: no pair counts more than its bucket, so a pair in a bucket below θ counts below θ and
//! cutting at it stays exact. The pairs that count θ or more are a few tens of thousands among up
//! to a million buckets, so few rare pairs share a bucket with one (they only stay uncut). What
//! each update touches is a megabyte per thread, which stays in the caches.

/// A key's bits mixed, for table slots (pair keys are two small ids side by side).
#[inline(always)]
pub fn spread(key: u64) -> u64 {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

/// Fewest and most buckets, as powers of two. The most keep the low bytes one thread updates at a
/// megabyte, so that replay's updates mostly hit the caches, while a bucket's noise (the replayed
/// pairs over the buckets) stays well below the counts of the pairs a stage merges; more buckets
/// made replay slower without cutting much more.
const MIN_BITS: u32 = 12;
const MAX_BITS: u32 = 20;

/// The most a bucket holds: its high part saturated, its low byte full.
const MAX_COUNT: u64 = (u32::MAX as u64) << 8 | 0xFF;

/// Bucket -> summed count of the pairs hashed there, split in two arrays: the low byte of each
/// count, which every update touches, and the rest, touched once per 256 of a bucket's count.
/// The low bytes of a million buckets take a megabyte, which stays in a core's second-level cache
/// beside replay's other tables, where four-byte counters outgrew it and replay waited on them.
/// A count saturates at `MAX_COUNT`, which only claims more than it may hold: its pairs stay uncut.
pub struct PairSketch {
    low: Vec<u8>,
    high: Vec<u32>,
    shift: u32,
}

impl PairSketch {
    /// Counters for the replay of pieces of `bytes` bytes in all: a bucket per four bytes (no more
    /// counters than the pieces have symbols), within `MIN_BITS..=MAX_BITS`.
    pub fn bits_for(bytes: u64) -> u32 {
        (bytes / 4).max(1).next_power_of_two().trailing_zeros().clamp(MIN_BITS, MAX_BITS)
    }

    pub fn with_bits(bits: u32) -> PairSketch {
        assert!((1..64).contains(&bits), "pair sketch of 2^{bits} buckets");
        PairSketch { low: vec![0; 1 << bits], high: vec![0; 1 << bits], shift: 64 - bits }
    }

    /// Bytes a sketch of `2^bits` buckets holds.
    pub fn bytes_for(bits: u32) -> u64 {
        5 << bits
    }

    pub fn buckets(&self) -> usize {
        self.low.len()
    }

    /// Bytes it holds.
    pub fn heap_bytes(&self) -> u64 {
        Self::bytes_for(self.low.len().trailing_zeros())
    }

    #[inline(always)]
    pub fn bucket(&self, key: u64) -> usize {
        (spread(key) >> self.shift) as usize
    }

    /// Bucket `b`'s count.
    #[inline(always)]
    fn count(&self, b: usize) -> u64 {
        (self.high[b] as u64) << 8 | self.low[b] as u64
    }

    /// Set bucket `b`'s count to `count` (at most `MAX_COUNT`).
    fn set(&mut self, b: usize, count: u64) {
        self.low[b] = count as u8;
        self.high[b] = (count >> 8) as u32;
    }

    /// Add `f` (at least 1) to the bucket of each adjacent pair of `syms`. A count outside
    /// `1..=MAX_COUNT` adds `MAX_COUNT`, which only claims too much (its pairs stay uncut).
    #[inline]
    pub fn add_pairs(&mut self, syms: &[u32], f: i64) {
        let f = u64::try_from(f).ok().filter(|&f| f >= 1).unwrap_or(MAX_COUNT).min(MAX_COUNT);
        for w in syms.windows(2) {
            let b = self.bucket(crate::bpe::pair_key(w[0], w[1]));
            let sum = self.low[b] as u64 + f;
            self.low[b] = sum as u8;
            if sum > 0xFF {
                self.carry(b, sum >> 8);
            }
        }
    }

    /// Add `carry` to bucket `b`'s high part, saturating the whole count at `MAX_COUNT`.
    #[cold]
    #[inline(never)]
    fn carry(&mut self, b: usize, carry: u64) {
        let high = self.high[b] as u64 + carry;
        if high > u32::MAX as u64 {
            self.set(b, MAX_COUNT);
        } else {
            self.high[b] = high as u32;
        }
    }

    /// The sketches of all threads summed (they have one size: `bits_for` of one corpus).
    pub fn merged(sketches: Vec<PairSketch>) -> PairSketch {
        let mut sketches = sketches.into_iter();
        let mut all = sketches.next().expect("one sketch per thread");
        for s in sketches {
            assert_eq!(s.buckets(), all.buckets(), "pair sketches of one size");
            for b in 0..all.buckets() {
                let sum = (all.count(b) + s.count(b)).min(MAX_COUNT);
                all.set(b, sum);
            }
        }
        all
    }

    /// The `rank`-th highest count (1-based), or 0 when fewer than `rank` buckets hold a pair.
    pub fn threshold(&self, rank: usize) -> i64 {
        let mut values: Vec<u64> = (0..self.buckets()).map(|b| self.count(b)).filter(|&c| c > 0).collect();
        if rank == 0 || rank > values.len() {
            return 0;
        }
        *values.select_nth_unstable_by(rank - 1, |a, b| b.cmp(a)).1 as i64
    }

    /// Whether bucket `b` counts `theta` or more.
    #[inline(always)]
    pub fn at_least(&self, b: usize, theta: i64) -> bool {
        self.count(b) as i64 >= theta
    }

    /// About how many distinct pairs were added (linear counting: from the share of buckets left
    /// empty; when none is, the buckets times their logarithm, the most it can tell apart).
    pub fn distinct_pairs(&self) -> u64 {
        let m = self.buckets() as f64;
        let empty = (0..self.buckets()).filter(|&b| self.count(b) == 0).count().max(1) as f64;
        (m * (m / empty).ln()).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Each bucket is the sum of the exact counts of the pairs hashed there, across threads'
    /// sketches merged; no pair counts more than its bucket; θ is a bucket's count.
    #[test]
    fn buckets_sum_the_exact_counts_of_their_pairs() {
        let seed = &mut 0x1234_5678_9ABC_DEF1u64;
        let mut want: HashMap<u64, i64> = HashMap::new();
        let bits = 8;
        let mut sketches: Vec<PairSketch> = (0..3).map(|_| PairSketch::with_bits(bits)).collect();
        for n in 0..20_000 {
            let len = 1 + crate::test_below(seed, if n % 50 == 0 { 200 } else { 9 });
            let syms: Vec<u32> = (0..len).map(|_| crate::test_below(seed, 300) as u32).collect();
            let f = 1 + crate::test_below(seed, 3) as i64;
            sketches[n % 3].add_pairs(&syms, f);
            for w in syms.windows(2) {
                *want.entry(crate::bpe::pair_key(w[0], w[1])).or_default() += f;
            }
        }
        let all = PairSketch::merged(sketches);
        let mut sums = vec![0i64; all.buckets()];
        for (&key, &f) in &want {
            sums[all.bucket(key)] += f;
        }
        assert_eq!((0..all.buckets()).map(|b| all.count(b) as i64).collect::<Vec<_>>(), sums);
        for (&key, &f) in &want {
            assert!(all.at_least(all.bucket(key), f));
        }
        let mut sorted = sums.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        for rank in [1, 7, 100] {
            assert_eq!(all.threshold(rank), sorted[rank - 1]);
        }
        assert_eq!(all.threshold(sums.iter().filter(|&&s| s > 0).count() + 1), 0);
    }

    /// Distinct pairs are told within a few percent while buckets are left empty.
    #[test]
    fn distinct_pairs_are_counted_from_empty_buckets() {
        let seed = &mut 0x0F1E_2D3C_4B5A_6978u64;
        for draws in [100, 5_000, 40_000] {
            let mut s = PairSketch::with_bits(15);
            let mut distinct = std::collections::HashSet::new();
            for _ in 0..draws {
                let pair = [crate::test_below(seed, 1000) as u32, crate::test_below(seed, 1000) as u32];
                s.add_pairs(&pair, 1);
                distinct.insert(pair);
            }
            let (got, n) = (s.distinct_pairs() as f64, distinct.len() as f64);
            assert!((got - n).abs() <= 0.05 * n, "{n} pairs told as {got}");
        }
    }

    #[test]
    fn counters_saturate() {
        let mut s = PairSketch::with_bits(4);
        s.add_pairs(&[1, 2], i64::MAX);
        s.add_pairs(&[1, 2], 5);
        assert_eq!(s.threshold(1), MAX_COUNT as i64);
        let mut t = PairSketch::with_bits(4);
        t.add_pairs(&[1, 2], MAX_COUNT as i64 - 3);
        let merged = PairSketch::merged(vec![s, t]);
        assert_eq!(merged.threshold(1), MAX_COUNT as i64);
        // A count out of range claims the most, never less than it may hold.
        for f in [0, -1] {
            let mut u = PairSketch::with_bits(4);
            u.add_pairs(&[1, 2], f);
            assert_eq!(u.threshold(1), MAX_COUNT as i64);
        }
    }

    /// Counts carried from the low bytes into the high parts, one by one and in large steps,
    /// equal the sums (a bucket hit 300 times by 1 and once by 70,000).
    #[test]
    fn low_bytes_carry_into_the_high_parts() {
        let mut s = PairSketch::with_bits(6);
        for _ in 0..300 {
            s.add_pairs(&[7, 9], 1);
        }
        s.add_pairs(&[7, 9], 70_000);
        assert_eq!(s.threshold(1), 70_300);
        assert!(s.at_least(s.bucket(crate::bpe::pair_key(7, 9)), 70_300));
        assert!(!s.at_least(s.bucket(crate::bpe::pair_key(7, 9)), 70_301));
    }
}
