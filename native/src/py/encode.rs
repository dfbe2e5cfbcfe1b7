//! The rank-based encoder, its ids handed out as shared int objects or packed buffers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyUnicodeDecodeError;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyString;

use super::*;
use crate::batch::{ids_room, thread_share, BatchIds, FirstFailure};
use crate::encode_levels::{Plan, Request};
use crate::memory::spare;

/// Rank-based encoder over a bytes -> id vocabulary.
#[pyclass(module = "superbpe._native", name = "Encoder")]
pub struct NativeEncoder {
    inner: Encoder,
    /// The pool of `encode_batch` and `encode_array`, sized when the encoder is made.
    pool: rayon::ThreadPool,
    /// The helpers (`threads - 1` threads) of the last `encode_texts*` call with more than one
    /// thread, kept with their number: starting threads costs more than encoding a small batch,
    /// and callers keep to one count.
    sized_pool: Mutex<Option<(usize, Arc<rayon::ThreadPool>)>>,
    /// One Python int per id (ids are dense in practice): a result list then holds new
    /// references to these instead of a fresh int object per token, which made building the
    /// list cost as much as encoding.
    id_objects: Vec<Py<PyAny>>,
    /// The special tokens `plain` and `plain_array` look for.
    watched: Specials,
}

/// Texts from this many bytes on are encoded with the GIL released (about 100 µs of work).
const DETACH_MIN_BYTES: usize = 1 << 15;

/// Largest id for which an int object is kept (bigger ids are created per use).
const MAX_CACHED_ID: u32 = 1 << 22;

/// A list of ints from ids, sharing the encoder's int objects.
fn ids_list<'py>(py: Python<'py>, ids: &[u32], objects: &[Py<PyAny>]) -> PyResult<Bound<'py, PyList>> {
    let len = pyo3::ffi::Py_ssize_t::try_from(ids.len()).map_err(|e| PyValueError::new_err(e.to_string()))?;
    // SAFETY: PyList_New returns a new list (or NULL with an exception set) whose slots we fill
    // exactly once each with a new strong reference, as PyList_SET_ITEM requires.
    unsafe {
        let list = pyo3::ffi::PyList_New(len);
        if list.is_null() {
            return Err(PyErr::fetch(py));
        }
        let list = Bound::from_owned_ptr(py, list).cast_into_unchecked::<PyList>();
        for (i, &id) in ids.iter().enumerate() {
            let obj = match objects.get(id as usize) {
                Some(o) => o.clone_ref(py).into_ptr(),
                None => {
                    let Ok(obj) = id.into_pyobject(py);
                    obj.into_any().into_ptr()
                }
            };
            pyo3::ffi::PyList_SET_ITEM(list.as_ptr(), i as pyo3::ffi::Py_ssize_t, obj);
        }
        Ok(list)
    }
}

