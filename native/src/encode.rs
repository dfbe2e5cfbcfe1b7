//! Encoder: pieces to ids by merge rank (docs/DESIGN.md "Encoding").
//!
//! Inside a piece: if the piece's bytes are a token (and `whole_pieces` is on), that id; otherwise
//! start from single bytes and repeatedly merge the adjacent pair with the lowest merge rank,
//! leftmost on ties (HF's `ignore_merges: false` is `whole_pieces` off). A vocabulary may lack
//! single bytes (HF-trained ones keep only the bytes they saw): that is an error only for a text
//! that needs such a byte. Short
//! pieces use a linear scan (fewer cache misses than a heap); long pieces a lazy min-heap over a
//! linked list, so a whole-line SuperBPE piece costs O(n log n), not O(n²). Pieces that are not
//! tokens are cached, since the same rare words recur. A SuperBPE tokenizer's pieces are merged on
//! two levels where that gives the same ids (`encode_levels.rs`).

use std::collections::HashMap;
use std::sync::Mutex;

use rayon::prelude::*;

use crate::bpe;
use crate::bytesmap::BytesMap;
use crate::encode_levels::{Levels, Plan, Request};
use crate::scan::Splitter;

/// Pieces up to this many bytes are merged with the linear scan (encoder pieces are short words).
const LINEAR_MAX: usize = 48;
const CACHE_SHARDS: usize = 16;
const CACHE_MAX_PER_SHARD: usize = 1 << 14;
/// Pieces longer than this are not cached (they rarely repeat).
const CACHE_MAX_PIECE: usize = 256;

type Cache = BytesMap<Box<[u32]>>;

pub struct Encoder {
    splitter: Splitter,
    vocab: BytesMap<u32>,
    /// The id of each single byte; `MISSING` where the vocabulary has none.
    byte_ids: [u32; 256],
    /// Whether any byte is `MISSING` (only then is the output checked for it).
    lacks_bytes: bool,
    /// Map a piece that is itself a token straight to its id (see the module doc).
    whole_pieces: bool,
    /// (left id, right id) -> (rank, merged id)
    ranks: HashMap<u64, (u32, u32), ahash::RandomState>,
    cache: Vec<Mutex<Cache>>,
    hasher: ahash::RandomState,
    /// Two-level BPE of SuperBPE pieces where it is exact (`encode_levels.rs`), else one level.
    levels: Plan,
}

/// The id of a byte the vocabulary lacks: no merge has it as a part, so it survives BPE unchanged
/// and `encode_ordinary` reports it.
const MISSING: u32 = u32::MAX;

#[inline]
fn pair_key(l: u32, r: u32) -> u64 {
    ((l as u64) << 32) | r as u64
}

impl Encoder {
    /// `vocab`: bytes -> id; `merges` in rank order. Every merge's result must be in `vocab`.
    /// Two levels where they are exact (`Request::Auto`).
    pub fn new(
        vocab: Vec<(Vec<u8>, u32)>,
        merges: &[(Vec<u8>, Vec<u8>)],
        splitter: Splitter,
        whole_pieces: bool,
    ) -> Result<Encoder, String> {
        Encoder::with_levels(vocab, merges, splitter, whole_pieces, Request::Auto)
    }

    /// As `new`, with the levels chosen as `request` says.
    pub fn with_levels(
        vocab: Vec<(Vec<u8>, u32)>,
        merges: &[(Vec<u8>, Vec<u8>)],
        splitter: Splitter,
        whole_pieces: bool,
        request: Request,
    ) -> Result<Encoder, String> {
        let mut map: BytesMap<u32> = BytesMap::default();
        for (bytes, id) in vocab {
            map.insert(&bytes, id);
        }
        let mut byte_ids = [MISSING; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = map.get(&[b as u8]).copied().unwrap_or(MISSING);
        }
        let lacks_bytes = byte_ids.contains(&MISSING);
        let mut ranks: HashMap<u64, (u32, u32), ahash::RandomState> = HashMap::default();
        for (rank, (l, r)) in merges.iter().enumerate() {
            let lookup = |t: &[u8]| map.get(t).copied();
            let merged = [l.as_slice(), r.as_slice()].concat();
            let Some(mi) = lookup(&merged) else {
                return Err(format!("merge {rank}: the token it makes is not in the vocabulary"));
            };
            // A part that is not a token can never be formed, so the merge can never apply.
            if let (Some(li), Some(ri)) = (lookup(l), lookup(r)) {
                ranks.entry(pair_key(li, ri)).or_insert((rank as u32, mi));
            }
        }
        let levels = Levels::plan(merges, &ranks, request);
        Ok(Encoder {
            splitter,
            vocab: map,
            byte_ids,
            lacks_bytes,
            whole_pieces,
            ranks,
            cache: (0..CACHE_SHARDS).map(|_| Mutex::new(Cache::default())).collect(),
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
            levels,
        })
    }

    pub fn splitter(&self) -> &Splitter {
        &self.splitter
    }

    /// The levels chosen at construction.
    pub fn plan(&self) -> &Plan {
        &self.levels
    }

