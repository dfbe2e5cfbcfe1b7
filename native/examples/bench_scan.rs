//! CPU-time throughput of the scanners alone and of scanning + counting, single thread:
//! `cargo run --release --example bench_scan -- FILE [PATTERN_NAME...]`.

/// CPU time of this thread in seconds: wall time is meaningless on a shared, loaded machine.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall writing into a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

use _native::count::CountSpec;
use _native::scan::{builtin_pattern, Splitter, ALL_BUILTINS};
use _native::specials::Specials;
use _native::tables::Counts;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[1]).expect("read corpus");
    let names: Vec<String> = args[2..].to_vec();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for b in ALL_BUILTINS {
        let name = format!("{b:?}");
        if !names.is_empty() && !names.contains(&name) {
            continue;
        }
        let line_units = matches!(b, _native::scan::Builtin::Superbpe | _native::scan::Builtin::SuperbpePaper);
        let splitter = Splitter::new(&builtin_pattern(b), line_units).unwrap();
        let t = cpu_seconds();
        let mut n = 0usize;
        splitter.split(&data, &mut |_p: &[u8]| n += 1).unwrap();
        let scan = cpu_seconds() - t;
        let spec = CountSpec {
            splitter,
            specials: Specials::new(&[b"<|endoftext|>".to_vec()]),
            chunk_bytes: 4 << 20,
            ceiling: Default::default(),
            stop: Default::default(),
        };
        let mut counts = Counts::default();
        let count = pool.install(|| {
            let t = cpu_seconds();
            spec.count_docs(&[&data], &mut counts).unwrap();
            cpu_seconds() - t
        });
        let mb = data.len() as f64 / 1e6;
        println!(
            "{name:16} scan {:7.1} MB/s ({n} pieces)  scan+count {:7.1} MB/s ({} unique)",
            mb / scan,
            mb / count,
            counts.len()
        );
    }
}