#[pymethods]
impl NativeEncoder {
    #[new]
    #[pyo3(signature = (vocab, merges, pattern, line_units, workers = 0, whole_pieces = true, two_level = true, transition = None, watched = Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        vocab: &Bound<'_, PyDict>,
        merges: Vec<(Vec<u8>, Vec<u8>)>,
        pattern: &str,
        line_units: bool,
        workers: usize,
        whole_pieces: bool,
        two_level: bool,
        transition: Option<usize>,
        watched: Vec<Vec<u8>>,
    ) -> PyResult<Self> {
        let mut v: Vec<(Vec<u8>, u32)> = Vec::with_capacity(vocab.len());
        for (k, id) in vocab.iter() {
            v.push((k.cast::<PyBytes>()?.as_bytes().to_vec(), id.extract()?));
        }
        let max_id = v.iter().map(|(_, id)| *id).max().unwrap_or(0).min(MAX_CACHED_ID);
        let id_objects: Vec<Py<PyAny>> = (0..=max_id)
            .map(|id| {
                let Ok(obj) = id.into_pyobject(py);
                obj.into_any().unbind()
            })
            .collect();
        let splitter = Splitter::new(pattern, line_units).map_err(PyValueError::new_err)?;
        let request = match (two_level, transition) {
            (false, _) => Request::One,
            (true, None) => Request::Auto,
            (true, Some(t)) => Request::Transition(t),
        };
        let inner = Encoder::with_levels(v, &merges, splitter, whole_pieces, request).map_err(PyValueError::new_err)?;
        // `workers` 0 leaves the count to rayon: RAYON_NUM_THREADS when set, else the usable cores.
        let watched = Specials::new(&watched);
        Ok(NativeEncoder { inner, pool: pool(workers)?, sized_pool: Mutex::new(None), id_objects, watched })
    }

    /// 2 when pieces are encoded on two levels (`encode_levels.rs`), else 1.
    #[getter]
    fn levels(&self) -> u8 {
        match self.inner.plan() {
            Plan::Two(_) => 2,
            Plan::One(_) => 1,
        }
    }

    /// The transition of the two levels (merges below it run first), None on one level.
    #[getter]
    fn transition(&self) -> Option<u32> {
        match self.inner.plan() {
            Plan::Two(levels) => Some(levels.transition()),
            Plan::One(_) => None,
        }
    }

    /// Why the encoder runs one level ("" on two).
    #[getter]
    fn levels_reason(&self) -> &str {
        match self.inner.plan() {
            Plan::Two(_) => "",
            Plan::One(why) => why,
        }
    }

    /// Ids of text with no special-token handling. A short text is encoded holding the GIL:
    /// releasing and taking it back costs more than such a text takes to encode, and far more when
    /// another thread is waiting for it.
    fn encode_ordinary<'py>(&self, py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyList>> {
        self.with_text_ids(py, text, |ids| ids_list(py, ids, &self.id_objects))
    }

    /// `encode_ordinary` as a numpy array of `dtype` ("uint16" or "uint32"): no Python object
    /// per id, and none for the cyclic collector to walk.
    fn encode_ordinary_array<'py>(&self, py: Python<'py>, text: &str, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
        check_dtype(dtype)?;
        self.with_text_ids(py, text, |ids| ids_array_of(py, ids, dtype))
    }

    /// `encode_ordinary(text)` when `text` is a str holding none of the watched special tokens
    /// and it encodes; else None, and the caller takes its general path, which gives the ids or
    /// the error. The common case of a per-document call in one step: no Python around it.
    fn plain<'py>(&self, py: Python<'py>, text: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyList>>> {
        self.if_plain(py, text, |ids| ids_list(py, ids, &self.id_objects))
    }

    /// `plain` as a numpy array of `dtype` ("uint16" or "uint32").
    fn plain_array<'py>(
        &self,
        py: Python<'py>,
        text: &Bound<'py, PyAny>,
        dtype: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        check_dtype(dtype)?;
        self.if_plain(py, text, |ids| ids_array_of(py, ids, dtype))
    }

    /// Ids of each text as a list of lists, special tokens (`specials`: their bytes and ids) cut
    /// out first as `Tokenizer.encode` does; on `threads` threads (1: the calling thread alone).
    fn encode_texts<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        specials: Vec<(Vec<u8>, u32)>,
        threads: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        if threads == 0 {
            return Err(PyValueError::new_err("threads must be at least 1"));
        }
        let mut lists = ListBuilder::new(py, texts.len(), &self.id_objects)?;
        if threads == 1 {
            for block in self.encode_blocks(py, &texts, specials, 1)? {
                lists.push(&block)?;
            }
            return lists.finish();
        }
        self.encode_lists_overlapped(py, &texts, SpecialIds::new(specials), threads, &mut lists)?;
        lists.finish()
    }

    /// As `encode_texts`, into one numpy array of ids (`dtype` "uint16" or "uint32") and the
    /// offsets of the texts' ids as int64: `len(texts) + 1` of them, from 0, so text `i` has ids
    /// `[offsets[i], offsets[i + 1])`.
    fn encode_texts_flat<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        specials: Vec<(Vec<u8>, u32)>,
        threads: usize,
        dtype: &str,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        check_dtype(dtype)?;
        let blocks = self.encode_blocks(py, &texts, specials, threads)?;
        let mut offsets = Vec::with_capacity(texts.len() + 1);
        offsets.push(0i64);
        let mut base = 0;
        for block in &blocks {
            offsets.extend(block.ends.iter().map(|&end| (base + end) as i64));
            base += block.ids.len();
        }
        let parts = BatchIds::of_buffers(blocks.into_iter().map(|b| b.ids).collect());
        // Joined by the encoder's pool when the batch had helpers, else here (one block).
        let pool = (threads > 1).then_some(&self.pool);
        let ids = run_detached(py, || {
            let ids = match pool {
                Some(pool) => pool.install(|| joined(parts, dtype)),
                None => joined(parts, dtype),
            };
            ids.map_err(NativeError::from)
        })?;
        Ok((joined_array(py, ids)?, PyArray1::from_vec(py, offsets).into_any()))
    }

    /// The ids of `data`, UTF-8 text given as bytes, special tokens cut out, as one numpy array
    /// (`dtype` "uint16" or "uint32"), on the calling thread with the GIL released (but for a
    /// short text, where releasing it costs more than it frees): a corpus read as bytes needs no
    /// str (decoding one, and Python's UTF-8 copy of a non-ASCII one, held the GIL, which threads
    /// encoding chunks side by side then waited for). Invalid UTF-8 raises `UnicodeDecodeError`
    /// as `bytes.decode` does, or with `replace` becomes U+FFFD as `bytes.decode(errors="replace")`
    /// makes it.
    fn encode_utf8<'py>(
        &self,
        py: Python<'py>,
        data: PyBackedBytes,
        specials: Vec<(Vec<u8>, u32)>,
        dtype: &str,
        replace: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_dtype(dtype)?;
        let inner = &self.inner;
        let encode = || {
            let text = match std::str::from_utf8(&data) {
                Ok(_) => std::borrow::Cow::Borrowed(&data[..]),
                Err(e) if !replace => return Ok(Err(e)),
                Err(_) => std::borrow::Cow::Owned(String::from_utf8_lossy(&data).into_owned().into_bytes()),
            };
            let mut ids = ids_room(text.len());
            // A text holding none of the specials (most) needs no finder of them built.
            if specials.iter().any(|(s, _)| memchr::memmem::find(&text, s).is_some()) {
                SpecialIds::new(specials).encode(inner, &text, &mut ids, text.len())?;
            } else {
                inner.encode_ordinary(&text, &mut ids)?;
            }
            Ok(Ok(joined(BatchIds::one(ids), dtype)?))
        };
        let encoded = if data.len() < DETACH_MIN_BYTES { run_attached(encode) } else { run_detached(py, encode) }?;
        match encoded {
            Ok(ids) => joined_array(py, ids),
            Err(e) => Err(utf8_error(py, &data, e)),
        }
    }

    /// Encode texts in parallel into one numpy array of ids (`dtype` "uint16" or "uint32") plus
    /// the end offset of each text's ids (uint64).
    fn encode_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        dtype: &str,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        check_dtype(dtype)?;
        let (inner, pool) = (&self.inner, &self.pool);
        let (ids, ends) = run_detached(py, || {
            let slices: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
            let ids = pool.install(|| inner.encode_batch_ids(&slices)).map_err(NativeError::from)?;
            let ends: Vec<u64> = ids.ends().collect();
            let ids = pool.install(|| joined(ids, dtype))?;
            Ok((ids, ends))
        })?;
        Ok((joined_array(py, ids)?, PyArray1::from_vec(py, ends).into_any()))
    }

    /// Encode one large text in parallel, cut only where pieces cannot cross; ids as in
    /// `encode_batch`.
    fn encode_array<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        dtype: &str,
        chunk_bytes: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_dtype(dtype)?;
        let (inner, pool) = (&self.inner, &self.pool);
        let bytes = text.as_bytes();
        let ids = run_detached(py, || {
            let chunks = safe_chunks(inner.splitter(), bytes, chunk_bytes.max(1));
            pool.install(|| joined(inner.encode_batch_ids(&chunks)?, dtype)).map_err(NativeError::from)
        })?;
        joined_array(py, ids)
    }
}

