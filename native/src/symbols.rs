//! The trainer's symbols: every piece's token ids in one flat `u32` array, about 4 bytes per symbol.
//!
//! A SuperBPE stage 2 holds every distinct line of the corpus (~180M symbols on a 1.2 GB corpus),
//! so the per-symbol constant decides whether it fits. Linked nodes (symbol, previous, next,
//! piece: 16 bytes) made a merge O(1) but cost four times the symbols themselves. Here the links
//! are implicit:
//!
//! - Pieces lie one after another, each followed by a separator `SEP`; slot 0 is a `SEP` too,
//!   so every piece has a `SEP` on both sides and walking never leaves it.
//! - A merge kills the right symbol. Symbols that died next to each other form a *dead run*, whose
//!   first and last slots hold `DEAD | run length` (every dead slot has the `DEAD` bit, so a stale
//!   position never looks live). The next or previous live symbol is then one or two reads away.
//! - The piece of a position (for its count) comes from a page table: the number of separators
//!   before each page of `PAGE` slots, plus those between the page start and the position.
//!
//! Token ids must stay below `DEAD` (2^31): replay takes at most `replay::MAX_REPLAY` merges and the
//! `train` binding at most `train::MAX_MERGES`.

use rayon::prelude::*;

use crate::memory::advise_huge;

/// No position (end of a piece).
pub const NONE: u32 = u32::MAX;
/// Separator between pieces (also a dead value: its `DEAD` bit is set).
pub const SEP: u32 = u32::MAX;
/// Marks a dead slot; the low bits of a dead run's first and last slot hold the run's length.
pub const DEAD: u32 = 1 << 31;
/// Longest piece, in symbols: its dead runs' lengths must stay below `SEP & !DEAD`.
pub const MAX_PIECE: usize = (SEP & !DEAD) as usize - 1;
/// Most slots (symbols plus one separator per piece, plus one): positions are u32 below `NONE`.
pub const MAX_SLOTS: usize = NONE as usize;

const PAGE_BITS: u32 = 5;
const PAGE: usize = 1 << PAGE_BITS;

/// See the module doc.
#[derive(Default)]
pub struct Symbols {
    slots: Vec<u32>,
    /// `pages[k]`: separators in `slots[..k * PAGE]`.
    pages: Vec<u32>,
}

#[inline(always)]
fn is_live(v: u32) -> bool {
    v & DEAD == 0
}

impl Symbols {
    /// Lay out pieces given as `(symbols, piece count)` batches, in order, in parallel: `batches[i]`
    /// holds `sizes[i].1` pieces in `sizes[i].0` slots (symbols plus a separator each), written by
    /// `fill(batch, slots)` (which must write exactly that, each piece followed by `SEP`). Each
    /// batch is handed over (and so may be freed) as soon as it is written. A size for each batch,
    /// or the error.
    ///
    /// # Safety
    /// `fill` must initialise every element of the slice it is given (the slots are taken as
    /// written, unread: a slot it leaves would be read uninitialised).
    pub unsafe fn from_batches<B: Send>(
        batches: Vec<B>,
        sizes: &[(usize, usize)],
        fill: impl Fn(B, &mut [std::mem::MaybeUninit<u32>]) + Sync,
    ) -> Result<Symbols, String> {
        if batches.len() != sizes.len() {
            return Err(format!("{} batches of symbols with {} sizes", batches.len(), sizes.len()));
        }
        let total = 1 + sizes.iter().map(|s| s.0).sum::<usize>();
        if total >= MAX_SLOTS {
            return Err(format!(
                "corpus too large for the native trainer: {total} symbol slots after replay, at most {} fit \
                 in 32-bit positions (train stage 2 on a smaller corpus)",
                MAX_SLOTS - 1
            ));
        }
        let mut slots: Vec<u32> = Vec::with_capacity(total);
        // Merges and the index visit the slots at random: huge pages spare each visit a TLB miss.
        advise_huge(slots.as_ptr() as usize, total * 4);
        slots.push(SEP);
        let mut spare = &mut slots.spare_capacity_mut()[..total - 1];
        let mut jobs = Vec::with_capacity(batches.len());
        for (batch, &(n, _)) in batches.into_iter().zip(sizes) {
            let (mine, rest) = std::mem::take(&mut spare).split_at_mut(n);
            spare = rest;
            jobs.push((batch, mine));
        }
        jobs.into_par_iter().for_each(|(batch, mine)| fill(batch, mine));
        // SAFETY: `fill` wrote every slot of each batch's part (the caller's promise), and the
        // parts, one per batch (as many batches as sizes), cover all `total - 1` slots after the
        // first.
        unsafe { slots.set_len(total) };
        Ok(Symbols::from_slots(slots))
    }

