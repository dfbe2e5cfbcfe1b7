"""SuperBPE stage 2 at scale: the compact native layout against the python engine, and the memory budget.

The native trainer keeps whole-line pieces as flat symbol arrays with dead-run tags and indexes only
warm pairs; lines that repeat and lines that are long and distinct stress different parts of that
(long dead runs, pieces spanning many pages, many rare pairs). The memory budget must refuse a stage
that would not fit in one line, before building, with the earlier stages' checkpoint left to resume.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fixture_texts import code_line, long_lines_corpus

from superbpe.core.errors import ConfigError, SuperBPEError
from superbpe.core.memory import (
    CHECK_EVERY_BYTES,
    CountCeiling,
    MemoryLimitError,
    count_over_memory,
    parse_size,
)
from superbpe.core.pretokenize import get_pretokenizer
from superbpe.core.rules import MergeRules
from superbpe.engines import native as native_engine
from superbpe.engines.python import PythonEngine
from superbpe.formats.checkpoints import load_checkpoint
from superbpe.jobs.count import count_corpus, count_on_executor
from superbpe.training.config import DataConfig, EngineConfig, PretokenizerConfig, TrainConfig, to_dataclass
from superbpe.training.run import run_training

pytestmark = pytest.mark.skipif(
    not native_engine.available(), reason="superbpe._native is not built (run `pip install -e .`)"
)

EOT = "<|endoftext|>"
@pytest.mark.parametrize("stage2_pattern", ["superbpe", "superbpe-paper"])
def test_stage2_on_long_repeated_and_distinct_lines_matches_python(
    tmp_path: Path, stage2_pattern: str
) -> None:
    path = long_lines_corpus(tmp_path / "lines.txt")
    native, python = native_engine.NativeEngine(), PythonEngine()
    stage1_pre = get_pretokenizer("superbpe-stage1")
    stage1 = python.train(python.count(path, stage1_pre, [EOT]), 250).merges
    assert native.train(native.count(path, stage1_pre, [EOT]), 250).merges == stage1
    rules = MergeRules(max_words_per_token=4, forbidden_substrings=(b": ",))
    pre = get_pretokenizer(stage2_pattern)
    for transition in (0, 120, 250):
        expected = python.train(python.count(path, pre, [EOT]), 700, rules=rules, replay=stage1[:transition])
        got = native.train(native.count(path, pre, [EOT]), 700, rules=rules, replay=stage1[:transition])
        assert got.merges == expected.merges, f"transition {transition}"
        assert len(got.merges) == 700


def test_build_progress_reports_replay_cut_and_index(tmp_path: Path) -> None:
    path = long_lines_corpus(tmp_path / "lines.txt")
    native = native_engine.NativeEngine()
    stage1 = native.train(native.count(path, get_pretokenizer("superbpe-stage1"), [EOT]), 100).merges
    seen: list[tuple[str, int, int]] = []
    counts = native.count(path, get_pretokenizer("superbpe"), [EOT])
    native.train(counts, 200, replay=stage1, build_progress=lambda *report: seen.append(report))
    phases = [phase for phase, _, _ in seen]
    assert phases[0] == "replay" and phases[-1] == "index"
    # Many rare pairs and few merges to choose: the replayed pieces are cut before they are indexed.
    assert phases.index("cut") > phases.index("replay") and phases.index("cut") < phases.index("index")
    cut = [(done, total) for phase, done, total in seen if phase == "cut"]
    assert cut[0][0] == 0 and cut[-1][0] == cut[-1][1] > 0
    assert seen[-1][1] == seen[-1][2] > 0
    replay_done = [done for phase, done, total in seen if phase == "replay"]
    assert replay_done == sorted(replay_done) and replay_done[-1] == len(counts)


def test_memory_estimate_counts_the_pieces_and_grows_with_them(tmp_path: Path) -> None:
    native = native_engine.NativeEngine()
    small = long_lines_corpus(tmp_path / "small.txt")
    big = tmp_path / "big.txt"
    big.write_text(small.read_text() + "".join(code_line(random.Random(i), 300) for i in range(200)))
    pre = get_pretokenizer("superbpe")
    estimates = []
    for path in (small, big):
        counts = native.count(path, pre, [EOT])
        need = native.train_memory(counts, [(b"t", b"h"), (b"th", b"e")])
        kept = [piece for piece, count in counts.items() if len(piece) >= 2 and count > 0]
        assert need.pieces == len(kept)
        assert need.piece_bytes == sum(map(len, kept))
        assert 0 < need.symbols <= need.piece_bytes
        estimates.append(need.build_bytes)
    assert estimates[1] > estimates[0]


def _superbpe_config(corpus: Path, out: Path, memory_limit: str | None) -> TrainConfig:
    from omegaconf import OmegaConf

    cfg = TrainConfig(
        data=DataConfig(paths=[str(corpus)]),
        pretokenizer=PretokenizerConfig("superbpe-stage1"),
        engine=EngineConfig("native"),
        vocab_size=900,
        output_dir=str(out),
        cache_dir=None,
        memory_limit=memory_limit,
    )
    schedule = {
        "name": "superbpe",
        "stages": [
            {"name": "stage1", "until": 400},
            {"name": "stage2", "pretokenizer": {"name": "superbpe"}, "max_words_per_token": 4},
        ],
    }
    return to_dataclass(OmegaConf.merge(OmegaConf.structured(cfg), {"schedule": schedule}), TrainConfig)


def test_a_stage_over_memory_limit_is_refused_in_one_line_leaving_nothing(tmp_path: Path) -> None:
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    reference = run_training(_superbpe_config(corpus, tmp_path / "reference", None))
    out = tmp_path / "run"
    # 1 MB is less than the process holds already: the first count stops after its first window.
    with pytest.raises(MemoryLimitError) as refused:
        run_training(_superbpe_config(corpus, out, "1MB"))
    message = str(refused.value)
    assert message.startswith("stage stage1: counting took the process to ")
    assert "\n" not in message and "memory_limit 1 MB" in message and "smaller corpus" in message
    assert "its approx_sample: an approximation" in message and "stage2_approx_sample" not in message
    assert not out.exists()  # refused before the first checkpoint: nothing to resume, nothing left
    again = run_training(_superbpe_config(corpus, out, None))
    assert again.merges == reference.merges


def test_stage1_checkpoint_survives_a_refused_stage2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    reference = run_training(_superbpe_config(corpus, tmp_path / "reference", None))
    out = tmp_path / "run"
    import superbpe.training.run as run_module

    real_check = run_module.check_fits

    def refuse_stage2(stage: str, need, memory_limit) -> None:  # type: ignore[no-untyped-def]
        real_check(stage, need, "1MB" if stage == "stage2" else memory_limit)

    monkeypatch.setattr(run_module, "check_fits", refuse_stage2)
    with pytest.raises(MemoryLimitError, match="stage stage2 needs about.*e.g. schedule.stage2_approx"):
        run_training(_superbpe_config(corpus, out, None))
    saved = load_checkpoint(out)
    assert saved is not None and saved.stage == 1
    assert saved.merges == reference.merges[: reference.stage_ends[0]]
    assert not (out / "vocab.json").exists()
    monkeypatch.setattr(run_module, "check_fits", real_check)
    resumed = run_training(to_dataclass(_resume(corpus, out, None), TrainConfig))
    assert resumed.merges == reference.merges


def test_a_stage2_count_over_its_ceiling_is_refused_and_stage1_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage-2 count runs on a helper thread while stage 1 trains; past its ceiling it stops, and
    the run says so once stage 1 is saved."""
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    reference = run_training(_superbpe_config(corpus, tmp_path / "reference", None))
    out = tmp_path / "run"
    import superbpe.training.run as run_module

    ceilings = iter([CountCeiling(), CountCeiling(limit=10**6)])  # stage 1's count, then stage 2's
    monkeypatch.setattr(run_module.CountCeiling, "for_run", lambda memory_limit: next(ceilings))
    refused = r"^stage stage2: counting took the process to .* more than memory_limit 1 MB: start a run that"
    with pytest.raises(MemoryLimitError, match=refused + r" counts this stage on a share of the corpus"):
        run_training(_superbpe_config(corpus, out, None))
    saved = load_checkpoint(out)
    assert saved is not None and saved.stage == 1
    assert saved.merges == reference.merges[: reference.stage_ends[0]]
    monkeypatch.undo()
    assert run_training(to_dataclass(_resume(corpus, out, None), TrainConfig)).merges == reference.merges


