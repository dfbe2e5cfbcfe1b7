//! Large id buffers kept for reuse between calls.
//!
//! A batch's ids go into buffers of megabytes (one per thread of a batch, and the joined result).
//! Memory the process has not written yet costs the kernel a page fault and a zeroed page per page
//! when first written, a sizeable share of encoding a batch whose pieces are cached: the arrays
//! that hand ids to Python give their buffer back here when they go, parts are given back once
//! joined, and the next batch takes them already mapped. What is kept is bounded
//! ([`KEPT_BYTES`]), and buffers below [`MIN_BYTES`] are left to the allocator, which reuses
//! small blocks anyway.
//!
//! New memory is asked for huge pages only where threads write at once ([`Pages::Huge`]): their
//! 4 KiB faults contend, and a batch's first pass on two threads spent more in the kernel than the
//! second thread saved. One thread alone takes the allocator's pages ([`Pages::Small`]): on a VM
//! that hands freed memory back to its host, a huge page is often fresh host memory, and a batch on
//! one thread after other work ran at half the speed in huge pages that it ran in 4 KiB ones.

use std::sync::{Mutex, MutexGuard, TryLockError};

use super::advise_huge;

/// Most bytes of buffers kept at once (what reuse may hold beyond what is in use).
pub const KEPT_BYTES: usize = 256 << 20;
/// Smaller buffers are not kept.
pub const MIN_BYTES: usize = 1 << 20;
/// Most buffers kept at once.
const KEPT: usize = 64;
/// A kept buffer more than this many times the size asked for is not taken for it.
const OVERSIZE: usize = 4;
/// A kept buffer is grown to the size asked for only from at least this share of it: growing a
/// much smaller one saves little fresh memory.
const GROW_FROM: usize = 2;

/// The pages new memory of a buffer is asked for (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pages {
    /// Written by one thread alone: the allocator's pages.
    Small,
    /// Written by several threads at once: huge pages asked for before it is first written.
    Huge,
}

/// Buffers of `T` given back, for the next [`Spares::take`].
pub struct Spares<T> {
    kept: Mutex<Vec<Vec<T>>>,
}

/// Buffers of 32-bit ids.
pub static IDS: Spares<u32> = Spares::new();
/// Buffers of 16-bit ids.
pub static NARROW_IDS: Spares<u16> = Spares::new();

impl<T: Copy> Default for Spares<T> {
    fn default() -> Self {
        Spares::new()
    }
}

impl<T: Copy> Spares<T> {
    pub const fn new() -> Spares<T> {
        Spares { kept: Mutex::new(Vec::new()) }
    }

    /// An empty vector with room for at least `n` elements: the smallest kept one that has it
    /// without being [`OVERSIZE`] times larger, else the largest kept one below `n` (but not below
    /// `n / GROW_FROM`) grown to it (a large block grows by remapping its pages, so only the new
    /// tail is new memory), else a new one. New memory is asked for `pages` before it is first
    /// written. A much larger buffer stays for a request its size (a small result in it would hold
    /// it all, or shrink it).
    pub fn take(&self, n: usize, pages: Pages) -> Vec<T> {
        let wanted = if n * size_of::<T>() >= MIN_BYTES { self.kept() } else { None };
        if let Some(mut kept) = wanted {
            let by_capacity = |v: &(usize, &Vec<T>)| v.1.capacity();
            let fits =
                kept.iter().enumerate().filter(|(_, v)| (n..=n.saturating_mul(OVERSIZE)).contains(&v.capacity()));
            let below = kept.iter().enumerate().filter(|(_, v)| v.capacity() < n && v.capacity() * GROW_FROM >= n);
            if let Some(i) = fits.min_by_key(by_capacity).or_else(|| below.max_by_key(by_capacity)).map(|(i, _)| i) {
                let mut v = kept.swap_remove(i);
                drop(kept);
                if v.capacity() < n {
                    v.reserve_exact(n);
                    // The grown part is new memory, which an advice before never covered.
                    advise(&v, pages);
                }
                return v;
            }
        }
        let v = Vec::with_capacity(n);
        advise(&v, pages);
        v
    }

    /// Keep `v` (emptied) for a later [`Spares::take`], unless it is small; when the kept buffers
    /// would then be too many or too large, the smallest go.
    pub fn give(&self, mut v: Vec<T>) {
        if v.capacity() * size_of::<T>() < MIN_BYTES || v.capacity() * size_of::<T>() > KEPT_BYTES {
            return;
        }
        v.clear();
        let Some(mut kept) = self.kept() else { return };
        kept.push(v);
        let bytes = |kept: &Vec<Vec<T>>| kept.iter().map(|v| v.capacity() * size_of::<T>()).sum::<usize>();
        while kept.len() > KEPT || bytes(&kept) > KEPT_BYTES {
            let smallest = (0..kept.len()).min_by_key(|&i| kept[i].capacity()).expect("not empty");
            drop(kept.swap_remove(smallest));
        }
    }

