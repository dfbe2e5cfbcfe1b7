"""Checkpoint serialisation: every field survives a save/load round trip."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from superbpe.checkpoints import Checkpoint, load_checkpoint, save_checkpoint


def test_checkpoint_round_trip_keeps_every_field(tmp_path: Path) -> None:
    checkpoint = Checkpoint(
        config={"vocab_size": 300, "stages": [{"name": "bpe"}]},
        fingerprint="abc",
        merges=[(b"a", b"b"), (b"\xff", b" \x00")],
        stage_ends=[2],
        stage_stats=[{"seconds": 1.5}],
        done=True,
    )
    assert set(checkpoint.to_json()) == {f.name for f in fields(Checkpoint)} | {"format"}
    save_checkpoint(tmp_path, checkpoint)
    assert load_checkpoint(tmp_path) == checkpoint
