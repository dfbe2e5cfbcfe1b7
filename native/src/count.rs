//! Pre-tokenize and count pieces in parallel: the drivers over documents, streams and mapped files.
//!
//! Text is cut into work units at special tokens, document boundaries and, when the splitter
//! allows it, at safe cuts ([`crate::cuts`]), so the pieces (and counts) never depend on thread
//! count, chunk or block size. Each rayon worker counts into its own table of a [`Tally`]
//! ([`crate::tables`]); a file is read block by block ([`CountSpec::count_stream`]) or counted
//! window by window from a mapping ([`CountSpec::count_windows`], [`crate::mem`]), so only about a
//! block of input is held at a time.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use crate::busy::Counting;
use crate::cuts::{next_cut, prev_cut};
use crate::memory::{Ceiling, Exceeded, MappedFile};
use crate::scan::Splitter;
use crate::specials::Specials;
use crate::tables::{Counts, LocalCounts, Tally};
use crate::valid_files;

/// Default size of the blocks [`CountSpec::count_stream`] reads.
pub const DEFAULT_BLOCK_BYTES: usize = 256 << 20;

/// Why a count failed.
#[derive(Debug)]
pub enum CountError {
    Msg(String),
    /// Invalid UTF-8 at this byte offset of the input.
    Utf8(u64),
    Io(std::io::Error),
    /// The count went past its memory ceiling (`CountSpec::ceiling`).
    Memory(Exceeded),
    /// [`stop_counts`] was called while the count ran.
    Stopped,
    /// The mapped file was cut short while it was read ([`MappedFile::cut_short`]).
    CutShort,
}

/// `data` as text to count: itself when it is valid UTF-8; else, with `replace`, each invalid
/// sequence as U+FFFD, or the error at the offset of the first.
pub fn checked_text(data: &[u8], replace: bool) -> Result<std::borrow::Cow<'_, [u8]>, CountError> {
    match std::str::from_utf8(data) {
        Ok(_) => Ok(std::borrow::Cow::Borrowed(data)),
        Err(e) if !replace => Err(CountError::Utf8(e.valid_up_to() as u64)),
        Err(_) => Ok(std::borrow::Cow::Owned(String::from_utf8_lossy(data).into_owned().into_bytes())),
    }
}

/// Files up to this size are counted on the calling thread ([`CountSpec::count_small_file`]).
pub const SMALL_FILE_BYTES: u64 = 1 << 18;

/// How many times [`stop_counts`] has been called.
static STOPS: AtomicU64 = AtomicU64::new(0);

/// Stop every count running now, each after the work unit it is on: what Ctrl-C does to a count
/// of a large file, which would otherwise run to its end (a 10 GB corpus counts for half a minute)
/// before the process could act on it. A signal is for the whole process, hence one call for every
/// count; counts made afterwards are not affected.
pub fn stop_counts() {
    STOPS.fetch_add(1, Ordering::Relaxed);
}

/// When a count's [`CountSpec`] was made, against [`stop_counts`] calls.
#[derive(Clone, Copy, Debug)]
pub struct Stop(u64);

impl Stop {
    /// A count made now: stopped by any later [`stop_counts`].
    pub fn now() -> Stop {
        Stop(STOPS.load(Ordering::Relaxed))
    }

    fn requested(self) -> bool {
        STOPS.load(Ordering::Relaxed) != self.0
    }
}

impl Default for Stop {
    fn default() -> Self {
        Stop::now()
    }
}

impl From<String> for CountError {
    fn from(s: String) -> Self {
        CountError::Msg(s)
    }
}

/// How a corpus is pre-tokenized (the splitter plus the special tokens), and when its count must
/// stop for memory.
pub struct CountSpec {
    pub splitter: Splitter,
    pub specials: Specials,
    pub chunk_bytes: usize,
    /// Checked after each batch of text is counted (a window of a file, a block of a stream).
    pub ceiling: Ceiling,
    /// Checked before each work unit is counted.
    pub stop: Stop,
}

/// A work unit: texts of about `target` bytes, each with whether it may hold special tokens (then
/// the worker splits it at them as it counts it).
type Unit<'a> = Vec<(&'a [u8], bool)>;

/// Work units as `CountSpec::units` gathers them.
struct UnitBuilder<'a> {
    units: Vec<Unit<'a>>,
    current: Unit<'a>,
    size: usize,
    target: usize,
}

