//! Piece counts held in Rust (`NativeCounts`) and the streaming `Counter` that fills them.

use super::*;

/// Piece counts held in Rust, so millions of pieces need not become Python objects.
#[pyclass(module = "superbpe._native", name = "NativeCounts")]
#[derive(Default)]
pub struct NativeCounts {
    pub(super) inner: Counts,
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

    /// The bytes of all pieces (what the `.counts` file holds besides 12 bytes per entry).
    fn key_bytes(&self) -> u64 {
        self.inner.key_bytes()
    }

    /// Number of piece occurrences.
    fn total(&self) -> u128 {
        self.inner.total()
    }

    fn get(&mut self, piece: &[u8]) -> u64 {
        self.inner.get(piece)
    }

    /// The distinct byte values of all pieces that occur, ascending (a vocabulary's "seen" alphabet).
    fn bytes_seen<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut seen = [false; 256];
        for (piece, count) in self.inner.iter() {
            if count > 0 {
                piece.iter().for_each(|&b| seen[b as usize] = true);
            }
        }
        intact(&self.inner)?;
        let found: Vec<u8> = (0..=255u8).filter(|&b| seen[b as usize]).collect();
        Ok(PyBytes::new(py, &found))
    }

    /// `dict[bytes, int]` of all entries.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.iter() {
            d.set_item(PyBytes::new(py, k), v)?;
        }
        intact(&self.inner)?;
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
    fn update(&mut self, py: Python<'_>, mut other: PyRefMut<'_, NativeCounts>) -> PyResult<()> {
        let (inner, theirs) = (&mut self.inner, &mut other.inner);
        run_detached(py, || {
            // Counts only listed are indexed once here, so that they merge shard by shard.
            theirs.index();
            inner.merge(theirs).map_err(NativeError::from)
        })
    }

    /// The `.counts` file bytes with the given JSON meta (docs/DESIGN.md).
    fn serialize<'py>(&self, py: Python<'py>, meta: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &self.inner;
        let chunks = run_detached(py, || Ok(countsfile::Chunks::new(inner, meta)))?;
        // Made straight into the bytes object: made first and copied, the file stood twice.
        let bytes = PyBytes::new_with(py, chunks.size(), |buf| {
            run_detached(py, || {
                chunks.fill(buf);
                Ok(())
            })
        })?;
        intact(inner)?;
        Ok(bytes)
    }

    /// Write the `.counts` file bytes with the given JSON meta to `out` (a binary file object), a
    /// chunk of about `chunk_bytes` at a time, so that they never stand whole in memory beside the
    /// table.
    #[pyo3(signature = (out, meta, chunk_bytes = 16 << 20))]
    fn write_to(&self, py: Python<'_>, out: &Bound<'_, PyAny>, meta: &[u8], chunk_bytes: usize) -> PyResult<()> {
        let inner = &self.inner;
        let mut chunks = run_detached(py, || Ok(countsfile::Chunks::new(inner, meta)))?;
        while let Some(chunk) = run_detached(py, || Ok(chunks.next_chunk(chunk_bytes.max(1))))? {
            intact(inner)?;
            out.call_method1("write", (PyBytes::new(py, &chunk),))?;
        }
        Ok(())
    }

    /// Parse `.counts` file bytes: `(meta_json_bytes, NativeCounts)`; a file of format 1, which has no
    /// checksum, only with `unchecked`.
    #[staticmethod]
    #[pyo3(signature = (data, unchecked = true))]
    fn parse<'py>(py: Python<'py>, data: &[u8], unchecked: bool) -> PyResult<(Bound<'py, PyBytes>, NativeCounts)> {
        let (meta, inner) = run_detached(py, || countsfile::parse(data, unchecked).map_err(NativeError::from))?;
        Ok((PyBytes::new(py, &meta), NativeCounts { inner }))
    }
}

/// Refuse counts whose keys were read from a mapped file found cut short (they read as zeros
/// past the cut).
pub(super) fn intact(counts: &Counts) -> Result<(), NativeError> {
    counts.cut_short_file().map_or(Ok(()), |name| Err(NativeError::CutShort(name)))
}