    /// Pieces given one by one (each at least 2 symbols).
    pub fn from_pieces<P: ExactSizeIterator<Item = u32>>(pieces: impl Iterator<Item = P>) -> Result<Symbols, String> {
        let mut slots = vec![SEP];
        for piece in pieces {
            if piece.len() > MAX_PIECE {
                return Err(format!("a piece of {} symbols is too long for the native trainer", piece.len()));
            }
            slots.extend(piece);
            slots.push(SEP);
            if slots.len() >= MAX_SLOTS {
                return Err("corpus too large for the native trainer (more than 4G symbol slots)".into());
            }
        }
        Ok(Symbols::from_slots(slots))
    }

    fn from_slots(slots: Vec<u32>) -> Symbols {
        let per_page: Vec<u32> =
            slots.par_chunks(PAGE).map(|c| c.iter().filter(|&&v| v == SEP).count() as u32).collect();
        let mut pages = Vec::with_capacity(per_page.len());
        let mut seps = 0u32;
        for n in per_page {
            pages.push(seps);
            seps += n;
        }
        Symbols { slots, pages }
    }

    /// Number of slots (symbols, dead or alive, and separators).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.len() <= 1
    }

    /// Bytes held (for memory estimates and reports).
    pub fn heap_bytes(&self) -> usize {
        4 * (self.slots.capacity() + self.pages.capacity())
    }

    /// The token at `p`, or a value with the `DEAD` bit for a dead slot or a separator.
    #[inline(always)]
    pub fn get(&self, p: u32) -> u32 {
        self.slots[p as usize]
    }

    /// The live symbol after live position `p` in its piece, or `NONE`.
    #[inline(always)]
    pub fn next(&self, p: u32) -> u32 {
        next_in(&self.slots[..], p)
    }

    /// The live symbol before live position `p` in its piece, or `NONE`.
    #[inline(always)]
    pub fn prev(&self, p: u32) -> u32 {
        prev_in(&self.slots[..], p)
    }

    /// The piece (0-based, in layout order) that slot `p` (not a separator) belongs to.
    #[inline(always)]
    pub fn piece(&self, p: u32) -> u32 {
        let page = p as usize >> PAGE_BITS;
        let before = self.slots[page << PAGE_BITS..p as usize].iter().filter(|&&v| v == SEP).count() as u32;
        self.pages[page] + before - 1
    }

    /// The addresses `piece(p)` and the walks from `p` read first, for prefetching: `p`'s slot, the
    /// first slot of its page (`piece` scans the slots from there to `p`, and with 32 slots a page
    /// that is often another cache line than `p`'s own) and its page-table entry.
    #[inline(always)]
    pub fn refs(&self, p: u32) -> [&u32; 3] {
        [&self.slots[p as usize], &self.slots[p as usize & !(PAGE - 1)], &self.pages[p as usize >> PAGE_BITS]]
    }

    /// Merge live `p` with its next live symbol `q` into `new`: `q` dies, joining the dead runs on
    /// either side of it. Returns the live symbol after `q` (now after `p`), or `NONE`.
    #[inline(always)]
    pub fn merge_at(&mut self, p: u32, q: u32, new: u32) -> u32 {
        merge_in(&mut self.slots[..], p, q, new)
    }

    /// The slots in two halves, before and after the separator at `at`, for a merge applied on two
    /// threads: each half walks and merges only its own pieces (a piece never crosses a separator).
    pub fn halves(&mut self, at: u32) -> (Half<'_>, Half<'_>) {
        let at = at as usize;
        assert_eq!(self.slots[at], SEP, "halves are cut at a separator");
        let page_start = (at + 1) & !(PAGE - 1);
        let seps_before = self.slots[page_start..at + 1].iter().filter(|&&v| v == SEP).count() as u32;
        let (before, rest) = self.slots.split_at_mut(at);
        let after = &mut rest[1..];
        let pages = &self.pages[..];
        (
            Half { slots: before, base: 0, pages, seps_before: 0 },
            Half { slots: after, base: at as u32 + 1, pages, seps_before },
        )
    }

    /// Split the slots into about `parts` consecutive ranges (for parallel passes).
    pub fn ranges(&self, parts: usize) -> Vec<std::ops::Range<usize>> {
        let n = self.slots.len();
        let step = n.div_ceil(parts.max(1)).max(1);
        (0..n).step_by(step).map(|s| s..(s + step).min(n)).collect()
    }

    /// Every adjacent live pair whose left symbol lies in `range`: `visit(p, left, right, piece)`,
    /// in position order.
    #[inline]
    pub fn pairs_in(&self, range: std::ops::Range<usize>, mut visit: impl FnMut(u32, u32, u32, u32)) {
        if range.is_empty() {
            return;
        }
        // Separators before the range start, minus one: the piece of the range's first slot.
        let mut piece = self.piece_before(range.start);
        for p in range {
            let v = self.slots[p];
            if v == SEP {
                piece = piece.wrapping_add(1);
                continue;
            }
            if !is_live(v) {
                continue;
            }
            let q = self.next(p as u32);
            if q != NONE {
                visit(p as u32, v, self.slots[q as usize], piece);
            }
        }
    }

    /// `piece(p)` for any slot, separators included (the piece before it; u32::MAX before the first).
    fn piece_before(&self, p: usize) -> u32 {
        let page = p >> PAGE_BITS;
        let before = self.slots[page << PAGE_BITS..p].iter().filter(|&&v| v == SEP).count() as u32;
        (self.pages[page] + before).wrapping_sub(1)
    }

    /// The live symbols of every piece, in order (for tests).
    #[cfg(test)]
    pub fn pieces(&self) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        let mut cur = Vec::new();
        for &v in &self.slots[1..] {
            if v == SEP {
                out.push(std::mem::take(&mut cur));
            } else if is_live(v) {
                cur.push(v);
            }
        }
        out
    }
}

