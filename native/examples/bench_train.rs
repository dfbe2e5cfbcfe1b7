//! CPU-time cost of the trainer phases on a corpus:
//! `cargo run --release --example bench_train -- FILE NUM_MERGES [PATTERN_NAME [STAGE2_PATTERN_NAME TRANSITION]]`.
//! With a stage-2 pattern it also times a SuperBPE stage 2: re-count with that pattern (the drain of
//! the workers' tables timed apart), build as a run does (`with_rules`: replay the first TRANSITION
//! merges, cut), then choose up to NUM_MERGES (the wall time to the 1st, 10th, 100th, ... of the
//! stage's own merges printed as it goes).

use _native::count::CountSpec;
use _native::scan::{builtin_pattern, Splitter, ALL_BUILTINS};
use _native::specials::Specials;
use _native::tables::Counts;
use _native::train::{Rules, Source, Trainer};

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall writing into a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn count_spec(name: &str) -> CountSpec {
    let builtin = ALL_BUILTINS.into_iter().find(|b| format!("{b:?}") == name).expect("pattern name");
    let line_units = matches!(builtin, _native::scan::Builtin::Superbpe | _native::scan::Builtin::SuperbpePaper);
    CountSpec {
        splitter: Splitter::new(&builtin_pattern(builtin), line_units).unwrap(),
        specials: Specials::new(&[b"<|endoftext|>".to_vec()]),
        chunk_bytes: 4 << 20,
        ceiling: Default::default(),
        stop: Default::default(),
    }
}

fn superbpe(data: &[u8], spec1: &CountSpec, spec2: &CountSpec, transition: usize, num_merges: usize) {
    let rules = Rules { min_frequency: 1, ..Default::default() };
    let timed = |f: &mut dyn FnMut()| {
        let t = cpu_seconds();
        f();
        cpu_seconds() - t
    };
    let mut counts1 = Counts::default();
    let c1 = timed(&mut || spec1.count_docs(&[data], &mut counts1).unwrap());
    let mut stage1 = Trainer::new(&counts1).unwrap();
    let t1 = timed(&mut || {
        stage1.choose(transition, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
    });
    let replay: Vec<(Vec<u8>, Vec<u8>)> = stage1.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
    let mut counts2 = Counts::default();
    let mut tally = _native::tables::Tally::new(rayon::current_num_threads());
    let c2 = timed(&mut || spec2.count_into(&[data], &tally).unwrap());
    let wall = std::time::Instant::now();
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall writing into a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    eprintln!("  stage-2 drain starts at {}.{:09}", ts.tv_sec, ts.tv_nsec);
    let d2 = timed(&mut || tally.drain_into(&mut counts2).unwrap());
    eprintln!("  stage-2 drain: {d2:.2}s CPU, {:.2}s wall", wall.elapsed().as_secs_f64());
    let rules2 = Rules { max_words_per_token: Some(4), forbidden_substrings: vec![b": ".to_vec()], ..rules.clone() };
    let pieces2 = counts2.len();
    // Handed over, as a run hands its counts to the trainer.
    let mut owned = Some(counts2);
    let mut stage2 = None;
    let r2 = timed(&mut || {
        let source = Source::Owned(owned.take().expect("built once"));
        // Wall seconds of each build phase (replay, cut, index), printed as the next one starts.
        let (mut phase, mut since) = (String::new(), std::time::Instant::now());
        let mut report = |name: &str, _: u64, _: u64| {
            if name != phase {
                if !phase.is_empty() {
                    eprintln!("  {phase}: {:.2}s wall", since.elapsed().as_secs_f64());
                }
                (phase, since) = (name.to_string(), std::time::Instant::now());
                let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                // SAFETY: plain syscall writing into a local struct.
                unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
                eprintln!("  {name} starts at {}.{:09}", ts.tv_sec, ts.tv_nsec);
            }
            Ok(())
        };
        stage2 = Some(Trainer::with_rules(source, &replay, &rules2, num_merges, &mut report).unwrap());
        eprintln!("  {phase}: {:.2}s wall", since.elapsed().as_secs_f64());
    });
    let mut stage2 = stage2.unwrap();
    // Wall seconds to each power of ten of stage 2's own merges: where choosing spends its time.
    let (start, mut marks) = (std::time::Instant::now(), Vec::new());
    let t2 = timed(&mut || {
        let (base, mut next) = (stage2.parts.len(), 1);
        stage2
            .choose(num_merges, &rules2, 1, |t| {
                if t.parts.len() - base == next {
                    marks.push(format!("{next}: {:.2}s", start.elapsed().as_secs_f64()));
                    next *= 10;
                }
                Ok::<_, ()>(false)
            })
            .unwrap();
    });
    eprintln!("  choosing, wall to each count of stage-2 merges: {}", marks.join(", "));
    println!(
        "stage 1: count {c1:.2}s + build/choose {t1:.2}s ({} merges, {} pieces); stage 2: count {c2:.2}s, \
         replay {r2:.2}s, choose {t2:.2}s ({} merges, {} pieces); CPU seconds",
        replay.len(),
        counts1.len(),
        stage2.parts.len(),
        pieces2
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[1]).expect("read corpus");
    let num_merges: usize = args[2].parse().unwrap();
    let name = args.get(3).cloned().unwrap_or_else(|| "Gpt2".into());
    let spec = count_spec(&name);
    if let (Some(stage2), Some(transition)) = (args.get(4), args.get(5)) {
        return superbpe(&data, &spec, &count_spec(stage2), transition.parse().unwrap(), num_merges);
    }
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
