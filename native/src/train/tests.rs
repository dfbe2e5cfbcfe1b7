#[cfg(test)]
mod choosing {
    use super::super::*;
    use crate::byte_table::char_of;

    fn counts(items: &[(&str, u64)]) -> Counts {
        let mut c = Counts::default();
        for (p, n) in items {
            c.add(p.as_bytes(), *n).unwrap();
        }
        c
    }

    fn train(items: &[(&str, u64)], n: usize, rules: &Rules) -> Vec<Vec<u8>> {
        let mut t = Trainer::new(&counts(items)).unwrap();
        t.choose(n, rules, 1000, |_| Ok::<_, ()>(false)).unwrap();
        t.merges().map(|(l, r)| [l, r].concat()).collect()
    }

    #[test]
    fn highest_count_then_greatest_bytes() {
        let rules = Rules { min_frequency: 1, ..Default::default() };
        // "ab" and "cd" tie at 5: (c, d) is greater than (a, b).
        let m = train(&[("ab", 5), ("cd", 5), ("xyz", 1)], 2, &rules);
        assert_eq!(m, vec![b"cd".to_vec(), b"ab".to_vec()]);
    }

    #[test]
    fn overlapping_pairs_merge_left_to_right() {
        let rules = Rules { min_frequency: 1, ..Default::default() };
        let m = train(&[("aaaaa", 1)], 3, &rules);
        assert_eq!(m, vec![b"aa".to_vec(), b"aaaa".to_vec(), b"aaaaa".to_vec()]);
    }

    #[test]
    fn rules_skip_tokens_without_costing_ids() {
        let rules = Rules { min_frequency: 1, max_token_bytes: Some(2), ..Default::default() };
        let m = train(&[("abc", 10), ("xy", 1)], 5, &rules);
        assert_eq!(m, vec![b"bc".to_vec(), b"xy".to_vec()]);
        let words = Rules { min_frequency: 1, max_words_per_token: Some(1), ..Default::default() };
        assert!(!words.allows(b"a b"));
        assert!(words.allows(b" ab "));
    }

    #[test]
    fn hf_ids_break_ties_by_lowest_ids() {
        // GPT-2's byte table: space is U+0120 and newline U+010A, so both rank after every letter.
        assert_eq!((char_of(b' '), char_of(b'\n'), char_of(b'a')), (0x120, 0x10A, 0x61));
        let rules = Rules { min_frequency: 1, tie_break_ids: true, ..Default::default() };
        // "ab", "cd" and " x" tie at 5: HF takes (a, b) first, then (c, d); (" ", x) comes last.
        let m = train(&[("ab", 5), ("cd", 5), (" x", 5)], 3, &rules);
        assert_eq!(m, vec![b"ab".to_vec(), b"cd".to_vec(), b" x".to_vec()]);
    }

    #[test]
    fn official_replay_drops_absent_merges_and_their_dependents() {
        let rules = Rules { drop_absent: true, ..Default::default() };
        let replay: Vec<(Vec<u8>, Vec<u8>)> = [("x", "y"), ("a", "b"), ("xy", "z"), ("ab", "ab")]
            .iter()
            .map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec()))
            .collect();
        let c = counts(&[("abab", 3), ("cd", 2)]);
        let mut t =
            Trainer::with_rules(Source::Borrowed(&c), &replay, &rules, usize::MAX, &mut |_, _, _| Ok(())).unwrap();
        t.choose(3, &rules, 1000, |_| Ok::<_, ()>(false)).unwrap();
        let m: Vec<Vec<u8>> = t.merges().map(|(l, r)| [l, r].concat()).collect();
        assert_eq!(m, vec![b"ab".to_vec(), b"abab".to_vec(), b"cd".to_vec()]);
    }

    #[test]
    fn min_frequency_stops() {
        let rules = Rules { min_frequency: 3, ..Default::default() };
        assert_eq!(train(&[("ab", 5), ("cd", 2)], 10, &rules), vec![b"ab".to_vec()]);
    }
}