/// Slot access for the walks of the dead runs: all of a `Symbols`' slots, or one of its `Half`s.
trait Slots {
    /// Slot `i`'s value (`SEP` outside a half: a half ends at separators).
    fn at(&self, i: u32) -> u32;
    fn set(&mut self, i: u32, v: u32);
}

impl Slots for [u32] {
    #[inline(always)]
    fn at(&self, i: u32) -> u32 {
        self[i as usize]
    }

    #[inline(always)]
    fn set(&mut self, i: u32, v: u32) {
        self[i as usize] = v;
    }
}

/// `Symbols::next` of slots `s`.
#[inline(always)]
fn next_in<S: Slots + ?Sized>(s: &S, p: u32) -> u32 {
    let q = p + 1;
    let v = s.at(q);
    if is_live(v) {
        return q;
    }
    if v == SEP {
        return NONE;
    }
    let z = q + (v & !DEAD);
    if s.at(z) == SEP {
        NONE
    } else {
        z
    }
}

/// `Symbols::prev` of slots `s`.
#[inline(always)]
fn prev_in<S: Slots + ?Sized>(s: &S, p: u32) -> u32 {
    let q = p - 1;
    let v = s.at(q);
    if is_live(v) {
        return q;
    }
    if v == SEP {
        return NONE;
    }
    let z = q - (v & !DEAD);
    if s.at(z) == SEP {
        NONE
    } else {
        z
    }
}

/// `Symbols::merge_at` of slots `s`.
#[inline(always)]
fn merge_in<S: Slots + ?Sized>(s: &mut S, p: u32, q: u32, new: u32) -> u32 {
    debug_assert!(is_live(new) && next_in(s, p) == q);
    let after = q + 1;
    let v = s.at(after);
    let z = if v != SEP && !is_live(v) { after + (v & !DEAD) } else { after };
    // The dead run is now p + 1 ..= z - 1; tag both ends, and `q`, which may lie inside it.
    let tag = DEAD | (z - p - 1);
    s.set(p, new);
    s.set(p + 1, tag);
    s.set(q, tag);
    s.set(z - 1, tag);
    if s.at(z) == SEP {
        NONE
    } else {
        z
    }
}

/// The slots on one side of a separator (`Symbols::halves`), addressed by their positions in the
/// whole: a thread of a merge walks and merges its half's pieces as `Symbols` would.
pub struct Half<'a> {
    slots: &'a mut [u32],
    /// The position of `slots[0]`.
    base: u32,
    pages: &'a [u32],
    /// Separators between the start of the page of `base` and `base` (which this half cannot read).
    seps_before: u32,
}

impl Slots for Half<'_> {
    #[inline(always)]
    fn at(&self, i: u32) -> u32 {
        match i.checked_sub(self.base) {
            Some(k) if (k as usize) < self.slots.len() => self.slots[k as usize],
            _ => SEP,
        }
    }

    #[inline(always)]
    fn set(&mut self, i: u32, v: u32) {
        self.slots[(i - self.base) as usize] = v;
    }
}

