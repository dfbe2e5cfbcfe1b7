//! The rank-based encoder, its ids handed out as shared int objects or packed buffers.

use super::*;
use crate::encode_levels::{Plan, Request};

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
    #[pyo3(signature = (vocab, merges, pattern, line_units, workers, whole_pieces = true, two_level = true, transition = None))]
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
        Ok(NativeEncoder { inner, pool: pool(workers.max(1))?, id_objects })
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
