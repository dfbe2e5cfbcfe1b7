//! PyO3 bindings: the `superbpe._native` module.
//!
//! Arguments are validated in Python (`superbpe/native_engine.py`) before they get here. Heavy
//! work runs with the GIL released, and every entry point catches Rust panics so a bug surfaces
//! as a Python `RuntimeError` with a message instead of killing the interpreter.

use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::count::{safe_chunks, CountError, CountSpec, Counts, Tally, DEFAULT_BLOCK_BYTES};
use crate::encode::Encoder;
use crate::mem::MappedFile;
use crate::scan::Splitter;
use crate::specials::Specials;
use crate::train::{Rules, Source, Trainer, MAX_MERGES};
use crate::{countsfile, memory, unicode};

create_exception!(_native, InvalidUtf8, PyValueError, "Invalid UTF-8; args[0] is the byte offset.");

/// Errors from the Rust core, before conversion to Python exceptions.
enum NativeError {
    Msg(String),
    Utf8(usize),
    Py(PyErr),
}

impl From<String> for NativeError {
    fn from(s: String) -> Self {
        NativeError::Msg(s)
    }
}

impl From<NativeError> for PyErr {
    fn from(e: NativeError) -> PyErr {
        match e {
            NativeError::Msg(m) => PyValueError::new_err(m),
            NativeError::Utf8(offset) => InvalidUtf8::new_err(offset),
            NativeError::Py(e) => e,
        }
    }
}

/// Run `f` with the GIL released, turning a panic into a `RuntimeError`.
fn run_detached<T: Send, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce() -> Result<T, NativeError> + Send,
{
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match result {
        Ok(r) => r.map_err(PyErr::from),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(PyRuntimeError::new_err(format!("native engine panicked: {msg}")))
        }
    }
}

fn pool(workers: usize) -> PyResult<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(workers)
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start worker threads: {e}")))
}

/// Piece counts held in Rust, so millions of pieces need not become Python objects.
#[pyclass(module = "superbpe._native", name = "NativeCounts")]
#[derive(Default)]
pub struct NativeCounts {
    inner: Counts,
}

#[pymethods]
impl NativeCounts {
    #[new]
    fn new() -> Self {
        NativeCounts::default()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Number of piece occurrences.
    fn total(&self) -> u128 {
        self.inner.total()
    }

    fn get(&self, piece: &[u8]) -> u64 {
        self.inner.get(piece)
    }

    /// The distinct byte values of all pieces that occur, ascending (a vocabulary's "seen" alphabet).
    fn bytes_seen<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let mut seen = [false; 256];
        for (piece, count) in self.inner.iter() {
            if count > 0 {
                piece.iter().for_each(|&b| seen[b as usize] = true);
            }
        }
        let found: Vec<u8> = (0..=255u8).filter(|&b| seen[b as usize]).collect();
        PyBytes::new(py, &found)
    }

    /// `dict[bytes, int]` of all entries.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.iter() {
            d.set_item(PyBytes::new(py, k), v)?;
        }
        Ok(d)
    }

    /// Counts from a `Mapping[bytes, int]` (keys bytes, values 0..2**64, checked in Python).
    #[staticmethod]
    fn from_dict(d: &Bound<'_, PyDict>) -> PyResult<NativeCounts> {
        let mut inner = Counts::default();
        for (k, v) in d.iter() {
            let k = k.cast::<PyBytes>()?;
            let v: u64 = v.extract()?;
            inner.add(k.as_bytes(), v).map_err(PyValueError::new_err)?;
        }
        Ok(NativeCounts { inner })
    }

    /// Add `other` into these counts.
    fn update(&mut self, py: Python<'_>, other: &NativeCounts) -> PyResult<()> {
        let inner = &mut self.inner;
        let theirs = &other.inner;
        run_detached(py, || inner.merge(theirs).map_err(NativeError::from))
    }

    /// The `.counts` file bytes with the given JSON meta (docs/DESIGN.md).
    fn serialize<'py>(&self, py: Python<'py>, meta: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &self.inner;
        let data = run_detached(py, || Ok(countsfile::serialize(inner, meta)))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Parse `.counts` file bytes: `(meta_json_bytes, NativeCounts)`.
    #[staticmethod]
    fn parse<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(Bound<'py, PyBytes>, NativeCounts)> {
        let (meta, inner) = run_detached(py, || countsfile::parse(data).map_err(NativeError::from))?;
        Ok((PyBytes::new(py, &meta), NativeCounts { inner }))
    }
}