/// Texts given to one rayon task: at least this many bytes of them (or one text), so a task's
/// work outweighs handing it out, while a batch of short documents still spreads over threads.
const BLOCK_BYTES: usize = 64 << 10;

/// The ids of a run of consecutive texts, and where each text's ids end in them.
struct Block {
    ids: Vec<u32>,
    ends: Vec<usize>,
}

impl Block {
    /// Each text's ids, in order.
    fn texts(&self) -> impl Iterator<Item = &[u32]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter()).map(|(start, &end)| &self.ids[start..end])
    }
}

/// Special tokens and their ids, cut out of a text before the ordinary text between them is
/// encoded (the leftmost occurrence wins, the longest there, as `SpecialSplitter` does).
struct SpecialIds {
    finder: Specials,
    ids: HashMap<Vec<u8>, u32>,
}

impl SpecialIds {
    fn new(specials: Vec<(Vec<u8>, u32)>) -> SpecialIds {
        let tokens: Vec<Vec<u8>> = specials.iter().map(|(t, _)| t.clone()).collect();
        SpecialIds { finder: Specials::new(&tokens), ids: specials.into_iter().collect() }
    }

    /// Ids of one text: its special tokens' ids, the ordinary text between them encoded, by a
    /// caller that encodes about `share` bytes on this thread in all
    /// ([`Encoder::encode_ordinary_of_share`]).
    fn encode(&self, inner: &Encoder, text: &[u8], out: &mut Vec<u32>, share: usize) -> Result<(), String> {
        if self.finder.is_empty() {
            return inner.encode_ordinary_of_share(text, out, share);
        }
        let mut pos = 0;
        let mut result = Ok(());
        self.finder.matches(text, |start, end| {
            if result.is_err() {
                return;
            }
            if start > pos {
                result = inner.encode_ordinary_of_share(&text[pos..start], out, share);
            }
            out.push(self.ids[&text[start..end]]);
            pos = end;
        });
        result?;
        if pos < text.len() {
            inner.encode_ordinary_of_share(&text[pos..], out, share)?;
        }
        Ok(())
    }
}

