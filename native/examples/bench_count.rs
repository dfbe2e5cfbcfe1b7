//! Wall time of counting a file as a run's stage counts it (memory-mapped, window by window, two
//! workers) and of what follows before a build: draining the workers' tables into one list of
//! entries in memory order, and the memory estimate:
//! `cargo run --release --example bench_count -- FILE [PATTERN_NAME] [copy]` (default `Superbpe`, a
//! SuperBPE stage 2's pattern, with line units; long keys left in the file where a run leaves
//! them, or all copied with `copy`).

use std::time::Instant;

use _native::count::{CountSpec, DEFAULT_BLOCK_BYTES};
use _native::memory::{estimate, MappedFile};
use _native::scan::{builtin_pattern, Builtin, Splitter, ALL_BUILTINS};
use _native::specials::Specials;
use _native::tables::{Counts, Tally};
use _native::train::Rules;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(2).cloned().unwrap_or_else(|| "Superbpe".into());
    let builtin = ALL_BUILTINS.into_iter().find(|b| format!("{b:?}") == name).expect("pattern name");
    let line_units = matches!(builtin, Builtin::Superbpe | Builtin::SuperbpePaper);
    let spec = CountSpec {
        splitter: Splitter::new(&builtin_pattern(builtin), line_units).unwrap(),
        specials: Specials::new(&[b"<|endoftext|>".to_vec()]),
        chunk_bytes: 4 << 20,
        ceiling: Default::default(),
        stop: Default::default(),
    };
    let file = std::fs::File::open(&args[1]).expect("open corpus");
    // SAFETY: the corpus is not modified while this benchmark maps it.
    let map =
        std::sync::Arc::new(unsafe { MappedFile::open(&file, &args[1]) }.expect("map corpus").expect("watch map"));
    // As a run counts a stage after the first (`borrow_files`); `copy` as it counts the first.
    let borrow = args.get(3).map(String::as_str) != Some("copy");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let timed = |what: &str, f: &mut (dyn FnMut() + Send)| {
        let t = Instant::now();
        pool.install(&mut *f);
        eprintln!("{what}: {:.2}s", t.elapsed().as_secs_f64());
    };
    let mut tally = Tally::new(2);
    timed("count", &mut || spec.count_mapped(&map, &tally, DEFAULT_BLOCK_BYTES, borrow).unwrap());
    let mut counts = Counts::default();
    timed("drain the workers' tables", &mut || tally.drain_into(&mut counts).unwrap());
    // One merge to replay: the estimate's own work (the pass over the keys, the sample) is what is timed.
    let replay = [(b"t".to_vec(), b"h".to_vec())];
    let rules = Rules { min_frequency: 1, ..Default::default() };
    timed("memory estimate", &mut || {
        let e = estimate(&counts, &replay, &rules, true).unwrap();
        eprintln!("  {} pieces, {} bytes", e.pieces, e.bytes);
    });
}