impl From<CountError> for NativeError {
    fn from(e: CountError) -> Self {
        match e {
            CountError::Msg(m) => NativeError::Msg(m),
            CountError::Utf8(offset) => NativeError::Utf8(offset as usize),
            CountError::Io(e) => NativeError::Msg(format!("cannot read ({e})")),
        }
    }
}

/// Streams inputs into one set of counts with a fixed pre-tokenizer and special tokens.
#[pyclass(module = "superbpe._native", name = "Counter")]
pub struct Counter {
    spec: CountSpec,
    /// Counts in progress (one table per worker); merged into `counts` by `take`.
    tally: Tally,
    counts: Counts,
    pool: rayon::ThreadPool,
}

impl Counter {
    fn count_text(&mut self, py: Python<'_>, data: &[u8], replace: bool) -> PyResult<()> {
        let (spec, tally, pool) = (&self.spec, &self.tally, &self.pool);
        run_detached(py, || {
            let text = match std::str::from_utf8(data) {
                Ok(_) => std::borrow::Cow::Borrowed(data),
                Err(e) if !replace => return Err(NativeError::Utf8(e.valid_up_to())),
                Err(_) => std::borrow::Cow::Owned(String::from_utf8_lossy(data).into_owned().into_bytes()),
            };
            pool.install(|| spec.count_into(&[&text], tally)).map_err(NativeError::from)
        })
    }
}

#[pymethods]
impl Counter {
    #[new]
    fn new(
        pattern: &str,
        line_units: bool,
        specials: Vec<Vec<u8>>,
        chunk_bytes: usize,
        workers: usize,
    ) -> PyResult<Self> {
        let splitter = Splitter::new(pattern, line_units).map_err(PyValueError::new_err)?;
        let spec = CountSpec { splitter, specials: Specials::new(&specials), chunk_bytes };
        let workers = workers.max(1);
        Ok(Counter { spec, tally: Tally::new(workers), counts: Counts::default(), pool: pool(workers)? })
    }

    /// Count a plain UTF-8 file block by block of about `block_bytes` (the counts never depend
    /// on the block size). Strict UTF-8: the file is memory-mapped and the pages of each block
    /// are dropped from the mapping once it is counted, so the process never holds more than
    /// about a block of the file. With `replace` it is read in blocks instead (invalid bytes are
    /// decoded into new text). The file must not change meanwhile.
    #[pyo3(signature = (path, replace, block_bytes = DEFAULT_BLOCK_BYTES))]
    fn count_file(&mut self, py: Python<'_>, path: &str, replace: bool, block_bytes: usize) -> PyResult<()> {
        let file = File::open(path).map_err(|e| PyValueError::new_err(format!("{path}: cannot read ({e})")))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (spec, tally, pool) = (&self.spec, &self.tally, &self.pool);
        let read_error = |e: CountError| match e {
            CountError::Io(e) => NativeError::Msg(format!("{path}: cannot read ({e})")),
            e => NativeError::from(e),
        };
        if replace || len == 0 {
            return run_detached(py, || {
                pool.install(|| spec.count_stream(file, tally, replace, block_bytes)).map_err(read_error)
            });
        }
        // SAFETY: inputs are not modified while a count runs (documented requirement, as for any
        // reader); the map is dropped before returning.
        let map = unsafe { MappedFile::open(&file) }
            .map_err(|e| PyValueError::new_err(format!("{path}: cannot map ({e})")))?;
        run_detached(py, || {
            let mut pages = map.pages();
            pool.install(|| spec.count_windows(map.bytes(), tally, block_bytes, |upto| pages.release_below(upto)))
                .map_err(read_error)
        })
    }

    /// Count one whole text given as bytes (e.g. a decompressed file).
    fn count_bytes(&mut self, py: Python<'_>, data: &[u8], replace: bool) -> PyResult<()> {
        self.count_text(py, data, replace)
    }

