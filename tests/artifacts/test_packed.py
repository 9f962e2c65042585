"""The shipped weights as git carries them (trtspec/artifacts/packed.py): exact restores, rounding, refusals,
and the size of the tracked tree."""

from __future__ import annotations

import json
import lzma
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.support import ROOT
from trtspec.artifacts import fs, packed
from trtspec.errors import ModelError

DEVICE_TREE_BYTES = 56 * 2**20  # a lent GPU machine receives at most 64 MiB; 8 are kept for wheels


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1024])
def test_shuffle_round_trips_any_length(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    shuffled = packed.shuffle(data)
    assert shuffled[: (n + 1) // 2] == data[0::2] and packed.unshuffle(shuffled) == data


def test_round_mantissa_is_round_to_nearest_even():
    bits = np.array([0x3C00, 0x3C01, 0x3C0F, 0x3C10, 0x3C11, 0x3C30, 0x3FFF, 0xBC11], np.uint16)
    assert packed.round_mantissa(bits, 10).tolist() == bits.tolist()
    assert [hex(b) for b in packed.round_mantissa(bits, 5)] == [
        "0x3c00", "0x3c00", "0x3c00", "0x3c00",  # 0x10: a tie, rounded to the even 0x3c00
        "0x3c20", "0x3c40",                      # 0x30: a tie, rounded to the even 0x3c40
        "0x4000", "0xbc20"]                      # a carry into the exponent; the sign is kept
    with pytest.raises(ValueError):
        packed.round_mantissa(bits, 0)


def test_round_mantissa_error_is_half_a_kept_step():
    w = np.random.default_rng(0).standard_normal(10_000).astype(np.float16)  # [n]
    r = packed.round_mantissa(w.view(np.uint16), 5).view(np.float16).astype(np.float32)  # [n]
    normal = np.abs(w) >= 2.0**-14
    rel = np.abs(r - w.astype(np.float32))[normal] / np.abs(w.astype(np.float32))[normal]
    assert 0 < rel.max() <= 2.0**-6


def _family(tmp_path):
    models, store = tmp_path / "models", tmp_path / "packed"
    (models / "head").mkdir(parents=True)
    save_file({"w": np.arange(-50, 50, dtype=np.float16) / 7}, models / "head" / "w.safetensors")
    return models, store, "head/w.safetensors"


def test_unpack_restores_exact_bytes_once(tmp_path, monkeypatch):
    models, store, rel = _family(tmp_path)
    original = (models / rel).read_bytes()
    packed.pack([rel], models, store, log=lambda s: None)
    (models / rel).unlink()
    lines = []
    assert packed.unpack(models, store, log=lines.append) == [rel]
    assert (models / rel).read_bytes() == original and "restored 1" in lines[0]
    reads = []
    monkeypatch.setattr(fs, "sha256_file", lambda p: reads.append(p) or pytest.fail("read again"))
    assert packed.unpack(models, store, log=lines.append) == [] and len(lines) == 1
    assert reads == []  # a file unpack wrote and nobody touched since is not hashed again


def test_unpack_keeps_a_file_it_did_not_write_and_replaces_one_it_did(tmp_path):
    models, store, rel = _family(tmp_path)
    packed.pack([rel], models, store, log=lambda s: None)
    (models / rel).write_bytes(b"retrained")  # someone's own weights: kept
    lines = []
    assert packed.unpack(models, store, log=lines.append) == []
    assert (models / rel).read_bytes() == b"retrained" and "kept" in lines[0]
    (models / rel).unlink()
    packed.unpack(models, store, log=lambda s: None)
    old = (models / rel).read_bytes()
    save_file({"w": np.ones(4, np.float16)}, tmp_path / "new.safetensors")  # a pull brings a new pack
    new = (tmp_path / "new.safetensors").read_bytes()
    (store / (rel + ".xz")).write_bytes(lzma.compress(packed.shuffle(new)))
    index = json.loads((store / packed.INDEX).read_text())
    index["files"][rel] = {"sha256": fs.sha256_file(tmp_path / "new.safetensors"), "bytes": len(new)}
    (store / packed.INDEX).write_text(json.dumps(index))
    assert old != new and packed.unpack(models, store, log=lambda s: None) == [rel]
    assert (models / rel).read_bytes() == new


@pytest.mark.parametrize("damage", ["truncated", "other bytes", "no pack"])
def test_a_damaged_pack_is_refused_and_nothing_is_written(tmp_path, damage):
    models, store, rel = _family(tmp_path)
    packed.pack([rel], models, store, log=lambda s: None)
    (models / rel).unlink()
    pack_file = store / (rel + ".xz")
    if damage == "truncated":
        pack_file.write_bytes(pack_file.read_bytes()[:-20])
    elif damage == "other bytes":
        pack_file.write_bytes(lzma.compress(b"not the weights"))
    else:
        pack_file.unlink()
    with pytest.raises(ModelError, match="w.safetensors.xz"):
        packed.unpack(models, store, log=lambda s: None)
    assert sorted(p.name for p in (models / "head").iterdir()) == []


def test_pack_with_fewer_mantissa_bits_rounds_and_refreshes_the_manifest(tmp_path):
    models, store, rel = _family(tmp_path)
    record = {"kind": "train", "outputs": {"w.safetensors": {"sha256": "old", "bytes": 0}}, "a_first": 1}
    (models / "head" / "trtspec.train.json").write_text(json.dumps(record))
    packed.pack([rel], models, store, mantissa_bits=3, log=lambda s: None)
    w = load_file(models / rel)["w"]
    assert w.dtype == np.float16 and (w.view(np.uint16) & 0x7F == 0).all()
    written = json.loads((models / "head" / "trtspec.train.json").read_text())
    assert list(written)[:3] == ["kind", "outputs", "a_first"]  # its key order is kept
    assert written["outputs"]["w.safetensors"]["sha256"] == fs.sha256_file(models / rel)
    assert written["stored"] == {"w.safetensors": {"mantissa_bits": 3}}
    assert json.loads((store / packed.INDEX).read_text())["files"][rel]["mantissa_bits"] == 3


def test_pack_refuses_a_path_outside_the_models(tmp_path):
    models, store, _ = _family(tmp_path)
    with pytest.raises(ModelError):
        packed.pack(["../outside.safetensors"], models, store, log=lambda s: None)


def test_the_shipped_packs_restore_the_shipped_weights():
    index = json.loads((packed.PACKED / packed.INDEX).read_text())["files"]
    assert set(index) >= {"target/model.safetensors", "draft/model.safetensors"}
    for rel, want in index.items():
        assert (packed.PACKED / (rel + ".xz")).is_file()
        assert fs.sha256_file(packed.MODELS / rel) == want["sha256"], rel  # the conftest restored them


def test_the_tracked_tree_fits_a_device_machine():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    total = sum((ROOT / n).stat().st_size for n in names.decode().split("\0") if n and (ROOT / n).is_file())
    assert total <= DEVICE_TREE_BYTES, f"{total / 2**20:.1f} MiB tracked"


def test_a_checkout_without_its_restored_weights_is_told_how_to_restore_them(tmp_path):
    from trtspec.artifacts.weights import weight_files

    with pytest.raises(ModelError) as e:
        weight_files(tmp_path)
    assert "no model.safetensors" in e.value.message and "make install" in e.value.hint