@pytest.mark.parametrize("engine", ["native", "python"])
def test_counts_stop_past_their_ceiling_and_count_alike_under_it(tmp_path: Path, engine: str) -> None:
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    counter = native_engine.NativeEngine() if engine == "native" else PythonEngine()
    pre = get_pretokenizer("superbpe")
    plain = dict(counter.count(corpus, pre, [EOT]).items())
    over = r"^counting took the process to .*, more than memory_limit 1 MB$"
    with pytest.raises(MemoryLimitError, match=over):
        counter.count(corpus, pre, [EOT], ceiling=CountCeiling(limit=10**6))
    with pytest.raises(MemoryLimitError, match=r"RAM available, less than the .* a count keeps free$"):
        counter.count(corpus, pre, [EOT], ceiling=CountCeiling(reserve=2**62))
    with pytest.raises(MemoryLimitError, match="memory_limit 1 MB"):
        documents = iter([{"text": line} for line in corpus.read_text().splitlines()])
        counter.count_documents(documents, [pre], [EOT], ceiling=CountCeiling(limit=10**6))
    roomy = CountCeiling(limit=2**62, reserve=1)
    assert dict(counter.count(corpus, pre, [EOT], ceiling=roomy).items()) == plain


def test_sampled_and_sharded_counts_check_the_ceiling_as_shards_add_up(tmp_path: Path) -> None:
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    pre = get_pretokenizer("superbpe")
    engine = native_engine.NativeEngine()
    over = CountCeiling(limit=10**6)
    with pytest.raises(MemoryLimitError, match="memory_limit 1 MB"):
        count_corpus(engine, "local", corpus, pre, [EOT], sample=0.5, ceiling=over)
    # What count_corpus hands a shard count on an executor: its progress, watching the ceiling.
    with pytest.raises(MemoryLimitError, match="memory_limit 1 MB"):
        count_on_executor(corpus, pre, [EOT], engine="native", progress=CountCeiling.watching(over, None))
    whole = count_corpus(engine, "local", corpus, pre, [EOT], ceiling=CountCeiling(limit=2**62))
    assert dict(whole.items()) == dict(engine.count(corpus, pre, [EOT]).items())