    /// Count independent documents (e.g. JSON lines).
    fn count_docs(&mut self, py: Python<'_>, docs: Vec<PyBackedStr>) -> PyResult<()> {
        let (spec, tally, pool) = (&self.spec, &self.tally, &self.pool);
        run_detached(py, || {
            let slices: Vec<&[u8]> = docs.iter().map(|d| d.as_bytes()).collect();
            pool.install(|| spec.count_into(&slices, tally)).map_err(NativeError::from)
        })
    }

    /// Hand over the counts so far (the counter starts again from empty).
    fn take(&mut self, py: Python<'_>) -> PyResult<NativeCounts> {
        let (tally, counts, pool) = (&mut self.tally, &mut self.counts, &self.pool);
        run_detached(py, || pool.install(|| tally.drain_into(counts)).map_err(NativeError::from))?;
        Ok(NativeCounts { inner: std::mem::take(&mut self.counts) })
    }
}

/// Pieces of `text` (for tests and the python side's differential checks).
#[pyfunction]
fn pretokenize(py: Python<'_>, pattern: &str, line_units: bool, text: &str) -> PyResult<Vec<String>> {
    let splitter = Splitter::new(pattern, line_units).map_err(PyValueError::new_err)?;
    let bytes = text.as_bytes();
    let spans: Vec<(usize, usize)> = run_detached(py, || {
        let mut spans = Vec::new();
        let base = bytes.as_ptr() as usize;
        splitter.split(bytes, &mut |p: &[u8]| {
            let start = p.as_ptr() as usize - base;
            spans.push((start, start + p.len()));
        })?;
        Ok(spans)
    })?;
    Ok(spans.into_iter().map(|(a, b)| text[a..b].to_string()).collect())
}

/// Whether the native engine can split with `pattern` (a scanner, or fancy-regex compiles it).
#[pyfunction]
fn supports_pattern(pattern: &str) -> bool {
    Splitter::new(pattern, false).is_ok()
}

/// Whether `pattern` gets a hand-written scanner (else fancy-regex).
#[pyfunction]
fn has_scanner(pattern: &str) -> bool {
    crate::scan::builtin_for(pattern).is_some()
}

/// The scanners' class code of every code point (0..0x110000), for checking the tables.
#[pyfunction]
fn char_classes<'py>(py: Python<'py>) -> Bound<'py, PyBytes> {
    let v: Vec<u8> = (0..0x110000u32).map(unicode::class_of).collect();
    PyBytes::new(py, &v)
}

/// `superbpe.trainer.MergeRules` as Python has it (attributes read by name; validated in Python).
#[derive(FromPyObject)]
struct PyRules {
    min_frequency: u64,
    max_token_bytes: Option<usize>,
    max_words_per_token: Option<usize>,
    forbidden_substrings: Vec<Vec<u8>>,
    tie_break: String,
    duplicates: String,
    absent_inherited: String,
}

impl From<PyRules> for Rules {
    fn from(r: PyRules) -> Rules {
        Rules {
            min_frequency: r.min_frequency,
            max_token_bytes: r.max_token_bytes,
            max_words_per_token: r.max_words_per_token,
            forbidden_substrings: r.forbidden_substrings,
            tie_break_ids: r.tie_break == "ids",
            merge_duplicates: r.duplicates == "merge",
            drop_absent: r.absent_inherited == "drop",
        }
    }
}

