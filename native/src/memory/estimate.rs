//! How much memory building a trainer will take, estimated from the counts before it is built.
//!
//! A SuperBPE stage 2 on gigabytes of text can need more memory than the machine has; finding out
//! by an OOM kill loses the run. The estimate replays a sample of the pieces (every `SAMPLE`-th in
//! memory order, at most about `SAMPLE_MAX` of them, so it costs a small part of the real replay)
//! to learn symbols per byte, then adds up what the build holds at its peak (`symbols.rs`,
//! `Trainer::index_pairs`).
//!
//! The official recipe's build (`Rules::official`) is another: every byte of every piece is a
//! symbol while the inherited merges are applied one by one on a table of every pair, which keeps
//! the positions and an entry of each pair they create. No formula of the counts gives that, so
//! official trainers are built on the sample and on half of it: symbols and positions scale with
//! the bytes, and the number of distinct pairs with the power of the bytes that the two samples
//! show. Distinct pairs grow ever slower as text is added (as words do), so the exponent seen on
//! small samples errs high on the whole corpus, not low.

use crate::pairs::PairSketch;
use crate::replay::ChunkSyms;
use crate::tables::Counts;
use crate::train::{CorpusHeap, Rules, Source, Trainer, PAIR_ENTRY_BYTES};

/// Every this many pieces, one is replayed for the estimate (all of them below `EXACT_BELOW`), and
/// every `pieces / SAMPLE_MAX`-th when that is sparser: symbols per byte are as sure from that many,
/// and every 64th piece of a stage 2 of 10 GB was half a million lines to copy and replay before
/// the build could start.
const SAMPLE: usize = 64;
const SAMPLE_MAX: usize = if cfg!(test) { 1 << 10 } else { 1 << 17 };
const EXACT_BELOW: usize = 1 << 16;

/// What the build of a trainer on some counts will hold.
#[derive(Debug, Clone, Copy)]
pub struct Estimate {
    /// Pieces of at least 2 bytes (the others drop out).
    pub pieces: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Symbols after replay (estimated from the sample).
    pub symbols: u64,
    /// Peak of the memory the build adds to what the process already holds, in bytes.
    pub peak_bytes: u64,
}

/// Bytes the build holds per piece at its peak (the pair index): its count (8), its separator (4)
/// and its share of the page table (1/8, rounded up with the symbols').
const PER_PIECE: u64 = 13;
/// Bytes per symbol at that peak: the symbol (4), its index position (4), its share of the page
/// table (1/8) and of the index's per-thread scratch (about 1).
const PER_SYMBOL_X8: u64 = 8 * 9 + 1;
/// Bytes per piece of replay's output besides its symbols: its length (4) and count (8).
const REPLAYED_PER_PIECE: u64 = 12;