/// Consecutive texts grouped into runs of about `block_bytes` (index ranges).
fn block_ranges(texts: &[PyBackedStr], block_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, text) in texts.iter().enumerate() {
        bytes += text.len();
        if bytes >= block_bytes {
            ranges.push(start..i + 1);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < texts.len() {
        ranges.push(start..texts.len());
    }
    ranges
}

impl NativeEncoder {
    /// `f` of the ids of one text with no special-token handling. A short text is encoded holding
    /// the GIL (see `encode_ordinary`) into room its piece cache keeps, a long one with the GIL
    /// released into a vector of its own.
    fn with_text_ids<'py, R>(
        &self,
        py: Python<'py>,
        text: &str,
        f: impl FnOnce(&[u32]) -> PyResult<Bound<'py, R>>,
    ) -> PyResult<Bound<'py, R>> {
        let inner = &self.inner;
        let bytes = text.as_bytes();
        if bytes.len() < DETACH_MIN_BYTES {
            return run_attached(|| Ok(inner.with_ids(bytes, f)?))?;
        }
        let ids = run_detached(py, || {
            let mut out = ids_room(bytes.len());
            inner.encode_ordinary(bytes, &mut out)?;
            Ok(out)
        })?;
        let built = f(&ids);
        spare::IDS.give(ids);
        built
    }

    /// `Some(f(ids))` for a plain text (see `plain`), None for anything else: not a str, not
    /// valid UTF-8, holding a watched special token, or failing to encode.
    fn if_plain<'py, R>(
        &self,
        py: Python<'py>,
        text: &Bound<'py, PyAny>,
        f: impl FnOnce(&[u32]) -> PyResult<Bound<'py, R>>,
    ) -> PyResult<Option<Bound<'py, R>>> {
        let Ok(text) = text.cast::<PyString>() else { return Ok(None) };
        let Ok(text) = text.to_str() else { return Ok(None) };
        let bytes = text.as_bytes();
        if self.watched.occur_in(bytes) {
            return Ok(None);
        }
        let inner = &self.inner;
        if bytes.len() < DETACH_MIN_BYTES {
            return match run_attached(|| Ok(inner.with_ids(bytes, f)))? {
                Ok(built) => built.map(Some),
                Err(_) => Ok(None),
            };
        }
        let encoded = run_detached(py, || {
            let mut out = ids_room(bytes.len());
            Ok(inner.encode_ordinary(bytes, &mut out).map(|()| out))
        })?;
        encoded.map_or(Ok(None), |ids| {
            let built = f(&ids).map(Some);
            spare::IDS.give(ids);
            built
        })
    }

    /// A pool of `threads` threads, the one kept from the last call when its size fits.
    fn sized_pool(&self, threads: usize) -> PyResult<Arc<rayon::ThreadPool>> {
        let mut kept = self.sized_pool.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((size, pool)) = kept.as_ref() {
            if *size == threads {
                return Ok(Arc::clone(pool));
            }
        }
        let fresh = Arc::new(pool(threads)?);
        *kept = Some((threads, Arc::clone(&fresh)));
        Ok(fresh)
    }

    /// Encode `texts` block by block with the GIL released, on the calling thread and
    /// `threads - 1` helpers. An error names the first text that fails.
    fn encode_blocks(
        &self,
        py: Python<'_>,
        texts: &[PyBackedStr],
        specials: Vec<(Vec<u8>, u32)>,
        threads: usize,
    ) -> PyResult<Vec<Block>> {
        let helpers = self.helpers(threads)?;
        let specials = SpecialIds::new(specials);
        // On one thread the batch is one block: its ids are then one vector (see `joined_array`).
        let block_bytes = if helpers.is_some() { BLOCK_BYTES } else { usize::MAX };
        let work = Work::new(&self.inner, &specials, texts, block_bytes, threads);
        run_detached(py, || {
            let mut results = Results::new(work.ranges.len());
            let Some(pool) = helpers else {
                while let Some((i, block)) = work.next() {
                    results.add(i, block);
                }
                return results.into_blocks().map_err(NativeError::Msg);
            };
            pool.in_place_scope(|scope| {
                let receiver = work.start_helpers(scope, pool.current_num_threads());
                while let Some((i, block)) = work.next() {
                    results.add(i, block);
                }
                for (i, block) in receiver {
                    results.add(i, block);
                }
            });
            results.into_blocks().map_err(NativeError::Msg)
        })
    }

    /// Lists of ids for `threads` > 1. Making Python objects needs the GIL, so only this thread
    /// can build the lists; it does so for each block as soon as the blocks before it are built,
    /// and encodes a block itself (GIL released) whenever the next one is not ready yet, while
    /// `threads - 1` helpers encode. So the building overlaps the encoding, and `threads`
    /// threads are busy in all.
    fn encode_lists_overlapped(
        &self,
        py: Python<'_>,
        texts: &[PyBackedStr],
        specials: SpecialIds,
        threads: usize,
        lists: &mut ListBuilder<'_, '_>,
    ) -> PyResult<()> {
        let Some(pool) = self.helpers(threads)? else {
            return Err(PyValueError::new_err("overlapped building needs more than one thread"));
        };
        let work = Work::new(&self.inner, &specials, texts, BLOCK_BYTES, threads);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            pool.in_place_scope(|scope| -> PyResult<()> {
                let mut receiver = work.start_helpers(scope, pool.current_num_threads());
                let mut results = Results::new(work.ranges.len());
                let mut built = 0;
                let mut encoding = true; // blocks may be left to claim
                loop {
                    while let Ok((i, block)) = receiver.try_recv() {
                        results.add(i, block);
                    }
                    if results.error.is_none() {
                        while let Some(block) = results.take(built) {
                            lists.push(&block)?;
                            built += 1;
                        }
                    }
                    if built == results.waiting.len() {
                        return Ok(());
                    }
                    if encoding {
                        match py.detach(|| work.next()) {
                            Some((i, block)) => results.add(i, block),
                            None => encoding = false,
                        }
                        continue;
                    }
                    let received;
                    (receiver, received) = py.detach(move || {
                        let received = receiver.recv();
                        (receiver, received)
                    });
                    match received {
                        Ok((i, block)) => results.add(i, block),
                        Err(_) => break, // every helper is done
                    }
                }
                match results.error {
                    Some((_, e)) => Err(PyValueError::new_err(e)),
                    None => Err(PyRuntimeError::new_err("a block of the batch was never encoded")),
                }
            })
        }));
        outcome.unwrap_or_else(|panic| {
            Err(PyRuntimeError::new_err(format!("native engine panicked: {}", panic_message(&panic))))
        })
    }

    /// The pool of helpers for `threads` (the calling thread is one of them): None for one.
    fn helpers(&self, threads: usize) -> PyResult<Option<Arc<rayon::ThreadPool>>> {
        match threads {
            0 => Err(PyValueError::new_err("threads must be at least 1")),
            1 => Ok(None),
            n => self.sized_pool(n - 1).map(Some),
        }
    }
}

