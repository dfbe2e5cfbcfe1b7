"""The stage-2 memory estimate against what the build really adds, for compat=official's rules.

python benchmarks/official_memory.py CORPUS TRANSITION

Counts CORPUS as compat=official does (line units), trains its stage 1 to TRANSITION merges (HF rules),
counts it with the stage-2 pattern, then builds the native stage-2 trainer on those merges (stopping at
its first merge) and prints: the estimate the run logs before the build, the estimate the per-piece
formula of our own build gives on the same counts (what the official build was estimated with before),
and how much the process's peak RSS grew over its RSS when the estimate was made. Run it alone in its
process: the peak is the process's.
"""

from __future__ import annotations

import argparse
import json
import resource

from superbpe.core.compat import OFFICIAL, training_rules
from superbpe.core.memory import StageMemory
from superbpe.core.pretokenize import get_pretokenizer
from superbpe.core.progress import current_rss_bytes
from superbpe.core.rules import MergeRules
from superbpe.engines.native import NativeEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("transition", type=int)
    args = parser.parse_args()
    native = NativeEngine()
    stage1 = get_pretokenizer("superbpe-stage1", line_units=True)
    stage2 = get_pretokenizer("superbpe", line_units=True)
    prior = native.train(native.count([args.corpus], stage1, []), args.transition,
                         rules=training_rules(MergeRules(), OFFICIAL)).merges  # fmt: skip
    counts = native.count([args.corpus], stage2, [])
    rules = training_rules(MergeRules(max_words_per_token=4, forbidden_substrings=(b": ",)), OFFICIAL)
    per_piece = native.train_memory(counts, prior)
    seen: dict[str, object] = {}

    def check(need: StageMemory) -> None:
        seen["need"], seen["rss"] = need, current_rss_bytes()

    native.train(counts, len(prior) + 1, rules=rules, replay=prior, check_memory=check,
                 callback=lambda merges: True, callback_every=1)  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    need = seen["need"]
    assert isinstance(need, StageMemory) and isinstance(seen["rss"], int)
    print(json.dumps({
        "pieces": need.pieces,
        "piece_mb": round(need.piece_bytes / 1e6, 1),
        "estimate_mb": round(need.build_bytes / 1e6, 1),
        "per_piece_formula_mb": round(per_piece.build_bytes / 1e6, 1),
        "measured_growth_mb": round((peak - seen["rss"]) / 1e6, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
