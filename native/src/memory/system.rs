//! Facts about the system the memory code rounds to, kept apart so that the modules that map
//! files (`pages`) and the one that catches faults in those maps (`sigbus`) both read them
//! without reading each other.

/// The system's page size (what `madvise` ranges and fault addresses are rounded to).
pub fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}
