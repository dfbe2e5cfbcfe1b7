//! PyO3 bindings: the `superbpe._native` module, one file per exposed concern (`counts.rs`: the
//! count table and the streaming counter; `train.rs`: training and its memory estimate;
//! `encode.rs`: the encoder; `tokenfiles.rs`: the strings of GPT-2 tokenizer files and of a
//! `tokenizer.json`'s model). They convert types and release the GIL; the work is the core's.
//!
//! Arguments are validated in Python (`superbpe/engines/native.py`) before they get here. Heavy
//! work runs with the GIL released, and every entry point catches Rust panics so a bug surfaces
//! as a Python `RuntimeError` with a message instead of killing the interpreter.

use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyKeyboardInterrupt, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::count::{checked_text, stop_counts, CountError, CountSpec, Stop, DEFAULT_BLOCK_BYTES};
use crate::cuts::safe_chunks;
use crate::encode::Encoder;
use crate::memory::MappedFile;
use crate::scan::Splitter;
use crate::specials::Specials;
use crate::tables::{Counts, Tally};
use crate::train::{Rules, Source, Trainer, MAX_MERGES};
use crate::{countsfile, memory, unicode};

mod counts;
mod encode;
mod tokenfiles;
mod train;

use counts::{Counter, NativeCounts};
use encode::NativeEncoder;

create_exception!(_native, InvalidUtf8, PyValueError, "Invalid UTF-8; args[0] is the byte offset.");
create_exception!(
    _native,
    OverMemory,
    PyMemoryError,
    "A count went past its memory ceiling; args: (held, limit, available, reserve), bytes, None where unused."
);

create_exception!(
    _native,
    FileChanged,
    PyValueError,
    "A mapped input file was cut short while it was read; args[0] is its path."
);

/// Errors from the Rust core, before conversion to Python exceptions.
pub(crate) enum NativeError {
    Msg(String),
    /// This mapped file was cut short while it was read.
    CutShort(String),
    Utf8(usize),
    Memory(memory::Exceeded),
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
            NativeError::CutShort(path) => FileChanged::new_err(path),
            NativeError::Utf8(offset) => InvalidUtf8::new_err(offset),
            NativeError::Memory(memory::Exceeded::Rss { held, limit }) => {
                OverMemory::new_err((held, Some(limit), None::<u64>, None::<u64>))
            }
            NativeError::Memory(memory::Exceeded::Available { held, available, reserve }) => {
                OverMemory::new_err((held, None::<u64>, Some(available), Some(reserve)))
            }
            NativeError::Py(e) => e,
        }
    }
}

/// Run `f` with the GIL released, turning a panic into a `RuntimeError`.
pub(crate) fn run_detached<T: Send, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce() -> Result<T, NativeError> + Send,
{
    panic_as_error(py.detach(|| catch_unwind(AssertUnwindSafe(f))))
}

/// How often [`run_interruptible`] looks for a signal while its work runs.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// [`run_detached`] for a count, which can take minutes: on a helper thread while the calling
/// thread looks for signals every [`SIGNAL_POLL`]. Python runs its signal handlers (Ctrl-C's
/// `KeyboardInterrupt`) only on the main thread, between bytecodes, so a call that holds the main
/// thread in Rust would hear Ctrl-C only once the count ended. When a handler raises, every
/// running count is stopped ([`stop_counts`]), this one is waited for, and the handler's error
/// is returned. (On other threads Python handles no signals, and this only waits.)
pub(crate) fn run_interruptible<T: Send, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce() -> Result<T, NativeError> + Send,
{
    let (done_tx, done_rx) = mpsc::channel();
    let (result, signal) = py.detach(move || {
        std::thread::scope(|scope| {
            scope.spawn(move || {
                let _ = done_tx.send(catch_unwind(AssertUnwindSafe(f)));
            });
            let mut signal = None;
            loop {
                match done_rx.recv_timeout(SIGNAL_POLL) {
                    Ok(result) => return (result, signal),
                    Err(mpsc::RecvTimeoutError::Timeout) if signal.is_none() => {
                        if let Err(e) = Python::attach(|py| py.check_signals()) {
                            stop_counts();
                            signal = Some(e);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        unreachable!("the helper sends its result before it ends")
                    }
                }
            }
        })
    });
    match signal {
        Some(e) => Err(e),
        None => panic_as_error(result),
    }
}

/// Run `f` holding the GIL (work too short to be worth releasing it), a panic as in [`run_detached`].
pub(crate) fn run_attached<T, F>(f: F) -> PyResult<T>
where
    F: FnOnce() -> Result<T, NativeError>,
{
    panic_as_error(catch_unwind(AssertUnwindSafe(f)))
}

fn panic_as_error<T>(result: std::thread::Result<Result<T, NativeError>>) -> PyResult<T> {
    match result {
        Ok(r) => r.map_err(PyErr::from),
        Err(panic) => Err(PyRuntimeError::new_err(format!("native engine panicked: {}", panic_message(&panic)))),
    }
}

/// The message a panic carries.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

pub(crate) fn pool(workers: usize) -> PyResult<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(workers)
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start worker threads: {e}")))
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

/// Stop every count running in this process ([`stop_counts`]): each raises `KeyboardInterrupt`
/// after the work unit it is on.
#[pyfunction]
fn stop_all_counts() {
    stop_counts();
}

/// Panic on purpose (tests check that it becomes a Python exception).
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    run_detached(py, || -> Result<(), NativeError> { panic!("deliberate test panic") })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("InvalidUtf8", m.py().get_type::<InvalidUtf8>())?;
    m.add("FileChanged", m.py().get_type::<FileChanged>())?;
    m.add("OverMemory", m.py().get_type::<OverMemory>())?;
    m.add_class::<NativeCounts>()?;
    m.add_class::<Counter>()?;
    m.add_class::<NativeEncoder>()?;
    m.add_function(wrap_pyfunction!(pretokenize, m)?)?;
    m.add_function(wrap_pyfunction!(has_scanner, m)?)?;
    m.add_function(wrap_pyfunction!(char_classes, m)?)?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    m.add_function(wrap_pyfunction!(train::train_memory, m)?)?;
    m.add_function(wrap_pyfunction!(tokenfiles::gpt2_vocab, m)?)?;
    m.add_function(wrap_pyfunction!(tokenfiles::gpt2_token_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(tokenfiles::gpt2_merges, m)?)?;
    m.add_function(wrap_pyfunction!(tokenfiles::gpt2_merges_unmade, m)?)?;
    m.add_function(wrap_pyfunction!(tokenfiles::hf_model_parts, m)?)?;
    m.add_function(wrap_pyfunction!(stop_all_counts, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    Ok(())
}
