//! Where a piece may be cut: positions whose two neighbours no merge can join, found 64 positions
//! at a time as bits.
//!
//! Replay cuts every piece of a SuperBPE stage 2 (most of its text) into segments that replay
//! independently (`replay.rs`), so finding the cuts is paid on every byte. One table lookup per
//! byte pair costs more than a byte takes to scan. With AVX-512 (VBMI), 64 bytes are looked up at
//! once in two 256-entry tables of byte *groups* instead: cutting at fewer positions than the
//! exact rule is still exact (a segment that holds a joinable position only merges within
//! itself, as the whole piece would), so the groups may be coarser than the bytes.

/// The positions `at..at + 64` of `items` where `cut(item before, item there)` holds, as bits (bit
/// k: position `at + k`; positions 0 and from `items.len()` on are clear). Computed without a
/// branch per item: cuts come every few items (segment ends in replay, cold boundaries in the cut),
/// and a branch on each was mispredicted that often.
#[inline(always)]
pub(crate) fn cut_mask<T: Copy>(items: &[T], at: usize, cut: impl Fn(T, T) -> bool) -> u64 {
    let lo = at.max(1);
    let hi = (at + 64).min(items.len());
    let mut bits = 0u64;
    if lo < hi {
        for (k, w) in items[lo - 1..hi].windows(2).enumerate() {
            bits |= u64::from(cut(w[0], w[1])) << (lo - at + k);
        }
    }
    bits
}

/// `run(start, end)` for each run of `0..len` between the cuts that `mask(at)` gives (`cut_mask`
/// bits for `at..at + 64`), in order; the runs cover `0..len`.
#[inline(always)]
pub(crate) fn for_each_run(len: usize, mask: impl Fn(usize) -> u64, mut run: impl FnMut(usize, usize)) {
    let mut start = 0;
    for at in (0..len).step_by(64) {
        let mut bits = mask(at);
        while bits != 0 {
            let end = at + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            run(start, end);
            start = end;
        }
    }
    if start < len {
        run(start, len);
    }
}

/// Groups the right-hand bytes fall into for the 64-byte lookups: one bit each in a table byte.
const GROUPS: usize = 8;

/// Byte pairs that some merge may join: bit (a, b) is set when a merge's left part ends with
/// byte a and its right part starts with byte b. Whatever tokens stand on either side of a
/// position, they end and start with the bytes there, so no merge can ever join across a position
/// whose byte pair is not set: a piece cut at such positions replays as its parts, concatenated.
#[derive(Clone)]
pub struct JoinedPairs {
    bits: Vec<u64>,
}