    /// Bytes kept now.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.kept().map_or(0, |kept| kept.iter().map(|v| v.capacity() * size_of::<T>()).sum())
    }

    /// The kept buffers, or none while another thread holds them: nothing ever waits here (a
    /// process forked while a thread held the lock must not wait for it forever), and a buffer
    /// then goes to or comes from the allocator as without reuse.
    fn kept(&self) -> Option<MutexGuard<'_, Vec<Vec<T>>>> {
        match self.kept.try_lock() {
            Ok(kept) => Some(kept),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// Give the system back the whole pages of `v`'s room past its length, keeping the room itself:
/// an array that holds a batch's ids then holds in memory only the pages its ids are on, and
/// when its buffer comes back here the room is still there for a batch of the same size (shrinking
/// the allocation instead left a buffer too small for the same batch's room, which then took
/// fresh pages every call). Room never written has no pages, and costs only the call.
pub fn release_room<T>(v: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        let page = super::system::page_size();
        let base = v.as_ptr() as usize;
        let start = (base + v.len() * size_of::<T>()).next_multiple_of(page);
        let end = (base + v.capacity() * size_of::<T>()) / page * page;
        if end > start {
            // SAFETY: `[start, end)` is whole pages inside `v`'s allocation past its elements:
            // memory `v` owns and holds nothing in, which MADV_DONTNEED on private anonymous
            // memory refills with zeros when it is next touched (the allocator's own records lie
            // outside the allocation, and stay untouched).
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Ask for huge pages for `v`'s memory when `pages` says so.
fn advise<T>(v: &Vec<T>, pages: Pages) {
    if pages == Pages::Huge {
        advise_huge(v.as_ptr() as usize, v.capacity() * size_of::<T>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `[start, end)` (page-aligned) the process holds, by `mincore`.
    #[cfg(target_os = "linux")]
    fn resident_pages(start: usize, end: usize) -> usize {
        let page = crate::memory::system::page_size();
        let mut held = vec![0u8; (end - start) / page];
        // SAFETY: `held` has a byte per page of the range, which lies in memory the test owns.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, end - start, held.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore");
        held.iter().filter(|&&b| b & 1 == 1).count()
    }

    /// The room past a buffer's ids goes out of memory, the ids and the room stay.
    #[cfg(target_os = "linux")]
    #[test]
    fn released_room_keeps_the_ids_and_the_room_but_not_its_pages() {
        let page = crate::memory::system::page_size();
        let ids_per_page = page / 4;
        let mut v: Vec<u32> = (0..64 * ids_per_page as u32).collect();
        let capacity = v.capacity();
        let len = 3 * ids_per_page + 5;
        v.truncate(len);
        let base = v.as_ptr() as usize;
        let (first_free, end) = ((base + 4 * len).next_multiple_of(page), (base + 4 * capacity) / page * page);
        assert!(resident_pages(first_free, end) > 0);
        release_room(&v);
        assert_eq!(resident_pages(first_free, end), 0, "the room's pages are given back");
        assert_eq!(v.capacity(), capacity);
        assert!(v.iter().enumerate().all(|(i, &id)| id == i as u32));
        v.extend(0..10);
        assert_eq!(v[len..], (0..10).collect::<Vec<u32>>()[..]);
    }

    const MB_IDS: usize = MIN_BYTES / 4;

    /// A buffer given back is taken again by a request it fits (the smallest that fits), small
    /// ones are never kept, and what is kept stays within its bounds.
    #[test]
    fn takes_back_what_was_given_within_bounds() {
        let spares: Spares<u32> = Spares::new();
        let (a, b) = (spares.take(2 * MB_IDS, Pages::Huge), spares.take(4 * MB_IDS, Pages::Huge));
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        spares.give(b);
        spares.give(a);
        let got = spares.take(MB_IDS, Pages::Huge);
        assert_eq!(got.as_ptr(), pa, "the smallest buffer that fits");
        assert!(got.is_empty() && got.capacity() >= MB_IDS);
        let second = spares.take(3 * MB_IDS, Pages::Huge);
        assert_eq!(second.as_ptr(), pb);
        assert_eq!(spares.kept_bytes(), 0);
        spares.give(Vec::with_capacity(2 * MB_IDS));
        let fresh = spares.take(5 * MB_IDS, Pages::Huge);
        assert!(fresh.capacity() >= 5 * MB_IDS && spares.kept_bytes() == 2 * MIN_BYTES, "too small to grow");
        drop(spares.take(2 * MB_IDS, Pages::Huge));
        spares.give(Vec::with_capacity(3 * MB_IDS));
        let grown = spares.take(5 * MB_IDS, Pages::Huge);
        assert!(grown.capacity() >= 5 * MB_IDS && spares.kept_bytes() == 0, "the largest, grown");
        spares.give(Vec::with_capacity(8 * MB_IDS));
        let _small = spares.take(MB_IDS, Pages::Huge);
        assert_eq!(spares.kept_bytes(), 8 * MIN_BYTES, "a much larger buffer stays for its size");
        assert_eq!(spares.take(7 * MB_IDS, Pages::Huge).capacity(), 8 * MB_IDS);
        spares.give(Vec::with_capacity(MB_IDS / 2));
        assert_eq!(spares.kept_bytes(), 0, "small buffers are left to the allocator");
        for _ in 0..KEPT + 10 {
            spares.give(vec![7; MB_IDS]);
        }
        assert!(spares.kept_bytes() <= KEPT_BYTES);
        assert!(spares.kept().unwrap().len() <= KEPT);
        assert!(spares.take(MB_IDS, Pages::Huge).is_empty(), "a kept buffer comes back empty");
    }
}