    /// Ids of text with no special tokens in it.
    pub fn encode_ordinary(&self, text: &[u8], out: &mut Vec<u32>) -> Result<(), String> {
        let start = out.len();
        self.splitter.split(text, &mut |piece| self.encode_piece(piece, out))?;
        if self.lacks_bytes && out[start..].contains(&MISSING) {
            let byte = text.iter().find(|&&b| self.byte_ids[b as usize] == MISSING).copied().unwrap_or(0);
            return Err(missing_byte_message(byte));
        }
        Ok(())
    }

    /// Encode many texts in parallel; returns ids and the end offset of each text's ids.
    pub fn encode_batch(&self, texts: &[&[u8]]) -> Result<(Vec<u32>, Vec<u64>), String> {
        let parts: Vec<Vec<u32>> = texts
            .par_iter()
            .map(|t| {
                let mut v = Vec::with_capacity(t.len() / 3 + 1);
                self.encode_ordinary(t, &mut v).map(|_| v)
            })
            .collect::<Result<_, _>>()?;
        let mut ends = Vec::with_capacity(parts.len());
        let mut ids = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in parts {
            ids.extend_from_slice(&p);
            ends.push(ids.len() as u64);
        }
        Ok((ids, ends))
    }

    #[inline]
    fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() == 1 {
            out.push(self.byte_ids[piece[0] as usize]);
            return;
        }
        if self.whole_pieces {
            if let Some(&id) = self.vocab.get(piece) {
                out.push(id);
                return;
            }
        }
        if piece.len() > CACHE_MAX_PIECE {
            self.merge_piece(piece, out);
            return;
        }
        let shard = (self.hasher.hash_one(piece) as usize) % CACHE_SHARDS;
        if let Ok(cache) = self.cache[shard].try_lock() {
            if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
        }
        let start = out.len();
        self.merge_piece(piece, out);
        if let Ok(mut cache) = self.cache[shard].try_lock() {
            if cache.len() < CACHE_MAX_PER_SHARD {
                cache.insert_new(piece, out[start..].into());
            }
        }
    }

    #[inline]
    fn rank(&self, l: u32, r: u32) -> Option<(u32, u32)> {
        self.ranks.get(&pair_key(l, r)).copied()
    }

    /// BPE of a piece from its bytes: on two levels, or by a linear scan (short pieces) or a heap.
    fn merge_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        match &self.levels {
            Plan::Two(levels) => levels.encode(piece, &self.byte_ids, out),
            Plan::One(_) if piece.len() <= LINEAR_MAX => self.merge_linear(piece, out),
            Plan::One(_) => self.merge_heap(piece, out),
        }
    }

    fn merge_linear(&self, piece: &[u8], out: &mut Vec<u32>) {
        let ids: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        out.extend_from_slice(&bpe::merge_linear(ids, |l, r| self.rank(l, r)));
    }

    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        let ids: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        out.extend_from_slice(&bpe::merge_heap(ids, |l, r| self.rank(l, r)));
    }
}

/// The error for a text that needs a byte the vocabulary lacks (the python engine says the same).
pub fn missing_byte_message(byte: u8) -> String {
    format!("text needs byte 0x{byte:02x}, which has no token in the vocabulary")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::{builtin_pattern, Builtin};

    fn encoder(merges: &[(&str, &str)]) -> Encoder {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        for (l, r) in merges {
            vocab.push(([l.as_bytes(), r.as_bytes()].concat(), vocab.len() as u32));
        }
        let m: Vec<(Vec<u8>, Vec<u8>)> =
            merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        Encoder::new(vocab, &m, Splitter::new(&builtin_pattern(Builtin::Superbpe), false).unwrap(), true).unwrap()
    }

    #[test]
    fn a_missing_byte_is_an_error_only_when_needed() {
        let vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).filter(|&b| b != 0xC0).map(|b| (vec![b], b as u32)).collect();
        let splitter = Splitter::new(&builtin_pattern(Builtin::Superbpe), false).unwrap();
        let e = Encoder::new(vocab, &[], splitter, false).unwrap();
        let mut out = Vec::new();
        e.encode_ordinary(b"fine text", &mut out).unwrap();
        assert_eq!(out.len(), 9);
        let err = e.encode_ordinary(b"bad \xC0 byte", &mut out).unwrap_err();
        assert!(err.contains("0xc0"), "{err}");
    }

    #[test]
    fn linear_and_heap_agree() {
        let e = encoder(&[("a", "a"), ("b", "c"), ("aa", "a"), ("a", "bc"), ("aa", "bc")]);
        for text in
            ["aaaaabcabcaaab", "abcaaaaaaaaaaaabcbcbcaabcaaaaaaaaaabcbcbcaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabcbcbcb"]
        {
            let mut lin = Vec::new();
            let mut heap = Vec::new();
            e.merge_linear(text.as_bytes(), &mut lin);
            e.merge_heap(text.as_bytes(), &mut heap);
            assert_eq!(lin, heap, "{text}");
        }
    }

    #[test]
    fn lowest_rank_first_leftmost_on_ties() {
        let e = encoder(&[("a", "a"), ("aa", "a")]);
        let mut out = Vec::new();
        e.merge_linear(b"aaaa", &mut out);
        assert_eq!(out, vec![256, 256]);
        out.clear();
        e.merge_linear(b"aaaaa", &mut out);
        assert_eq!(out, vec![256, 257]);
    }
}
