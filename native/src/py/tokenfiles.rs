//! GPT-2 tokenizer files' strings to bytes (`tokenfiles.rs`) and a `tokenizer.json`'s model
//! (`hf_model.rs`), for `superbpe/formats/gpt2.py` and `hf.py`.

use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use super::run_attached;
use crate::tokenfiles::Spelt;
use crate::{hf_model, tokenfiles};

/// `{id: token bytes}` of a `vocab.json` text, or None unless it is a flat object of distinct table
/// strings to distinct non-negative integers.
#[pyfunction]
pub(super) fn gpt2_vocab<'py>(py: Python<'py>, text: PyBackedStr) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(entries) = run_attached(|| Ok(tokenfiles::vocab(&text)))? else { return Ok(None) };
    let vocab = PyDict::new(py);
    for (id, token) in entries {
        vocab.set_item(id, PyBytes::new(py, &token))?;
    }
    Ok(Some(vocab))
}

/// The bytes of each token string, or None when one is not spelt in the byte table.
#[pyfunction]
pub(super) fn gpt2_token_bytes<'py>(
    py: Python<'py>,
    strings: Vec<PyBackedStr>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let decoded = run_attached(|| Ok(strings.iter().map(|s| tokenfiles::token_bytes(s)).collect::<Option<Vec<_>>>()))?;
    decoded.map(|tokens| PyList::new(py, tokens.iter().map(|t| PyBytes::new(py, t)))).transpose()
}

/// The `(left, right)` merges of a `merges.txt` text, checked against `tokens` when given, or None
/// when the text is malformed or a merge does not fit the tokens.
#[pyfunction]
#[pyo3(signature = (text, tokens=None))]
pub(super) fn gpt2_merges<'py>(
    py: Python<'py>,
    text: PyBackedStr,
    tokens: Option<Vec<PyBackedBytes>>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let Some(tokens) = tokens else {
        let Some(merges) = run_attached(|| Ok(tokenfiles::merges(&text)))? else { return Ok(None) };
        let pairs = merges.iter().map(|(l, r)| PyTuple::new(py, [PyBytes::new(py, l), PyBytes::new(py, r)]));
        return Ok(Some(PyList::new(py, pairs.collect::<PyResult<Vec<_>>>()?)?));
    };
    let known: Vec<&[u8]> = tokens.iter().map(|b| &b[..]).collect();
    let Some(placed) = placed_merges(&text, &known)? else { return Ok(None) };
    Ok(Some(pairs_of(py, &placed.parts, |i| object_of(py, &tokens[i]))?))
}

/// [`gpt2_merges`] checked against `tokens`, with the positions in `tokens` of the ones of two or
/// more bytes that no merge makes; None as there.
#[pyfunction]
pub(super) fn gpt2_merges_unmade<'py>(
    py: Python<'py>,
    text: PyBackedStr,
    tokens: Vec<PyBackedBytes>,
) -> PyResult<Option<(Bound<'py, PyList>, Vec<usize>)>> {
    let known: Vec<&[u8]> = tokens.iter().map(|b| &b[..]).collect();
    let Some(placed) = placed_merges(&text, &known)? else { return Ok(None) };
    Ok(Some((pairs_of(py, &placed.parts, |i| object_of(py, &tokens[i]))?, placed.unmade(&known))))
}

/// The merges of `text` placed among `known` (`tokenfiles::placed_merges`), read without the GIL.
fn placed_merges(text: &str, known: &[&[u8]]) -> PyResult<Option<tokenfiles::Placed>> {
    run_attached(|| Ok(tokenfiles::placed_merges(text, known)))
}

/// The `(left, right)` tuples of merges given as positions of tokens, made of the tokens' own
/// objects (`token(position)`): a 200K vocab's 400K merge parts are then no new `bytes` each.
fn pairs_of<'py>(
    py: Python<'py>,
    parts: &[(usize, usize)],
    token: impl Fn(usize) -> Bound<'py, PyBytes>,
) -> PyResult<Bound<'py, PyList>> {
    let pairs = parts.iter().map(|&(l, r)| PyTuple::new(py, [token(l), token(r)]));
    PyList::new(py, pairs.collect::<PyResult<Vec<_>>>()?)
}

/// The object of a token held as [`PyBackedBytes`] (the caller's own `bytes`).
fn object_of<'py>(py: Python<'py>, token: &PyBackedBytes) -> Bound<'py, PyBytes> {
    let Ok(object) = token.into_pyobject(py);
    object
}

/// What `hf_model_parts` hands Python: the skeleton, the vocab, the merges and the ids whose
/// tokens are text.
type ModelParts<'py> = (String, Bound<'py, PyDict>, Bound<'py, PyList>, Vec<u64>);

/// A `tokenizer.json` text's model read here (`hf_model.rs`): the document without its vocab and
/// merges (written `{}` and `[]`), `{id: token}` in file order (bytes, or a `str` for a string not
/// spelt in the byte table), the `(left, right)` merges and the ids of the `str` tokens; None when
/// Python must read the whole document.
#[pyfunction]
pub(super) fn hf_model_parts<'py>(py: Python<'py>, text: PyBackedStr) -> PyResult<Option<ModelParts<'py>>> {
    let Some(parts) = run_attached(|| Ok(hf_model::model_parts(&text)))? else { return Ok(None) };
    let vocab = PyDict::new(py);
    let mut texts = Vec::new();
    // The table tokens' objects in order, which the merges' positions refer to.
    let mut table = Vec::with_capacity(parts.vocab.len());
    for (id, token) in &parts.vocab {
        match token {
            Spelt::Table(bytes) => {
                let token = PyBytes::new(py, bytes);
                vocab.set_item(id, &token)?;
                table.push(token);
            }
            Spelt::Text(text) => {
                vocab.set_item(id, text)?;
                texts.push(*id);
            }
        }
    }
    Ok(Some((parts.skeleton, vocab, pairs_of(py, &parts.merges, |i| table[i].clone())?, texts)))
}