/// A batch cut into blocks, handed out one at a time to whichever thread asks next.
struct Work<'a> {
    inner: &'a Encoder,
    specials: &'a SpecialIds,
    texts: &'a [PyBackedStr],
    ranges: Vec<std::ops::Range<usize>>,
    /// The bytes each of the batch's threads encodes, about: what a piece cache seeded for it
    /// makes room for.
    share: usize,
    claimed: AtomicUsize,
    /// Later blocks than a failed one are not started, earlier ones still run, so the error
    /// reported is that of the first failing text, as on one thread.
    failed: FirstFailure,
}

type Encoded = (usize, Result<Block, String>);

impl<'a> Work<'a> {
    /// The blocks of `texts` for `threads` threads.
    fn new(
        inner: &'a Encoder,
        specials: &'a SpecialIds,
        texts: &'a [PyBackedStr],
        block_bytes: usize,
        threads: usize,
    ) -> Self {
        let ranges = block_ranges(texts, block_bytes);
        let share = thread_share(texts.iter().map(|t| t.len()).sum(), threads);
        Work { inner, specials, texts, ranges, share, claimed: AtomicUsize::new(0), failed: FirstFailure::default() }
    }

    /// Claim the next block and encode it; None when every block is claimed (or all that are
    /// left come after a failed one).
    fn next(&self) -> Option<Encoded> {
        let i = self.claimed.fetch_add(1, Ordering::Relaxed);
        if i >= self.ranges.len() || self.failed.is_after(i) {
            return None;
        }
        let block = encode_range(self.inner, self.specials, self.texts, self.ranges[i].clone(), self.share);
        if block.is_err() {
            self.failed.note(i);
        }
        Some((i, block))
    }

