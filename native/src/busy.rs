//! Whether counting work fills the threads: a SuperBPE run counts the corpus for its next stage
//! while the stage before it chooses merges, and a merge applied on two threads (`train/merge.rs`)
//! then only queues behind the count's work and takes CPU the count would have used. Counts note
//! themselves here while they run; a merge takes the second thread only when none does.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts running in this process.
static COUNTS: AtomicUsize = AtomicUsize::new(0);

/// A count in progress, from `Counting::start` until dropped.
pub(crate) struct Counting(());

impl Counting {
    pub(crate) fn start() -> Counting {
        COUNTS.fetch_add(1, Ordering::Relaxed);
        Counting(())
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        COUNTS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether a count is running (`Counting`).
pub(crate) fn counting() -> bool {
    COUNTS.load(Ordering::Relaxed) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count is seen as running from its start until it ends, however many run at once.
    #[test]
    fn counts_are_seen_while_they_run() {
        let first = Counting::start();
        assert!(counting());
        let second = Counting::start();
        drop(first);
        assert!(counting(), "one count still runs");
        drop(second);
    }
}