/// Train merges; see `superbpe.trainer.train_merges` (validation happens in Python).
/// `build_progress(phase, done, total)`, if given, hears how building the state goes (replay,
/// index) before choosing starts.
#[pyfunction]
#[pyo3(signature = (counts, num_merges, replay, rules, callback, callback_every, build_progress=None, consume=false))]
#[allow(clippy::too_many_arguments)]
fn train<'py>(
    py: Python<'py>,
    mut counts: PyRefMut<'_, NativeCounts>,
    num_merges: usize,
    replay: Vec<(Vec<u8>, Vec<u8>)>,
    rules: PyRules,
    callback: Option<Py<PyAny>>,
    callback_every: usize,
    build_progress: Option<Py<PyAny>>,
    consume: bool,
) -> PyResult<(Bound<'py, PyList>, bool)> {
    if num_merges > MAX_MERGES {
        return Err(PyValueError::new_err(format!(
            "{num_merges} merges; the native trainer makes at most {MAX_MERGES}"
        )));
    }
    let rules = Rules::from(rules);
    // With `consume`, the table moves into the trainer, which frees it once replayed (the caller's
    // object is left empty).
    let owned = if consume { Some(std::mem::take(&mut counts.inner)) } else { None };
    let counts: &NativeCounts = &counts;
    let every = callback_every.max(1);
    // One list grown in place: the callback gets it (Python wraps it read-only) and the result is it, so
    // each merge becomes a Python tuple once however often the callback runs.
    let merges: Py<PyList> = PyList::empty(py).unbind();
    let (trainer, stopped) = run_detached(py, || {
        let mut failed: Option<PyErr> = None;
        let mut report = |phase: &str, done: u64, total: u64| -> Result<(), String> {
            let Some(cb) = &build_progress else { return Ok(()) };
            Python::attach(|py| cb.bind(py).call1((phase, done, total)).map(drop)).map_err(|e| {
                failed = Some(e);
                "build progress callback failed".to_string()
            })
        };
        let source = match owned {
            Some(table) => Source::Owned(table),
            None => Source::Borrowed(&counts.inner),
        };
        let built = Trainer::with_rules(source, &replay, &rules, &mut report);
        let mut trainer = match (built, failed) {
            (_, Some(e)) => return Err(NativeError::Py(e)),
            (built, None) => built?,
        };
        let stopped = trainer
            .choose(num_merges, &rules, every, |t| match &callback {
                None => Ok(false),
                Some(cb) => Python::attach(|py| {
                    let list = merges.bind(py);
                    extend_merges(list, t)?;
                    cb.bind(py).call1((list,))?.is_truthy()
                }),
            })
            .map_err(NativeError::Py)?;
        Ok((trainer, stopped))
    })?;
    let list = merges.into_bound(py);
    extend_merges(&list, &trainer)?;
    drop_in_background(trainer);
    Ok((list, stopped))
}

/// What building a trainer on `counts` with `replay` under `rules` will add to this process's memory
/// at its peak, estimated (see `memory.rs`; `consume`: the counts are handed to the trainer):
/// `(peak_bytes, symbols, pieces, bytes)`.
#[pyfunction]
fn train_memory(
    py: Python<'_>,
    counts: &NativeCounts,
    replay: Vec<(Vec<u8>, Vec<u8>)>,
    rules: PyRules,
    consume: bool,
) -> PyResult<(u64, u64, u64, u64)> {
    let inner = &counts.inner;
    let rules = Rules::from(rules);
    let e = run_detached(py, || Ok(memory::estimate(inner, &replay, &rules, consume)?))?;
    Ok((e.peak_bytes, e.symbols, e.pieces, e.bytes))
}

/// Free a large structure on a helper thread: a trainer holds millions of small allocations whose
/// release took 0.15 s per stage on kernel_docs, time the caller need not wait for. If no thread
/// can be started, `spawn` drops the closure, and with it the value, right here.
fn drop_in_background<T: Send + 'static>(value: T) {
    let _ = std::thread::Builder::new().name("superbpe-drop".into()).spawn(move || drop(value));
}

/// Append the merges `list` lacks (those chosen since it was last extended) as `(bytes, bytes)` tuples.
fn extend_merges(list: &Bound<'_, PyList>, t: &Trainer) -> PyResult<()> {
    let py = list.py();
    for (l, r) in t.merges_from(list.len()) {
        list.append(PyTuple::new(py, [PyBytes::new(py, l), PyBytes::new(py, r)])?)?;
    }
    Ok(())
}

