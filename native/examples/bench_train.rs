//! CPU-time cost of the trainer phases on a corpus, single thread:
//! `cargo run --release --example bench_train -- FILE NUM_MERGES [PATTERN_NAME]`.

use _native::count::{CountSpec, Counts};
use _native::scan::{builtin_pattern, Splitter, ALL_BUILTINS};
use _native::specials::Specials;
use _native::train::{Rules, Trainer};

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall writing into a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[1]).expect("read corpus");
    let num_merges: usize = args[2].parse().unwrap();
    let name = args.get(3).cloned().unwrap_or_else(|| "Gpt2".into());
    let builtin = ALL_BUILTINS.into_iter().find(|b| format!("{b:?}") == name).expect("pattern name");
    let line_units = matches!(builtin, _native::scan::Builtin::Superbpe | _native::scan::Builtin::SuperbpePaper);
    let spec = CountSpec {
        splitter: Splitter::new(&builtin_pattern(builtin), line_units).unwrap(),
        specials: Specials::new(&[b"<|endoftext|>".to_vec()]),
        chunk_bytes: 4 << 20,
    };
    let mut counts = Counts::default();
    let t = cpu_seconds();
    spec.count_docs(&[&data], &mut counts).unwrap();
    let t_count = cpu_seconds() - t;
    let t = cpu_seconds();
    let mut trainer = Trainer::new(&counts).unwrap();
    let t_build = cpu_seconds() - t;
    let t = cpu_seconds();
    let rules = Rules { min_frequency: 1, ..Default::default() };
    trainer.choose(num_merges, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
    let t_choose = cpu_seconds() - t;
    println!(
        "{name}: count {t_count:.2}s, build {t_build:.2}s, choose {t_choose:.2}s ({} merges, {} pieces)",
        trainer.parts.len(),
        counts.len()
    );
}
