//! Two-level encoding of SuperBPE pieces (docs/DESIGN.md "Encoding", "Two levels").
//!
//! A stage-2 piece is a stretch of words, so it rarely repeats and the encoder's piece cache does
//! little; rank-based BPE of it from single bytes is what costs. Its words repeat, though. Merges
//! below the transition `t` (stage 1's, which never join a word to the space after it) are run
//! first: they can never join across a byte pair that no such merge joins (`JoinedPairs`), so the
//! piece is cut there into segments (words, nearly always), each merged once per thread and then
//! copied from a cache. The merges at or above `t` then run over the short sequence of the piece's tokens.
//!
//! This equals rank-based BPE of the whole piece when no merge below `t` has a part that a merge
//! at or above `t` makes (so a later merge never enables an earlier one); `plan` checks that and
//! otherwise leaves the encoder on one level, saying why. The proof is in docs/DESIGN.md.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::bpe::{self, merge_tail_linear, pair_key, unpack};
use crate::bytesmap::hash_short;
use crate::joins::JoinedPairs;
use crate::memory::prefetch;
use crate::replay::{hash_segment, pack_segment, SegmentCache, Syms, MANY, PACKED_MAX};
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
/// A cache holding this many segments is emptied before the next piece (bounds memory on a corpus
/// with an endless supply of rare words).
const MAX_CACHED_SEGMENTS: usize = 1 << 18;
/// Second-level sequences up to this many tokens are merged by a linear scan, longer ones by the heap.
const SECOND_LINEAR_MAX: usize = 64;
/// First-level segments up to this many bytes are merged by a linear scan, longer ones by the heap.
const FIRST_LINEAR_MAX: usize = 48;
/// Pairs of a segment not in the cache fetched before any is merged (enough for a long word).
const PREFETCH_PAIRS: usize = 16;
/// Worker slots kept at least (one per pool thread; empty until used).
const MIN_WORKER_SLOTS: usize = 64;
/// Largest token id the second level's part filters map (4 MB of bits each at most).
const MAX_FILTERED_ID: usize = 1 << 25;
/// No merge: the rank of a pair that never merges.
const NONE: u32 = u32::MAX;

/// (left id, right id) -> (rank, merged id) in one flat array probed linearly from the pair's
/// hash: a lookup reads one slot (one cache line) where a general hash map reads its control bytes
/// and then its entry. Lookups of the pairs of new words are what a first pass waits on.
struct PairTable {
    slots: Vec<(u64, (u32, u32))>,
}

/// The key of an empty slot: the pair `(u32::MAX, u32::MAX)`, which `plan` keeps out (`u32::MAX`
/// is the encoder's sentinel for a byte the vocabulary lacks).
const EMPTY_PAIR: u64 = u64::MAX;

impl PairTable {
    fn new<I: Iterator<Item = (u64, (u32, u32))> + Clone>(entries: I) -> PairTable {
        // At most 70% full: as fast as half full on the released tokenizer, in half the memory.
        let size = (entries.clone().count() * 10 / 7 + 1).next_power_of_two().max(16);
        let mut slots = vec![(EMPTY_PAIR, (NONE, 0)); size];
        for (key, value) in entries {
            let mut i = hash_short(key) as usize & (size - 1);
            while slots[i].0 != EMPTY_PAIR {
                i = (i + 1) & (size - 1);
            }
            slots[i] = (key, value);
        }
        PairTable { slots }
    }

    /// Fetch the slot the pair's lookup will read first into the CPU cache.
    #[inline(always)]
    fn prefetch(&self, l: u32, r: u32) {
        prefetch(&self.slots[hash_short(pair_key(l, r)) as usize & (self.slots.len() - 1)]);
    }

    /// (rank, merged id) of the pair, rank `NONE` when it never merges.
    #[inline(always)]
    fn get(&self, l: u32, r: u32) -> (u32, u32) {
        let key = pair_key(l, r);
        let mask = self.slots.len() - 1;
        let mut i = hash_short(key) as usize & mask;
        loop {
            let (k, value) = self.slots[i];
            if k == key {
                return value;
            }
            if k == EMPTY_PAIR {
                return (NONE, 0);
            }
            i = (i + 1) & mask;
        }
    }
}

