//! Native engine of superbpe: pre-tokenizers, piece counting, BPE training and encoding.
//!
//! The pure-Rust core lives in the modules below and is tested with `cargo test`; the PyO3
//! bindings (`superbpe._native`) are in `py` and only built with the `python` feature.

pub mod ascii_classes;
pub mod bpe;
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

#[cfg(feature = "python")]
mod py;

/// Every allocation of the crate (and of the extension) goes through mimalloc. A SuperBPE stage 2
/// frees gigabytes while the next phase asks for as much (replay frees the count's arenas as it
/// passes them and writes its symbols; the cut, the index and the trainer follow). The system
/// allocator gives each large block back to the kernel when it is freed, and the next one faults in
/// fresh pages that the kernel zeroes first; mimalloc keeps freed memory for the next request
/// (and its small allocations, the trainer's many short vectors, are cheaper too).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