impl<'a> UnitBuilder<'a> {
    /// Cut units off `seg` (which may hold special tokens when `specials`) while it is longer than
    /// the target and `cut` finds a place; the rest.
    fn cut_while(&mut self, mut seg: &'a [u8], specials: bool, cut: impl Fn(&'a [u8]) -> Option<usize>) -> &'a [u8] {
        while seg.len() > self.target {
            let Some(at) = cut(seg) else { break };
            let (head, tail) = seg.split_at(at);
            self.current.push((head, specials));
            self.units.push(std::mem::take(&mut self.current));
            self.size = 0;
            seg = tail;
        }
        seg
    }

    /// Add `seg` (which may hold special tokens when `specials`) to the current unit, which ends
    /// once it holds the target.
    fn push(&mut self, seg: &'a [u8], specials: bool) {
        self.current.push((seg, specials));
        self.size += seg.len();
        if self.size >= self.target {
            self.units.push(std::mem::take(&mut self.current));
            self.size = 0;
        }
    }
}

impl CountSpec {
    /// Cut `docs` into work units of about `chunk_bytes`: where the splitter allows safe cuts,
    /// stretches of text cut where no special token is near ([`Self::next_clear_cut`]), which the
    /// worker counting a unit splits at its special tokens (so that the search for them runs in
    /// parallel, over text about to be counted); a stretch longer than that with no such cut, and
    /// all text when the splitter allows no safe cuts, as the ordinary text between special
    /// tokens, found here.
    fn units<'a>(&self, docs: &[&'a [u8]]) -> Vec<Unit<'a>> {
        let target = self.chunk_bytes.max(1);
        let cuttable = self.splitter.cuttable();
        let split = cuttable && !self.specials.is_empty();
        let mut b = UnitBuilder { units: Vec::new(), current: Vec::new(), size: 0, target };
        let safe = |seg: &[u8]| if cuttable { next_cut(&self.splitter, seg, target) } else { None };
        for &doc in docs {
            let mut ordinary = doc;
            if split {
                let rest = b.cut_while(doc, true, |seg| self.next_clear_cut(seg, target));
                if rest.len() <= target {
                    b.push(rest, true);
                    continue;
                }
                // No line clear of special tokens to cut at (documents joined by special tokens
                // alone): the ordinary text between them, cut at safe cuts, so that the workers
                // still share it.
                ordinary = rest;
            }
            self.specials.ordinary(ordinary, |seg| {
                let rest = b.cut_while(seg, false, safe);
                b.push(rest, false)
            });
        }
        if !b.current.is_empty() {
            b.units.push(b.current);
        }
        b.units
    }

    /// Count the pieces of independent documents (files, JSON lines) into `tally`, then check the
    /// memory ceiling. Nothing borrows `docs` afterwards.
    pub fn count_into(&self, docs: &[&[u8]], tally: &Tally) -> Result<(), CountError> {
        let _counting = Counting::start();
        self.units(docs).par_iter().try_for_each(|unit| {
            if self.stop.requested() {
                return Err(CountError::Stopped);
            }
            self.count_unit(unit, &mut tally.local())
        })?;
        self.ceiling.check().map_err(CountError::Memory)
    }

    /// Count a work unit's texts into `local`, those that may hold special tokens split at them
    /// first (see [`Self::units`]).
    fn count_unit(&self, unit: &Unit<'_>, local: &mut LocalCounts) -> Result<(), CountError> {
        for &(text, specials) in unit {
            if specials {
                let mut counted = Ok(());
                self.specials.ordinary(text, |seg| {
                    if counted.is_ok() {
                        counted = local.count(&self.splitter, seg);
                    }
                });
                counted?;
            } else {
                local.count(&self.splitter, text)?;
            }
        }
        Ok(())
    }

    /// Count the file at `path` on the calling thread, read whole, if it is a regular file of at
    /// most [`SMALL_FILE_BYTES`] and one `block` (else `Ok(false)`, nothing done; a file of several
    /// blocks is [`Self::count_mapped`]'s, which reads it so): handing so small a text to a
    /// pool's threads (a thread to wait on, waking the pool, then waiting for it) took longer than
    /// counting it, and a corpus of many small files spent most of its time so. Invalid UTF-8 is
    /// replaced with `replace`, else the error at its offset, as [`Self::count_mapped`] says it.
    pub fn count_small_file(
        &self,
        path: &Path,
        tally: &Tally,
        replace: bool,
        block: usize,
    ) -> Result<bool, CountError> {
        let most = SMALL_FILE_BYTES.min(block as u64);
        let Some(meta) = std::fs::metadata(path).ok().filter(|m| m.is_file() && m.len() <= most) else {
            return Ok(false);
        };
        if self.stop.requested() {
            return Err(CountError::Stopped);
        }
        let mut data = Vec::with_capacity(meta.len() as usize);
        File::open(path).and_then(|mut f| f.read_to_end(&mut data)).map_err(CountError::Io)?;
        let text = checked_text(&data, replace)?;
        let mut local = tally.local();
        for unit in &self.units(&[&text]) {
            self.count_unit(unit, &mut local)?;
        }
        drop(local);
        self.ceiling.check().map_err(CountError::Memory)?;
        Ok(true)
    }

    /// Count the pieces of independent documents (files, JSON lines) into `into`.
    pub fn count_docs(&self, docs: &[&[u8]], into: &mut Counts) -> Result<(), CountError> {
        let mut tally = Tally::new(rayon::current_num_threads());
        self.count_into(docs, &tally)?;
        Ok(tally.drain_into(into)?)
    }

    /// The last position `c` where `text`, a prefix of a longer text, can be cut so that
    /// counting `text[..c]` and the rest separately gives the counts of the whole: the end of a
    /// special token, or (when the splitter allows) a safe cut, that no continuation of the text
    /// can change. 0 when there is none.
    ///
    /// Special tokens are found leftmost first, longest among those starting at the same place,
    /// so a match starting at `s` is final once every special starting at `s` fits in `text`
    /// (`s + max_len <= text.len()`); a later match may still change, so cuts are only made up
    /// to `text.len() - max_len`, where no special token of the whole text can straddle them.
    /// A text shorter than the longest special token has no such place: a special token may
    /// start at its very beginning and end past it (`<|` of `<|endoftext|>` read in part).
    pub fn last_cut(&self, text: &[u8]) -> usize {
        let Some(limit) = text.len().checked_sub(self.specials.max_len()) else {
            return 0;
        };
        if let Some(cut) = self.last_clear_cut(text, limit) {
            return cut;
        }
        let mut after_special = 0;
        self.specials.matches(text, |start, end| {
            if start <= limit && end > after_special {
                after_special = end;
            }
        });
        if self.splitter.cuttable() && limit > after_special {
            // `seg` runs from the last final special token to the text end; no special token
            // of the whole text starts inside it before `limit`.
            let seg = &text[after_special..];
            if let Some(cut) = prev_cut(&self.splitter, seg, limit - after_special) {
                return after_special + cut;
            }
        }
        after_special
    }

    /// One of the last few safe cuts at or before `limit` that no special token occurs near,
    /// found without reading the text before it (the search for special tokens that
    /// [`Self::last_cut`] falls back on reads the whole text: a pass over every window of a count).
    ///
    /// A special token that straddles a cut lies within `max_len - 1` bytes of it on both sides,
    /// so where no special token occurs in that stretch, none of the whole text's straddles it, and
    /// the text on either side is ordinary there. The safe-cut rule then holds as judged in the
    /// whole text: it reads at most a few characters before the cut, and where the ordinary text
    /// starts among them (after a special token) it judges more strictly than within that text.
    fn last_clear_cut(&self, text: &[u8], limit: usize) -> Option<usize> {
        /// Candidates looked at before the whole text is searched instead.
        const TRIES: usize = 16;
        if !self.splitter.cuttable() {
            return None;
        }
        let mut upto = limit;
        for _ in 0..TRIES {
            let cut = prev_cut(&self.splitter, text, upto)?;
            if self.clear_at(text, cut) {
                return Some(cut);
            }
            upto = cut - 1;
        }
        None
    }

    /// The first safe cut at or after `from` in `text` that no special token occurs near (see
    /// [`Self::last_clear_cut`]), if any. Only when the splitter allows safe cuts.
    fn next_clear_cut(&self, text: &[u8], from: usize) -> Option<usize> {
        let mut from = from;
        loop {
            let cut = next_cut(&self.splitter, text, from)?;
            if self.clear_at(text, cut) {
                return Some(cut);
            }
            from = cut + 1;
        }
    }

    /// Whether no special token occurs within `max_len - 1` bytes of `cut` on either side (so
    /// none of the whole text's straddles it).
    fn clear_at(&self, text: &[u8], cut: usize) -> bool {
        let reach = self.specials.max_len().saturating_sub(1);
        !self.specials.occur_in(&text[cut.saturating_sub(reach)..(cut + reach).min(text.len())])
    }

    /// Count a whole stream (e.g. a file) read in blocks of about `block` bytes: each block is
    /// counted up to its [`Self::last_cut`] and the rest is carried into the next one, so only
    /// about a block of text is held at a time and the counts are those of the whole text. A
    /// block with no cut (a document longer than the block, or a pattern that allows no safe
    /// cuts) grows until it has one or the stream ends. Strict UTF-8 (`replace` false) reports
    /// the stream offset of the first invalid byte; else invalid bytes become U+FFFD as in
    /// `String::from_utf8_lossy` of the whole stream. Text is only decoded up to the last "\n"
    /// read, so no character (or invalid sequence) is ever split between blocks.
    pub fn count_stream<R: Read + Send>(
        &self,
        mut reader: R,
        tally: &Tally,
        replace: bool,
        block: usize,
    ) -> Result<(), CountError> {
        let _counting = Counting::start();
        let block = block.max(1);
        let mut buf: Vec<u8> = Vec::new();
        // The next block is read into `spare` while `buf` is counted.
        let mut spare: Vec<u8> = Vec::new();
        // buf[..decoded] is valid UTF-8 (not counted yet); buf[decoded..] is raw input.
        let mut decoded = 0usize;
        // Offset in the stream of buf[decoded] (strict mode: buf holds the raw bytes).
        let mut offset = 0u64;
        let mut eof = read_more(&mut reader, &mut buf, block)?;
        loop {
            // Decode what was read. An incomplete character at the end waits for the next
            // block; invalid bytes are an error, or (replace) are decoded up to the last "\n"
            // read, which no invalid sequence can extend past.
            if let Err(e) = std::str::from_utf8(&buf[decoded..]) {
                let valid = e.valid_up_to();
                if !replace && (e.error_len().is_some() || eof) {
                    return Err(CountError::Utf8(offset + valid as u64));
                }
                offset += valid as u64;
                decoded += valid;
                if replace && (e.error_len().is_some() || eof) {
                    let upto = if eof {
                        buf.len()
                    } else {
                        memchr::memrchr(b'\n', &buf[decoded..]).map_or(decoded, |nl| decoded + nl + 1)
                    };
                    let fixed = String::from_utf8_lossy(&buf[decoded..upto]).into_owned().into_bytes();
                    let n = fixed.len();
                    buf.splice(decoded..upto, fixed);
                    decoded += n;
                }
            } else {
                offset += (buf.len() - decoded) as u64;
                decoded = buf.len();
            }
            let cut = if eof { decoded } else { self.last_cut(&buf[..decoded]) };
            if eof {
                return self.count_into(&[&buf[..cut]], tally);
            }
            // Count up to the cut while the next block is read behind the carried tail. Read at
            // least a block, and as much again as is pending, so a document longer than a block
            // costs a geometric number of passes.
            let carry = buf.len() - cut;
            let want = block.max(carry);
            spare.clear();
            spare.resize(carry, 0);
            let (counted, read) = rayon::join(
                || if cut > 0 { self.count_into(&[&buf[..cut]], tally) } else { Ok(()) },
                || read_more(&mut reader, &mut spare, want),
            );
            counted?;
            eof = read?;
            spare[..carry].copy_from_slice(&buf[cut..]);
            std::mem::swap(&mut buf, &mut spare);
            decoded -= cut;
        }
    }

    /// Count a whole text that is already in memory (e.g. a memory-mapped file), window by
    /// window of about `block` bytes, cut like [`Self::count_stream`]; after each window
    /// `release(upto)` is called: `data[..upto]` is counted and no longer needed (so a mapping's
    /// pages can be dropped). Strict UTF-8 only: the first invalid byte
    /// is reported by its offset, unless the caller knows the text valid (`known_valid`: it is
    /// not checked again). Counts are those of the whole text for every block size.
    /// `cut_short` is asked before each window is counted and as a window grows: once it holds,
    /// the text is no longer what it was (a mapped file cut short reads as zeros from its cut)
    /// and the count stops.
    pub fn count_windows<F: FnMut(usize)>(
        &self,
        data: &[u8],
        tally: &Tally,
        block: usize,
        known_valid: bool,
        cut_short: &(dyn Fn() -> bool + Sync),
        mut release: F,
    ) -> Result<(), CountError> {
        let _counting = Counting::start();
        let block = block.max(1);
        // data[..valid] is known to be valid UTF-8.
        let mut valid = if known_valid { data.len() } else { 0 };
        let mut start = 0usize;
        let mut end = self.window_end(data, start, block, &mut valid, cut_short)?;
        while start < data.len() {
            if cut_short() {
                return Err(CountError::CutShort);
            }
            // Count this window while the next one is validated and cut (serial work that
            // would otherwise leave the other workers waiting).
            let (counted, next) = rayon::join(
                || self.count_into(&[&data[start..end]], tally),
                || {
                    if end < data.len() {
                        self.window_end(data, end, block, &mut valid, cut_short)
                    } else {
                        Ok(end)
                    }
                },
            );
            counted?;
            (start, end) = (end, next?);
            release(start);
        }
        Ok(())
    }

    /// Count a mapped file window by window ([`Self::count_windows`]), giving each window's pages
    /// back once it is counted. With `borrow`, a window's new keys of at least
    /// [`crate::tables::REFER_FROM`] bytes stay where they lie in the map ([`Tally::refer_to`])
    /// when most of the window before was such keys (distinct lines, as in a stage 2 of web
    /// text), and those windows' pages stay mapped: the keys are read again (a later piece of the
    /// same hash, the merge of the workers' tables, replay), and each page given back would be
    /// mapped in again with 64 KB around it (the kernel's fault-around). The first window, and
    /// windows of repeated or short pieces (as in code), copy their keys and give their pages
    /// back, so that the map holds little more than the keys it stands in for. A file cut short
    /// while it is read ends the count in [`CountError::CutShort`], whatever else went wrong: what
    /// was read past the cut was not the file. A read that faulted stops it at once
    /// ([`MappedFile::read_past_end`]); a cut inside the last page is found once done. A file
    /// counted whole is noted valid UTF-8, and not checked again while unchanged
    /// ([`crate::valid_files`]).
    pub fn count_mapped(
        &self,
        map: &Arc<MappedFile>,
        tally: &Tally,
        block: usize,
        borrow: bool,
    ) -> Result<(), CountError> {
        let mut pages = map.pages();
        let (mut window_start, mut long_before, mut referring) = (0, tally.long_key_bytes(), false);
        let cut_short = || map.read_past_end();
        let known_valid = map.stamp().is_some_and(valid_files::is_valid);
        let counted = self.count_windows(map.bytes(), tally, block, known_valid, &cut_short, |upto| {
            if referring {
                pages.keep_below(upto);
            } else {
                pages.release_below(upto);
            }
            if !borrow {
                return;
            }
            let long = tally.long_key_bytes();
            referring = 2 * (long - long_before) >= (upto - window_start) as u64;
            if referring {
                tally.refer_to(map);
            } else {
                tally.copy_keys();
            }
            (window_start, long_before) = (upto, long);
        });
        tally.copy_keys();
        if map.cut_short() {
            return Err(CountError::CutShort);
        }
        if let (Ok(()), Some(stamp)) = (&counted, map.stamp()) {
            valid_files::note_valid(stamp);
        }
        counted
    }

    /// The end of the window of `data` that starts at `start` (a cut): about `block` bytes
    /// on, at the window's [`Self::last_cut`], the window growing until it has one. Validates
    /// UTF-8 up to there (`valid` tracks how far it is known to be valid). Stops once `cut_short`
    /// holds (see [`Self::count_windows`]): zeros past a cut hold no cut, and the window would
    /// grow to the end of the map.
    fn window_end(
        &self,
        data: &[u8],
        start: usize,
        block: usize,
        valid: &mut usize,
        cut_short: &(dyn Fn() -> bool + Sync),
    ) -> Result<usize, CountError> {
        let mut size = block;
        loop {
            if cut_short() {
                return Err(CountError::CutShort);
            }
            let end = start.saturating_add(size).min(data.len());
            if *valid < end {
                match std::str::from_utf8(&data[*valid..end]) {
                    Ok(_) => *valid = end,
                    Err(e) if e.error_len().is_none() && end < data.len() => *valid += e.valid_up_to(),
                    Err(e) => return Err(CountError::Utf8((*valid + e.valid_up_to()) as u64)),
                }
            }
            if end == data.len() && *valid == end {
                return Ok(end);
            }
            let cut = self.last_cut(&data[start..(*valid).min(end)]);
            if cut > 0 {
                return Ok(start + cut);
            }
            // No cut in this window (a long document): try one twice as large.
            size = size.saturating_mul(2);
        }
    }
}

