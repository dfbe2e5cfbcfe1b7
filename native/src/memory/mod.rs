//! Memory: what building a trainer will take (`estimate`), and the low-level page and cache hints
//! the tables and the trainer use (`pages`: prefetch, huge-page advice, file mappings whose read
//! pages are given back).

mod estimate;
mod pages;

pub use estimate::{estimate, Estimate};
pub use pages::{advise_huge, prefetch, MappedFile};