def test_a_watched_progress_checks_at_its_first_report_then_once_per_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[int] = []
    reported: list[int] = []
    monkeypatch.setattr(CountCeiling, "check", lambda self: checks.append(len(reported)))
    watched = CountCeiling.watching(CountCeiling(limit=10**6), reported.append)
    assert watched is not None
    for _ in range(600):
        watched(1 << 20)
    assert reported == [1 << 20] * 600
    step = CHECK_EVERY_BYTES >> 20
    assert checks == [0, step, 2 * step]
    assert CountCeiling.watching(None, reported.append) == reported.append


def test_a_run_ceiling_is_its_memory_limit_or_a_reserve_of_the_machine() -> None:
    assert CountCeiling.for_run("8GB") == CountCeiling(limit=8 * 10**9)
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) * 1024
    assert CountCeiling.for_run(None) == CountCeiling(reserve=int(total / 16))


def test_a_stage_estimates_its_peak_as_its_build_or_its_peak_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    first = run_training(_superbpe_config(corpus, tmp_path / "first", None)).metrics["stages"][-1]
    build_peak = first["estimated_build_peak_bytes"]
    assert first["estimated_peak_bytes"] >= build_peak > first["estimated_build_bytes"]
    import superbpe.training.run as run_module

    # A stage whose count peaked above what its build will reach: the estimate is that peak.
    monkeypatch.setattr(run_module, "peak_rss_bytes", lambda: 2**40)
    stage2 = run_training(_superbpe_config(corpus, tmp_path / "second", None)).metrics["stages"][-1]
    assert stage2["estimated_peak_bytes"] == 2**40 > stage2["estimated_build_peak_bytes"]


def _resume(corpus: Path, out: Path, memory_limit: str | None) -> TrainConfig:
    cfg = _superbpe_config(corpus, out, memory_limit)
    cfg.output_dir = None
    cfg.resume = str(out)
    return cfg


@pytest.mark.parametrize(
    ("text", "size"),
    [("8GB", 8 * 10**9), ("1.5GiB", int(1.5 * 2**30)), ("512 MB", 512 * 10**6), ("800000", 800000)],
)
def test_memory_limit_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1GB", "0", "8 parsecs", ""])
def test_bad_memory_limit_is_a_config_error(text: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="memory_limit"):
        parse_size(text)
    corpus = long_lines_corpus(tmp_path / "lines.txt")
    with pytest.raises(SuperBPEError, match="memory_limit"):
        run_training(_superbpe_config(corpus, tmp_path / "out", text))
    assert not (tmp_path / "out" / "checkpoint.json").exists()


def test_merge_eta_is_measured_from_the_end_of_the_build(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """A long build before the first merge must not make the merge rate tiny and the ETA huge."""
    import logging

    from superbpe.core import progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger="superbpe")
    with progress.task("merging (stage2)", 2000, "merges", enabled=False, initial=1000) as update:
        now[0] += 600.0  # the build: ten minutes, no merges
        update.restart_clock()
        now[0] += 10.0
        update(500)  # 50 merges/s since the build ended
    lines = [r.getMessage() for r in caplog.records if "merging (stage2)" in r.getMessage()]
    assert "ETA 10.0s, 50 merges/s" in lines[0]


