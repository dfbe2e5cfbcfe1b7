//! Files cut short while they are mapped. Reading a page of a file mapping that lies past the
//! file's end raises SIGBUS, whose default action ends the process without a word. The crate's
//! mappings ([`super::MappedFile`]) are entered in a registry of address ranges, and a SIGBUS
//! handler, installed once for the process, serves such a fault inside one of them: it maps
//! zero-filled anonymous pages over the rest of that range, so the read goes on (reading zeros),
//! and sets the range's mark (an `AtomicBool` its owner passed [`Watched::new`]), which readers
//! check to refuse what they read. Any other SIGBUS goes to the handler that was there before (or
//! the default action), as if this one were not installed: that handler is put back, for good,
//! and the signal reaches it (such a SIGBUS usually ends the process).
//!
//! The handler may run at any point of any thread, so it only reads and writes atomics, in fixed
//! arrays, and calls async-signal-safe functions (`mmap`, `sigaction`, `raise`): it never
//! allocates, locks or waits. Entries are written under a lock by ordinary code and read by the
//! handler as a sequence lock (a write makes the entry's sequence odd, then even again; a read
//! taken while it was odd or that saw it change is thrown away).

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How many mappings can be watched at once (a mapping beyond them is not made: the file is read
/// instead). Each costs 32 bytes, and the handler looks through all of them only on a fault.
const SLOTS: usize = 4096;

struct Slot {
    /// Odd while the entry is written; 0 and other even values while it is stable.
    seq: AtomicUsize,
    /// The range `[start, end)` of the mapping, or `start == end == 0` when the slot is free.
    start: AtomicUsize,
    end: AtomicUsize,
    /// The address of the range's mark (an `AtomicBool` its [`Watched`] keeps alive while the
    /// slot holds it), set by the handler once it has mapped zeros over part of the range.
    mark: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only the array's initializer
const FREE: Slot =
    Slot { seq: AtomicUsize::new(0), start: AtomicUsize::new(0), end: AtomicUsize::new(0), mark: AtomicUsize::new(0) };

static REGISTRY: [Slot; SLOTS] = [FREE; SLOTS];

/// Held while a slot is taken or freed (never by the handler); also guards installing it.
static WRITERS: Mutex<bool> = Mutex::new(false);

/// A mapped range watched for truncation until this is dropped (drop it before the range is
/// unmapped: once freed, a fault there is no longer this crate's).
pub(super) struct Watched {
    slot: usize,
    /// Kept alive while the slot holds its address.
    _mark: Arc<AtomicBool>,
}

impl Watched {
    /// Watch `[start, start + len)`, installing the handler on first use: a fault there sets
    /// `mark`. `None` when every slot is taken (or where there is no handler: outside Linux).
    ///
    /// # Safety
    /// The range must be a read-only mapping of a file, starting at a page boundary, that the
    /// caller owns and keeps mapped until the returned value is dropped: a fault in it has its
    /// pages past the fault replaced by zero pages, which must take nothing from anyone else.
    pub(super) unsafe fn new(start: usize, len: usize, mark: Arc<AtomicBool>) -> Option<Watched> {
        if !cfg!(target_os = "linux") || len == 0 {
            return None;
        }
        let mut installed = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        if !*installed {
            *installed = handler::install();
            if !*installed {
                return None;
            }
        }
        let slot = REGISTRY.iter().position(|s| s.end.load(Ordering::Relaxed) == 0)?;
        write(&REGISTRY[slot], start, start + len, Arc::as_ptr(&mark) as usize);
        Some(Watched { slot, _mark: mark })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _lock = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        write(&REGISTRY[self.slot], 0, 0, 0);
    }
}

/// Set a slot's range and the address of its mark (the caller holds [`WRITERS`]).
fn write(slot: &Slot, start: usize, end: usize, mark: usize) {
    slot.seq.fetch_add(1, Ordering::Relaxed);
    fence(Ordering::Release);
    slot.start.store(start, Ordering::Relaxed);
    slot.end.store(end, Ordering::Relaxed);
    slot.mark.store(mark, Ordering::Relaxed);
    slot.seq.fetch_add(1, Ordering::Release);
}

/// The end of the watched range that holds `addr`, and the address of its mark (a
/// sequence-lock read of each slot; a slot being written is skipped: it cannot be the range of a
/// mapping a thread is reading).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // read by the handler alone
fn find(addr: usize) -> Option<(usize, usize)> {
    REGISTRY.iter().find_map(|slot| {
        let seq = slot.seq.load(Ordering::Acquire);
        if seq % 2 == 1 {
            return None;
        }
        let (start, end) = (slot.start.load(Ordering::Relaxed), slot.end.load(Ordering::Relaxed));
        let mark = slot.mark.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        (slot.seq.load(Ordering::Relaxed) == seq && start <= addr && addr < end).then_some((end, mark))
    })
}

#[cfg(target_os = "linux")]
mod handler {
    use super::find;
    use std::cell::UnsafeCell;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The page size, read once before the handler is installed (`sysconf` is not
    /// async-signal-safe).
    static PAGE: AtomicUsize = AtomicUsize::new(0);

    /// The SIGBUS disposition found when the handler was installed.
    struct Previous(UnsafeCell<Option<libc::sigaction>>);
    // SAFETY: written only by `install`, under `WRITERS`, before the handler that reads it is
    // installed, and never once it is (`install` is not called again after it succeeds): every
    // read, in the handler, sees a fixed value.
    unsafe impl Sync for Previous {}
    static PREVIOUS: Previous = Previous(UnsafeCell::new(None));

    /// Install the handler for the process, keeping the disposition it replaces; whether it is
    /// installed. Called once, under `WRITERS`.
    pub(super) fn install() -> bool {
        PAGE.store(super::super::system::page_size(), Ordering::Relaxed);
        // SAFETY: zeroed `sigaction` structs are valid (an empty mask, no flags, SIG_DFL);
        // `sigemptyset` and `sigaction` get pointers to live locals. PREVIOUS is written before
        // the handler that reads it is installed, and only here (see `Previous`).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return false;
            }
            *PREVIOUS.0.get() = Some(old);
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) == 0
        }
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler; errno is this
        // thread's, saved and restored so the interrupted code sees its own.
        unsafe {
            let errno = *libc::__errno_location();
            if (*info).si_code != libc::BUS_ADRERR || !serve((*info).si_addr() as usize) {
                pass_on(sig, (*info).si_code);
            }
            *libc::__errno_location() = errno;
        }
    }

    /// Map zeros over the rest of the watched range that holds `addr` (from `addr`'s page on:
    /// the file ends before that page, so every later page of the range is past its end too),
    /// and mark the range; whether `addr` was in one.
    fn serve(addr: usize) -> bool {
        let Some((end, mark)) = find(addr) else { return false };
        let page = PAGE.load(Ordering::Relaxed);
        let from = addr / page * page;
        let to = end.div_ceil(page) * page;
        // SAFETY: `[from, to)` is the page-rounded tail of a watched mapping that holds the
        // faulting address. A synchronous SIGBUS runs on the thread that faulted, which was
        // reading that mapping through a borrow of its `MappedFile`: the mapping stays mapped
        // and watched until this handler returns. The range was the crate's read-only mapping
        // of the file, so replacing its pages with private zero pages (MAP_FIXED) takes nothing
        // from anyone else; it is unmapped with the rest of the mapping when that is dropped.
        let mapped = unsafe {
            libc::mmap(
                from as *mut libc::c_void,
                to - from,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: `mark` is the address of the `AtomicBool` the range's `Watched` keeps alive
        // while the slot holds it, which lasts until this handler returns (as above).
        unsafe { (*(mark as *const std::sync::atomic::AtomicBool)).store(true, Ordering::Release) };
        true
    }

    /// Give a SIGBUS that is not ours to the disposition found at install: put it back, and let
    /// the signal reach it. A fault re-runs the faulting instruction on return, which raises
    /// the signal again; a signal sent by a process is raised again here (it stays pending
    /// until this handler returns, since SIGBUS is blocked while it runs).
    fn pass_on(sig: libc::c_int, code: libc::c_int) {
        // SAFETY: PREVIOUS was written before this handler was installed and never since (see
        // `Previous`); `sigaction` and `raise` are async-signal-safe and get valid arguments.
        unsafe {
            let previous = (*PREVIOUS.0.get()).unwrap_or_else(|| std::mem::zeroed());
            libc::sigaction(sig, &previous, std::ptr::null_mut());
            if code <= 0 {
                libc::raise(sig);
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod handler {
    pub(super) fn install() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range is found, with its mark, while watched, and not after.
    #[test]
    fn watched_ranges_are_found_until_dropped() {
        let mark = Arc::new(AtomicBool::new(false));
        // SAFETY: the test maps nothing at this range, and the process's own maps lie far above
        // it (a position-independent binary, maps placed top-down), so no fault arises there.
        let w = unsafe { Watched::new(0x1000_0000, 0x3000, mark.clone()) }.unwrap();
        assert_eq!(find(0x1000_0000), Some((0x1000_3000, Arc::as_ptr(&mark) as usize)));
        assert!(find(0x1000_2fff).is_some());
        assert!(find(0x1000_3000).is_none() && find(0x0fff_ffff).is_none());
        drop(w);
        assert!(find(0x1000_0000).is_none());
    }
}
