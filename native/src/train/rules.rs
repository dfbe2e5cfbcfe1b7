//! Which merged tokens a trainer may create (`MergeRules` in docs/DESIGN.md), and the tie-break
//! keys of the official recipe's ids.

use crate::byte_table;

/// Which merged tokens may be created, and how the official recipe's choices are made (see
/// `MergeRules` in docs/DESIGN.md and `superbpe.compat`).
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub min_frequency: u64,
    pub max_token_bytes: Option<usize>,
    pub max_words_per_token: Option<usize>,
    pub forbidden_substrings: Vec<Vec<u8>>,
    /// Count ties go to the lowest (left, right) in HF's id order instead of the greatest bytes.
    pub tie_break_ids: bool,
    /// A chosen pair whose token exists is merged and recorded (no new id) instead of skipped.
    pub merge_duplicates: bool,
    /// A replayed merge whose pair never occurs (or whose part was dropped) is left out.
    pub drop_absent: bool,
}

impl Rules {
    /// Whether training must follow HF's bookkeeping (then every pair stays warm, see `with_rules`).
    pub(crate) fn official(&self) -> bool {
        self.tie_break_ids || self.merge_duplicates || self.drop_absent
    }
}

/// The tie-break key of a token for `Rules::tie_break_ids`: HF numbers the bytes by their GPT-2
/// byte-to-unicode character, then each new token in order; the key is big-endian and reversed so
/// the heap's "greatest key wins" picks the lowest ids.
pub(super) fn hf_tie_key(id: usize) -> Vec<u8> {
    let rank = if id < 256 { byte_table::char_of(id as u8) } else { 0x144 + (id as u32 - 256) };
    (u32::MAX - rank).to_be_bytes().to_vec()
}

impl Rules {
    pub fn allows(&self, token: &[u8]) -> bool {
        if self.max_token_bytes.is_some_and(|m| token.len() > m) {
            return false;
        }
        if let Some(m) = self.max_words_per_token {
            let words = token.split(|&b| b == b' ').filter(|w| !w.is_empty()).count();
            if words > m {
                return false;
            }
        }
        !self.forbidden_substrings.iter().any(|f| memchr::memmem::find(token, f).is_some())
    }
}