    /// `helpers` tasks on the scope's pool, each encoding blocks until none is left; their
    /// blocks arrive on the receiver, which ends when they all have.
    fn start_helpers<'scope>(&'scope self, scope: &rayon::Scope<'scope>, helpers: usize) -> mpsc::Receiver<Encoded>
    where
        'a: 'scope,
    {
        let (sender, receiver) = mpsc::channel();
        for _ in 0..helpers {
            let sender = sender.clone();
            scope.spawn(move |_| {
                while let Some(encoded) = self.next() {
                    if sender.send(encoded).is_err() {
                        return; // the caller stopped listening (it failed)
                    }
                }
            });
        }
        receiver
    }
}

/// Blocks as they arrive, in any order, and the failure of the lowest block.
struct Results {
    waiting: Vec<Option<Block>>,
    error: Option<(usize, String)>,
}

impl Results {
    fn new(blocks: usize) -> Results {
        Results { waiting: (0..blocks).map(|_| None).collect(), error: None }
    }

    fn add(&mut self, i: usize, block: Result<Block, String>) {
        match block {
            Ok(block) => self.waiting[i] = Some(block),
            Err(e) if self.error.as_ref().is_none_or(|(at, _)| i < *at) => self.error = Some((i, e)),
            Err(_) => {}
        }
    }

    /// Block `i`, if it has arrived (and was not taken before).
    fn take(&mut self, i: usize) -> Option<Block> {
        self.waiting.get_mut(i).and_then(Option::take)
    }

    /// Every block in order, or the first failure.
    fn into_blocks(self) -> Result<Vec<Block>, String> {
        if let Some((_, e)) = self.error {
            return Err(e);
        }
        self.waiting
            .into_iter()
            .map(|b| b.ok_or_else(|| "a block of the batch was never encoded".to_string()))
            .collect()
    }
}

/// The ids of the texts in `range`, special tokens cut out, as one block, by a thread that encodes
/// about `share` bytes of the batch.
fn encode_range(
    inner: &Encoder,
    specials: &SpecialIds,
    texts: &[PyBackedStr],
    range: std::ops::Range<usize>,
    share: usize,
) -> Result<Block, String> {
    let bytes: usize = texts[range.clone()].iter().map(|t| t.len()).sum();
    let mut block = Block { ids: ids_room(bytes), ends: Vec::with_capacity(range.len()) };
    for i in range {
        specials.encode(inner, texts[i].as_bytes(), &mut block.ids, share).map_err(|e| format!("texts[{i}]: {e}"))?;
        block.ends.push(block.ids.len());
    }
    Ok(block)
}

/// The outer list of `encode_texts`, filled block by block with one list of ids per text. Its
/// slots are empty (NULL) until filled: it takes no more texts than it has slots, and is handed
/// out only once every slot is filled.
struct ListBuilder<'py, 'a> {
    py: Python<'py>,
    outer: Bound<'py, PyList>,
    len: usize,
    filled: usize,
    objects: &'a [Py<PyAny>],
}

impl<'py, 'a> ListBuilder<'py, 'a> {
    fn new(py: Python<'py>, len: usize, objects: &'a [Py<PyAny>]) -> PyResult<Self> {
        let size = pyo3::ffi::Py_ssize_t::try_from(len).map_err(|e| PyValueError::new_err(e.to_string()))?;
        // SAFETY: PyList_New returns a new list (or NULL with an exception set); `push` sets each
        // slot once, in order, and a list dropped before it is full holds NULLs, which CPython's
        // list deallocation skips.
        let outer = unsafe {
            let list = pyo3::ffi::PyList_New(size);
            if list.is_null() {
                return Err(PyErr::fetch(py));
            }
            Bound::from_owned_ptr(py, list).cast_into_unchecked::<PyList>()
        };
        Ok(ListBuilder { py, outer, len, filled: 0, objects })
    }

