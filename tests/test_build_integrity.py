"""`trtspec build` trusts its outputs only as far as their hashes: a changed or deleted output is rebuilt
(saying why), leftovers of killed builds are cleaned, and outputs are readable by a serving container's user."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.runtime.family import build_family, write_spec
from trtspec.backends import build
from trtspec.builders import BuildOptions
from trtspec.builders.lock import LOCK_NAME, atomic_dir, write_json
from trtspec.check import load_spec
from trtspec.cli import main


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    return build_family(tmp_path_factory.mktemp("family"))


def _opts(tmp_path: Path) -> BuildOptions:
    return BuildOptions(out_engines=tmp_path / "engines", out_repo=tmp_path / "model_repository", progress=False)


def _tree(root: Path) -> dict[str, bytes]:
    """Every file's bytes; a lock's without its "created" time (a rebuild in a later second is the same build)."""
    tree = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == LOCK_NAME:
                lock = json.loads(data)
                lock.pop("created")
                data = json.dumps(lock, sort_keys=True).encode()
            tree[p.relative_to(root).as_posix()] = data
    return tree


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_flipped_weight_byte_and_a_deleted_model_py_are_rebuilt(family, tmp_path):
    spec = load_spec(write_spec(family, "draft-model"))
    opts = _opts(tmp_path)
    build(spec, opts)
    engine, repo = tmp_path / "engines" / spec.name, tmp_path / "model_repository" / spec.name
    good_engine, good_repo = _tree(engine), _tree(repo)

    weights = engine / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    again = build(spec, opts)
    assert sorted(again.rebuilt) == ["draft", "target"]
    assert "draft/model.safetensors changed" in again.reason
    assert _tree(engine) == good_engine

    (repo / "tensorrt_llm" / "1" / "model.py").unlink()
    again = build(spec, opts)
    assert again.rebuilt and "tensorrt_llm/1/model.py missing" in again.reason
    assert _tree(repo) == good_repo

    # what Triton's Python backend leaves beside the models it imported is not a change
    (repo / "tensorrt_llm" / "1" / "__pycache__").mkdir()
    (repo / "tensorrt_llm" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert build(spec, opts).rebuilt == []


def test_cli_says_why_it_rebuilds(family, tmp_path):
    spec_path = write_spec(family, "lookahead")
    args = ["build", "-c", str(spec_path), "--out-engines", str(tmp_path / "e"), "--out-repo", str(tmp_path / "r")]
    assert CliRunner().invoke(main, args).exit_code == 0
    (tmp_path / "r" / "t-lookahead" / "ensemble" / "config.pbtxt").write_text("edited\n")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "rebuilding: " in result.output and "ensemble/config.pbtxt changed" in result.output
    assert "nothing to rebuild" in CliRunner().invoke(main, args).output


def test_leftovers_of_dead_builds_are_removed_and_live_ones_kept(family, tmp_path):
    spec = load_spec(write_spec(family, "lookahead"))
    engines = tmp_path / "engines"
    engines.mkdir()
    dead, live = _dead_pid(), os.getpid()
    stale = [engines / f".{spec.name}.tmp-{dead}-abc123", engines / f".{spec.name}.old-{dead}"]
    kept = [engines / f".{spec.name}.tmp-{live}-def456", engines / f".{spec.name}x.tmp-{dead}-zzz",
            engines / f".other.tmp-{dead}-abc"]
    for d in stale + kept:
        (d / "target").mkdir(parents=True)
        (d / "target" / "model.safetensors").write_bytes(b"\0" * 1024)
    build(spec, _opts(tmp_path))
    assert not any(d.exists() for d in stale)
    assert all(d.exists() for d in kept)
    from trtspec.builders.lock import remove_stale

    assert remove_stale(engines, spec.name) == []  # the live build's dir stays while we run


def test_killed_build_leaves_a_dir_the_next_build_removes(tmp_path):
    code = ("import os, sys; sys.path.insert(0, sys.argv[2]); from trtspec.builders.lock import atomic_dir\n"
            "with atomic_dir(sys.argv[1]) as tmp:\n"
            "    (tmp / 'big').write_bytes(b'x' * 1000); os.kill(os.getpid(), 9)\n")
    final = tmp_path / "engines" / "m"
    proc = subprocess.run([sys.executable, "-c", code, str(final), str(Path(__file__).parents[1])])
    assert proc.returncode == -9
    assert len(list((tmp_path / "engines").glob(".m.tmp-*"))) == 1
    with atomic_dir(final) as tmp:
        (tmp / "ok").write_text("1")
    assert sorted(p.name for p in (tmp_path / "engines").iterdir()) == ["m"]


@pytest.mark.parametrize("umask,dirs,files", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_outputs_have_the_modes_a_plain_mkdir_gives(family, tmp_path, umask, dirs, files):
    spec = load_spec(write_spec(family, "lookahead"))
    old = os.umask(umask)
    try:
        build(spec, _opts(tmp_path))
        write_json(tmp_path / "x.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == files
    for root in (tmp_path / "engines" / spec.name, tmp_path / "model_repository" / spec.name):
        assert stat.S_IMODE(root.stat().st_mode) == dirs, root
        for p in root.rglob("*"):
            assert stat.S_IMODE(p.stat().st_mode) == (dirs if p.is_dir() else files), p
    assert stat.S_IMODE((tmp_path / "engines" / spec.name / LOCK_NAME).stat().st_mode) == files


def test_a_cpu_build_compiles_the_fused_kernel_so_the_server_does_not(family, tmp_path, monkeypatch):
    from trtspec.runtime import fused

    calls = []
    monkeypatch.setattr(fused, "available", lambda: calls.append(1) or True)
    build(load_spec(write_spec(family, "none")), _opts(tmp_path))
    assert calls == [1]