impl JoinedPairs {
    pub fn of(merges: &[(Vec<u8>, Vec<u8>)]) -> JoinedPairs {
        let mut bits = vec![0u64; 256 * 256 / 64];
        for (l, r) in merges {
            if let (Some(&a), Some(&b)) = (l.last(), r.first()) {
                let i = (a as usize) << 8 | b as usize;
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        JoinedPairs { bits }
    }

    #[inline(always)]
    pub fn may_join(&self, a: u8, b: u8) -> bool {
        joined(&self.bits, a, b)
    }
}

/// The [`JoinedPairs`] of some merges with what finds their cuts 64 positions at a time.
#[derive(Clone)]
pub struct Joins {
    pairs: JoinedPairs,
    /// The tables of the 64-byte lookups (boxed: a `Joins` lives inside encoders that move).
    tables: Box<GroupTables>,
    /// Whether `cuts` looks bytes up 64 at a time (the CPU has AVX-512 with VBMI).
    wide: bool,
}

impl Joins {
    pub fn of(merges: &[(Vec<u8>, Vec<u8>)]) -> Joins {
        let pairs = JoinedPairs::of(merges);
        let tables = Box::new(GroupTables::of(&groups(&pairs.bits)));
        Joins { pairs, tables, wide: wide_available() }
    }

    /// These joins, finding cuts a pair at a time (the exact rule), whatever the CPU has.
    #[cfg(test)]
    pub(crate) fn narrow(mut self) -> Joins {
        self.wide = false;
        self
    }

    #[inline(always)]
    pub fn may_join(&self, a: u8, b: u8) -> bool {
        self.pairs.may_join(a, b)
    }

    /// Among the positions `at..at + 64` of `piece`, positions where no merge joins the byte
    /// before and the byte there, as `cut_mask` bits: all of them, or with the 64-byte lookups
    /// those the groups tell apart (a subset, see the module doc). None from the piece's end on.
    #[inline(always)]
    pub fn cuts(&self, piece: &[u8], at: usize) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.wide && at < piece.len() {
            // SAFETY: `wide` is only set when the CPU has the features `wide::cuts` is compiled
            // for, and `at` is below the piece's length (checked here: past it the lookups would
            // read outside the piece).
            return unsafe { wide::cuts(piece, at, &self.tables.left, &self.tables.right) };
        }
        cut_mask(piece, at, |a, b| !self.may_join(a, b))
    }
}

/// Whether bit (a, b) of the pair bits is set.
#[inline(always)]
fn joined(bits: &[u64], a: u8, b: u8) -> bool {
    let i = (a as usize) << 8 | b as usize;
    bits[i / 64] >> (i % 64) & 1 == 1
}

/// The right-hand bytes in at most `GROUPS` groups. Bytes whose columns (the left bytes that join
/// them) are equal share a group at no loss; while there are more groups, the two whose union
/// loses the fewest cuts are merged, a cut weighing more where both bytes are printable ASCII
/// (text is mostly made of those).
fn groups(bits: &[u64]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for b in 0..256 {
        let mut column = [0u64; 4];
        for a in 0..256 {
            if joined(bits, a as u8, b as u8) {
                column[a / 64] |= 1 << (a % 64);
            }
        }
        match groups.iter_mut().find(|g| g.column == column) {
            Some(g) => g.add(b),
            None => {
                let mut g = Group { column, bytes: Vec::new(), weight: 0 };
                g.add(b);
                groups.push(g);
            }
        }
    }
    // Losses of merging each two groups, updated for the merged one only.
    let n = groups.len();
    let mut lost: Vec<Vec<u64>> =
        (0..n).map(|i| (0..n).map(|j| if i < j { groups[i].lost_with(&groups[j]) } else { 0 }).collect()).collect();
    let mut alive: Vec<usize> = (0..n).collect();
    while alive.len() > GROUPS {
        let (mut best, mut pick) = (u64::MAX, (0, 0));
        for (x, &i) in alive.iter().enumerate() {
            for &j in &alive[x + 1..] {
                if lost[i][j] < best {
                    (best, pick) = (lost[i][j], (i, j));
                }
            }
        }
        let (i, j) = pick;
        let gone = std::mem::take(&mut groups[j]);
        groups[i].absorb(gone);
        alive.retain(|&k| k != j);
        for &k in &alive {
            if k != i {
                let (lo, hi) = (k.min(i), k.max(i));
                lost[lo][hi] = groups[lo].lost_with(&groups[hi]);
            }
        }
    }
    alive.into_iter().map(|k| std::mem::take(&mut groups[k])).collect()
}

/// Right-hand bytes cut alike: the left bytes that join any of them, and their weight in text.
#[derive(Default)]
struct Group {
    column: [u64; 4],
    bytes: Vec<usize>,
    weight: u64,
}

/// Printable ASCII and "\n", where most cuts of text fall.
const COMMON: [u64; 4] = [0xFFFF_FFFF_0000_0400, 0x7FFF_FFFF_FFFF_FFFF, 0, 0];

/// How much a cut next to a byte weighs: 16 for a common one, 1 for others.
fn weight_of(set: [u64; 4]) -> u64 {
    (0..4).map(|k| 16 * (set[k] & COMMON[k]).count_ones() as u64 + (set[k] & !COMMON[k]).count_ones() as u64).sum()
}

impl Group {
    fn add(&mut self, b: usize) {
        self.bytes.push(b);
        let mut one = [0u64; 4];
        one[b / 64] = 1 << (b % 64);
        self.weight += weight_of(one);
    }

    /// The weighted cuts lost by sharing a group with `other`: each side's bytes stop being cut
    /// after the left bytes that join only the other's.
    fn lost_with(&self, other: &Group) -> u64 {
        let minus = |x: [u64; 4], y: [u64; 4]| [x[0] & !y[0], x[1] & !y[1], x[2] & !y[2], x[3] & !y[3]];
        self.weight * weight_of(minus(other.column, self.column))
            + other.weight * weight_of(minus(self.column, other.column))
    }