    /// A list of ids for each text of `block`, in the next slots.
    ///
    /// The cyclic garbage collector is paused meanwhile: every new list counts towards its next
    /// run, and its runs kept walking the lists already made (lists of ints, which can hold no
    /// cycle), which cost as much as the encoding. It is on again once the block is in.
    fn push(&mut self, block: &Block) -> PyResult<()> {
        // SAFETY: a plain call of the C API with the GIL held.
        let collecting = unsafe { pyo3::ffi::PyGC_Disable() } == 1;
        let mut result = Ok(());
        for ids in block.texts() {
            if self.filled == self.len {
                result = Err(PyRuntimeError::new_err("more lists of ids than texts"));
                break;
            }
            let list = match ids_list(self.py, ids, self.objects) {
                Ok(list) => list,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            // SAFETY: `filled` < the list's length (checked above) and each slot is set once.
            unsafe {
                pyo3::ffi::PyList_SET_ITEM(self.outer.as_ptr(), self.filled as pyo3::ffi::Py_ssize_t, list.into_ptr())
            };
            self.filled += 1;
        }
        if collecting {
            // SAFETY: as above; it was on before this block.
            unsafe { pyo3::ffi::PyGC_Enable() };
        }
        result
    }

    /// The list, once every slot is filled (a NULL item would crash whoever reads it).
    fn finish(self) -> PyResult<Bound<'py, PyList>> {
        if self.filled < self.len {
            return Err(PyRuntimeError::new_err("fewer lists of ids than texts"));
        }
        Ok(self.outer)
    }
}

fn check_dtype(dtype: &str) -> PyResult<()> {
    match dtype {
        "uint16" | "uint32" => Ok(()),
        _ => Err(PyValueError::new_err(format!("dtype must be 'uint16' or 'uint32', not {dtype:?}"))),
    }
}

/// Ids as a new numpy array of `dtype` ("uint16" or "uint32"), copied.
fn ids_array_of<'py>(py: Python<'py>, ids: &[u32], dtype: &str) -> PyResult<Bound<'py, PyAny>> {
    if dtype == "uint32" {
        return Ok(PyArray1::from_slice(py, ids).into_any());
    }
    // Written straight into the array's own memory: a vector of the narrowed ids handed over to
    // numpy costs a second Python object per array, which a short text notices. Whether every id
    // fits is learnt in the same pass (the bits of all ids or-ed together), not in one before it.
    // SAFETY: `new` gives a fresh one-dimensional, contiguous, aligned array of `ids.len()`
    // uninitialized elements that no one else sees yet. They are viewed as `MaybeUninit` (no
    // reference to an unwritten `u16` is made), and every one is written below, through the slice
    // of exactly that length, before the array is returned or dropped.
    let (array, bits) = unsafe {
        let array = PyArray1::<u16>::new(py, ids.len(), false);
        let slots = std::slice::from_raw_parts_mut(array.data() as *mut std::mem::MaybeUninit<u16>, ids.len());
        let mut bits = 0;
        for (slot, &id) in slots.iter_mut().zip(ids) {
            slot.write(id as u16);
            bits |= id;
        }
        (array, bits)
    };
    if bits > u16::MAX as u32 {
        let id = ids.iter().find(|&&id| id > u16::MAX as u32).unwrap_or(&bits);
        return Err(PyValueError::new_err(format!("id {id} does not fit in uint16")));
    }
    Ok(array.into_any())
}

/// A batch's ids joined, in the width of its numpy array.
enum Joined {
    Wide(Vec<u32>),
    Narrow(Vec<u16>),
}

/// A batch's ids joined in order as `dtype` ("uint16" or "uint32"), by the current pool's threads
/// (run it inside the pool); an id that does not fit in uint16 is the error.
fn joined(ids: BatchIds, dtype: &str) -> Result<Joined, String> {
    if dtype == "uint32" {
        return Ok(Joined::Wide(ids.into_ids()));
    }
    ids.into_narrow().map(Joined::Narrow).map_err(|id| format!("id {id} does not fit in uint16"))
}

