//! Two-level encoding of SuperBPE pieces (docs/DESIGN.md "Encoding", "Two levels").
//!
//! A stage-2 piece is a stretch of words, so it rarely repeats and the encoder's piece cache does
//! little; rank-based BPE of it from single bytes is what costs. Its words repeat, though. Merges
//! below the transition `t` (stage 1's, which never join a word to the space after it) are run
//! first: they can never join across a byte pair that no such merge joins (`Joins`), so the piece
//! is cut there into segments (words, nearly always), each merged once per thread and then copied
//! from a cache. The merges at or above `t` then run over the short sequence of the piece's tokens.
//!
//! This equals rank-based BPE of the whole piece when no merge below `t` has a part that a merge
//! at or above `t` makes (so a later merge never enables an earlier one); `plan` checks that and
//! otherwise leaves the encoder on one level, saying why. The proof is in docs/DESIGN.md.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::bpe::{self, pair_key, unpack, Ranks};
use crate::replay::{hash_segment, pack_segment, Joins, SegmentCache, MANY, PACKED_MAX};
use crate::unicode::{class_of, WS};

/// How the encoder should choose its levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Two levels at the detected transition when that is exact, else one.
    Auto,
    /// Always one level.
    One,
    /// Two levels at this transition (a merge count) when that is exact, else one.
    Transition(usize),
}

/// What the encoder chose: two levels, or one and the reason.
pub enum Plan {
    Two(Levels),
    One(String),
}

/// Segments longer than this are merged but not cached (they rarely repeat).
const MAX_CACHED_SEGMENT: usize = 256;
/// A cache holding this many segments is emptied before it takes more (bounds memory on a corpus
/// with an endless supply of rare words).
const MAX_CACHED_SEGMENTS: usize = 1 << 20;
/// Second-level sequences up to this many tokens are merged by a linear scan, longer ones by the heap.
const SECOND_LINEAR_MAX: usize = 64;
/// No merge: the rank of a pair that never merges.
const NONE: u32 = u32::MAX;

/// The two-level state: the transition, where pieces are cut, the second level's merges, the
/// per-thread segment caches.
pub struct Levels {
    transition: u32,
    /// Byte pairs a merge below the transition may join.
    joins: Joins,
    /// The merges at or above the transition: (left id, right id) -> (rank, merged id).
    second: Ranks,
    /// Bit per token id: is it the left part of a merge in `second` (most pairs are not; this
    /// saves their lookups).
    second_left: Vec<u64>,
    /// One cache per pool thread plus one for other threads; a thread that finds its own busy
    /// takes any free one, or merges without a cache.
    caches: Vec<Mutex<SegmentCache>>,
}

/// A segment of a piece: its byte range, and its packed key and hash when it is cached packed.
type Segment = (u32, u32, Option<([u64; 2], u64)>);

/// Whether `left + right` joins a word to the space after it: `right` starts with a space and the
/// last character of `left` is not white space. Stage 1 never makes such a token (every stage-1
/// pattern keeps a space in front of the word it belongs to); SuperBPE's stage 2 is made of them.
pub fn joins_word_to_space(left: &[u8], right: &[u8]) -> bool {
    if right.first() != Some(&b' ') || left.is_empty() {
        return false;
    }
    // The last character's first byte: at most three continuation bytes back.
    let mut start = left.len() - 1;
    while start > 0 && left.len() - start < 4 && left[start] & 0xC0 == 0x80 {
        start -= 1;
    }
    match std::str::from_utf8(&left[start..]) {
        Ok(s) => s.chars().next().is_some_and(|c| class_of(c as u32) != WS),
        // A cut-off character: what it is cannot be told, so it does not count.
        Err(_) => false,
    }
}