/// The build has two peaks. At the end of replay the replayed chunks (2 or 4 bytes per symbol, see
/// `ChunkSyms`) stand beside the counts; at the pair index the trainer's arrays stand, and counts
/// handed over to the trainer (`consume`) were freed before they were laid out. Which is higher
/// depends on how much the counts hold against the symbols they replay to. A cut build (many
/// distinct pairs, `cut_peak`) frees handed-over counts during replay already.
pub fn estimate(
    counts: &Counts,
    replay: &[(Vec<u8>, Vec<u8>)],
    rules: &Rules,
    consume: bool,
) -> Result<Estimate, String> {
    // The pieces and their bytes without reading every key: short keys are held in the memory
    // order itself, and the long ones (all of at least 2 bytes; a count of 0 is only there when
    // added so, and counts as a piece) are the arenas' totals. The sample
    // is every `SAMPLE`-th entry of the memory order (the build reads the keys in that order too,
    // and reuses it), so only those keys are read.
    let order = counts.memory_order();
    let (long_pieces, long_bytes) = counts.long_key_totals();
    let (pieces, bytes) = order
        .short
        .iter()
        .map(|(key, count)| (key[7] as u64, *count))
        .filter(|&(len, count)| len >= 2 && count > 0)
        .fold((long_pieces, long_bytes), |(pieces, bytes), (len, _)| (pieces + 1, bytes + len));
    let step = if pieces <= EXACT_BELOW as u64 {
        1
    } else {
        SAMPLE.max(usize::try_from(pieces).unwrap_or(usize::MAX).div_ceil(SAMPLE_MAX))
    };
    let mut sample = Counts::default();
    let mut sample_bytes = 0u64;
    let mut add = |piece: &[u8], count: u64| {
        if piece.len() < 2 || count == 0 {
            return Ok(());
        }
        sample_bytes += piece.len() as u64;
        sample.add(piece, count)
    };
    if step == 1 {
        // Few pieces: all of them, so the estimate of a small stage is exact.
        for (piece, count) in counts.iter() {
            add(piece, count)?;
        }
    } else {
        for (key, count) in order.short.iter().step_by(step) {
            add(&key[..key[7] as usize], *count)?;
        }
        for &(arena, ref list) in &order.long {
            for &(loc, count) in list.iter().step_by(step) {
                add(counts.arena_key(arena, loc), count)?;
            }
        }
    }
    drop(order);
    let scale = |sampled: u64| {
        if sample_bytes == 0 {
            0
        } else {
            (sampled as u128 * bytes as u128).div_ceil(sample_bytes as u128) as u64
        }
    };
    if rules.official() {
        return official(&sample, sample_bytes, bytes, pieces, step == 1, replay, rules);
    }
    // Only the symbol and pair counts are needed: replay the sample without building a trainer.
    let (sampled_symbols, sampled_pairs) = Trainer::replayed(&sample, replay)?;
    let symbols = scale(sampled_symbols);
    let index = PER_PIECE * pieces + (PER_SYMBOL_X8 * symbols).div_ceil(8);
    // Without merges to replay the symbols are the pieces' bytes, built while the counts stand.
    if replay.is_empty() {
        return Ok(Estimate { pieces, bytes, symbols, peak_bytes: index });
    }
    let width = if ChunkSyms::fits_narrow(256 + replay.len()) { 2 } else { 4 };
    let replayed = width * symbols + REPLAYED_PER_PIECE * pieces;
    // Handed-over counts that are only listed keep their list until replay ends (replay reads it).
    let (freed, listed) = if consume { (counts.heap_bytes(), counts.list_bytes()) } else { (0, 0) };
    // The sample's distinct pairs are at most the whole corpus's: when they alone are many, the
    // build cuts (see `CUT_FROM_PAIRS`).
    let peak_bytes = if sampled_pairs < CUT_FROM_PAIRS {
        replayed.max(index.saturating_sub(freed))
    } else {
        let sketch = PairSketch::bytes_for(PairSketch::bits_for(counts.heap_bytes()));
        cut_peak(replayed, sketch, index, freed, listed)
    };
    Ok(Estimate { pieces, bytes, symbols, peak_bytes })
}

/// Below this many distinct pairs the build is estimated as if laid out whole: a build cuts its
/// pieces only when they have more pairs than twice the merges to choose, which the estimate is
/// not told, and a small build's memory hardly matters.
const CUT_FROM_PAIRS: u64 = 1 << 16;
/// The laid-out cut pieces hold at most about this share of the replayed symbols (English at 1.2 GB
/// lays out 7% of them, see `train/cut.rs`).
const CUT_SHARE: u64 = 8;

/// A cut build's two peaks (`train/cut.rs`): during replay, one pair sketch per thread (`sketch`
/// bytes each) beside the replayed chunks; then the chunks (kept), the summed sketch and the copy
/// of its counters θ is picked from, and the cut pieces' trainer, the counts freed. Counts handed
/// over (`freed` is their size, else 0) are freed as replay passes them, so the chunks grow into
/// their memory and add only what they outgrow it by; but for their list of entries (`listed`
/// bytes of `freed`), which replay reads to the end.
fn cut_peak(replayed: u64, sketch: u64, index: u64, freed: u64, listed: u64) -> u64 {
    let threads = rayon::current_num_threads().max(1) as u64;
    let replay = threads * sketch + replayed.saturating_sub(freed - listed);
    let cut = (replayed + 2 * sketch + index / CUT_SHARE).saturating_sub(freed);
    replay.max(cut)
}

