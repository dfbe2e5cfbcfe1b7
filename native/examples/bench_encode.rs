//! CPU-time throughput of the encoder with the GPT-2 files, single thread:
//! `cargo run --release --example bench_encode -- VOCAB_JSON_DECODED MERGES_DECODED TEXT`.
//!
//! The vocab and merges are read from a simple binary dump made by the Python side
//! (`u32 len, bytes, u32 id` per token; `u32 len, bytes` twice per merge), so this example needs
//! no JSON parser.

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
    let enc =
        Encoder::new(vocab, &merges, Splitter::new(&builtin_pattern(Builtin::Gpt2), false).unwrap(), true).unwrap();
    for round in 0..2 {
        let mut out = Vec::with_capacity(text.len() / 3);
        let t = cpu_seconds();
        enc.encode_ordinary(&text, &mut out).unwrap();
        let dt = cpu_seconds() - t;
        println!("round {round}: {:.1} MB/s, {} ids", text.len() as f64 / dt / 1e6, out.len());
    }
}