    fn absorb(&mut self, other: Group) {
        for k in 0..4 {
            self.column[k] |= other.column[k];
        }
        self.bytes.extend(other.bytes);
        self.weight += other.weight;
    }
}

/// Bit g of `left[a]`: byte a joins some byte of group g; `right[b]`: the bit of b's group. A
/// pair (a, b) with `left[a] & right[b] == 0` joins no byte of b's group, so not b.
#[derive(Clone)]
struct GroupTables {
    left: [u8; 256],
    right: [u8; 256],
}

impl GroupTables {
    /// The tables of `groups` (at most 8): a group's column holds every left byte that joins one
    /// of its bytes.
    fn of(groups: &[Group]) -> GroupTables {
        let mut tables = GroupTables { left: [0; 256], right: [0; 256] };
        for (g, group) in groups.iter().enumerate() {
            for &b in &group.bytes {
                tables.right[b] = 1 << g;
            }
            for (a, left) in tables.left.iter_mut().enumerate() {
                if group.column[a / 64] >> (a % 64) & 1 == 1 {
                    *left |= 1 << g;
                }
            }
        }
        tables
    }
}

/// Whether this CPU runs `wide::cuts`.
fn wide_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    /// `table[i]` for each byte i of `idx`: two 128-entry lookups, picked by the index's top bit.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn lookup(table: &[u8; 256], idx: __m512i) -> __m512i {
        // SAFETY (of the loads): each reads 64 bytes inside `table`, unaligned loads allowed.
        let t = |k: usize| unsafe { _mm512_loadu_si512(table.as_ptr().add(64 * k) as *const __m512i) };
        let lo = _mm512_permutex2var_epi8(t(0), idx, t(1));
        let hi = _mm512_permutex2var_epi8(t(2), idx, t(3));
        _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi)
    }

    /// `Joins::cuts` by groups, for the positions `at..at + 64` of `piece`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and VBMI, and `at` must be below `piece.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) unsafe fn cuts(piece: &[u8], at: usize, left: &[u8; 256], right: &[u8; 256]) -> u64 {
        let rest = piece.len() - at;
        let inside = if rest >= 64 { u64::MAX } else { (1u64 << rest) - 1 };
        // SAFETY: only the bytes `at..at + rest.min(64)` are read (the others are masked off,
        // and a masked-off byte is never accessed), all inside `piece`.
        let here = unsafe { _mm512_maskz_loadu_epi8(inside, piece.as_ptr().add(at) as *const i8) };
        // Each byte's left neighbour: the bytes moved up one place, the first from before `at`.
        let up = _mm512_set_epi8(
            62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36,
            35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9,
            8, 7, 6, 5, 4, 3, 2, 1, 0, 0,
        );
        let mut before = _mm512_permutexvar_epi8(up, here);
        if at > 0 {
            before = _mm512_mask_set1_epi8(before, 1, piece[at - 1] as i8);
        }
        let joined = _mm512_test_epi8_mask(lookup(left, before), lookup(right, here));
        // Position 0 has no byte before it.
        !joined & inside & if at == 0 { !1 } else { u64::MAX }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_below as below;

    /// The exact rule finds exactly the positions whose byte pair no merge joins; the 64-byte
    /// lookups find only such positions, and with at most `GROUPS` distinct columns all of them.
    #[test]
    fn cuts_are_unjoined_positions() {
        let seed = &mut 0x9E37_79B9_7F4A_7C15u64;
        let mut fewer = 0;
        for round in 0..40 {
            // Few byte values in the first rounds (few columns: the groups are exact), all later.
            let values = if round < 10 { 6 } else { 256 };
            let merges: Vec<(Vec<u8>, Vec<u8>)> = (0..1 + below(seed, 400))
                .map(|_| (vec![below(seed, values) as u8], vec![below(seed, values) as u8]))
                .collect();
            let joins = Joins::of(&merges);
            let exact = joins.clone().narrow();
            for _ in 0..50 {
                let piece: Vec<u8> = (0..1 + below(seed, 300)).map(|_| below(seed, values) as u8).collect();
                let want: Vec<usize> = (1..piece.len()).filter(|&i| !joins.may_join(piece[i - 1], piece[i])).collect();
                let found = |joins: &Joins| -> Vec<usize> {
                    (0..piece.len().div_ceil(64))
                        .flat_map(|b| {
                            let bits = joins.cuts(&piece, 64 * b);
                            (0..64).filter(move |k| bits >> k & 1 == 1).map(move |k| 64 * b + k)
                        })
                        .collect()
                };
                let got = found(&joins);
                assert!(got.iter().all(|p| want.contains(p)), "a cut at a joinable position");
                if round < 10 {
                    assert_eq!(got, want, "groups as fine as the columns");
                }
                fewer += want.len() - got.len();
                assert_eq!(found(&exact), want);
            }
        }
        // With 256 byte values and many merges the groups are coarser than the columns.
        assert!(!wide_available() || fewer > 0);
    }

    /// From the piece's end on there are no cuts, and nothing outside the piece is read (a
    /// 64-byte lookup there read past it, far past it for a large `at`).
    #[test]
    fn no_cuts_from_the_end_of_a_piece() {
        let merges: Vec<(Vec<u8>, Vec<u8>)> = vec![(b"a".to_vec(), b"b".to_vec())];
        let piece = b"abcabxab".to_vec();
        for joins in [Joins::of(&merges), Joins::of(&merges).narrow()] {
            assert_ne!(joins.cuts(&piece, 0), 0);
            for at in [piece.len(), piece.len() + 1, piece.len() + 64, 1 << 40] {
                assert_eq!(joins.cuts(&piece, at), 0, "at {at}");
                assert_eq!(joins.cuts(&[], at), 0, "at {at}, empty");
            }
        }
    }
}