/// The official build's estimate from official trainers on the sample (and on every other piece
/// of it, unless the sample is the whole corpus).
fn official(
    sample: &Counts,
    sample_bytes: u64,
    bytes: u64,
    pieces: u64,
    exact: bool,
    replay: &[(Vec<u8>, Vec<u8>)],
    rules: &Rules,
) -> Result<Estimate, String> {
    let build = |counts: &Counts| -> Result<(CorpusHeap, u64), String> {
        let t = Trainer::with_rules(Source::Borrowed(counts), replay, rules, usize::MAX, &mut |_, _, _| Ok(()))?;
        Ok((t.corpus_heap(), t.symbol_count() as u64))
    };
    let (heap, sample_symbols) = build(sample)?;
    let table_bytes = |slots: u64| (slots * 8).div_ceil(7) * PAIR_ENTRY_BYTES;
    if exact || sample_bytes == 0 {
        let peak_bytes = heap.linear + table_bytes(heap.pair_slots);
        return Ok(Estimate { pieces, bytes, symbols: sample_symbols, peak_bytes });
    }
    let mut half = Counts::default();
    let mut half_bytes = 0u64;
    for (piece, count) in sample.iter().step_by(2) {
        half.add(piece, count)?;
        half_bytes += piece.len() as u64;
    }
    let (half_heap, _) = build(&half)?;
    let ratio = bytes as f64 / sample_bytes as f64;
    // Pairs grow as bytes^power; the two samples give the power (at most 1: never faster than text).
    let power = if half_heap.pair_entries > 0 && heap.pair_entries > half_heap.pair_entries && sample_bytes > half_bytes
    {
        ((heap.pair_entries as f64 / half_heap.pair_entries as f64).ln()
            / (sample_bytes as f64 / half_bytes as f64).ln())
        .clamp(0.0, 1.0)
    } else {
        1.0
    };
    let slots = (heap.pair_slots.max(heap.pair_entries) as f64 * ratio.powf(power)).ceil() as u64;
    let linear = (heap.linear as f64 * ratio).ceil() as u64;
    let symbols = (sample_symbols as f64 * ratio).ceil() as u64;
    // A hash table's room is a power of two buckets: the next one up from what the pairs need.
    let buckets = (slots * 8).div_ceil(7).next_power_of_two();
    Ok(Estimate { pieces, bytes, symbols, peak_bytes: linear + buckets * PAIR_ENTRY_BYTES })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Below the sampling size the symbol count is exact: compare with a built trainer.
    #[test]
    fn small_counts_are_estimated_exactly() {
        let mut c = Counts::default();
        for (p, n) in [("hello world\n", 3), ("hello there\n", 1), ("a", 5), ("hi\n", 2)] {
            c.add(p.as_bytes(), n).unwrap();
        }
        let replay = vec![(b"h".to_vec(), b"e".to_vec()), (b"l".to_vec(), b"l".to_vec())];
        let e = estimate(&c, &replay, &Rules::default(), false).unwrap();
        let t = Trainer::with_replay(&c, &replay).unwrap();
        assert_eq!(e.pieces, 3);
        assert_eq!(e.bytes, 12 + 12 + 3);
        assert_eq!(e.symbols, t.symbol_count() as u64);
        assert!(e.peak_bytes >= 9 * e.symbols + 13 * e.pieces);
    }

    /// Above `EXACT_BELOW` pieces the symbols are estimated from a sample of at most about
    /// `SAMPLE_MAX` of them (every 64th would be more here): close to the built trainer's.
    #[test]
    fn a_sample_of_many_pieces_estimates_their_symbols() {
        let words = ["the ", "of ", "tokens ", "merge ", "and ", "a ", "superword ", "line "];
        let seed = &mut 0x5EED_0F5A_3B1E_0001u64;
        let mut c = Counts::default();
        while c.len() < 3 * EXACT_BELOW {
            let n = 3 + crate::test_below(seed, 12);
            let line: String = (0..n).map(|_| words[crate::test_below(seed, words.len())]).collect();
            c.add(format!("{line}{}\n", c.len()).as_bytes(), 1).unwrap();
        }
        assert!(c.len().div_ceil(SAMPLE) > SAMPLE_MAX, "the cap must bite");
        let replay: Vec<(Vec<u8>, Vec<u8>)> =
            [("t", "h"), ("th", "e"), ("e", " "), ("o", "f"), ("a", "n"), ("an", "d"), ("e", "r")]
                .iter()
                .map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec()))
                .collect();
        let e = estimate(&c, &replay, &Rules::default(), false).unwrap();
        let (symbols, _) = Trainer::replayed(&c, &replay).unwrap();
        let error = (e.symbols as f64 / symbols as f64 - 1.0).abs();
        assert!(error < 0.02, "estimated {} symbols for {symbols}", e.symbols);
        assert_eq!(e.pieces, c.len() as u64);
    }

    /// Counts handed over are freed before the index is built: the build then adds what the index
    /// needs beyond them, but never less than the replayed chunks that stand beside them.
    #[test]
    fn handed_over_counts_lower_the_estimate_to_the_larger_peak() {
        let mut c = Counts::default();
        for i in 0..5000u32 {
            c.add(format!("line {i} of some text that never repeats\n").as_bytes(), 1).unwrap();
        }
        let replay = vec![(b"e".to_vec(), b" ".to_vec()), (b"t".to_vec(), b"e".to_vec())];
        let kept = estimate(&c, &replay, &Rules::default(), false).unwrap();
        let handed = estimate(&c, &replay, &Rules::default(), true).unwrap();
        let replayed = 2 * kept.symbols + 12 * kept.pieces;
        assert_eq!(handed.peak_bytes, replayed.max(kept.peak_bytes.saturating_sub(c.heap_bytes())));
        assert!(handed.peak_bytes < kept.peak_bytes && handed.peak_bytes >= replayed);
        assert_eq!(
            estimate(&c, &[], &Rules::default(), true).unwrap().peak_bytes,
            estimate(&c, &[], &Rules::default(), false).unwrap().peak_bytes
        );
    }

    /// The official build keeps every byte as a symbol and every pair the replay creates: below
    /// the sampling size its estimate is that trainer's own memory.
    #[test]
    fn official_rules_are_estimated_from_their_own_build() {
        let mut c = Counts::default();
        for (p, n) in [("hello world\n", 3), ("hello there\n", 1), ("a", 5), ("hi\n", 2)] {
            c.add(p.as_bytes(), n).unwrap();
        }
        let replay = vec![(b"h".to_vec(), b"e".to_vec()), (b"l".to_vec(), b"l".to_vec())];
        let rules = Rules { tie_break_ids: true, merge_duplicates: true, drop_absent: true, ..Default::default() };
        let e = estimate(&c, &replay, &rules, false).unwrap();
        let t = Trainer::with_rules(Source::Borrowed(&c), &replay, &rules, usize::MAX, &mut |_, _, _| Ok(())).unwrap();
        assert_eq!(e.symbols, t.symbol_count() as u64);
        let heap = t.corpus_heap();
        assert_eq!(e.peak_bytes, heap.linear + (heap.pair_slots * 8).div_ceil(7) * PAIR_ENTRY_BYTES);
        assert!(e.peak_bytes > estimate(&c, &replay, &Rules::default(), false).unwrap().peak_bytes);
    }

    /// A build with many distinct pairs is cut (`train/cut.rs`): the estimate covers the pair
    /// sketches of replay and what the cut trainer holds (the replayed pieces kept whole among it).
    #[test]
    fn a_cut_build_is_covered() {
        let letters = b"abcdefghijklmnopqrstuvwxyz";
        let replay: Vec<(Vec<u8>, Vec<u8>)> =
            letters.iter().flat_map(|&a| letters.iter().map(move |&b| (vec![a], vec![b]))).collect();
        let mut c = Counts::default();
        let seed = &mut 0x0123_4567_89AB_CDEFu64;
        for _ in 0..30_000 {
            let piece: Vec<u8> = (0..24).map(|_| letters[crate::test_below(seed, 26)]).collect();
            c.add(&piece, 1).unwrap();
        }
        let (symbols, pairs) = Trainer::replayed(&c, &replay).unwrap();
        assert!(pairs >= CUT_FROM_PAIRS, "{pairs} pairs");
        let e = estimate(&c, &replay, &Rules::default(), false).unwrap();
        assert_eq!(e.symbols, symbols);
        let threads = rayon::current_num_threads() as u64;
        let sketch = PairSketch::bytes_for(PairSketch::bits_for(c.heap_bytes()));
        assert!(e.peak_bytes >= 2 * symbols + threads * sketch);
        let t = Trainer::with_replay_cut(&c, &replay, 50, None, crate::train::WARM_PAIRS).unwrap();
        assert!(t.is_cut());
        assert!(e.peak_bytes >= t.corpus_heap().linear, "{} < {}", e.peak_bytes, t.corpus_heap().linear);
    }
}
