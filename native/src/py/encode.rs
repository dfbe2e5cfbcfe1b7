//! The rank-based encoder, its ids handed out as shared int objects or packed buffers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::*;

/// Rank-based encoder over a bytes -> id vocabulary.
#[pyclass(module = "superbpe._native", name = "Encoder")]
pub struct NativeEncoder {
    inner: Encoder,
    /// The pool of `encode_batch` and `encode_array`, sized when the encoder is made.
    pool: rayon::ThreadPool,
    /// The pool of the last `encode_texts*` call with more than one thread, kept with its size:
    /// starting threads costs more than encoding a small batch, and callers keep one count.
    sized_pool: Mutex<Option<(usize, Arc<rayon::ThreadPool>)>>,
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
    #[pyo3(signature = (vocab, merges, pattern, line_units, workers = 0, whole_pieces = true))]
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
        // `workers` 0 leaves the count to rayon: RAYON_NUM_THREADS when set, else the usable cores.
        Ok(NativeEncoder { inner, pool: pool(workers)?, sized_pool: Mutex::new(None), id_objects })
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

    /// Ids of each text as a list of lists, special tokens (`specials`: their bytes and ids) cut
    /// out first as `Tokenizer.encode` does; on `threads` threads (1: the calling thread alone).
    fn encode_texts<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        specials: Vec<(Vec<u8>, u32)>,
        threads: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let blocks = self.encode_blocks(py, &texts, specials, threads)?;
        let len = pyo3::ffi::Py_ssize_t::try_from(texts.len()).map_err(|e| PyValueError::new_err(e.to_string()))?;
        // SAFETY: as in `ids_list`: a new list whose every slot is set once with a new reference.
        unsafe {
            let outer = pyo3::ffi::PyList_New(len);
            if outer.is_null() {
                return Err(PyErr::fetch(py));
            }
            let outer = Bound::from_owned_ptr(py, outer).cast_into_unchecked::<PyList>();
            let mut index: pyo3::ffi::Py_ssize_t = 0;
            for block in &blocks {
                for ids in block.texts() {
                    let list = ids_list(py, ids, &self.id_objects)?;
                    pyo3::ffi::PyList_SET_ITEM(outer.as_ptr(), index, list.into_ptr());
                    index += 1;
                }
            }
            Ok(outer)
        }
    }

    /// As `encode_texts`, into one flat buffer of little-endian ids (`dtype` "uint16" or
    /// "uint32") and the offsets of the texts' ids as little-endian int64: `len(texts) + 1`
    /// of them, from 0, so text `i` has ids `[offsets[i], offsets[i + 1])`.
    fn encode_texts_flat<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        specials: Vec<(Vec<u8>, u32)>,
        threads: usize,
        dtype: &str,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        check_dtype(dtype)?;
        let blocks = self.encode_blocks(py, &texts, specials, threads)?;
        let parts: Vec<&[u32]> = blocks.iter().map(|b| b.ids.as_slice()).collect();
        let ids = ids_buffer_parts(py, &parts, dtype)?;
        let offsets = PyBytes::new_with(py, (texts.len() + 1) * 8, |buf| {
            let mut chunks = buf.chunks_exact_mut(8);
            let mut base = 0u64;
            if let Some(first) = chunks.next() {
                first.copy_from_slice(&0i64.to_le_bytes());
            }
            for block in &blocks {
                for (&end, chunk) in block.ends.iter().zip(chunks.by_ref()) {
                    chunk.copy_from_slice(&((base + end as u64) as i64).to_le_bytes());
                }
                base += block.ids.len() as u64;
            }
            Ok(())
        })?;
        Ok((ids, offsets))
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

    /// Ids of one text: its special tokens' ids, the ordinary text between them encoded.
    fn encode(&self, inner: &Encoder, text: &[u8], out: &mut Vec<u32>) -> Result<(), String> {
        if self.finder.is_empty() {
            return inner.encode_ordinary(text, out);
        }
        let mut pos = 0;
        let mut result = Ok(());
        self.finder.matches(text, |start, end| {
            if result.is_err() {
                return;
            }
            if start > pos {
                result = inner.encode_ordinary(&text[pos..start], out);
            }
            out.push(self.ids[&text[start..end]]);
            pos = end;
        });
        result?;
        if pos < text.len() {
            inner.encode_ordinary(&text[pos..], out)?;
        }
        Ok(())
    }
}

/// Consecutive texts grouped into runs of about `BLOCK_BYTES` (index ranges).
fn block_ranges(texts: &[PyBackedStr]) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, text) in texts.iter().enumerate() {
        bytes += text.len();
        if bytes >= BLOCK_BYTES {
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
    /// A pool of `threads` threads (> 1), the one kept from the last call when its size fits.
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

    /// Encode `texts` block by block with the GIL released: on the calling thread for
    /// `threads` 1, else on a pool of `threads`. An error names the first text that fails.
    fn encode_blocks(
        &self,
        py: Python<'_>,
        texts: &[PyBackedStr],
        specials: Vec<(Vec<u8>, u32)>,
        threads: usize,
    ) -> PyResult<Vec<Block>> {
        if threads == 0 {
            return Err(PyValueError::new_err("threads must be at least 1"));
        }
        let pool = if threads > 1 { Some(self.sized_pool(threads)?) } else { None };
        let inner = &self.inner;
        run_detached(py, || {
            let specials = SpecialIds::new(specials);
            let ranges = block_ranges(texts);
            let encode = |range: &std::ops::Range<usize>| -> Result<Block, NativeError> {
                let bytes: usize = texts[range.clone()].iter().map(|t| t.len()).sum();
                let mut block = Block { ids: Vec::with_capacity(bytes / 3 + 1), ends: Vec::with_capacity(range.len()) };
                for i in range.clone() {
                    specials
                        .encode(inner, texts[i].as_bytes(), &mut block.ids)
                        .map_err(|e| NativeError::Msg(format!("texts[{i}]: {e}")))?;
                    block.ends.push(block.ids.len());
                }
                Ok(block)
            };
            match pool {
                // collect() into a Result stops at an error; the blocks keep their order, so
                // the error reported is that of the first failing block.
                Some(pool) => pool.install(|| ranges.par_iter().map(encode).collect()),
                None => ranges.iter().map(encode).collect(),
            }
        })
    }
}

fn check_dtype(dtype: &str) -> PyResult<()> {
    match dtype {
        "uint16" | "uint32" => Ok(()),
        _ => Err(PyValueError::new_err(format!("dtype must be 'uint16' or 'uint32', not {dtype:?}"))),
    }
}

/// Ids of several parts, one after another, packed as in [`ids_buffer`].
fn ids_buffer_parts<'py>(py: Python<'py>, parts: &[&[u32]], dtype: &str) -> PyResult<Bound<'py, PyBytes>> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let all = parts.iter().flat_map(|p| p.iter().copied());
    match dtype {
        "uint32" => PyBytes::new_with(py, total * 4, |buf| {
            for (chunk, id) in buf.chunks_exact_mut(4).zip(all) {
                chunk.copy_from_slice(&id.to_le_bytes());
            }
            Ok(())
        }),
        _ => {
            check_dtype(dtype)?;
            if let Some(id) = parts.iter().flat_map(|p| p.iter()).find(|&&id| id > u16::MAX as u32) {
                return Err(PyValueError::new_err(format!("id {id} does not fit in uint16")));
            }
            PyBytes::new_with(py, total * 2, |buf| {
                for (chunk, id) in buf.chunks_exact_mut(2).zip(all) {
                    chunk.copy_from_slice(&(id as u16).to_le_bytes());
                }
                Ok(())
            })
        }
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