/// Rank-based encoder over a bytes -> id vocabulary.
#[pyclass(module = "superbpe._native", name = "Encoder")]
pub struct NativeEncoder {
    inner: Encoder,
    pool: rayon::ThreadPool,
    /// One Python int per id (ids are dense in practice): a result list then holds new
    /// references to these instead of a fresh int object per token, which made building the
    /// list cost as much as encoding.
    id_objects: Vec<Py<PyAny>>,
}

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
    #[pyo3(signature = (vocab, merges, pattern, line_units, workers, whole_pieces = true))]
    fn new(
        py: Python<'_>,
        vocab: &Bound<'_, PyDict>,
        merges: Vec<(Vec<u8>, Vec<u8>)>,
        pattern: &str,
        line_units: bool,
        workers: usize,
        whole_pieces: bool,
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
        let inner = Encoder::new(v, &merges, splitter, whole_pieces).map_err(PyValueError::new_err)?;
        Ok(NativeEncoder { inner, pool: pool(workers.max(1))?, id_objects })
    }

    /// Ids of text with no special-token handling.
    fn encode_ordinary<'py>(&self, py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyList>> {
        let inner = &self.inner;
        let bytes = text.as_bytes();
        let ids = run_detached(py, || {
            let mut out = Vec::with_capacity(bytes.len() / 3 + 1);
            inner.encode_ordinary(bytes, &mut out)?;
            Ok(out)
        })?;
        ids_list(py, &ids, &self.id_objects)
    }

    /// Encode texts in parallel into one flat buffer of little-endian ids (`dtype` "uint16" or
    /// "uint32"; Python wraps it with `numpy.frombuffer`) plus the end offset of each text's ids
    /// as little-endian uint64.
    fn encode_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        dtype: &str,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let (inner, pool) = (&self.inner, &self.pool);
        let (ids, ends) = run_detached(py, || {
            let slices: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
            pool.install(|| inner.encode_batch(&slices)).map_err(NativeError::from)
        })?;
        let ends = PyBytes::new_with(py, ends.len() * 8, |buf| {
            for (chunk, e) in buf.chunks_exact_mut(8).zip(&ends) {
                chunk.copy_from_slice(&e.to_le_bytes());
            }
            Ok(())
        })?;
        Ok((ids_buffer(py, &ids, dtype)?, ends))
    }

    /// Encode one large text in parallel, cut only where pieces cannot cross; ids as in
    /// `encode_batch`.
    fn encode_array<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        dtype: &str,
        chunk_bytes: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (inner, pool) = (&self.inner, &self.pool);
        let bytes = text.as_bytes();
        let (ids, _) = run_detached(py, || {
            let chunks = safe_chunks(inner.splitter(), bytes, chunk_bytes.max(1));
            pool.install(|| inner.encode_batch(&chunks)).map_err(NativeError::from)
        })?;
        ids_buffer(py, &ids, dtype)
    }
}

/// Ids as packed little-endian integers of the given width, written straight into a bytes object.
fn ids_buffer<'py>(py: Python<'py>, ids: &[u32], dtype: &str) -> PyResult<Bound<'py, PyBytes>> {
    match dtype {
        "uint32" => PyBytes::new_with(py, ids.len() * 4, |buf| {
            for (chunk, id) in buf.chunks_exact_mut(4).zip(ids) {
                chunk.copy_from_slice(&id.to_le_bytes());
            }
            Ok(())
        }),
        "uint16" => {
            if let Some(id) = ids.iter().find(|&&id| id > u16::MAX as u32) {
                return Err(PyValueError::new_err(format!("id {id} does not fit in uint16")));
            }
            PyBytes::new_with(py, ids.len() * 2, |buf| {
                for (chunk, id) in buf.chunks_exact_mut(2).zip(ids) {
                    chunk.copy_from_slice(&(*id as u16).to_le_bytes());
                }
                Ok(())
            })
        }
        _ => Err(PyValueError::new_err(format!("dtype must be 'uint16' or 'uint32', not {dtype:?}"))),
    }
}

/// Panic on purpose (tests check that it becomes a Python exception).
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    run_detached(py, || -> Result<(), NativeError> { panic!("deliberate test panic") })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("InvalidUtf8", m.py().get_type::<InvalidUtf8>())?;
    m.add_class::<NativeCounts>()?;
    m.add_class::<Counter>()?;
    m.add_class::<NativeEncoder>()?;
    m.add_function(wrap_pyfunction!(pretokenize, m)?)?;
    m.add_function(wrap_pyfunction!(has_scanner, m)?)?;
    m.add_function(wrap_pyfunction!(supports_pattern, m)?)?;
    m.add_function(wrap_pyfunction!(char_classes, m)?)?;
    m.add_function(wrap_pyfunction!(train, m)?)?;
    m.add_function(wrap_pyfunction!(train_memory, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    Ok(())
}
