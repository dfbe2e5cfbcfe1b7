//! Runs the official SuperBPE fork's `BpeTrainer::do_train` on given word counts and saves its
//! `vocab.json` + `merges.txt`, so tests can compare `compat=official` with the fork itself without
//! its Python bindings (which are not on PyPI).
//!
//! Usage: `official-fork WORDS VOCAB_SIZE OUT_DIR`. WORDS holds one `count<TAB>word` line per
//! pre-tokenized piece, the word spelled in GPT-2's byte-to-unicode characters (what HF's ByteLevel
//! pre-tokenizer hands the trainer). The fork extends (stage 2) when the working directory holds a
//! `merges.txt` (header line first), else it trains from scratch (stage 1, stock HF's loop).

use std::collections::HashMap;
use std::path::Path;

use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::Model;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, words, vocab_size, out] = args.as_slice() else {
        eprintln!("usage: official-fork WORDS VOCAB_SIZE OUT_DIR");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(words).expect("read WORDS");
    let mut counts: HashMap<String, u64> = HashMap::new();
    for line in text.split('\n').filter(|line| !line.is_empty()) {
        let (count, word) = line.split_once('\t').expect("count<TAB>word");
        *counts.entry(word.to_string()).or_default() += count.parse::<u64>().expect("count");
    }
    let vocab_size = vocab_size.parse().expect("VOCAB_SIZE");
    let trainer = BpeTrainer::builder().vocab_size(vocab_size).show_progress(false).build();
    let mut model = BPE::default();
    trainer.do_train(&counts, &mut model).expect("train");
    model.save(Path::new(out), None).expect("save");
}