/// Joined ids as a numpy array that takes over their buffer, and gives it back for reuse when it
/// goes (`ids_array`). One part of uint32 ids is that buffer as it is (a batch on one thread is one
/// part): copying a large batch's ids, and faulting in the fresh memory of the copy, was a good part
/// of the batch.
fn joined_array(py: Python<'_>, ids: Joined) -> PyResult<Bound<'_, PyAny>> {
    match ids {
        Joined::Wide(ids) => {
            // The array keeps the whole allocation: the pages of the room its ids do not use go.
            spare::release_room(&ids);
            ids_array(py, ids)
        }
        Joined::Narrow(ids) => ids_array(py, ids),
    }
}

/// Owns the buffer behind a numpy array of ids (the array's base object) and gives it back for
/// reuse (`memory::spare`) when the array goes. It holds the buffer as raw parts: Python may write
/// the array, and nothing in Rust reads the buffer until it is given back.
#[pyclass(module = "superbpe._native", frozen)]
struct IdsBuffer {
    address: usize,
    len: usize,
    capacity: usize,
    wide: bool,
}

impl Drop for IdsBuffer {
    fn drop(&mut self) {
        let (len, capacity) = (self.len, self.capacity);
        // SAFETY: the parts are those of the vector `ids_array` took apart (of u32 when `wide`, else
        // of u16: `IdType::WIDE` of its element type), which nothing else owns; the array that
        // viewed it is gone (this is its base).
        unsafe {
            if self.wide {
                spare::IDS.give(Vec::from_raw_parts(self.address as *mut u32, len, capacity));
            } else {
                spare::NARROW_IDS.give(Vec::from_raw_parts(self.address as *mut u16, len, capacity));
            }
        }
    }
}

/// An id type whose buffers `IdsBuffer` gives back: u32 (`wide`) or u16.
trait IdType: numpy::Element {
    const WIDE: bool;
}

impl IdType for u32 {
    const WIDE: bool = true;
}

impl IdType for u16 {
    const WIDE: bool = false;
}

/// `ids` as a numpy array whose buffer goes back to `memory::spare` when the array goes.
fn ids_array<T: IdType>(py: Python<'_>, ids: Vec<T>) -> PyResult<Bound<'_, PyAny>> {
    let mut ids = std::mem::ManuallyDrop::new(ids);
    let (pointer, len, capacity) = (ids.as_mut_ptr(), ids.len(), ids.capacity());
    // From here the owner holds the vector (and gives it back if making it fails).
    let owner = Bound::new(py, IdsBuffer { address: pointer as usize, len, capacity, wide: T::WIDE })?;
    // SAFETY: `pointer` holds `len` initialised elements, aligned, that stay where they are while
    // `owner` lives (it never touches them before it is dropped), and `owner` becomes the array's
    // base, so it lives as long as the array.
    let array = unsafe {
        let view = numpy::ndarray::ArrayView1::from_shape_ptr(len, pointer as *const T);
        PyArray1::borrow_from_array(&view, owner.into_any())
    };
    Ok(array.into_any())
}

/// The `UnicodeDecodeError` that `bytes.decode("utf-8")` raises for `data` (its range and reason):
/// PyO3's own says "invalid utf-8" for every kind of fault.
fn utf8_error(py: Python<'_>, data: &[u8], e: std::str::Utf8Error) -> PyErr {
    let start = e.valid_up_to();
    let (end, reason) = match e.error_len() {
        None => (data.len(), c"unexpected end of data"),
        Some(n) if matches!(data[start], 0x80..=0xC1 | 0xF5..=0xFF) => (start + n, c"invalid start byte"),
        Some(n) => (start + n, c"invalid continuation byte"),
    };
    match PyUnicodeDecodeError::new(py, c"utf-8", data, start..end, reason) {
        Ok(error) => PyErr::from_value(error.into_any()),
        Err(other) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block with more texts than the list has slots is refused before any slot past the end
    /// is written, and a list with slots left empty is never handed out.
    #[test]
    fn lists_of_ids_fill_their_slots_exactly() {
        Python::initialize();
        Python::attach(|py| {
            let block = Block { ids: vec![1, 2, 3], ends: vec![1, 3] };
            let mut lists = ListBuilder::new(py, 1, &[]).unwrap();
            assert!(lists.push(&block).is_err(), "two texts into one slot");
            assert_eq!(lists.filled, 1);
            assert!(lists.finish().is_ok(), "the one slot was filled");
            let mut lists = ListBuilder::new(py, 3, &[]).unwrap();
            lists.push(&block).unwrap();
            assert!(lists.finish().is_err(), "a slot left empty");
            let mut lists = ListBuilder::new(py, 2, &[]).unwrap();
            lists.push(&block).unwrap();
            let list = lists.finish().unwrap();
            assert_eq!(list.extract::<Vec<Vec<u32>>>().unwrap(), vec![vec![1], vec![2, 3]]);
        });
    }
}
