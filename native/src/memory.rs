//! How much memory building a trainer will take, estimated from the counts before it is built.
//!
//! A SuperBPE stage 2 on gigabytes of text can need more memory than the machine has; finding out
//! by an OOM kill loses the run. The estimate replays a sample of the pieces (every `SAMPLE`-th,
//! so it costs a small part of the real replay) to learn symbols per byte, then adds up what the
//! build holds at its peak (`symbols.rs`, `Trainer::index_pairs`).

use crate::count::Counts;
use crate::train::Trainer;

/// Every this many pieces, one is replayed for the estimate (all of them below `EXACT_BELOW`).
const SAMPLE: usize = 64;
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
/// table (1/8) and of the index's per-thread scratch (about 1). (Replay's output, 4 bytes per
/// symbol and 12 per piece, is freed as the symbols are laid out, and counts handed over to the
/// trainer are freed before that: with the several symbols per piece of real text, the earlier
/// phases hold less.)
const PER_SYMBOL_X8: u64 = 8 * 9 + 1;

pub fn estimate(counts: &Counts, replay: &[(Vec<u8>, Vec<u8>)]) -> Result<Estimate, String> {
    let (mut pieces, mut bytes) = (0u64, 0u64);
    let mut sample = Counts::default();
    let mut sample_bytes = 0u64;
    let mut sampled = Vec::new();
    for (piece, count) in counts.iter().filter(|(p, c)| p.len() >= 2 && *c > 0) {
        // Every `SAMPLE`-th piece; the first `EXACT_BELOW` are all kept until it is clear there are more.
        if pieces < EXACT_BELOW as u64 {
            sampled.push((piece, count));
        } else if pieces.is_multiple_of(SAMPLE as u64) {
            sample.add(piece, count)?;
            sample_bytes += piece.len() as u64;
        }
        pieces += 1;
        bytes += piece.len() as u64;
    }
    let step = if pieces <= EXACT_BELOW as u64 { 1 } else { SAMPLE };
    for &(piece, count) in sampled.iter().step_by(step) {
        sample.add(piece, count)?;
        sample_bytes += piece.len() as u64;
    }
    drop(sampled);
    let t = Trainer::with_replay(&sample, replay)?;
    let sample_symbols = t.symbol_count() as u64;
    let symbols = if sample_bytes == 0 {
        0
    } else {
        (sample_symbols as u128 * bytes as u128).div_ceil(sample_bytes as u128) as u64
    };
    let peak_bytes = PER_PIECE * pieces + (PER_SYMBOL_X8 * symbols).div_ceil(8);
    Ok(Estimate { pieces, bytes, symbols, peak_bytes })
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
        let e = estimate(&c, &replay).unwrap();
        let t = Trainer::with_replay(&c, &replay).unwrap();
        assert_eq!(e.pieces, 3);
        assert_eq!(e.bytes, 12 + 12 + 3);
        assert_eq!(e.symbols, t.symbol_count() as u64);
        assert!(e.peak_bytes >= 9 * e.symbols + 13 * e.pieces);
    }
}