def test_the_python_engines_merge_rate_leaves_out_its_replay(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """The python engine reports no build, so its replay of stage 1's merges counted as merging: a stage
    2 that replayed for 42 s logged "2 merges/s" and ended at a fifth of the rate it chose merges at."""
    import logging
    from types import SimpleNamespace

    from superbpe.core import progress
    from superbpe.core.rules import TrainResult
    from superbpe.training import run

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger="superbpe")
    replay = [(bytes([i]), b"x") for i in range(100)]
    chosen = [(bytes([i]), b"y") for i in range(200)]

    def train(counts, end, *, callback, callback_every, **_):  # what PythonEngine.train does, timed
        now[0] += 600.0  # the replay: ten minutes, no merges chosen
        for step in range(callback_every, len(chosen) + 1, callback_every):
            now[0] += 0.1 * callback_every  # 10 merges/s
            callback([*replay, *chosen[:step]])
        return TrainResult([*replay, *chosen], False)

    job = SimpleNamespace(cfg=SimpleNamespace(checkpoint=SimpleNamespace(every_merges=1), progress=False),
                          engine=SimpleNamespace(train=train))  # fmt: skip
    plan = SimpleNamespace(name="stage2", end=300, rules=MergeRules())
    checkpointer = SimpleNamespace(progress=lambda merges: None)
    merges = run._choose(job, plan, None, replay, checkpointer, None)  # type: ignore[arg-type]
    assert merges == [*replay, *chosen]
    lines = [r.getMessage() for r in caplog.records if "merging (stage2)" in r.getMessage()]
    assert len(lines) > 2 and all(", 10 merges/s" in line for line in lines), lines


def test_merge_eta_waits_for_a_share_of_the_stage_and_follows_the_latest_rate(
    monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """Merges speed up as a stage goes: the slow first ones must not set the ETA for the rest."""
    import logging

    from superbpe.core import progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger="superbpe")
    stage = progress.task("merging (stage2)", 11000, "merges", enabled=False, initial=1000, eta_after=0.1)
    with stage as update:
        for seconds, merges in ((5.0, 500), (5.0, 2000), (5.0, 4000)):
            now[0] += seconds
            update(merges)
    lines = [r.getMessage() for r in caplog.records if "merging (stage2)" in r.getMessage()]
    assert "ETA" not in lines[0] and "100 merges/s" in lines[0]  # 5% of the stage: no ETA yet
    assert "ETA 18.8s, 400 merges/s" in lines[1]  # 7500 left at the rate of the last 5 s
    assert "ETA 4.4s, 800 merges/s" in lines[2]
    assert "in 15.0s" in lines[3] and "ETA" not in lines[3]


def test_build_reporter_logs_phases_with_rss(caplog) -> None:
    import logging

    from superbpe.core.progress import build_reporter

    caplog.set_level(logging.INFO, logger="superbpe")
    done = []
    report = build_reporter("building (stage2)", lambda: done.append(True))
    report("replay", 0, 10)
    report("replay", 10, 10)
    assert not done
    report("index", 40, 40)
    assert done == [True]
    lines = [r.getMessage() for r in caplog.records]
    assert any("replay 10/10 pieces (100%), RSS" in line for line in lines)
    assert any("index 40/40 slots (100%), RSS" in line for line in lines)


def test_counts_handed_to_the_trainer_give_the_same_merges_and_are_spent(tmp_path: Path) -> None:
    path = long_lines_corpus(tmp_path / "lines.txt")
    native = native_engine.NativeEngine()
    stage1 = native.train(native.count(path, get_pretokenizer("superbpe-stage1"), [EOT]), 150).merges
    pre = get_pretokenizer("superbpe")
    kept = native.train(native.count(path, pre, [EOT]), 400, replay=stage1)
    counts = native.count(path, pre, [EOT])
    handed = native.train(counts, 400, replay=stage1, consume_counts=True)
    assert handed.merges == kept.merges
    with pytest.raises(SuperBPEError, match="handed to a trainer"):
        len(counts)


def test_a_limit_under_a_megabyte_is_not_shown_as_0_mb() -> None:
    """``memory_limit=1KB`` was refused as "more than memory_limit 0 MB"."""
    for limit, shown in ((1000, "1.0 KB"), (512, "512 B"), (10**6, "1 MB"), (8 * 10**9, "8,000 MB")):
        message = str(count_over_memory(300 * 10**6, limit, None, None))
        assert message == f"counting took the process to 300 MB, more than memory_limit {shown}"
    assert "left 0 B of RAM available" in str(count_over_memory(10**9, None, 0, 10**9))
