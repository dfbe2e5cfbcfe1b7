//! A batch's ids: texts cut into groups, the groups encoded by the threads of a rayon pool, each
//! thread appending its groups' ids to one buffer of its own, then the buffers' spans joined in the
//! batch's order.
//!
//! Why a buffer per thread and not one per group: a group's ids are megabytes, and memory the
//! process has not written before costs a page fault and a zeroed page per page when first written.
//! A buffer per group (a few megabytes each) rarely holds a whole 2 MiB-aligned span, so it was
//! faulted in 4 KiB pages, both threads at once; a first pass on two threads then spent as much
//! in the kernel as it saved. A thread's buffer is large enough to be backed by huge pages
//! ([`spare::Pages::Huge`]), and is given back for the next batch once joined.

use std::mem::MaybeUninit;
use std::sync::Mutex;

use rayon::prelude::*;

use crate::memory::spare::{self, Pages};

/// A batch is cut into groups of texts of about this many bytes at least, each encoded by one
/// thread with one cache, so that a batch of short texts is not one task per text.
const GROUP_MIN_BYTES: usize = 1 << 16;
/// Groups per thread of the pool: enough that a thread that finishes early takes more.
const GROUPS_PER_THREAD: usize = 8;

/// Room for the ids of `bytes` bytes of text, written by one thread: a token holds two bytes or
/// more in most text, so this rarely grows; large buffers come from (and go back to)
/// [`spare::IDS`].
pub fn ids_room(bytes: usize) -> Vec<u32> {
    spare::IDS.take(bytes / 2 + 1, Pages::Small)
}

