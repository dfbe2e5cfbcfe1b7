//! A batch's ids: texts cut into groups, the groups encoded by the threads of a rayon pool, each
//! thread appending its groups' ids to one buffer of its own, then the buffers' spans joined in the
//! batch's order. On two threads the ids go straight into one vector instead, one thread's from the
//! front and the other's from the back ([`BatchIds::encode`]), so that each is written once to new
//! memory.
//!
//! Why a buffer per thread and not one per group: a group's ids are megabytes, and memory the
//! process has not written before costs a page fault and a zeroed page per page when first written.
//! A buffer per group (a few megabytes each) rarely holds a whole 2 MiB-aligned span, so it was
//! faulted in 4 KiB pages, both threads at once; a first pass on two threads then spent as much
//! in the kernel as it saved. A thread's buffer is large enough to be backed by huge pages
//! ([`spare::Pages::Huge`]), and is given back for the next batch once joined.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// About the bytes each of `threads` threads encodes of a batch of `total_bytes`: what a piece
/// cache seeded for one of them makes room for.
pub fn thread_share(total_bytes: usize, threads: usize) -> usize {
    total_bytes / threads.max(1)
}

/// The earliest of a batch's parts (groups, blocks) known to have failed, shared by the threads
/// encoding them: a batch reports its first failing part's error, so a part after it need not be
/// encoded, while the parts before it still must (one of them may fail earlier).
pub struct FirstFailure(AtomicUsize);

impl Default for FirstFailure {
    /// No part failed yet.
    fn default() -> FirstFailure {
        FirstFailure(AtomicUsize::new(usize::MAX))
    }
}

impl FirstFailure {
    /// Whether part `i` comes after a part that failed (and need not be encoded).
    pub fn is_after(&self, i: usize) -> bool {
        i > self.0.load(Ordering::Relaxed)
    }

    /// Note that part `i` failed.
    pub fn note(&self, i: usize) {
        self.0.fetch_min(i, Ordering::Relaxed);
    }
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

/// The two ends of a batch encoded from both ([`BatchIds::encode_from_both_ends`]): the groups
/// each end takes next, and the slots of the one vector each end has filled. The front's ids fill
/// `..front` and the back's `back..top`, and `front <= back` always holds, so no slot is given twice.
struct Ends {
    /// The next group from the front, and one past the next from the back.
    front_group: usize,
    back_group: usize,
    front: usize,
    /// Bytes of the groups the front has placed.
    front_bytes: usize,
    back: usize,
    /// Where the back's ids end: set when the back places its first group.
    top: Option<usize>,
    /// Set when the front's group failed: no later group can be the batch's error, so neither end
    /// takes another.
    stopped: bool,
}

/// How much more room than its first group's ids per byte the back leaves the front's groups.
const RECKONING_SLACK: (usize, usize) = (5, 4);

impl Ends {
    /// The next group for the front or the back, if any is left.
    fn take(&mut self, from_front: bool) -> Option<usize> {
        if self.stopped || self.front_group >= self.back_group {
            return None;
        }
        if from_front {
            self.front_group += 1;
            Some(self.front_group - 1)
        } else {
            self.back_group -= 1;
            Some(self.back_group)
        }
    }