/// The two-level state: the transition, where pieces are cut, the second level's merges, the
/// per-thread segment caches.
pub struct Levels {
    transition: u32,
    /// Byte pairs a merge below the transition may join.
    joins: JoinedPairs,
    /// The merges below the transition.
    first: PairTable,
    /// The merges at or above the transition.
    second: PairTable,
    /// Bits per token id: is it the left part of a merge in `second`, the right part of one (most
    /// pairs of tokens are not both; this saves their lookups). Ids past the end are looked up.
    second_left: Vec<u64>,
    second_right: Vec<u64>,
    /// One per pool thread plus one for other threads; a thread that finds its own busy takes any
    /// free one, or works without a cache.
    workers: Vec<Mutex<Worker>>,
    /// A worker's cache holding this many segments is emptied before the next piece.
    max_cached: usize,
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
    /// ((left id, right id) key, (rank, merged id)) in any order: the first rank of a pair, only
    /// merges whose parts are tokens.
    pub fn plan(merges: &[(Vec<u8>, Vec<u8>)], ranks: &[(u64, (u32, u32))], request: Request) -> Plan {
        let transition = match request {
            Request::One => return Plan::One("one level was asked for".into()),
            Request::Transition(t) if t > merges.len() => {
                return Plan::One(format!("transition {t} is beyond the {} merges", merges.len()))
            }
            Request::Transition(t) => t as u32,
            Request::Auto => {
                // The first effective merge that joins a word to a space, found in rank order.
                let mut effective = vec![false; merges.len()];
                for &(_, (rank, _)) in ranks {
                    effective[rank as usize] = true;
                }
                let first = merges.iter().zip(&effective).position(|((l, r), &e)| e && joins_word_to_space(l, r));
                match first {
                    Some(t) => t as u32,
                    None => {
                        return Plan::One(
                            "no merge joins a word to the space after it: pieces are words, cached whole".into(),
                        )
                    }
                }
            }
        };
        if ranks.iter().any(|&(key, _)| key == EMPTY_PAIR) {
            return Plan::One(format!("a merge joins two tokens of id {}", u32::MAX));
        }
        // Exactness: no merge below the transition may have a part that a merge at or above it makes.
        let mut made_above: HashMap<u32, u32> = HashMap::new();
        for &(_, (rank, merged)) in ranks {
            if rank >= transition {
                let e = made_above.entry(merged).or_insert(rank);
                *e = (*e).min(rank);
            }
        }
        let mut clash: Option<(u32, u32)> = None;
        for &(key, (rank, _)) in ranks {
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
    fn build(merges: &[(Vec<u8>, Vec<u8>)], ranks: &[(u64, (u32, u32))], transition: u32) -> Levels {
        let below = |&&(_, (rank, _)): &&(u64, (u32, u32))| rank < transition;
        let first = PairTable::new(ranks.iter().filter(below).copied());
        let second = PairTable::new(ranks.iter().filter(|e| !below(e)).copied());
        // Ids past the bits (an id space too large to map) are not filtered: they are looked up.
        let bits = |part: fn((u32, u32)) -> u32| {
            let ids: Vec<usize> = ranks.iter().filter(|e| !below(e)).map(|&(k, _)| part(unpack(k)) as usize).collect();
            let mut bits = vec![0u64; ids.iter().max().map_or(0, |&i| i.min(MAX_FILTERED_ID) / 64) + 1];
            for i in ids {
                if i / 64 < bits.len() {
                    bits[i / 64] |= 1 << (i % 64);
                }
            }
            bits
        };
        let (second_left, second_right) = (bits(|(l, _)| l), bits(|(_, r)| r));
        // A slot per thread of any pool up to this size (an unused slot is an empty cache), so a
        // pool larger than the machine still gives each thread its own.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).max(MIN_WORKER_SLOTS);
        Levels {
            transition,
            joins: JoinedPairs::of(&merges[..transition as usize]),
            first,
            second,
            second_left,
            second_right,
            workers: (0..=threads).map(|_| Mutex::default()).collect(),
            max_cached: MAX_CACHED_SEGMENTS,
        }
    }

    /// The transition: merges of lower rank run on the first level, the others on the second.
    pub fn transition(&self) -> u32 {
        self.transition
    }

    /// The ids of `piece` (single bytes' ids in `byte_ids`) appended to `out`, with a worker state
    /// of this thread's own (or any free one, or a new one when all are busy).
    pub fn encode(&self, piece: &[u8], byte_ids: &[u32; 256], out: &mut Vec<u32>) {
        let mut spare = None;
        let mut guard = self.worker();
        let w: &mut Worker = match guard.as_deref_mut() {
            Some(w) => w,
            None => spare.insert(Worker::default()),
        };
        self.encode_in(piece, byte_ids, out, w);
    }

    /// As [`Self::encode`], with the caller's worker state `w` (the encoder keeps one beside each
    /// of its piece caches, so a text takes no lock per piece).
    pub fn encode_in(&self, piece: &[u8], byte_ids: &[u32; 256], out: &mut Vec<u32>, w: &mut Worker) {
        // Emptied before the lookups, never between them: a hit refers into the cache's arena.
        if w.cache.len() >= self.max_cached {
            w.cache = SegmentCache::default();
        }
        self.cut(piece, w);
        // First every segment's cached result, the pairs of those not cached fetched meanwhile
        // (new words' pair lookups are what a first pass waits on; fetched together, they overlap).
        w.hits.clear();
        for &(from, to, packed) in &w.segments {
            let segment = &piece[from as usize..to as usize];
            let hit = if segment.len() < 3 { None } else { w.cache.get(segment, packed) };
            if hit.is_none() && segment.len() >= 3 {
                for pair in segment.windows(2).take(PREFETCH_PAIRS) {
                    self.first.prefetch(byte_ids[pair[0] as usize], byte_ids[pair[1] as usize]);
                }
            }
            w.hits.push(hit);
        }
        let start = out.len();
        for (&(from, to, packed), &hit) in w.segments.iter().zip(&w.hits) {
            let segment = &piece[from as usize..to as usize];
            match (segment, hit) {
                (&[b], _) => out.push(byte_ids[b as usize]),
                // Two bytes merge (one id) or not, whatever else the first level holds.
                (&[a, b], _) => {
                    let (a, b) = (byte_ids[a as usize], byte_ids[b as usize]);
                    match self.first.get(a, b) {
                        (NONE, _) => out.extend_from_slice(&[a, b]),
                        (_, merged) => out.push(merged),
                    }
                }
                (_, Some(syms)) => w.cache.copy(syms, out),
                (_, None) => {
                    // The same word twice in a piece: the first one's result is cached by now.
                    if let Some(syms) = w.cache.get(segment, packed) {
                        w.cache.copy(syms, out);
                        continue;
                    }
                    let at = out.len();
                    out.extend(segment.iter().map(|&b| byte_ids[b as usize]));
                    if segment.len() <= FIRST_LINEAR_MAX {
                        merge_tail_linear(out, at, &mut w.ranks, |l, r| self.first.get(l, r));
                    } else {
                        let ids = out.split_off(at);
                        let rank = |l, r| Some(self.first.get(l, r)).filter(|&(rk, _)| rk != NONE);
                        out.extend_from_slice(&bpe::merge_heap(ids, rank));
                    }
                    let ids = &out[at..];
                    if segment.len() <= MAX_CACHED_SEGMENT && ids.iter().all(|&id| id < MANY) {
                        w.cache.insert(segment, packed, ids);
                    }
                }
            }
        }
        self.merge_second(out, start, &mut w.ranks);
    }

    /// This thread's worker state, or any free one, or none when all are busy.
    fn worker(&self) -> Option<MutexGuard<'_, Worker>> {
        let n = self.workers.len();
        let own = rayon::current_thread_index().map_or(0, |i| i + 1) % n;
        (0..n).find_map(|k| self.workers[(own + k) % n].try_lock().ok())
    }

    /// `piece` cut at every byte pair no first-level merge joins, into `w.segments`; the cache
    /// slot of each packed segment is fetched, so that the lookups that follow find it in the CPU
    /// cache.
    #[inline(always)]
    fn cut(&self, piece: &[u8], w: &mut Worker) {
        w.segments.clear();
        let mut start = 0;
        for end in 1..=piece.len() {
            if end < piece.len() && self.joins.may_join(piece[end - 1], piece[end]) {
                continue;
            }
            let len = end - start;
            let packed = (3..=PACKED_MAX).contains(&len).then(|| {
                let key = pack_segment(&piece[start..end]);
                let hash = hash_segment(key);
                w.cache.prefetch(hash);
                (key, hash)
            });
            w.segments.push((start as u32, end as u32, packed));
            start = end;
        }
    }

    /// (rank, merged id) of a second-level merge of `l`, `r`; rank `NONE` when there is none.
    #[inline(always)]
    fn second_rank(&self, l: u32, r: u32) -> (u32, u32) {
        let has = |bits: &[u64], id: u32| bits.get(id as usize / 64).is_none_or(|w| w >> (id % 64) & 1 == 1);
        if has(&self.second_left, l) && has(&self.second_right, r) {
            return self.second.get(l, r);
        }
        (NONE, 0)
    }

    /// Rank-based BPE with the second level's merges over `ids[start..]`, in place.
    fn merge_second(&self, ids: &mut Vec<u32>, start: usize, ranks: &mut Vec<(u32, u32)>) {
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
        merge_tail_linear(ids, start, ranks, |l, r| self.second_rank(l, r));
    }
}

/// What one thread reuses from piece to piece: its segment cache and scratch space.
#[derive(Default)]
pub struct Worker {
    cache: SegmentCache,
    segments: Vec<Segment>,
    hits: Vec<Option<Syms>>,
    ranks: Vec<(u32, u32)>,
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