/// What a merge reads and writes of the symbols: all of them (`Symbols`) or one `Half`.
pub trait Walk {
    /// The token at `p`, or a value with the `DEAD` bit for a dead slot or a separator.
    fn get(&self, p: u32) -> u32;
    /// The live symbol after live position `p` in its piece, or `NONE`.
    fn next(&self, p: u32) -> u32;
    /// The live symbol before live position `p` in its piece, or `NONE`.
    fn prev(&self, p: u32) -> u32;
    /// Merge live `p` with its next live symbol `q` into `new`; the live symbol after, or `NONE`.
    fn merge_at(&mut self, p: u32, q: u32, new: u32) -> u32;
    /// The piece that slot `p` (not a separator) belongs to.
    fn piece(&self, p: u32) -> u32;
    /// What `piece(p)` and the walks from `p` read first, for prefetching.
    fn refs(&self, p: u32) -> [&u32; 3];
}

impl Walk for Symbols {
    #[inline(always)]
    fn get(&self, p: u32) -> u32 {
        Symbols::get(self, p)
    }

    #[inline(always)]
    fn next(&self, p: u32) -> u32 {
        Symbols::next(self, p)
    }

    #[inline(always)]
    fn prev(&self, p: u32) -> u32 {
        Symbols::prev(self, p)
    }

    #[inline(always)]
    fn merge_at(&mut self, p: u32, q: u32, new: u32) -> u32 {
        Symbols::merge_at(self, p, q, new)
    }

    #[inline(always)]
    fn piece(&self, p: u32) -> u32 {
        Symbols::piece(self, p)
    }

    #[inline(always)]
    fn refs(&self, p: u32) -> [&u32; 3] {
        Symbols::refs(self, p)
    }
}

