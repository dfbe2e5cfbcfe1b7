//! A count's memory ceiling, checked after each window of text it counts.
//!
//! A count holds every distinct piece it has seen, so on gigabytes of distinct lines (a SuperBPE
//! stage 2 of web text) it grows to about the size of the text. The kernel's OOM killer would end
//! such a run without a word; checked between windows, the count stops instead with an error that
//! says what it held, and the run turns that into a one-line refusal.

/// When a count must stop: the process holding more than `rss` bytes, or the machine having less
/// than `reserve` bytes available. Either may be off; the default checks nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ceiling {
    pub rss: Option<u64>,
    pub reserve: Option<u64>,
}

/// What a count held when it went past its [`Ceiling`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    /// The process's resident bytes, over the limit.
    Rss { held: u64, limit: u64 },
    /// The machine's available bytes, under the reserve, and the process's resident bytes.
    Available { held: u64, available: u64, reserve: u64 },
}

impl Ceiling {
    /// Whether the ceiling is checked at all.
    pub fn is_set(&self) -> bool {
        self.rss.is_some() || self.reserve.is_some()
    }

    /// `Err` once the process or the machine is past the ceiling. Where `/proc` cannot be read
    /// nothing is known, and nothing stops.
    pub fn check(&self) -> Result<(), Exceeded> {
        if !self.is_set() {
            return Ok(());
        }
        let Some(held) = resident_bytes() else { return Ok(()) };
        if let Some(limit) = self.rss.filter(|&limit| held > limit) {
            return Err(Exceeded::Rss { held, limit });
        }
        match (self.reserve, available_bytes()) {
            (Some(reserve), Some(available)) if available < reserve => {
                Err(Exceeded::Available { held, available, reserve })
            }
            _ => Ok(()),
        }
    }
}

/// This process's resident bytes (`/proc/self/statm`), as the run's `memory_limit` counts them.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * super::system::page_size() as u64)
}

/// What the kernel can still give without swapping (`MemAvailable` of `/proc/meminfo`).
fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ceiling_below_the_process_is_exceeded_and_one_above_it_is_not() {
        let held = resident_bytes().expect("this test runs on Linux");
        assert!(held > 0);
        assert!(Ceiling::default().check().is_ok());
        assert!(Ceiling { rss: Some(u64::MAX), reserve: Some(0) }.check().is_ok());
        match (Ceiling { rss: Some(held / 2), reserve: None }).check() {
            Err(Exceeded::Rss { held: h, limit }) => assert!(h > limit && limit == held / 2),
            other => panic!("{other:?}"),
        }
        match (Ceiling { rss: None, reserve: Some(u64::MAX) }).check() {
            Err(Exceeded::Available { available, reserve, .. }) => assert!(available < reserve),
            other => panic!("{other:?}"),
        }
    }
}