/// The texts of a batch in consecutive groups of about `total / (threads * GROUPS_PER_THREAD)`
/// bytes (at least [`GROUP_MIN_BYTES`]), each with the index of its first text; one thread takes
/// the batch as one group, whose ids are then one buffer, handed on without joining.
fn groups<'t>(texts: &'t [&'t [u8]], threads: usize) -> Vec<(usize, &'t [&'t [u8]])> {
    let total: usize = texts.iter().map(|t| t.len()).sum();
    let target = match threads {
        0 | 1 => usize::MAX,
        n => (total / (n * GROUPS_PER_THREAD)).max(GROUP_MIN_BYTES),
    };
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, t) in texts.iter().enumerate() {
        bytes += t.len();
        if bytes >= target {
            groups.push((start, &texts[start..=i]));
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < texts.len() {
        groups.push((start, &texts[start..]));
    }
    groups
}

/// Where one group's ids went: a span of a buffer, and the number of ids of each of its texts.
struct Placed {
    buffer: usize,
    start: usize,
    lens: Vec<usize>,
}

/// A group as encoded: where its ids went, and the buffer of its own if it wrote one.
struct Encoded {
    placed: Placed,
    own: Option<Vec<u32>>,
}

impl Placed {
    fn end(&self) -> usize {
        self.start + self.lens.iter().sum::<usize>()
    }
}

/// The ids of a batch as its threads wrote them (see the module doc): join them with
/// [`BatchIds::into_ids`] or [`BatchIds::into_narrow`].
pub struct BatchIds {
    buffers: Vec<Vec<u32>>,
    /// The groups in the batch's order.
    groups: Vec<Placed>,
}

impl BatchIds {
    /// Encode `texts` on the current rayon pool: `encode(first, group, out)` appends the ids of
    /// each text of `group` (`texts[first..]` onwards) to `out` and returns how many each has. The
    /// error is the first group's, in order.
    pub fn encode<E: Send>(
        texts: &[&[u8]],
        encode: impl Fn(usize, &[&[u8]], &mut Vec<u32>) -> Result<Vec<usize>, E> + Sync,
    ) -> Result<BatchIds, E> {
        let threads = rayon::current_num_threads();
        if threads <= 1 {
            return BatchIds::encode_alone(texts, encode);
        }
        let total: usize = texts.iter().map(|t| t.len()).sum();
        let shared: Vec<Mutex<Vec<u32>>> = (0..threads).map(|_| Mutex::new(Vec::new())).collect();
        let encoded: Vec<Result<Encoded, E>> = groups(texts, threads)
            .par_iter()
            .map(|&(first, group)| {
                let slot = rayon::current_thread_index().unwrap_or(0) % threads;
                // The thread's own buffer; a group that finds it taken (a task run inside another,
                // never in practice) writes a buffer of its own rather than wait.
                match shared[slot].try_lock() {
                    Ok(mut buffer) => {
                        if buffer.capacity() == 0 {
                            // Room for an id per byte of a thread's share, twice what text mostly
                            // needs: threads take groups as they come, so one may write more than
                            // its share, and a buffer it outgrew was copied into fresh memory (most
                            // of a first pass's time in the kernel on two threads). Room never
                            // written is address space only.
                            *buffer = spare::IDS.take(total / threads + 1, Pages::Huge);
                        }
                        let start = buffer.len();
                        let lens = encode(first, group, &mut buffer).inspect_err(|_| buffer.truncate(start))?;
                        Ok(Encoded { placed: Placed { buffer: slot, start, lens }, own: None })
                    }
                    Err(_) => {
                        let mut own = ids_room(group.iter().map(|t| t.len()).sum());
                        let lens = encode(first, group, &mut own)?;
                        Ok(Encoded { placed: Placed { buffer: usize::MAX, start: 0, lens }, own: Some(own) })
                    }
                }
            })
            .collect();
        let mut buffers: Vec<Vec<u32>> =
            shared.into_iter().map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).collect();
        let mut groups = Vec::with_capacity(encoded.len());
        for group in encoded {
            let Encoded { mut placed, own } = group?;
            if let Some(own) = own {
                placed.buffer = buffers.len();
                buffers.push(own);
            }
            groups.push(placed);
        }
        Ok(BatchIds { buffers, groups })
    }

    /// Encode `texts` as [`BatchIds::encode`] does, as one group on the calling thread.
    pub fn encode_alone<E>(
        texts: &[&[u8]],
        encode: impl FnOnce(usize, &[&[u8]], &mut Vec<u32>) -> Result<Vec<usize>, E>,
    ) -> Result<BatchIds, E> {
        let mut buffer = ids_room(texts.iter().map(|t| t.len()).sum());
        let lens = encode(0, texts, &mut buffer)?;
        Ok(BatchIds { buffers: vec![buffer], groups: vec![Placed { buffer: 0, start: 0, lens }] })
    }

    /// The ids of one text, already in a buffer.
    pub fn one(ids: Vec<u32>) -> BatchIds {
        BatchIds::of_buffers(vec![ids])
    }

    /// Ids already in buffers of their own (the blocks of a batch encoded elsewhere), in order, each
    /// buffer's counted as one text's in [`BatchIds::ends`].
    pub fn of_buffers(buffers: Vec<Vec<u32>>) -> BatchIds {
        let groups = buffers.iter().enumerate().map(|(i, b)| Placed { buffer: i, start: 0, lens: vec![b.len()] });
        BatchIds { groups: groups.collect(), buffers }
    }

    /// The end of each text's ids in the joined ids.
    pub fn ends(&self) -> impl Iterator<Item = u64> + '_ {
        self.groups.iter().flat_map(|g| g.lens.iter()).scan(0u64, |end, &n| {
            *end += n as u64;
            Some(*end)
        })
    }

    /// The ids in the batch's order: the one buffer as it is when it holds them all in order
    /// (always so on one thread), else copied by the current pool's threads into one new vector.
    pub fn into_ids(mut self) -> Vec<u32> {
        if let Some(only) = self.in_one_buffer() {
            return std::mem::take(&mut self.buffers[only]);
        }
        // SAFETY: `write_copy_of_slice` fills the whole span (of the ids' length, or it panics).
        let joined = unsafe {
            self.join(&spare::IDS, |dst, ids| {
                dst.write_copy_of_slice(ids);
                Ok::<(), std::convert::Infallible>(())
            })
        };
        match joined {
            Ok(ids) => ids,
            Err(never) => match never {},
        }
    }

    /// The ids in the batch's order as 16-bit ids, joined as [`BatchIds::into_ids`]; the error is
    /// an id that does not fit (the first in order).
    pub fn into_narrow(self) -> Result<Vec<u16>, u32> {
        // SAFETY: the span and the ids have the same length, so the loop writes every element of
        // the span unless it returns an error.
        unsafe {
            self.join(&spare::NARROW_IDS, |dst, ids| {
                for (d, &id) in dst.iter_mut().zip(ids) {
                    d.write(u16::try_from(id).map_err(|_| id)?);
                }
                Ok(())
            })
        }
    }

    /// The buffer that holds every id in the batch's order and nothing else, if one does.
    fn in_one_buffer(&self) -> Option<usize> {
        let first = self.groups.first().map_or(0, |g| g.buffer);
        let mut at = 0;
        for g in &self.groups {
            if g.buffer != first || g.start != at {
                return None;
            }
            at = g.end();
        }
        (self.buffers.get(first)?.len() == at).then_some(first)
    }

    /// The groups' spans joined in order into one vector from `spares`, each written into its own
    /// span by `write` (on the current rayon pool's threads); the buffers then go back for reuse.
    /// The error is the first group's, in order.
    ///
    /// # Safety
    /// `write(dst, ids)` (given spans of equal length) must initialise all of `dst` whenever it
    /// returns `Ok`: the joined vector is taken as written, unread.
    unsafe fn join<T: Copy + Send, E: Send>(
        self,
        spares: &spare::Spares<T>,
        write: impl Fn(&mut [MaybeUninit<T>], &[u32]) -> Result<(), E> + Sync,
    ) -> Result<Vec<T>, E> {
        let total = self.groups.iter().map(|g| g.end() - g.start).sum();
        // Several spans are written by the pool's threads at once; one (a single text narrowed) by one.
        let pages = if self.groups.len() > 1 { Pages::Huge } else { Pages::Small };
        let mut out: Vec<T> = spares.take(total, pages);
        let mut room = &mut out.spare_capacity_mut()[..total];
        let mut spans = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let (dst, rest) = room.split_at_mut(g.end() - g.start);
            spans.push((dst, &self.buffers[g.buffer][g.start..g.end()]));
            room = rest;
        }
        let written: Vec<Result<(), E>> = spans.into_par_iter().map(|(dst, ids)| write(dst, ids)).collect();
        for buffer in self.buffers {
            spare::IDS.give(buffer);
        }
        written.into_iter().collect::<Result<(), E>>()?;
        // SAFETY: the spans are consecutive and together exactly the first `total` elements of the
        // spare capacity of the empty vector (each group's length in order, split off the front),
        // and `write` filled each in full (the caller's promise): it stops early only with an
        // error, and then the vector is dropped unset.
        unsafe { out.set_len(total) };
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Texts of random lengths, each "encoded" as its bytes (one id per byte, offset so that some
    /// do not fit in 16 bits when `wide`).
    fn batch(state: &mut u64, count: usize) -> Vec<Vec<u8>> {
        (0..count)
            .map(|_| {
                let len = if crate::test_below(state, 4) == 0 { 0 } else { crate::test_below(state, 50_000) };
                (0..len).map(|_| crate::test_below(state, 256) as u8).collect()
            })
            .collect()
    }

    type Lens = Result<Vec<usize>, String>;

    fn encode_bytes(offset: u32) -> impl Fn(usize, &[&[u8]], &mut Vec<u32>) -> Lens + Sync {
        move |_, group, out| {
            Ok(group
                .iter()
                .map(|t| {
                    out.extend(t.iter().map(|&b| u32::from(b) * offset));
                    t.len()
                })
                .collect())
        }
    }

    /// On pools of one to three threads, the joined ids are every text's ids in order, the ends
    /// are where each text's ids end, narrowing gives the same ids, and the first id too wide for
    /// 16 bits is the error.
    #[test]
    fn joined_ids_are_the_texts_in_order() {
        let state = &mut 0x1405_7B7E_F767_814Fu64;
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for count in [0, 1, 2, 7, 40, 300] {
                let texts = batch(state, count);
                let slices: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
                let want: Vec<u32> = texts.concat().into_iter().map(u32::from).collect();
                let ids = pool.install(|| BatchIds::encode(&slices, encode_bytes(1))).unwrap();
                let ends: Vec<u64> = ids.ends().collect();
                let mut end = 0;
                let want_ends: Vec<u64> = texts
                    .iter()
                    .map(|t| {
                        end += t.len() as u64;
                        end
                    })
                    .collect();
                assert_eq!(ends, want_ends, "{threads} threads, {count} texts");
                assert_eq!(pool.install(|| ids.into_ids()), want, "{threads} threads, {count} texts");
                let narrow = pool.install(|| BatchIds::encode(&slices, encode_bytes(1)).unwrap().into_narrow());
                assert_eq!(narrow.unwrap().into_iter().map(u32::from).collect::<Vec<_>>(), want);
                let wide = pool.install(|| BatchIds::encode(&slices, encode_bytes(300)).unwrap().into_narrow());
                let first_wide = want.iter().map(|&b| b * 300).find(|&id| id > u32::from(u16::MAX));
                assert_eq!(wide.err(), first_wide, "{threads} threads, {count} texts");
            }
        }
    }

    /// The first failing group's error (in the batch's order) is the batch's.
    #[test]
    fn the_first_failing_group_is_the_error() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let texts: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 100_000]).collect();
        let slices: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        let failing = |first: usize, group: &[&[u8]], out: &mut Vec<u32>| {
            for (i, t) in group.iter().enumerate() {
                assert_eq!(usize::from(t[0]), first + i, "the index of the group's first text");
                if t[0] % 10 == 7 {
                    return Err(t[0]);
                }
                out.push(t[0].into());
            }
            Ok(vec![1; group.len()])
        };
        assert_eq!(pool.install(|| BatchIds::encode(&slices, failing)).err(), Some(7));
    }
}
