//! Files a count has read whole and found valid UTF-8, so that a later count of the same bytes
//! need not check them again.
//!
//! A SuperBPE run counts its corpus twice, once per stage's pattern, in one process. Checking the
//! second time finds nothing new, yet it is the first read of each window of the file, made while
//! the workers count the window before, and a good share of the count's time. A file counts as
//! the same when its device, inode, size and modification and change times are those it had when
//! it was checked: any write changes the change time, which no one but the kernel sets. Were the
//! bytes changed without it, a count would read invalid UTF-8 as bytes: the built-in scanners split
//! any bytes, and the regex fallback checks its own input, so the result is counts, never an
//! unchecked `str`.

use std::sync::Mutex;

/// What identifies a file's bytes: device, inode, size, and modification and change times.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Stamp {
    device: u64,
    inode: u64,
    size: u64,
    /// Seconds and nanoseconds.
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Stamp {
    /// The stamp of the file `meta` describes, as it is now.
    pub fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether `meta` describes the same file (device and inode), whatever it holds now.
    pub fn is_of_file(&self, meta: &std::fs::Metadata) -> bool {
        let now = Stamp::of(meta);
        (self.device, self.inode) == (now.device, now.inode)
    }
}

/// Most stamps kept: a run reads a few files many times, not many files once each.
const KEPT: usize = 256;

/// The stamps of files found valid, the oldest first.
struct Notes(Vec<Stamp>);

impl Notes {
    fn holds(&self, stamp: Stamp) -> bool {
        self.0.contains(&stamp)
    }

    /// Add `stamp` (the oldest goes when `KEPT` are held).
    fn note(&mut self, stamp: Stamp) {
        if !self.holds(stamp) {
            if self.0.len() == KEPT {
                self.0.remove(0);
            }
            self.0.push(stamp);
        }
    }
}

static VALID: Mutex<Notes> = Mutex::new(Notes(Vec::new()));

fn notes() -> std::sync::MutexGuard<'static, Notes> {
    VALID.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a file with this stamp was found valid UTF-8 whole.
pub fn is_valid(stamp: Stamp) -> bool {
    notes().holds(stamp)
}

/// Note that the file with this stamp is valid UTF-8 whole.
pub fn note_valid(stamp: Stamp) {
    notes().note(stamp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_changes_the_stamp() {
        let dir = std::env::temp_dir().join(format!("superbpe-valid-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.txt");
        std::fs::write(&path, "same size").unwrap();
        let before = Stamp::of(&std::fs::metadata(&path).unwrap());
        assert_eq!(before, Stamp::of(&std::fs::metadata(&path).unwrap()));
        // Past the clock tick of file times on kernels without fine-grained ones.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, "SAME SIZE").unwrap();
        assert_ne!(before, Stamp::of(&std::fs::metadata(&path).unwrap()), "same size, new bytes");
        // Still the same file, whatever it holds; another file is not.
        assert!(before.is_of_file(&std::fs::metadata(&path).unwrap()));
        std::fs::write(dir.join("b.txt"), "same size").unwrap();
        assert!(!before.is_of_file(&std::fs::metadata(dir.join("b.txt")).unwrap()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A local set of notes: the process's own is shared with the count tests running beside.
    #[test]
    fn notes_are_kept_up_to_a_bound() {
        let stamp =
            |n: u64| Stamp { device: u64::MAX, inode: u64::MAX - 1, size: n, modified: (0, 0), changed: (0, 0) };
        let mut notes = Notes(Vec::new());
        notes.note(stamp(0));
        notes.note(stamp(0));
        assert!(notes.holds(stamp(0)) && !notes.holds(stamp(1)) && notes.0.len() == 1);
        (1..=KEPT as u64).for_each(|n| notes.note(stamp(n)));
        assert!(!notes.holds(stamp(0)) && notes.holds(stamp(1)) && notes.holds(stamp(KEPT as u64)));
        assert_eq!(notes.0.len(), KEPT);
    }
}