#[cfg(test)]
mod replay_tests {
    use super::super::*;

    fn below(seed: &mut u64, n: usize) -> usize {
        (crate::test_random(seed) % n as u64) as usize
    }

    /// Keeping only a few pairs warm (thawing the rest when the best count falls below theirs)
    /// must choose exactly the merges of a table that holds every pair, with and without replay
    /// and rules.
    #[test]
    fn cold_pairs_change_no_merge() {
        let seed = &mut 0x9E37_79B9_7F4A_7C15u64;
        let mut below = |n: usize| below(seed, n);
        for round in 0..150 {
            let mut c = Counts::default();
            for _ in 0..1 + below(30) {
                let len = 1 + below(25);
                let piece: Vec<u8> = (0..len).map(|_| b"ab c.d"[below(6)]).collect();
                let count = 1 + below(5) as u64;
                c.add(&piece, count).unwrap();
            }
            let rules = match round % 3 {
                0 => Rules::default(),
                1 => Rules { min_frequency: 2, ..Default::default() },
                _ => Rules {
                    max_words_per_token: Some(2),
                    forbidden_substrings: vec![b". ".to_vec()],
                    ..Default::default()
                },
            };
            let n = below(60);
            let mut full = Trainer::with_replay_warm(&c, &[], usize::MAX).unwrap();
            full.choose(n, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            let all: Vec<(Vec<u8>, Vec<u8>)> = full.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
            let cut = below(all.len() + 1);
            let mut reference = Trainer::with_replay_warm(&c, &all[..cut], usize::MAX).unwrap();
            reference.choose(n, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            for warm in [0, 1, 2, 5] {
                for replay in [&all[..0], &all[..cut]] {
                    let expected = if replay.is_empty() { &full } else { &reference };
                    let mut t = Trainer::with_replay_warm(&c, replay, warm).unwrap();
                    t.choose(n, &rules, 7, |_| Ok::<_, ()>(false)).unwrap();
                    assert!(t.merges().eq(expected.merges()), "round {round}, warm {warm}, replay {}", replay.len());
                }
            }
        }
    }

    /// The same over many pieces, so replay runs in several chunks laid out in parallel.
    #[test]
    fn replay_over_many_chunks_equals_sequential_merging() {
        let seed = &mut 0x5DEE_CE66_D1CE_4E5Bu64;
        let mut c = Counts::default();
        for _ in 0..20_000 {
            let len = 1 + below(seed, 12);
            let piece: Vec<u8> = (0..len).map(|_| b"abcde fg."[below(seed, 9)]).collect();
            c.add(&piece, 1 + below(seed, 4) as u64).unwrap();
        }
        let rules = Rules::default();
        let mut full = Trainer::new(&c).unwrap();
        full.choose(300, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        let all: Vec<(Vec<u8>, Vec<u8>)> = full.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
        let mut t = Trainer::with_replay(&c, &all[..200]).unwrap();
        t.choose(300, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        assert!(t.merges().eq(full.merges()));
    }

    /// Replay through per-piece BPE must equal choosing the same merges one by one.
    #[test]
    fn replay_equals_sequential_merging() {
        let mut c = Counts::default();
        for (p, n) in [("aaaaaa", 3), ("abababa", 2), ("banana band", 4), ("a", 9), ("xyz", 1)] {
            c.add(p.as_bytes(), n).unwrap();
        }
        let rules = Rules { min_frequency: 1, ..Default::default() };
        let mut full = Trainer::new(&c).unwrap();
        full.choose(12, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        let all: Vec<(Vec<u8>, Vec<u8>)> = full.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
        for cut in 0..=all.len() {
            let mut t = Trainer::with_replay(&c, &all[..cut]).unwrap();
            t.choose(12, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            let got: Vec<(Vec<u8>, Vec<u8>)> = t.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
            assert_eq!(got, all, "replaying {cut} merges");
        }
    }
}

#[cfg(test)]
mod source_tests {
    use super::super::*;

    /// Counts handed over (and freed after replay) build the same trainer as borrowed ones.
    #[test]
    fn owned_counts_choose_the_same_merges() {
        let mut c = Counts::default();
        for (p, n) in [("hello world\n", 3), ("hello there world\n", 2), ("a", 5), ("wow wow\n", 4)] {
            c.add(p.as_bytes(), n).unwrap();
        }
        let replay = vec![(b"l".to_vec(), b"l".to_vec()), (b"o".to_vec(), b" ".to_vec())];
        let mut borrowed = Trainer::with_replay(&c, &replay).unwrap();
        borrowed.choose(30, &Rules::default(), usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        let mut owned = Trainer::with_replay_progress(Source::Owned(c), &replay, &mut |_, _, _| Ok(())).unwrap();
        owned.choose(30, &Rules::default(), usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
        assert!(owned.merges().eq(borrowed.merges()));
        assert!(owned.parts.len() > replay.len());
    }
}

#[cfg(test)]
mod cut_tests {
    use super::super::*;
    use crate::test_below as below;

    /// Random word-chain lines, stage-1 merges learned on their words, then stage 2 on whole lines:
    /// pieces cut where the merges cannot reach (and cut again, lower, as often as the best count
    /// falls below θ) choose exactly the merges of the whole pieces, under SuperBPE's rules too.
    #[test]
    fn cut_pieces_choose_the_merges_of_whole_ones() {
        let seed = &mut 0x9E37_79B9_7F4A_7C15u64;
        let words = ["the", " cat", " sat", " on", " a", " mat", ",", " and", " dog", " ran", ": ", " to", "a"];
        for round in 0..60 {
            let (mut lines, mut stage1) = (Counts::default(), Counts::default());
            for _ in 0..200 + below(seed, 600) {
                let mut line = Vec::new();
                let mut w = below(seed, words.len());
                for _ in 0..1 + below(seed, 14) {
                    // A Markov chain over few words, so some bigrams are frequent and most are rare.
                    w = if below(seed, 3) == 0 { below(seed, words.len()) } else { (w * 7 + 3) % words.len() };
                    line.extend_from_slice(words[w].as_bytes());
                    stage1.add(words[w].as_bytes(), 1).unwrap();
                }
                // Equal weights in some rounds: many pairs then tie at θ.
                lines.add(&line, if round % 3 == 0 { 1 } else { 1 + below(seed, 3) as u64 }).unwrap();
            }
            let rules1 = Rules { min_frequency: 1, ..Default::default() };
            let mut s1 = Trainer::new(&stage1).unwrap();
            s1.choose(5 + below(seed, 20), &rules1, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            let replay: Vec<(Vec<u8>, Vec<u8>)> = s1.merges().map(|(l, r)| (l.to_vec(), r.to_vec())).collect();
            let rules = if round % 2 == 0 {
                Rules {
                    min_frequency: 1,
                    max_words_per_token: Some(2),
                    forbidden_substrings: vec![b": ".to_vec()],
                    ..Default::default()
                }
            } else {
                Rules::default()
            };
            let total = replay.len() + 10 + below(seed, 120);
            let mut whole = Trainer::with_replay(&lines, &replay).unwrap();
            whole.choose(total, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
            // Sketches of 4 and 64 buckets: rare pairs share buckets with hot ones.
            let plans = [(1, WARM_PAIRS, Some(2)), (3, 4, Some(6)), (total - replay.len(), WARM_PAIRS, None)];
            for (to_choose, warm, bits) in plans {
                let mut cut = Trainer::with_replay_cut(&lines, &replay, to_choose, bits, warm).unwrap();
                cut.choose(total, &rules, usize::MAX, |_| Ok::<_, ()>(false)).unwrap();
                assert!(cut.merges().eq(whole.merges()), "round {round}, cut for {to_choose}, warm {warm}, {bits:?}");
            }
        }
    }
}