impl Levels {
    /// Choose the levels for `merges` (in rank order) whose effective entries are `ranks`
    /// ((left id, right id) key -> (rank, merged id); the first rank of a pair, only merges whose
    /// parts are tokens).
    pub fn plan<S: BuildHasher>(
        merges: &[(Vec<u8>, Vec<u8>)],
        ranks: &HashMap<u64, (u32, u32), S>,
        request: Request,
    ) -> Plan {
        let transition = match request {
            Request::One => return Plan::One("one level was asked for".into()),
            Request::Transition(t) if t > merges.len() => {
                return Plan::One(format!("transition {t} is beyond the {} merges", merges.len()))
            }
            Request::Transition(t) => t as u32,
            Request::Auto => {
                let first = ranks
                    .values()
                    .map(|&(rank, _)| rank)
                    .filter(|&rank| {
                        let (l, r) = &merges[rank as usize];
                        joins_word_to_space(l, r)
                    })
                    .min();
                match first {
                    Some(t) => t,
                    None => {
                        return Plan::One(
                            "no merge joins a word to the space after it: pieces are words, cached whole".into(),
                        )
                    }
                }
            }
        };
        // Exactness: no merge below the transition may have a part that a merge at or above it makes.
        let mut made_above: HashMap<u32, u32> = HashMap::new();
        for &(rank, merged) in ranks.values() {
            if rank >= transition {
                let e = made_above.entry(merged).or_insert(rank);
                *e = (*e).min(rank);
            }
        }
        let mut clash: Option<(u32, u32)> = None;
        for (&key, &(rank, _)) in ranks {
            if rank < transition {
                let (l, r) = unpack(key);
                for part in [l, r] {
                    if let Some(&maker) = made_above.get(&part) {
                        if clash.is_none_or(|(c, _)| rank < c) {
                            clash = Some((rank, maker));
                        }
                    }
                }
            }
        }
        if let Some((rank, maker)) = clash {
            return Plan::One(format!(
                "merge {rank} (below the transition {transition}) has a part that merge {maker} makes, \
                 so a later merge could enable an earlier one"
            ));
        }
        Plan::Two(Levels::build(merges, ranks, transition))
    }

    /// The two-level state at `transition`, exact or not (`plan` checks that first).
    fn build<S: BuildHasher>(
        merges: &[(Vec<u8>, Vec<u8>)],
        ranks: &HashMap<u64, (u32, u32), S>,
        transition: u32,
    ) -> Levels {
        let mut second = Ranks::default();
        let mut max_left = 0;
        for (&key, &value) in ranks {
            if value.0 >= transition {
                second.insert(key, value);
                max_left = max_left.max(unpack(key).0 as usize);
            }
        }
        let mut second_left = vec![0u64; max_left / 64 + 1];
        for &key in second.keys() {
            let l = unpack(key).0 as usize;
            second_left[l / 64] |= 1 << (l % 64);
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Levels {
            transition,
            joins: Joins::of(&merges[..transition as usize]),
            second,
            second_left,
            caches: (0..=threads).map(|_| Mutex::default()).collect(),
        }
    }

    /// The transition: merges of lower rank run on the first level, the others on the second.
    pub fn transition(&self) -> u32 {
        self.transition
    }

    /// The ids of `piece` (single bytes' ids in `byte_ids`; `rank` is the encoder's lookup of all
    /// merges) appended to `out`.
    pub fn encode<F: Fn(u32, u32) -> Option<(u32, u32)>>(
        &self,
        piece: &[u8],
        byte_ids: &[u32; 256],
        rank: &F,
        out: &mut Vec<u32>,
    ) {
        let t = self.transition;
        let first = |l: u32, r: u32| rank(l, r).filter(|&(rk, _)| rk < t);
        let mut guard = self.cache();
        let segments = self.cut(piece, guard.as_deref());
        let start = out.len();
        for &(from, to, packed) in &segments {
            let segment = &piece[from as usize..to as usize];
            match *segment {
                [b] => out.push(byte_ids[b as usize]),
                // Two bytes merge (one id) or not, whatever else the first level holds.
                [a, b] => {
                    let (a, b) = (byte_ids[a as usize], byte_ids[b as usize]);
                    match first(a, b) {
                        Some((_, merged)) => out.push(merged),
                        None => out.extend_from_slice(&[a, b]),
                    }
                }
                _ => {
                    if let Some(cache) = guard.as_deref() {
                        if let Some(syms) = cache.get(segment, packed) {
                            cache.copy(syms, out);
                            continue;
                        }
                    }
                    let ids = bpe::merge(segment.iter().map(|&b| byte_ids[b as usize]).collect(), first);
                    out.extend_from_slice(&ids);
                    if let Some(cache) = guard.as_deref_mut() {
                        if segment.len() <= MAX_CACHED_SEGMENT && ids.iter().all(|&id| id < MANY) {
                            if cache.len() >= MAX_CACHED_SEGMENTS {
                                *cache = SegmentCache::default();
                            }
                            cache.insert(segment, packed, &ids);
                        }
                    }
                }
            }
        }
        drop(guard);
        self.merge_second(out, start);
    }

    /// This thread's cache, or any free one, or none when all are busy.
    fn cache(&self) -> Option<MutexGuard<'_, SegmentCache>> {
        let n = self.caches.len();
        let own = rayon::current_thread_index().map_or(0, |i| i + 1) % n;
        (0..n).find_map(|k| self.caches[(own + k) % n].try_lock().ok())
    }

