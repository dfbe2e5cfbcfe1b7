//! Native engine of superbpe: pre-tokenizers, piece counting, BPE training and encoding.
//!
//! The pure-Rust core lives in the modules below and is tested with `cargo test`; the PyO3
//! bindings (`superbpe._native`) are in `py` and only built with the `python` feature.

pub mod ascii_classes;
pub mod batch;
pub mod bpe;
mod busy;
pub mod byte_table;
pub mod bytesmap;
pub mod count;
pub mod countsfile;
pub mod cuts;
pub mod encode;
pub mod encode_levels;
pub mod hf_model;
pub mod joins;
pub mod memory;
pub mod pairs;
pub mod piecemap;
pub mod replay;
pub mod scan;
pub mod specials;
pub mod symbols;
pub mod tables;
pub mod tokenfiles;
pub mod train;
pub mod unicode;
pub mod valid_files;

#[cfg(feature = "python")]
mod py;

/// A small deterministic generator for the randomised unit tests (xorshift64).
#[cfg(test)]
pub(crate) fn test_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A deterministic draw below `n` for the randomised unit tests.
#[cfg(test)]
pub(crate) fn test_below(state: &mut u64, n: usize) -> usize {
    (test_random(state) % n as u64) as usize
}