/// Append up to `want` bytes from `reader` to `buf` (without zero-filling the space first);
/// returns whether the stream ended.
fn read_more<R: Read>(reader: &mut R, buf: &mut Vec<u8>, want: usize) -> Result<bool, CountError> {
    buf.reserve(want);
    let n = reader.by_ref().take(want as u64).read_to_end(buf).map_err(CountError::Io)?;
    Ok(n < want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{builtin_pattern, Builtin};

    fn spec(b: Builtin, line_units: bool, specials: &[&str], chunk: usize) -> CountSpec {
        CountSpec {
            splitter: Splitter::new(&builtin_pattern(b), line_units).unwrap(),
            specials: Specials::new(&specials.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>()),
            chunk_bytes: chunk,
            ceiling: Ceiling::default(),
            stop: Stop::now(),
        }
    }

    fn count(s: &CountSpec, text: &str) -> Vec<(Vec<u8>, u64)> {
        let mut c = Counts::default();
        s.count_docs(&[text.as_bytes()], &mut c).unwrap();
        c.sorted().into_iter().map(|(k, v)| (k.to_vec(), v)).collect()
    }

    #[test]
    fn counts_do_not_depend_on_chunk_size() {
        let text = "Hello world.\nHello  there\n  indented\nx<|e|>y world\n\nHello \nA\u{3000}\nB .\n//x\n".repeat(37);
        for b in crate::scan::ALL_BUILTINS {
            let big = count(&spec(b, b == Builtin::Superbpe, &["<|e|>"], 1 << 20), &text);
            for chunk in [1, 2, 7, 64, 300] {
                assert_eq!(count(&spec(b, b == Builtin::Superbpe, &["<|e|>"], chunk), &text), big, "{b:?} {chunk}");
            }
        }
    }

    fn custom_spec(pattern: &str, line_units: bool, specials: &[&str], chunk: usize) -> CountSpec {
        CountSpec {
            splitter: Splitter::new(pattern, line_units).unwrap(),
            specials: Specials::new(&specials.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>()),
            chunk_bytes: chunk,
            ceiling: Ceiling::default(),
            stop: Stop::now(),
        }
    }

    fn count_streamed(
        s: &CountSpec,
        text: &[u8],
        block: usize,
        replace: bool,
    ) -> Result<Vec<(Vec<u8>, u64)>, CountError> {
        let mut tally = Tally::new(2);
        s.count_stream(text, &tally, replace, block)?;
        let mut c = Counts::default();
        tally.drain_into(&mut c)?;
        Ok(c.sorted().into_iter().map(|(k, v)| (k.to_vec(), v)).collect())
    }

    fn count_windowed(s: &CountSpec, text: &[u8], block: usize) -> Result<Vec<(Vec<u8>, u64)>, CountError> {
        let mut tally = Tally::new(2);
        let mut released = 0;
        s.count_windows(text, &tally, block, false, &|| false, |upto| {
            assert!(upto <= text.len() && upto >= released);
            released = upto;
        })?;
        assert_eq!(released, text.len());
        let mut c = Counts::default();
        tally.drain_into(&mut c)?;
        Ok(c.sorted().into_iter().map(|(k, v)| (k.to_vec(), v)).collect())
    }

    #[test]
    fn a_count_made_before_a_stop_stops_and_one_made_after_counts() {
        let text = block_corpus();
        let mut s = spec(Builtin::Gpt2, false, &["<|e|>"], 64);
        // As if `stop_counts` had been called since `s` was made (without stopping the counts of
        // tests running beside this one).
        s.stop = Stop(STOPS.load(Ordering::Relaxed).wrapping_sub(1));
        let mut windows = 0;
        let tally = Tally::new(2);
        let stopped = s.count_windows(text.as_bytes(), &tally, 100, false, &|| false, |_| windows += 1);
        assert!(matches!(stopped, Err(CountError::Stopped)), "{stopped:?}");
        assert_eq!(windows, 0);
        assert!(matches!(count_streamed(&s, text.as_bytes(), 100, false), Err(CountError::Stopped)));
        assert!(matches!(s.count_docs(&[text.as_bytes()], &mut Counts::default()), Err(CountError::Stopped)));
        s.stop = Stop::now();
        assert_eq!(count_windowed(&s, text.as_bytes(), 100).unwrap(), count(&s, &text));
    }

    /// A mapped file cut short before it is read ends its count in an error, borrowed or not:
    /// cut pages away, the read faults (a SIGBUS caught, not the process's end); cut inside its
    /// last page, it does not, and the count finds the cut once done.
    #[test]
    fn a_mapped_file_cut_short_while_counted_is_refused() {
        let text = block_corpus().repeat(40);
        let path = std::env::temp_dir().join(format!("superbpe-cut-count-test-{}", std::process::id()));
        let s = spec(Builtin::Gpt2, false, &["<|e|>"], 64);
        for (borrow, cut_to) in [(false, 5000), (true, 5000), (false, text.len() - 3)] {
            std::fs::write(&path, &text).unwrap();
            let file = File::open(&path).unwrap();
            // SAFETY: the test's own file; it is only cut short, which the map is watched for.
            let map = Arc::new(unsafe { MappedFile::open(&file, path.to_str().unwrap()) }.unwrap().unwrap());
            assert!(map.bytes().len() > 3 * 8192);
            std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(cut_to as u64).unwrap();
            let tally = Tally::new(2);
            let counted = s.count_mapped(&map, &tally, 1000, borrow);
            assert!(matches!(counted, Err(CountError::CutShort)), "{counted:?}");
            assert_eq!(map.read_past_end(), cut_to == 5000);
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// A file counted whole is checked for UTF-8 once: a file noted valid is not checked again
    /// (one noted by hand with an invalid byte counts without error), one that changed since is,
    /// and a file found invalid is not noted.
    #[test]
    fn a_mapped_file_found_valid_is_checked_again_only_once_changed() {
        let text = block_corpus().repeat(40);
        let path = std::env::temp_dir().join(format!("superbpe-valid-count-test-{}", std::process::id()));
        let s = spec(Builtin::Gpt2, false, &["<|e|>"], 64);
        let count_file = || {
            let file = File::open(&path).unwrap();
            // SAFETY: the test's own file, not changed while mapped.
            let map = Arc::new(unsafe { MappedFile::open(&file, path.to_str().unwrap()) }.unwrap().unwrap());
            let tally = Tally::new(2);
            (s.count_mapped(&map, &tally, 1000, false), map.stamp().unwrap())
        };
        std::fs::write(&path, &text).unwrap();
        let (counted, stamp) = count_file();
        assert!(counted.is_ok() && valid_files::is_valid(stamp), "{counted:?}");

        let mut invalid = text.clone().into_bytes();
        invalid[5000] = 0xFF;
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, &invalid).unwrap();
        let (counted, stamp) = count_file();
        assert!(matches!(counted, Err(CountError::Utf8(5000))), "{counted:?}");
        assert!(!valid_files::is_valid(stamp));

        valid_files::note_valid(stamp);
        assert!(count_file().0.is_ok(), "noted valid: not checked");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_count_past_its_ceiling_stops_after_the_window_that_went_past() {
        let text = block_corpus();
        let mut s = spec(Builtin::Gpt2, false, &["<|e|>"], 64);
        s.ceiling = Ceiling { rss: Some(1), reserve: None };
        let mut windows = 0;
        let tally = Tally::new(2);
        match s.count_windows(text.as_bytes(), &tally, 100, false, &|| false, |_| windows += 1) {
            Err(CountError::Memory(Exceeded::Rss { held, limit: 1 })) => assert!(held > 1),
            other => panic!("{other:?}"),
        }
        assert_eq!(windows, 0, "the first window went past: none is released as counted");
        assert!(matches!(count_streamed(&s, text.as_bytes(), 100, false), Err(CountError::Memory(_))));
        assert!(matches!(s.count_docs(&[text.as_bytes()], &mut Counts::default()), Err(CountError::Memory(_))));
        s.ceiling = Ceiling { rss: Some(u64::MAX), reserve: None };
        assert_eq!(count_windowed(&s, text.as_bytes(), 100).unwrap(), count(&s, &text));
    }

    /// A corpus with specials at every offset modulo small block sizes, a document far longer
    /// than the blocks, multi-byte characters, whitespace runs before newlines and text after
    /// the last newline.
    fn block_corpus() -> String {
        let mut t = String::new();
        for i in 0..40 {
            t.push_str(&"ab ".repeat(i % 7));
            t.push_str("Hello world.\n  x\u{e9}\u{4e2d}\u{1F600} 12345 \n\nfoo//bar \n");
            t.push_str(if i % 3 == 0 { "<|e|>" } else { "<|e|><|e" });
            t.push_str("y\n");
        }
        t.push_str(&"long line without any newline at all ".repeat(20));
        t.push('\n');
        t.push_str(&"word \u{e9}t\u{e9} ".repeat(30));
        t.push_str("<|e|>tail with no newline");
        t
    }

    #[test]
    fn counts_do_not_depend_on_block_size() {
        let text = block_corpus();
        let mut specs: Vec<(String, CountSpec)> = Vec::new();
        for b in crate::scan::ALL_BUILTINS {
            for lu in [false, true] {
                specs.push((format!("{b:?} {lu}"), spec(b, lu, &["<|e|>", "<|e|><|e"], 64)));
            }
        }
        specs.push(("custom".into(), custom_spec(r"\s+\S|[a-z]+", false, &["<|e|>"], 64)));
        specs.push(("custom lines".into(), custom_spec(r"[a-z]+\s", true, &["<|e|>"], 64)));
        specs.push(("no specials".into(), custom_spec(r"\p{L}+", false, &[], 64)));
        for (name, s) in &specs {
            let whole = count(s, &text);
            for block in [1, 2, 3, 5, 7, 16, 61, 200, 1 << 20] {
                let got = count_streamed(s, text.as_bytes(), block, false).unwrap();
                assert_eq!(got, whole, "{name} block {block}");
                assert_eq!(count_windowed(s, text.as_bytes(), block).unwrap(), whole, "{name} windows {block}");
            }
        }
    }

    /// Special tokens that hold or end in whitespace and newlines, next to the newlines cuts are
    /// made after: random texts count the same whatever the windows (the cut found near the end
    /// of a window without searching all of it must be one the whole search allows).
    #[test]
    fn counts_near_specials_that_hold_whitespace_do_not_depend_on_block_size() {
        let specials = ["<s>", "<s> ", "\n<s>\n", " \n", "\n\n<t>"];
        let words = ["\n", " ", "a", "bc", "/", "<s>", "<s> ", " \n", "\n<s>\n", "\n\n<t>", "<t>", "\u{e9}", "12"];
        let seed = &mut 0x0DDB_1A5E_5BAD_5EEDu64;
        for round in 0..200 {
            let text: String =
                (0..crate::test_below(seed, 120)).map(|_| words[crate::test_below(seed, words.len())]).collect();
            let builtins = crate::scan::ALL_BUILTINS;
            let (name, s) = match builtins.get(round % (builtins.len() + 1)) {
                Some(&b) => (format!("{b:?}"), spec(b, round % 2 == 0, &specials, 64)),
                None => ("custom".to_string(), custom_spec(r"[a-z]+\s|\s+|\S", true, &specials, 64)),
            };
            let whole = count(&s, &text);
            for block in [1, 2, 3, 5, 8, 13, 40] {
                assert_eq!(count_windowed(&s, text.as_bytes(), block).unwrap(), whole, "{name} {block} {text:?}");
                assert_eq!(
                    count_streamed(&s, text.as_bytes(), block, false).unwrap(),
                    whole,
                    "{name} {block} {text:?}"
                );
            }
        }
    }

    /// Documents joined by special tokens alone (no line to cut at) are still cut into work units
    /// at the special tokens, so that every worker gets some of a window.
    #[test]
    fn documents_joined_by_specials_alone_make_many_units() {
        let text = "one two three<|e|>".repeat(100);
        let s = spec(Builtin::Gpt2, false, &["<|e|>"], 64);
        let units = s.units(&[text.as_bytes()]);
        assert!(units.len() >= 20, "{} units", units.len());
        assert!(units.iter().flatten().all(|&(_, specials)| !specials), "split here, not again by the workers");
        assert_eq!(count_windowed(&s, text.as_bytes(), 100).unwrap(), count(&s, &text));
    }

    #[test]
    fn a_window_shorter_than_the_longest_special_is_not_cut() {
        // The window "<|" holds the whole special "<|" but only the start of "<|endoftext|>",
        // which is what the text holds: cut after "<|", its rest was counted as text.
        let text = "<|endoftext|>a<|endoftext|>";
        for b in crate::scan::ALL_BUILTINS {
            let s = spec(b, false, &["<|endoftext|>", "<|end|>", "<|"], 64);
            assert_eq!(s.last_cut(b"<|"), 0, "{b:?}");
            assert_eq!(s.last_cut(b"<|end"), 0, "{b:?}");
            let whole = count(&s, text);
            assert_eq!(whole, vec![(b"a".to_vec(), 1)], "{b:?}");
            for block in [1, 2, 3, 5, 12, 13, 14] {
                assert_eq!(count_streamed(&s, text.as_bytes(), block, false).unwrap(), whole, "{b:?} {block}");
                assert_eq!(count_windowed(&s, text.as_bytes(), block).unwrap(), whole, "{b:?} windows {block}");
            }
        }
    }

    #[test]
    fn stream_reports_invalid_utf8_offset() {
        let s = spec(Builtin::Gpt2, false, &["<|e|>"], 64);
        // A valid 4-byte character straddles many block edges; the bad byte is at 31.
        let mut text = "ab\u{1F600}cd\n<|e|>\u{e9}\u{4e2d}x y\nz".as_bytes().to_vec();
        let bad = text.len();
        text.extend_from_slice(b"\xff tail\n");
        for block in [1, 2, 3, 4, 5, 8, 1 << 20] {
            match count_streamed(&s, &text, block, false) {
                Err(CountError::Utf8(at)) => assert_eq!(at, bad as u64, "block {block}"),
                other => panic!("block {block}: {other:?}"),
            }
            match count_windowed(&s, &text, block) {
                Err(CountError::Utf8(at)) => assert_eq!(at, bad as u64, "windows {block}"),
                other => panic!("windows {block}: {other:?}"),
            }
        }
        // A truncated character at the very end.
        let trunc = b"ok\n\xe4\xb8".to_vec();
        for block in [1, 2, 4, 1 << 20] {
            assert!(matches!(count_streamed(&s, &trunc, block, false), Err(CountError::Utf8(3))));
            assert!(matches!(count_windowed(&s, &trunc, block), Err(CountError::Utf8(3))));
        }
        // errors="replace": the same as decoding the whole text at once.
        let mut mixed = text.clone();
        mixed.extend_from_slice(b"\xe4\xb8 q\n\xc3<|e|>\xf0\x9f\x98");
        let lossy = String::from_utf8_lossy(&mixed).into_owned();
        let whole = count(&s, &lossy);
        for block in [1, 2, 3, 5, 1 << 20] {
            assert_eq!(count_streamed(&s, &mixed, block, true).unwrap(), whole, "block {block}");
        }
    }

    #[test]
    fn specials_are_not_counted() {
        let got = count(&spec(Builtin::Gpt2, false, &["<|e|>"], 100), "a<|e|>a");
        assert_eq!(got, vec![(b"a".to_vec(), 2)]);
    }
}
