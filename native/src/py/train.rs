//! Training from `NativeCounts`, with Python callbacks for progress and checkpoints, and its memory estimate.

use super::*;
use crate::tables::first_cut_short;

/// `superbpe.core.rules.MergeRules` as Python has it (attributes read by name; validated in Python).
#[derive(FromPyObject)]
pub(super) struct PyRules {
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

/// Train merges; see `superbpe.engines.python_trainer.train_merges` (validation happens in Python).
/// `build_progress(phase, done, total)`, if given, hears how building the state goes (replay,
/// index) before choosing starts.
#[pyfunction]
#[pyo3(signature = (counts, num_merges, replay, rules, callback, callback_every, build_progress=None, consume=false))]
#[allow(clippy::too_many_arguments)]
pub(super) fn train<'py>(
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
        // The build frees an owned table, and its maps, as it goes: their marks are kept.
        let marks = owned.as_ref().unwrap_or(&counts.inner).cut_marks();
        let source = match owned {
            Some(table) => Source::Owned(table),
            None => Source::Borrowed(&counts.inner),
        };
        let built = Trainer::with_rules(source, &replay, &rules, num_merges, &mut report);
        let mut trainer = match (built, failed) {
            (_, Some(e)) => return Err(NativeError::Py(e)),
            (built, None) => built?,
        };
        if let Some(name) = first_cut_short(&marks) {
            return Err(NativeError::CutShort(name));
        }
        drop(marks);
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
/// at its peak, estimated (see `memory/estimate.rs`; `consume`: the counts are handed to the trainer):
/// `(peak_bytes, symbols, pieces, bytes)`.
#[pyfunction]
pub(super) fn train_memory(
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