impl From<CountError> for NativeError {
    fn from(e: CountError) -> Self {
        match e {
            CountError::Msg(m) => NativeError::Msg(m),
            CountError::Utf8(offset) => NativeError::Utf8(offset as usize),
            CountError::Io(e) => NativeError::Msg(format!("cannot read ({e})")),
            CountError::Memory(e) => NativeError::Memory(e),
            CountError::Stopped => NativeError::Py(PyKeyboardInterrupt::new_err("count stopped")),
            CountError::CutShort => NativeError::CutShort("a mapped file".to_owned()),
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
        run_interruptible(py, || {
            let text = checked_text(data, replace)?;
            pool.install(|| spec.count_into(&[&text], tally)).map_err(NativeError::from)
        })
    }
}

#[pymethods]
impl Counter {
    /// With `memory_limit` (bytes of this process's RSS) or `memory_reserve` (bytes the machine
    /// must keep available), each count stops with `OverMemory` once past them
    /// ([`crate::memory::Ceiling`]).
    #[new]
    #[pyo3(signature = (pattern, line_units, specials, chunk_bytes, workers, memory_limit = None, memory_reserve = None))]
    fn new(
        pattern: &str,
        line_units: bool,
        specials: Vec<Vec<u8>>,
        chunk_bytes: usize,
        workers: usize,
        memory_limit: Option<u64>,
        memory_reserve: Option<u64>,
    ) -> PyResult<Self> {
        let splitter = Splitter::new(pattern, line_units).map_err(PyValueError::new_err)?;
        let ceiling = memory::Ceiling { rss: memory_limit, reserve: memory_reserve };
        let spec = CountSpec { splitter, specials: Specials::new(&specials), chunk_bytes, ceiling, stop: Stop::now() };
        let workers = workers.max(1);
        Ok(Counter { spec, tally: Tally::new(workers), counts: Counts::default(), pool: pool(workers)? })
    }

    /// Count a plain UTF-8 file block by block of about `block_bytes` (the counts never depend
    /// on the block size). Strict UTF-8: the file is memory-mapped and the pages of each block
    /// are dropped from the mapping once it is counted, so the process never holds more than
    /// about a block of the file. With `replace` it is read in blocks instead (invalid bytes are
    /// decoded into new text). The file must not change meanwhile.
    ///
    /// With `borrow` (mapped files only), long pieces may stay where they lie in the file
    /// ([`CountSpec::count_mapped`]): the counts keep the map, and the file must not change until
    /// they are freed.
    #[pyo3(signature = (path, replace, block_bytes = DEFAULT_BLOCK_BYTES, borrow = false))]
    fn count_file(
        &mut self,
        py: Python<'_>,
        path: &str,
        replace: bool,
        block_bytes: usize,
        borrow: bool,
    ) -> PyResult<()> {
        let (spec, tally, pool) = (&self.spec, &self.tally, &self.pool);
        let read_error = |e: CountError| match e {
            CountError::Io(e) => NativeError::Msg(format!("{path}: cannot read ({e})")),
            CountError::CutShort => NativeError::CutShort(path.to_owned()),
            e => NativeError::from(e),
        };
        // A small file is counted on this thread (see `CountSpec::count_small_file`).
        if run_detached(py, || spec.count_small_file(Path::new(path), tally, replace, block_bytes).map_err(read_error))?
        {
            return Ok(());
        }
        // Opened without the GIL too: opening a named pipe (or a file on a stalled network mount)
        // waits, and other threads must not wait with it.
        run_interruptible(py, || {
            let file = File::open(path).map_err(|e| NativeError::Msg(format!("{path}: cannot read ({e})")))?;
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            if replace || len == 0 {
                return pool.install(|| spec.count_stream(file, tally, replace, block_bytes)).map_err(read_error);
            }
            // SAFETY: inputs are not modified while a count runs, nor while counts that borrow them
            // live (documented requirement, as for any reader); unless borrowed the map is dropped
            // before returning. A file cut short meanwhile reads as zeros past its cut, which the
            // count reports (`CountError::CutShort`).
            let map = unsafe { MappedFile::open(&file, path) }
                .map_err(|e| NativeError::Msg(format!("{path}: cannot map ({e})")))?;
            let Some(map) = map else {
                // No room to watch another map for truncation: read the file instead.
                return pool.install(|| spec.count_stream(file, tally, replace, block_bytes)).map_err(read_error);
            };
            let map = Arc::new(map);
            pool.install(|| spec.count_mapped(&map, tally, block_bytes, borrow)).map_err(read_error)
        })
    }

    /// Count one whole text given as bytes (e.g. a decompressed file).
    fn count_bytes(&mut self, py: Python<'_>, data: &[u8], replace: bool) -> PyResult<()> {
        self.count_text(py, data, replace)
    }

    /// Count independent documents (e.g. JSON lines).
    fn count_docs(&mut self, py: Python<'_>, docs: Vec<PyBackedStr>) -> PyResult<()> {
        let (spec, tally, pool) = (&self.spec, &self.tally, &self.pool);
        run_interruptible(py, || {
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
