//! CPU-time throughput of the encoder with the GPT-2 files, single thread:
//! `cargo run --release --example bench_encode -- VOCAB_JSON_DECODED MERGES_DECODED TEXT [PATTERN] [ROUNDS]`.
//! PATTERN is gpt2 (default), cl100k or o200k; the text is cut into documents at `<|endoftext|>` and
//! each is encoded alone, as `Tokenizer.encode` per document does (round 0 meets cold caches).
//!
//! The vocab and merges are read from a simple binary dump (`u32 len, bytes, u32 id` per token;
//! `u32 len, bytes` twice per merge; BENCHMARKS.md "The encoder on code, without Python" has the
//! Python that writes it), so this example needs no JSON parser.

use _native::encode::Encoder;
use _native::scan::{builtin_pattern, Builtin, Splitter};

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall writing into a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn read_chunk(data: &[u8], pos: &mut usize) -> Vec<u8> {
    let len = u32::from_le_bytes(data[*pos..*pos + 4].try_into().unwrap()) as usize;
    let out = data[*pos + 4..*pos + 4 + len].to_vec();
    *pos += 4 + len;
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let vdata = std::fs::read(&args[1]).unwrap();
    let mdata = std::fs::read(&args[2]).unwrap();
    let text = std::fs::read(&args[3]).unwrap();
    let mut vocab = Vec::new();
    let mut pos = 0;
    while pos < vdata.len() {
        let tok = read_chunk(&vdata, &mut pos);
        let id = u32::from_le_bytes(vdata[pos..pos + 4].try_into().unwrap());
        pos += 4;
        vocab.push((tok, id));
    }
    let mut merges = Vec::new();
    pos = 0;
    while pos < mdata.len() {
        let l = read_chunk(&mdata, &mut pos);
        let r = read_chunk(&mdata, &mut pos);
        merges.push((l, r));
    }
    let kind = match args.get(4).map(String::as_str) {
        None | Some("gpt2") => Builtin::Gpt2,
        Some("cl100k") => Builtin::Cl100k,
        Some("o200k") => Builtin::O200k,
        Some(other) => panic!("unknown pattern {other}"),
    };
    let rounds: usize = args.get(5).map_or(2, |r| r.parse().unwrap());
    let docs: Vec<&[u8]> = split_docs(&text);
    let enc = Encoder::new(vocab, &merges, Splitter::new(&builtin_pattern(kind), false).unwrap(), true).unwrap();
    for round in 0..rounds {
        let mut ids = 0;
        let t = cpu_seconds();
        for doc in &docs {
            let mut out = Vec::with_capacity(doc.len() / 3 + 1);
            enc.encode_ordinary(doc, &mut out).unwrap();
            ids += out.len();
        }
        let dt = cpu_seconds() - t;
        println!("round {round}: {:.1} MB/s, {} docs, {ids} ids", text.len() as f64 / dt / 1e6, docs.len());
    }
}

/// The documents of `text`, cut at `<|endoftext|>` (which belongs to none).
fn split_docs(text: &[u8]) -> Vec<&[u8]> {
    let sep = b"<|endoftext|>";
    let mut docs = Vec::new();
    let mut start = 0;
    for at in memchr::memmem::find_iter(text, sep) {
        docs.push(&text[start..at]);
        start = at + sep.len();
    }
    docs.push(&text[start..]);
    docs.retain(|d| !d.is_empty());
    docs
}