    /// `piece` cut at every byte pair no first-level merge joins; the cache slot of each packed
    /// segment is fetched, so that the lookups that follow find it in the CPU cache.
    #[inline(always)]
    fn cut(&self, piece: &[u8], cache: Option<&SegmentCache>) -> SmallVec<[Segment; 16]> {
        let mut segments = SmallVec::new();
        let mut start = 0;
        for end in 1..=piece.len() {
            if end < piece.len() && self.joins.may_join(piece[end - 1], piece[end]) {
                continue;
            }
            let len = end - start;
            let packed = (3..=PACKED_MAX).contains(&len).then(|| {
                let key = pack_segment(&piece[start..end]);
                let hash = hash_segment(key);
                if let Some(cache) = cache {
                    cache.prefetch(hash);
                }
                (key, hash)
            });
            segments.push((start as u32, end as u32, packed));
            start = end;
        }
        segments
    }

    /// (rank, merged id) of a second-level merge of `l`, `r`; rank `NONE` when there is none.
    #[inline(always)]
    fn second_rank(&self, l: u32, r: u32) -> (u32, u32) {
        let i = l as usize;
        if self.second_left.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1) {
            if let Some(&found) = self.second.get(&pair_key(l, r)) {
                return found;
            }
        }
        (NONE, 0)
    }

    /// Rank-based BPE with the second level's merges over `ids[start..]`, in place.
    fn merge_second(&self, ids: &mut Vec<u32>, start: usize) {
        let n = ids.len() - start;
        if n < 2 {
            return;
        }
        if n > SECOND_LINEAR_MAX {
            let tail = ids.split_off(start);
            let rank = |l, r| Some(self.second_rank(l, r)).filter(|&(rk, _)| rk != NONE);
            ids.extend_from_slice(&bpe::merge_heap(tail, rank));
            return;
        }
        // ranks[i]: rank and result of merging ids[start + i] and the token after it.
        let mut ranks: SmallVec<[(u32, u32); 32]> =
            ids[start..].windows(2).map(|w| self.second_rank(w[0], w[1])).collect();
        loop {
            let mut best = 0;
            for (i, r) in ranks.iter().enumerate() {
                if r.0 < ranks[best].0 {
                    best = i;
                }
            }
            let (rank, merged) = ranks[best];
            if rank == NONE {
                return;
            }
            let at = start + best;
            ids[at] = merged;
            ids.remove(at + 1);
            ranks.remove(best);
            if ranks.is_empty() {
                return;
            }
            if best > 0 {
                ranks[best - 1] = self.second_rank(ids[at - 1], merged);
            }
            if best < ranks.len() {
                ranks[best] = self.second_rank(merged, ids[at + 1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::Encoder;
    use crate::scan::{builtin_pattern, Builtin, Splitter};
    use crate::test_below;

    #[test]
    fn word_to_space_joins() {
        assert!(joins_word_to_space(b" of", b" the"));
        assert!(joins_word_to_space(b".", b" "));
        assert!(joins_word_to_space("é".as_bytes(), b" x"));
        assert!(!joins_word_to_space(b" ", b" "));
        assert!(!joins_word_to_space(b"\n", b" a"));
        assert!(!joins_word_to_space("\u{a0}".as_bytes(), b" "));
        assert!(!joins_word_to_space(b"\xa0", b" "), "a cut-off character does not count");
        assert!(!joins_word_to_space(b"the", b"ir"));
        assert!(!joins_word_to_space(b"", b" "));
    }

    /// Byte-valued ids, one per merge after them; `merges` as text.
    fn encoder(merges: &[(&str, &str)], request: Request) -> Encoder {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        let mut seen: std::collections::HashSet<Vec<u8>> = vocab.iter().map(|(b, _)| b.clone()).collect();
        for (l, r) in merges {
            let token = [l.as_bytes(), r.as_bytes()].concat();
            if seen.insert(token.clone()) {
                vocab.push((token, vocab.len() as u32));
            }
        }
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        let splitter = Splitter::new(&builtin_pattern(Builtin::SuperbpePaper), false).unwrap();
        Encoder::with_levels(vocab, &m, splitter, false, request).unwrap()
    }

    fn ids(e: &Encoder, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        e.encode_ordinary(text.as_bytes(), &mut out).unwrap();
        out
    }

    #[test]
    fn plans_two_levels_at_the_first_word_to_space_merge() {
        let merges = [("t", "h"), ("th", "e"), (" ", "a"), ("the", " a"), ("a", "t")];
        let e = encoder(&merges, Request::Auto);
        assert!(matches!(e.plan(), Plan::Two(l) if l.transition() == 3));
        let one = encoder(&merges, Request::One);
        for text in ["the athe a", "at the at", "the a the a the"] {
            assert_eq!(ids(&e, text), ids(&one, text), "{text}");
        }
        assert!(matches!(encoder(&merges[..3], Request::Auto).plan(), Plan::One(_)));
    }

    /// A merge below the transition whose part a later merge makes: the second level could enable
    /// the first, so two levels would be wrong ("abcd": whole-piece BPE makes "abcd", two levels
    /// would stop at "ab" "cd"). The plan must refuse it.
    #[test]
    fn a_part_made_above_the_transition_keeps_one_level() {
        let merges = [("c", "d"), ("ab", "cd"), ("x", " "), ("a", "b")];
        let e = encoder(&merges, Request::Auto);
        match e.plan() {
            Plan::One(why) => assert!(why.contains("merge 1") && why.contains("merge 3"), "{why}"),
            Plan::Two(_) => panic!("two levels chosen"),
        }
        let abcd = ids(&e, "abcd");
        assert_eq!(abcd.len(), 1);
        // Two levels at that transition anyway stop at "ab" "cd".
        let mut ranks: HashMap<u64, (u32, u32)> = HashMap::new();
        let id = |s: &str| ids(&e, s)[0];
        for (rank, (l, r)) in merges.iter().enumerate() {
            ranks.insert(pair_key(id(l), id(r)), (rank as u32, id(&format!("{l}{r}"))));
        }
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        let unchecked = Levels::build(&m, &ranks, 2);
        let byte_ids: [u32; 256] = std::array::from_fn(|b| b as u32);
        let mut out = Vec::new();
        unchecked.encode(b"abcd", &byte_ids, &|l, r| ranks.get(&pair_key(l, r)).copied(), &mut out);
        assert_eq!(out, vec![id("ab"), id("cd")]);
        assert!(matches!(encoder(&merges, Request::Transition(1)).plan(), Plan::Two(_)));
    }

    /// Random merges made of random tokens, cut at random transitions: whenever the plan picks two
    /// levels, the ids equal one-level BPE of every piece (the texts mix words, spaces, newlines).
    #[test]
    fn two_levels_equal_one_level_on_random_merges() {
        let seed = &mut 0x9E37_79B9_7F4A_7C15u64;
        let alphabet: &[&str] = &["a", "b", " ", "\n", ".", "é"];
        let (mut two_level, mut refused) = (0, 0);
        for _ in 0..600 {
            let mut tokens: Vec<String> = alphabet.iter().map(|s| s.to_string()).collect();
            let mut merges: Vec<(String, String)> = Vec::new();
            // Sometimes a token is made twice (another split of it), as duplicate merges do.
            let duplicates = test_below(seed, 4) == 0;
            for _ in 0..test_below(seed, 30) {
                let l = tokens[test_below(seed, tokens.len())].clone();
                let r = tokens[test_below(seed, tokens.len())].clone();
                let t = format!("{l}{r}");
                if !tokens.contains(&t) {
                    tokens.push(t);
                    merges.push((l, r));
                } else if duplicates && !merges.contains(&(l.clone(), r.clone())) {
                    merges.push((l, r));
                }
            }
            // Sometimes in another order, so that a merge's part may be made by a later merge.
            if test_below(seed, 3) == 0 {
                for i in (1..merges.len()).rev() {
                    merges.swap(i, test_below(seed, i + 1));
                }
            }
            let as_refs: Vec<(&str, &str)> = merges.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
            let request = match test_below(seed, 3) {
                0 => Request::Auto,
                _ => Request::Transition(test_below(seed, merges.len() + 1)),
            };
            let e = encoder(&as_refs, request);
            let one = encoder(&as_refs, Request::One);
            match e.plan() {
                Plan::Two(_) => two_level += 1,
                Plan::One(why) if why.contains("makes") => refused += 1,
                Plan::One(_) => {}
            }
            for _ in 0..20 {
                let text: String =
                    (0..test_below(seed, 40)).map(|_| alphabet[test_below(seed, alphabet.len())]).collect();
                // Twice: the second time reads the segments the first one cached.
                for _ in 0..2 {
                    assert_eq!(ids(&e, &text), ids(&one, &text), "{text:?} with {merges:?} ({request:?})");
                }
            }
        }
        assert!(two_level > 100 && refused > 10, "two levels {two_level}, refused {refused}");
    }

    #[test]
    fn long_pieces_use_the_heap_on_the_second_level() {
        let merges = [("a", "b"), ("ab", " "), ("ab ", "ab "), ("ab ab ", "ab ab ")];
        let e = encoder(&merges, Request::Auto);
        assert!(matches!(e.plan(), Plan::Two(l) if l.transition() == 1));
        let one = encoder(&merges, Request::One);
        let text = "ab ".repeat(200);
        assert_eq!(ids(&e, &text), ids(&one, &text));
        assert_eq!(ids(&e, &text).len(), 50);
    }
}
