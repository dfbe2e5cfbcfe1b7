//! Memory: hints shared by the counting tables and the trainer (cache-line prefetch, transparent
//! huge pages for large, randomly probed tables), and mapped files whose read pages are given back.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::sigbus::Watched;
use super::system::page_size;
use crate::valid_files::Stamp;

/// Ask for transparent huge pages on the 2 MiB-aligned part of `[addr, addr + len)`, before
/// it is first touched (the memory of a fresh large allocation is not mapped yet).
pub fn advise_huge(addr: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = addr.next_multiple_of(HUGE);
        let end = (addr + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: MADV_HUGEPAGE only changes how memory is backed, never its contents or what
            // is mapped, so no range can make it unsound (callers pass one of their own
            // allocations; errors, e.g. for unmapped addresses, are ignored: it is a hint).
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, len);
}

/// The first `n` items of `items` in a vector whose memory is asked for huge pages before it is
/// first written: large tables probed at random are fresh memory (first filled, then at each
/// growth), and `vec!` or `collect` would write their pages before any advice could reach them.
pub fn huge_vec<T>(n: usize, items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    advise_huge(v.as_ptr() as usize, n * size_of::<T>());
    v.extend(items.take(n));
    v
}

/// Hint the CPU to load the cache line of `r` (a no-op where there is no prefetch instruction).
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults, even on a bad address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(r as *const T as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

/// A read-only memory map of a whole file, read front to back, whose pages can be given back
/// once they are read ([`PageReleaser`]): counting a file larger than memory then holds only
/// about a window of it. The map is watched for the file being cut short meanwhile
/// ([`super::sigbus`]): what is read past the new end reads as zeros, and [`Self::cut_short`]
/// says so, instead of the read ending the process.
pub struct MappedFile {
    /// Dropped before `map` (fields drop in order): the range stops being watched before it is
    /// unmapped.
    _watch: Option<Watched>,
    map: memmap2::Mmap,
    mark: CutMark,
}

impl MappedFile {
    /// Map `file` whole, with a hint that it is read sequentially; `name` is its path (it names
    /// the file in errors, and [`CutMark::cut_short`] looks there for its size). `None` where the
    /// map could not be watched for truncation (every slot taken): the caller reads the file
    /// instead. Outside Linux maps are not watched.
    ///
    /// # Safety
    /// The file must not be modified while the map lives (the bytes would change under `&[u8]`
    /// borrows). A truncation is caught instead of faulting (on Linux): the bytes past the new
    /// end read as zeros and [`Self::cut_short`] holds, so a reader must check it before it
    /// trusts what it read.
    pub unsafe fn open(file: &std::fs::File, name: &str) -> std::io::Result<Option<MappedFile>> {
        // SAFETY: the caller guarantees the file's bytes stay unchanged while mapped.
        let map = unsafe { memmap2::Mmap::map(file) }?;
        let _ = map.advise(memmap2::Advice::Sequential); // a hint: failure changes nothing
        let mark = CutMark {
            name: name.into(),
            cut: Arc::new(AtomicBool::new(false)),
            len: map.len() as u64,
            stamp: file.metadata().ok().as_ref().map(Stamp::of),
        };
        // SAFETY: `map` is a read-only mapping of the file, page-aligned (offset 0), owned by the
        // `MappedFile` made below, whose `_watch` is dropped before its `map`.
        let watch = unsafe { Watched::new(map.as_ptr() as usize, map.len(), mark.cut.clone()) };
        if watch.is_none() && cfg!(target_os = "linux") && !map.is_empty() {
            return Ok(None);
        }
        cut_for_test(name, map.len());
        Ok(Some(MappedFile { _watch: watch, map, mark }))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The file's stamp when it was mapped ([`crate::valid_files`]).
    pub fn stamp(&self) -> Option<Stamp> {
        self.mark.stamp
    }

    /// Whether the file was found cut short while mapped ([`CutMark::cut_short`]): bytes read
    /// from the map may be zeros that were never the file's.
    pub fn cut_short(&self) -> bool {
        self.mark.cut_short()
    }

    /// Whether a read of the map faulted past the file's end: the part of [`Self::cut_short`]
    /// that costs no system call, for a reader to ask as it goes (a cut inside the last page
    /// raises no fault; ask [`Self::cut_short`] once done).
    pub fn read_past_end(&self) -> bool {
        self.mark.cut.load(Ordering::Acquire)
    }

    /// What [`Self::cut_short`] reads, kept past the map.
    pub fn cut_mark(&self) -> CutMark {
        self.mark.clone()
    }

    /// A releaser for this map's pages (borrowing the map, so it cannot outlive it).
    pub fn pages(&self) -> PageReleaser<'_> {
        PageReleaser {
            base: self.map.as_ptr() as usize,
            len: self.map.len(),
            dropped: 0,
            page: page_size(),
            _map: PhantomData,
        }
    }
}

/// Whether a [`MappedFile`] was found cut short, for a reader that copies bytes out of maps it
/// may let go before it is done (the trainer's build frees the counts, and their maps, as it
/// goes).
#[derive(Clone)]
pub struct CutMark {
    name: Arc<str>,
    /// Set when a read faulted past the file's end ([`super::sigbus`]).
    cut: Arc<AtomicBool>,
    /// The file's size, and its stamp (which file it was, and how it stood), when mapped
    /// (`None` where it could not be read).
    len: u64,
    stamp: Option<Stamp>,
}

impl CutMark {
    /// Whether a read faulted past the file's end, or the file (still at its path) is now shorter
    /// than it was mapped: a cut inside the last page raises no fault, and the bytes past it read
    /// as zeros there too. A file no longer at its path (removed, or replaced by another) keeps
    /// its bytes in the map and is not taken as cut.
    pub fn cut_short(&self) -> bool {
        self.cut.load(Ordering::Acquire)
            || std::fs::metadata(&*self.name)
                .is_ok_and(|m| self.stamp.is_some_and(|s| s.is_of_file(&m)) && m.len() < self.len)
    }

    /// The name the map was opened with.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Tests reach a truncation while a file is mapped without racing another process: with
/// `SUPERBPE_TEST_CUT_MAPPED` set to a byte count `n`, a file of more than `n` bytes is cut to
/// `n` bytes as soon as it is mapped, before anything reads it.
fn cut_for_test(name: &str, len: usize) {
    let Some(n) = std::env::var("SUPERBPE_TEST_CUT_MAPPED").ok().and_then(|v| v.parse::<u64>().ok()) else {
        return;
    };
    if (len as u64) > n {
        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(name) {
            let _ = f.set_len(n);
        }
    }
}

/// Drops the pages of a [`MappedFile`] that were already read from this process's memory.
pub struct PageReleaser<'a> {
    base: usize,
    len: usize,
    dropped: usize,
    page: usize,
    _map: PhantomData<&'a [u8]>,
}

impl PageReleaser<'_> {
    /// Give back the whole pages below byte `upto` (clamped to the map). Their contents stay those
    /// of the file: touching them again reads it back.
    pub fn release_below(&mut self, upto: usize) {
        let end = upto.min(self.len) / self.page * self.page;
        if end > self.dropped {
            // SAFETY: the range lies inside the live read-only mapping (the borrow keeps it alive)
            // and starts page-aligned. The mapping is a shared one of the file (memmap2 maps
            // read-only with MAP_SHARED): MADV_DONTNEED only unmaps its pages from this process,
            // and reading them again maps in the file's bytes, which do not change (the contract
            // of `MappedFile::open`; past a truncation, the zero pages mapped over them read as
            // zeros again), so outstanding `&[u8]` borrows of the map stay valid.
            unsafe {
                libc::madvise((self.base + self.dropped) as *mut libc::c_void, end - self.dropped, libc::MADV_DONTNEED)
            };
            self.dropped = end;
        }
    }

    /// Keep the pages below byte `upto` (clamped to the map; a page it ends inside included):
    /// later releases start above them.
    pub fn keep_below(&mut self, upto: usize) {
        let end = upto.min(self.len).div_ceil(self.page) * self.page;
        self.dropped = self.dropped.max(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The vector holds the first `n` items, past the huge pages its advice covers.
    #[test]
    fn huge_vec_holds_the_first_n_items() {
        let n = (5 << 20) / 24 + 3;
        let v = huge_vec(n, (0u64..).map(|i| ([i, 2], [u32::MAX, i as u32])));
        assert_eq!(v.len(), n);
        assert!(v.iter().enumerate().all(|(i, e)| *e == ([i as u64, 2], [u32::MAX, i as u32])));
        assert_eq!(huge_vec(10, [1u8, 2, 3].into_iter()), [1, 2, 3]);
    }

    /// A file of `content` in the temporary directory, named for the test, and its map. The tests
    /// change such a file only by cutting it short or removing it, which the map is watched for.
    fn mapped(test: &str, content: &[u8]) -> (std::path::PathBuf, std::fs::File, MappedFile) {
        let path = std::env::temp_dir().join(format!("superbpe-{test}-test-{}", std::process::id()));
        std::fs::File::create(&path).unwrap().write_all(content).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test's own file, only cut short or removed while mapped (see above).
        let map = unsafe { MappedFile::open(&file, path.to_str().unwrap()) }.unwrap().unwrap();
        (path, file, map)
    }

    /// Pages given back read the same bytes again, whatever the order and size of the releases.
    #[test]
    fn released_pages_still_read_the_file() {
        let content: Vec<u8> = (0..5 * page_size() + 123).map(|i| (i * 7 % 251) as u8).collect();
        let (path, file, map) = mapped("mem", &content);
        let data = map.bytes();
        let mut pages = map.pages();
        for upto in [0, 10, page_size() + 1, 3 * page_size(), 2 * page_size(), content.len(), usize::MAX] {
            pages.release_below(upto);
            assert_eq!(data, &content[..], "after releasing below {upto}");
        }
        assert_eq!(pages.dropped, content.len() / page_size() * page_size());
        drop(file);
        std::fs::remove_file(&path).unwrap();
    }

    /// A file cut short while mapped reads as zeros past its new end, and the map says so,
    /// rather than the read raising SIGBUS; the fault's mark outlives the map and the file.
    #[test]
    fn a_file_cut_short_while_mapped_reads_zeros_and_is_marked() {
        let page = page_size();
        let (path, file, map) = mapped("cut", &vec![7u8; 6 * page + 5]);
        let mark = map.cut_mark();
        assert_eq!(map.bytes()[0], 7);
        assert!(!map.cut_short());
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(2 * page as u64 + 1).unwrap();
        assert!(map.cut_short(), "shorter than mapped");
        let data = map.bytes();
        assert!(data[..2 * page + 1].iter().all(|&b| b == 7));
        assert!(data[2 * page + 1..].iter().all(|&b| b == 0), "past the cut: zeros");
        assert_eq!(mark.name(), path.to_str().unwrap());
        drop(map);
        drop(file);
        std::fs::remove_file(&path).unwrap();
        assert!(mark.cut_short(), "the fault's mark, with the file gone");
    }

    /// A cut inside the last page raises no fault (the page still holds some of the file), and
    /// the map still says the file was cut; a file removed while mapped keeps its bytes and is
    /// not taken as cut, nor is another file put at its path.
    #[test]
    fn a_cut_inside_the_last_page_is_seen_and_a_removal_is_not_a_cut() {
        let page = page_size();
        let (path, _file, map) = mapped("tail-cut", &vec![7u8; 2 * page + 100]);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(2 * page as u64 + 10).unwrap();
        assert!(map.bytes()[2 * page + 10..].iter().all(|&b| b == 0));
        assert!(map.cut_short());
        std::fs::write(&path, vec![7u8; 2 * page + 100]).unwrap(); // the same file, its size back
        assert!(!map.cut_short(), "no fault, and as long as mapped");
        std::fs::remove_file(&path).unwrap();
        assert!(!map.cut_short());
        // Another file at the path (the map still holds the first, so it is a new inode): shorter,
        // but not the file mapped.
        std::fs::write(&path, b"short").unwrap();
        assert!(!map.cut_short(), "another file at its path");
        std::fs::remove_file(&path).unwrap();
        assert!(map.bytes()[..2 * page].iter().all(|&b| b == 7));
    }

    /// Pages kept (a page a kept range ends inside included) are never given back by later
    /// releases, which start above them.
    #[test]
    fn kept_pages_stay_mapped() {
        let page = page_size();
        let (path, file, map) = mapped("keep", &vec![7u8; 6 * page]);
        let mut pages = map.pages();
        pages.release_below(page + 10);
        assert_eq!(pages.dropped, page);
        pages.keep_below(2 * page + 10);
        assert_eq!(pages.dropped, 3 * page);
        pages.keep_below(page);
        pages.release_below(2 * page);
        assert_eq!(pages.dropped, 3 * page);
        pages.release_below(5 * page);
        assert_eq!(pages.dropped, 5 * page);
        assert!(map.bytes().iter().all(|&b| b == 7));
        drop(file);
        std::fs::remove_file(&path).unwrap();
    }
}
