//! Memory: what building a trainer will take (`estimate`), when a count must stop (`ceiling`),
//! the low-level page and cache hints the tables and the trainer use (`pages`: prefetch, huge-page
//! advice, file mappings whose read pages are given back), files cut short while mapped (`sigbus`),
//! the page size these round to (`system`), and id buffers kept for reuse between encoding calls
//! (`spare`).

mod ceiling;
mod estimate;
mod pages;
mod sigbus;
pub mod spare;
mod system;

pub use ceiling::{resident_bytes, Ceiling, Exceeded};
pub use estimate::{estimate, Estimate};
pub use pages::{advise_huge, huge_vec, prefetch, CutMark, MappedFile};
