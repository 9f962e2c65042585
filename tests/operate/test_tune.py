"""trtspec tune: the best K per load band from a grid, written into the spec with its comments kept,
validated first and atomically; the written schedule is what the runtime then reads."""

from __future__ import annotations

import os
import stat

import pytest

from trtspec.bench.load import Grid, Point
from trtspec.bench.tune import best_schedule, write_schedule
from trtspec.check import load_spec
from trtspec.errors import SpecError

SPEC = """# my deployment: keep this comment
schema = 1

[model]
name = "mine"   # the name
target = "target"

[speculative]
method = "draft-model"
draft = "draft"
num_draft_tokens = 4   # K max

[limits]
max_batch_size = 4
"""


def _grid(rates: dict[tuple[int, int | None], float]) -> Grid:
    points = [Point(c, k, requests=4, tokens=int(rate * 10), wall=10.0) for (c, k), rate in rates.items()]
    return Grid("mine", "draft-model", "test", 16, 4, points)


def test_best_schedule_takes_the_fastest_k_per_band_and_keeps_batch_one_at_k_max(tmp_path):
    (tmp_path / "s.toml").write_text(SPEC)
    spec = load_spec(tmp_path / "s.toml")
    grid = _grid({(1, 0): 100, (1, 2): 180, (1, 4): 170,
                  (2, 0): 150, (2, 2): 200, (2, 4): 190,
                  (4, 0): 300, (4, 2): 280, (4, 4): 260,
                  (16, 0): 310, (16, 2): 330, (16, 4): 250})
    # c=2 -> band 2: K=2; c=4 and c=16 share band 4 (more clients than rows queue): geometric mean of the
    # speedups: K=2 -> sqrt(280/300 * 330/310) = 0.997, K=0 -> 1.0, K=4 -> 0.86, so K=0
    assert best_schedule(grid, spec) == {1: 4, 2: 2, 4: 0}
    # bands equal to the band below are left out
    same = _grid({(1, 0): 100, (1, 4): 200, (2, 0): 100, (2, 4): 200})
    assert best_schedule(same, spec) == {1: 4}


def test_write_schedule_keeps_comments_and_layout(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SPEC)
    path.chmod(0o640)
    spec = write_schedule(path, {1: 4, 2: 2, 4: 1})
    text = path.read_text()
    assert spec.speculative.schedule == {1: 4, 2: 2, 4: 1} == load_spec(path).speculative.schedule
    assert "# my deployment: keep this comment" in text and "# K max" in text and "# the name" in text
    assert text.replace("schedule = {1 = 4, 2 = 2, 4 = 1}\n", "") == SPEC
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name != "s.toml"]  # no temp file left


def test_an_invalid_schedule_leaves_the_spec_untouched(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SPEC)
    with pytest.raises(SpecError, match=r"speculative.schedule.8 = 1: batch size 8 is outside"):
        write_schedule(path, {1: 4, 8: 1})
    assert path.read_text() == SPEC and len(list(tmp_path.iterdir())) == 1


def test_tune_refuses_a_routed_spec_before_sweeping(tmp_path, monkeypatch):
    """A routed spec has a K per drafter, so no schedule: tune says so at once, without running the sweep."""
    from click.testing import CliRunner

    from trtspec.bench import load
    from trtspec.cli import main

    monkeypatch.setattr(load, "measure", lambda *a, **k: pytest.fail("swept a spec it cannot tune"))
    path = tmp_path / "routed.toml"
    path.write_text('schema = 1\n[model]\ntarget = "t"\n[speculative]\nmethod = "routed"\n'
                    '[[speculative.drafters]]\nname = "a"\nmethod = "draft-model"\ndraft = "d"\n'
                    '[[speculative.drafters]]\nname = "b"\nmethod = "ngram"\n[speculative.router]\ndefault = "a"\n')
    result = CliRunner().invoke(main, ["tune", "-c", str(path), "--local"])
    assert result.exit_code == 2 and "a schedule sets one K by load; a routed spec has a K per drafter" in result.output