    /// Slots for `n` ids of a group of `bytes` bytes (of a batch of `total`) from the front or the
    /// back, or None when they do not fit between the two.
    fn place(&mut self, from_front: bool, n: usize, bytes: usize, total: usize) -> Option<usize> {
        if from_front {
            if n > self.back - self.front {
                return None;
            }
            self.front += n;
            self.front_bytes += bytes;
            return Some(self.front - n);
        }
        if self.top.is_none() {
            // The bytes the front has not placed, at this group's ids per byte, and some more.
            let left = (total - self.front_bytes) as u128 * n as u128 / bytes.max(1) as u128;
            let room = left * RECKONING_SLACK.0 as u128 / RECKONING_SLACK.1 as u128 + n as u128;
            self.back = self.back.min(self.front.saturating_add(usize::try_from(room).unwrap_or(usize::MAX)));
            self.top = Some(self.back);
        }
        if n > self.back - self.front {
            return None;
        }
        self.back -= n;
        Some(self.back)
    }
}

/// A group encoded on two threads: its index, and where its ids went with each text's count, or
/// its error.
type Done<E> = (usize, Result<(Spot, Vec<usize>), E>);

/// Where a group's ids went on two threads: slots of the shared vector, or a buffer of its own.
enum Spot {
    Shared(usize),
    Own(Vec<u32>),
}

/// The shared vector's slots, written by both threads at once (each only the slots `Ends::place`
/// gave it).
#[derive(Clone, Copy)]
struct Shared(*mut MaybeUninit<u32>);

// SAFETY: the pointer is only used for the slots `Ends::place` handed out, each to one thread, and
// the vector it points into outlives both threads' work (`rayon::join` returns before it is touched
// again).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// Slot `i`.
    ///
    /// # Safety
    /// `i` must be at most the vector's capacity.
    unsafe fn at(self, i: usize) -> *mut MaybeUninit<u32> {
        // SAFETY: within the allocation or one past its end (the caller's promise).
        unsafe { self.0.add(i) }
    }
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
        if threads == 2 {
            return BatchIds::encode_from_both_ends(texts, encode);
        }
        let total: usize = texts.iter().map(|t| t.len()).sum();
        let shared: Vec<Mutex<Vec<u32>>> = (0..threads).map(|_| Mutex::new(Vec::new())).collect();
        // A group after one that failed cannot be the batch's error, so it is not encoded (`None`).
        let failed = FirstFailure::default();
        let encode_group = |first: usize, group: &[&[u8]]| -> Result<Encoded, E> {
            let slot = rayon::current_thread_index().unwrap_or(0) % threads;
            // The thread's own buffer; a group that finds it taken (a task run inside another,
            // never in practice) writes a buffer of its own rather than wait.
            match shared[slot].try_lock() {
                Ok(mut buffer) => {
                    if buffer.capacity() == 0 {
                        // Room for an id per byte of a thread's share, twice what text mostly
                        // needs: threads take groups as they come, so one may write more than its
                        // share, and a buffer it outgrows is copied into fresh memory. Room never
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
        };
        let encoded: Vec<Option<Result<Encoded, E>>> = groups(texts, threads)
            .par_iter()
            .enumerate()
            .map(|(g, &(first, group))| {
                if failed.is_after(g) {
                    return None;
                }
                let result = encode_group(first, group);
                if result.is_err() {
                    failed.note(g);
                }
                Some(result)
            })
            .collect();
        let mut buffers: Vec<Vec<u32>> =
            shared.into_iter().map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).collect();
        let mut groups = Vec::with_capacity(encoded.len());
        for group in encoded {
            // A skipped group comes after a failed one, whose error is returned first.
            let Encoded { mut placed, own } = group.expect("a group is skipped only after one that failed")?;
            if let Some(own) = own {
                placed.buffer = buffers.len();
                buffers.push(own);
            }
            groups.push(placed);
        }
        Ok(BatchIds { buffers, groups })
    }

    /// Encode `texts` as [`BatchIds::encode`] does on two threads: one takes groups from the front,
    /// the other from the back, each encoding a group into room of its own that it reuses and
    /// copying the ids straight into one vector, the front's up from its start and the back's down
    /// from about where the ids will end (reckoned from the back's first group); the back's ids are
    /// then moved down to follow the front's. Each id is then written once to memory new to the
    /// process, where a buffer per thread and then their join wrote it twice: a first pass over
    /// fresh memory waits on its pages. A group that finds no room left between the two (more ids
    /// than the vector holds, or than the reckoning left) keeps its room as a buffer of its own,
    /// joined later.
    fn encode_from_both_ends<E: Send>(
        texts: &[&[u8]],
        encode: impl Fn(usize, &[&[u8]], &mut Vec<u32>) -> Result<Vec<usize>, E> + Sync,
    ) -> Result<BatchIds, E> {
        let groups = groups(texts, 2);
        let bytes = |group: &[&[u8]]| group.iter().map(|t| t.len()).sum::<usize>();
        let total = bytes(texts);
        // Room for a token per two bytes, which nearly all text needs at most; groups beyond it
        // keep buffers of their own.
        let mut out: Vec<u32> = spare::IDS.take(total / 2 + 1, Pages::Huge);
        let shared = Shared(out.spare_capacity_mut().as_mut_ptr());
        let ends = Mutex::new(Ends {
            front_group: 0,
            back_group: groups.len(),
            front: 0,
            front_bytes: 0,
            back: out.capacity(),
            top: None,
            stopped: false,
        });
        let largest = groups.iter().map(|g| bytes(g.1)).max().unwrap_or(0);
        let work = |from_front: bool| {
            let mut room = ids_room(largest);
            let mut done: Vec<Done<E>> = Vec::new();
            loop {
                // Bound first: the lock must not be held while the group is encoded.
                let next = ends.lock().unwrap_or_else(|e| e.into_inner()).take(from_front);
                let Some(g) = next else { break };
                let (first, group) = groups[g];
                room.clear();
                let lens = match encode(first, group, &mut room) {
                    Ok(lens) => lens,
                    Err(e) => {
                        // The batch's error is its first failing group's. The front takes groups
                        // in order, so every group after this one can only fail later: both ends
                        // stop. A failing back group leaves the front to go on, up to it, for an
                        // earlier one.
                        if from_front {
                            ends.lock().unwrap_or_else(|e| e.into_inner()).stopped = true;
                        }
                        done.push((g, Err(e)));
                        break;
                    }
                };
                let at =
                    ends.lock().unwrap_or_else(|e| e.into_inner()).place(from_front, room.len(), bytes(group), total);
                let spot = match at {
                    Some(at) => {
                        // SAFETY: `place` gave `at..at + len` to this group alone, inside the
                        // vector's capacity, and never gives a slot twice (see `Ends`).
                        unsafe {
                            std::ptr::copy_nonoverlapping(room.as_ptr(), shared.at(at).cast::<u32>(), room.len())
                        };
                        Spot::Shared(at)
                    }
                    None => Spot::Own(std::mem::replace(&mut room, ids_room(largest))),
                };
                done.push((g, Ok((spot, lens))));
            }
            spare::IDS.give(room);
            done
        };
        let (front, back) = rayon::join(|| work(true), || work(false));
        let Ends { front: front_end, back: back_start, top, .. } = ends.into_inner().unwrap_or_else(|e| e.into_inner());
        let top = top.unwrap_or(back_start);
        // SAFETY: `..front_end` and `back_start..top` were written in full (each slot `place` gave
        // out was copied into at once, and they never overlap: `front_end <= back_start`); the back's
        // ids move down to follow the front's (`copy` allows the overlap), so the first
        // `front_end + top - back_start` elements are set.
        unsafe {
            std::ptr::copy(shared.at(back_start), shared.at(front_end), top - back_start);
            out.set_len(front_end + top - back_start);
        }
        let mut done: Vec<_> = front.into_iter().chain(back).collect();
        done.sort_unstable_by_key(|d| d.0);
        let mut buffers = vec![out];
        let mut placed = Vec::with_capacity(done.len());
        for (_, result) in done {
            let (spot, lens) = result?;
            let (buffer, start) = match spot {
                Spot::Shared(at) if at >= back_start => (0, at - (back_start - front_end)),
                Spot::Shared(at) => (0, at),
                Spot::Own(ids) => {
                    buffers.push(ids);
                    (buffers.len() - 1, 0)
                }
            };
            placed.push(Placed { buffer, start, lens });
        }
        Ok(BatchIds { buffers, groups: placed })
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

    /// On two threads, ids go from both ends into one vector, or into buffers of their own where
    /// the reckoning of how many come leaves no room (here texts make from one id per eight bytes
    /// to three per byte, in runs): joined, they are every text's ids in order either way.
    #[test]
    fn both_ends_join_in_order_whatever_the_ids_per_byte() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let state = &mut 0x2F1B_9D3C_44A7_E165u64;
        let ids_of = |t: &[u8]| -> Vec<u32> {
            match t.first().map_or(0, |&b| b % 4) {
                0 => t.iter().step_by(8).map(|&b| u32::from(b)).collect(),
                k => t.iter().flat_map(|&b| std::iter::repeat_n(u32::from(b), k as usize)).collect(),
            }
        };
        let (mut one_buffer, mut own_buffers) = (0, 0);
        for round in 0..40 {
            // Alike in even rounds; in odd ones in runs, so that the back's first group can
            // misjudge the rest.
            let kind =
                |i: usize| if round % 2 == 0 { (round / 2 % 2) as u8 } else { ((i * 4 / 300 + round) % 4) as u8 };
            let texts: Vec<Vec<u8>> = (0..300)
                .map(|i| {
                    let len = crate::test_below(state, 20_000);
                    (0..len)
                        .map(|j| {
                            if j == 0 {
                                kind(i) + 4 * crate::test_below(state, 60) as u8
                            } else {
                                crate::test_below(state, 256) as u8
                            }
                        })
                        .collect()
                })
                .collect();
            let slices: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
            let encode = |_: usize, group: &[&[u8]], out: &mut Vec<u32>| -> Result<Vec<usize>, ()> {
                Ok(group
                    .iter()
                    .map(|t| {
                        let ids = ids_of(t);
                        out.extend_from_slice(&ids);
                        ids.len()
                    })
                    .collect())
            };
            let ids = pool.install(|| BatchIds::encode(&slices, encode)).unwrap();
            if ids.buffers.len() == 1 {
                one_buffer += 1
            } else {
                own_buffers += 1
            }
            let want_ends: Vec<u64> = texts
                .iter()
                .scan(0u64, |end, t| {
                    *end += ids_of(t).len() as u64;
                    Some(*end)
                })
                .collect();
            assert_eq!(ids.ends().collect::<Vec<_>>(), want_ends, "round {round}");
            let want: Vec<u32> = texts.iter().flat_map(|t| ids_of(t)).collect();
            assert_eq!(pool.install(|| ids.into_ids()), want, "round {round}");
        }
        assert!(one_buffer > 0 && own_buffers > 0, "{one_buffer} in one buffer, {own_buffers} with their own");
    }

    /// A batch whose first group fails stops there: on two threads and on more, the groups after
    /// it are not all encoded (each thread finishes at most the group it holds). On two threads a
    /// failing group from the back leaves the front to go on to it, for an earlier failure.
    #[test]
    fn a_failing_group_stops_the_groups_after_it() {
        let texts: Vec<Vec<u8>> = (0..=255u8).map(|i| vec![i; 100_000]).collect();
        let slices: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        for threads in [2, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let calls = std::sync::atomic::AtomicUsize::new(0);
            let first_fails = |first: usize, group: &[&[u8]], out: &mut Vec<u32>| {
                calls.fetch_add(1, Ordering::Relaxed);
                if first == 0 {
                    return Err("first");
                }
                // The others take a while, so that the failure is known before most of them start.
                std::thread::sleep(std::time::Duration::from_millis(2));
                out.extend(group.iter().map(|t| u32::from(t[0])));
                Ok(vec![1; group.len()])
            };
            assert_eq!(pool.install(|| BatchIds::encode(&slices, first_fails)).err(), Some("first"));
            let groups = groups(&slices, threads).len();
            let called = calls.load(Ordering::Relaxed);
            assert!(groups >= 8 * threads && called <= 2 * threads, "{threads} threads: {called} of {groups} groups");
        }
        // On two threads the back's failure is not the batch's when the front finds an earlier one.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let last = slices.len() - 1;
        let two_fail = |first: usize, group: &[&[u8]], out: &mut Vec<u32>| {
            if first + group.len() - 1 == last {
                return Err(last);
            }
            // The front's groups take a while: the back's failure comes first.
            std::thread::sleep(std::time::Duration::from_millis(2));
            if (first..first + group.len()).contains(&100) {
                return Err(100);
            }
            out.extend(group.iter().map(|t| u32::from(t[0])));
            Ok(vec![1; group.len()])
        };
        assert_eq!(pool.install(|| BatchIds::encode(&slices, two_fail)).err(), Some(100));
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