    /// Byte-valued ids, one per merge after them, then the parts no merge makes; `merges` as text.
    fn encoder(merges: &[(&str, &str)], request: Request) -> Encoder {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        let mut seen: std::collections::HashSet<Vec<u8>> = vocab.iter().map(|(b, _)| b.clone()).collect();
        for (l, r) in merges {
            let token = [l.as_bytes(), r.as_bytes()].concat();
            if seen.insert(token.clone()) {
                vocab.push((token, vocab.len() as u32));
            }
        }
        // A part no merge makes (a character of several bytes) is a token too, as an encoder requires.
        for part in merges.iter().flat_map(|(l, r)| [l.as_bytes(), r.as_bytes()]) {
            if seen.insert(part.to_vec()) {
                vocab.push((part.to_vec(), vocab.len() as u32));
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
        let unchecked = Levels::build(&m, &ranks.into_iter().collect::<Vec<_>>(), 2);
        let byte_ids: [u32; 256] = std::array::from_fn(|b| b as u32);
        let mut out = Vec::new();
        unchecked.encode(b"abcd", &byte_ids, &mut out);
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

    /// A cache emptied often, and words that repeat inside one piece (the second occurrence finds
    /// the first one's result): the ids stay those of one level.
    #[test]
    fn a_small_cache_emptied_between_pieces_changes_nothing() {
        let merges = [("a", "b"), ("ab", "c"), ("c", "a"), ("abc", "d"), ("d", " "), ("abcd", " ")];
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        let one = encoder(&merges, Request::One);
        let mut ranks: HashMap<u64, (u32, u32)> = HashMap::new();
        let id = |s: &str| ids(&one, s)[0];
        for (rank, (l, r)) in merges.iter().enumerate() {
            ranks.entry(pair_key(id(l), id(r))).or_insert((rank as u32, id(&format!("{l}{r}"))));
        }
        let byte_ids: [u32; 256] = std::array::from_fn(|b| b as u32);
        let seed = &mut 0x1234_5678_9ABC_DEF1u64;
        for max_cached in [0, 1, 2, 5] {
            let mut levels = Levels::build(&m, &ranks.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>(), 4);
            levels.max_cached = max_cached;
            for _ in 0..300 {
                let words = ["abcd", "abcab", "cabcabca", "d", "abcdabcdabcdabcdabcd", "ab"];
                let text: String = (0..test_below(seed, 12))
                    .map(|_| words[test_below(seed, words.len())])
                    .collect::<Vec<_>>()
                    .join(" ");
                let mut got = Vec::new();
                levels.encode(text.as_bytes(), &byte_ids, &mut got);
                let mut want = Vec::new();
                one.encode_ordinary(text.as_bytes(), &mut want).unwrap();
                assert_eq!(got, want, "{text:?} with a cache of {max_cached}");
            }
        }
    }

    /// Token ids past what the second level's part filters map are looked up, not dropped.
    #[test]
    fn huge_token_ids_are_looked_up() {
        let merges = [("t", "h"), ("th", "e"), ("the", " "), ("the ", "the "), ("a", "t")];
        let big = (MAX_FILTERED_ID + 1000) as u32;
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        for (i, (l, r)) in merges.iter().enumerate() {
            vocab.push(([l.as_bytes(), r.as_bytes()].concat(), big + i as u32));
        }
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        let make = |request| {
            let splitter = Splitter::new(&builtin_pattern(Builtin::SuperbpePaper), false).unwrap();
            Encoder::with_levels(vocab.clone(), &m, splitter, false, request).unwrap()
        };
        let (two, one) = (make(Request::Auto), make(Request::One));
        assert!(matches!(two.plan(), Plan::Two(l) if l.transition() == 2));
        for text in ["the the the at", "athe the thethe "] {
            assert_eq!(ids(&two, text), ids(&one, text), "{text}");
        }
        assert_eq!(ids(&two, "the the "), vec![big + 3]);
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