impl Walk for Half<'_> {
    #[inline(always)]
    fn get(&self, p: u32) -> u32 {
        self.at(p)
    }

    #[inline(always)]
    fn next(&self, p: u32) -> u32 {
        next_in(self, p)
    }

    #[inline(always)]
    fn prev(&self, p: u32) -> u32 {
        prev_in(self, p)
    }

    #[inline(always)]
    fn merge_at(&mut self, p: u32, q: u32, new: u32) -> u32 {
        merge_in(self, p, q, new)
    }

    /// `Symbols::piece`: the separators before `p`'s page from the page table, and those of the
    /// page before `p`, counted where they lie outside this half when the half was cut.
    #[inline(always)]
    fn piece(&self, p: u32) -> u32 {
        let (page, base) = (p as usize >> PAGE_BITS, self.base as usize);
        let start = page << PAGE_BITS;
        let (from, carried) = if start < base { (base, self.seps_before) } else { (start, 0) };
        let before = self.slots[from - base..p as usize - base].iter().filter(|&&v| v == SEP).count() as u32;
        self.pages[page] + carried + before - 1
    }

    #[inline(always)]
    fn refs(&self, p: u32) -> [&u32; 3] {
        let (k, base) = ((p - self.base) as usize, self.base as usize);
        let page_start = (p as usize & !(PAGE - 1)).max(base) - base;
        [&self.slots[k], &self.slots[page_start], &self.pages[p as usize >> PAGE_BITS]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_below as below;

    /// Random merges on random pieces: next, prev and piece agree with a plain vector model.
    #[test]
    fn dead_runs_and_pages_match_a_vector_model() {
        let seed = &mut 0x0DDB_A11C_AFE5_EED5u64;
        for round in 0..200 {
            let mut model: Vec<Vec<(u32, u32)>> = Vec::new(); // (position, symbol) of live symbols
            let mut flat: Vec<Vec<u32>> = Vec::new();
            let mut pos = 1u32;
            for _ in 0..1 + below(seed, 30) {
                let len = 2 + below(seed, if round % 2 == 0 { 8 } else { 90 });
                let piece: Vec<u32> = (0..len).map(|_| below(seed, 5) as u32).collect();
                model.push(piece.iter().enumerate().map(|(k, &s)| (pos + k as u32, s)).collect());
                pos += len as u32 + 1;
                flat.push(piece);
            }
            let mut s = Symbols::from_pieces(flat.iter().map(|p| p.iter().copied())).unwrap();
            let mut new = 100;
            for _ in 0..below(seed, 200) {
                let w = below(seed, model.len());
                if model[w].len() < 2 {
                    continue;
                }
                let k = below(seed, model[w].len() - 1);
                let (p, q) = (model[w][k].0, model[w][k + 1].0);
                assert_eq!(s.next(p), q);
                assert_eq!(s.prev(q), p);
                let after = s.merge_at(p, q, new);
                model[w][k].1 = new;
                model[w].remove(k + 1);
                assert_eq!(after, model[w].get(k + 1).map_or(NONE, |e| e.0));
                new += 1;
            }
            for (w, live) in model.iter().enumerate() {
                for (k, &(p, sym)) in live.iter().enumerate() {
                    assert_eq!(s.get(p), sym);
                    assert_eq!(s.piece(p), w as u32);
                    assert_eq!(s.next(p), live.get(k + 1).map_or(NONE, |e| e.0));
                    assert_eq!(s.prev(p), if k == 0 { NONE } else { live[k - 1].0 });
                }
            }
            let expected: Vec<Vec<u32>> = model.iter().map(|l| l.iter().map(|e| e.1).collect()).collect();
            assert_eq!(s.pieces(), expected);
            let mut seen = Vec::new();
            for r in s.ranges(3) {
                s.pairs_in(r, |p, l, r, w| seen.push((p, l, r, w)));
            }
            let want: Vec<(u32, u32, u32, u32)> = model
                .iter()
                .enumerate()
                .flat_map(|(w, l)| l.windows(2).map(move |x| (x[0].0, x[0].1, x[1].1, w as u32)))
                .collect();
            assert_eq!(seen, want);
        }
    }

    /// The two halves a separator cuts the slots into walk, merge and find pieces as the whole does,
    /// each seeing only its own slots (the other half's read as separators), for every separator.
    #[test]
    fn halves_walk_and_merge_as_the_whole() {
        let seed = &mut 0x5EED_4A1F_0000_0001u64;
        for _ in 0..60 {
            let pieces: Vec<Vec<u32>> = (0..1 + below(seed, 12))
                .map(|_| (0..2 + below(seed, 40)).map(|_| below(seed, 3) as u32).collect())
                .collect();
            let mut whole = Symbols::from_pieces(pieces.iter().map(|p| p.iter().copied())).unwrap();
            // Some merges first, so that the walks cross dead runs.
            for new in 10..10 + below(seed, 30) as u32 {
                let p = 1 + below(seed, whole.len() - 2) as u32;
                let q = if is_live(whole.get(p)) { whole.next(p) } else { NONE };
                if q != NONE {
                    whole.merge_at(p, q, new);
                }
            }
            let seps: Vec<u32> = (0..whole.len() as u32).filter(|&i| whole.get(i) == SEP).collect();
            for &at in &seps {
                let mut twin = Symbols { slots: whole.slots.clone(), pages: whole.pages.clone() };
                let live: Vec<u32> = (1..whole.len() as u32).filter(|&p| is_live(whole.get(p))).collect();
                let want: Vec<(u32, u32, u32, u32)> =
                    live.iter().map(|&p| (p, whole.next(p), whole.prev(p), whole.piece(p))).collect();
                let (mut first, mut second) = twin.halves(at);
                for &(p, next, prev, piece) in &want {
                    let half = if p < at { &mut first } else { &mut second };
                    assert_eq!(
                        (half.get(p), half.next(p), half.prev(p), half.piece(p)),
                        (whole.get(p), next, prev, piece)
                    );
                }
                // A merge in a half writes what it writes in the whole.
                if let Some(&(p, q, _, _)) = want.iter().find(|w| w.1 != NONE) {
                    let mut merged = Symbols { slots: whole.slots.clone(), pages: whole.pages.clone() };
                    let after = merged.merge_at(p, q, 99);
                    let half = if p < at { &mut first } else { &mut second };
                    assert_eq!(half.merge_at(p, q, 99), after);
                    assert_eq!(twin.slots, merged.slots);
                }
            }
        }
    }

    /// Batches laid out in order; a size with no batch to write its slots (they would be taken
    /// as written, uninitialised) is the error, and so is a batch with no size.
    #[test]
    fn batches_and_sizes_pair_up() {
        let fill = |batch: Vec<u32>, out: &mut [std::mem::MaybeUninit<u32>]| {
            for (o, s) in out.iter_mut().zip(batch) {
                o.write(s);
            }
        };
        let batches = vec![vec![1, 2, SEP], vec![3, 4, 5, SEP, 6, 7, SEP]];
        // SAFETY: each batch is exactly its part's slots, and `fill` writes all of them.
        let s = unsafe { Symbols::from_batches(batches.clone(), &[(3, 1), (7, 2)], fill) }.unwrap();
        assert_eq!(s.pieces(), vec![vec![1, 2], vec![3, 4, 5], vec![6, 7]]);
        // SAFETY: as above for the batches there are; the size without one is refused.
        let missing = unsafe { Symbols::from_batches(batches.clone(), &[(3, 1), (7, 2), (1000, 10)], fill) };
        assert!(missing.is_err());
        // SAFETY: as above.
        let extra = unsafe { Symbols::from_batches(batches, &[(3, 1)], fill) };
        assert!(extra.is_err());
    }
}
