"""The shipped weights as git carries them: byte-shuffled and xz-compressed, restored by `make install`.

A packed file is the xz stream of the original's even bytes followed by its odd bytes: the shuffle filter of
HDF5 and Blosc for 2-byte elements. It puts the fp16 sign-and-exponent bytes, which compress well, apart from
the mantissa bytes, which hardly compress: 0.85 of the size where plain xz gives 0.90. Restoring is exact; the
index records every restored file's sha256 and size, and a file is renamed into place only once it matches.

    examples/packed/INDEX.json               {"files": {"<path under examples/models>": {"sha256", "bytes",
                                                         "mantissa_bits"?}}}
    examples/packed/<path>.xz                 the packed file

Drafting heads can be stored with fewer fp16 mantissa bits (`pack --mantissa-bits N`, rounded to nearest even;
the file stays an fp16 safetensors file): a head only proposes tokens, which the target verifies, so its
precision moves acceptance, never the output. The manifests that list a rounded file get its new digest.

`unpack` never overwrites work: a restored file that differs from its pack is replaced only when it is the one
`unpack` itself wrote before (recorded in `examples/packed/.restored.json`, not tracked, with its size and mtime,
so a file unchanged since is not read again: `fs.file_digests`), as after a pull that brings a new pack; any
other is kept, with a warning.

    python -m trtspec.artifacts.packed unpack
    python -m trtspec.artifacts.packed pack [--mantissa-bits N] <path under examples/models>...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trtspec.artifacts import fs, manifest
from trtspec.errors import ModelError
from trtspec.names import inside

ROOT = Path(__file__).resolve().parents[2]
MODELS, PACKED = ROOT / "examples" / "models", ROOT / "examples" / "packed"
INDEX, STATE = "INDEX.json", ".restored.json"
_XZ = {"format": lzma.FORMAT_XZ, "preset": 9 | lzma.PRESET_EXTREME}


def shuffle(data: bytes) -> bytes:
    """Even bytes, then odd bytes."""
    a = np.frombuffer(data, np.uint8)  # [n]
    return a[0::2].tobytes() + a[1::2].tobytes()


def unshuffle(data: bytes) -> bytes:
    a = np.frombuffer(data, np.uint8)  # [n]
    out = np.empty_like(a)  # [n]
    even = (len(a) + 1) // 2
    out[0::2], out[1::2] = a[:even], a[even:]
    return out.tobytes()


def round_mantissa(bits: np.ndarray, keep: int) -> np.ndarray:
    """fp16 bit patterns rounded to `keep` of their 10 mantissa bits, to nearest, ties to even."""
    if not 0 < keep <= 10:
        raise ValueError(f"mantissa bits must be 1..10, not {keep}")
    drop = 10 - keep
    if drop == 0:
        return bits
    u = bits.astype(np.uint32)  # [n]
    odd = (u >> drop) & 1  # [n]
    u = ((u + (1 << (drop - 1)) - 1 + odd) >> drop) << drop  # [n]
    return u.astype(np.uint16)


def _rounded_safetensors(path: Path, keep: int) -> None:
    """Rewrite an fp16 safetensors file with `keep` mantissa bits (other dtypes as they are), atomically."""
    from safetensors.numpy import load_file, save

    tensors = {k: round_mantissa(v.view(np.uint16), keep).view(np.float16) if v.dtype == np.float16 else v
               for k, v in load_file(path).items()}
    fs.write_bytes(path, save(tensors, metadata={"format": "pt"}))


def _at(root: Path, rel: str) -> Path:
    """`root / rel`, refused unless it lies inside root."""
    return inside(root, Path(root) / rel, ModelError)


def _index(packed: Path) -> dict[str, dict]:
    data = fs.read_json(packed / INDEX)
    if data is None or not isinstance(data.get("files"), dict):
        raise ModelError(f"{packed / INDEX}: missing or unreadable", hint="restore it with `git checkout`")
    return data["files"]


def unpack(models: Path = MODELS, packed: Path = PACKED, log: Callable[[str], None] = print) -> list[str]:
    """Restore every packed file that is missing under `models`, or that unpack wrote before and its pack has
    changed since; returns the paths it wrote."""
    models, files, state = Path(models).resolve(), _index(packed), fs.read_json(packed / STATE) or {}
    wrote, t0 = [], time.perf_counter()
    for rel, want in sorted(files.items()):
        dst = _at(models, rel)
        if dst.is_file():
            have = fs.file_digests([dst], models, state)[rel]["sha256"]  # not read again when unpack wrote it
            if have == want["sha256"]:
                continue
            if have != (state.get(rel) or {}).get("sha256"):
                log(f"warning: {dst} differs from its pack and was not written by unpack: kept "
                    f"(delete it to restore the shipped file, or pack it to ship yours)")
                continue
        src = _at(packed, rel + ".xz")
        try:
            data = unshuffle(lzma.decompress(src.read_bytes()))
        except (OSError, lzma.LZMAError) as e:
            raise ModelError(f"{src}: cannot be read ({e})", hint="restore it with `git checkout`") from None
        if len(data) != want["bytes"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
            raise ModelError(f"{src}: restores to other bytes than {INDEX} records",
                             hint="restore the pack and the index with `git checkout`")
        fs.write_bytes(dst, data)
        state.update(fs.file_digests([dst], models))  # with its size and mtime: not read again while unchanged
        wrote.append(rel)
    if wrote:
        fs.write_json(packed / STATE, state)
        log(f"restored {len(wrote)} packed file(s) into {models} in {time.perf_counter() - t0:.1f}s")
    return wrote


def pack(rels: list[str], models: Path = MODELS, packed: Path = PACKED, mantissa_bits: int | None = None,
         log: Callable[[str], None] = print) -> None:
    """Pack `rels` (paths under `models`) into `packed`, first rounding them to `mantissa_bits` when given
    (and updating the digests of the manifests that list them)."""
    files = fs.read_json(packed / INDEX) or {"files": {}}
    for rel in rels:
        src = _at(models, rel)
        if not src.is_file():
            raise ModelError(f"{src}: no such file")
        if mantissa_bits is not None:
            _rounded_safetensors(src, mantissa_bits)
            _refresh_manifests(models, rel, mantissa_bits)
        data = src.read_bytes()
        t0 = time.perf_counter()
        packed_data = lzma.compress(shuffle(data), **_XZ)
        fs.write_bytes(_at(packed, rel + ".xz"), packed_data)
        entry = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        old = files["files"].get(rel, {})
        bits = mantissa_bits if mantissa_bits is not None else old.get("mantissa_bits")
        files["files"][rel] = entry if bits is None else {**entry, "mantissa_bits": bits}
        log(f"packed {rel}: {len(data):,} -> {len(packed_data):,} bytes in {time.perf_counter() - t0:.0f}s")
    fs.write_json(packed / INDEX, files)
    state = fs.read_json(packed / STATE) or {}  # the packed files are what unpack would write: its own
    state.update(fs.file_digests([_at(models, rel) for rel in rels], models))
    fs.write_json(packed / STATE, state)


def _refresh_manifests(models: Path, rel: str, mantissa_bits: int) -> None:
    """Give every manifest above `rel` (up to `models`) that lists it the file's current digest and size, and
    say under "stored" that it was rounded (what the manifest measured, it measured before)."""
    models, path = Path(models).resolve(), _at(models, rel)
    for d in [p for p in path.parents if p == models or models in p.parents]:
        for name in manifest.FILE_NAMES.values():
            data = fs.read_json(d / name)
            key = path.relative_to(d).as_posix()
            for table in ("outputs", "files"):
                if data is not None and key in (data.get(table) or {}):
                    data[table][key] = {"sha256": fs.sha256_file(path), "bytes": path.stat().st_size}
                    data.setdefault("stored", {})[key] = {"mantissa_bits": mantissa_bits}
                    fs.write_bytes(d / name, (json.dumps(data, indent=2) + "\n").encode())  # its key order kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtspec.artifacts.packed", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("unpack", help="restore the packed files that are missing under examples/models")
    p = sub.add_parser("pack", help="pack files of examples/models into examples/packed")
    p.add_argument("paths", nargs="+", help="paths under examples/models")
    p.add_argument("--mantissa-bits", type=int, help="round fp16 tensors to this many mantissa bits first")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "unpack":
            unpack()
        else:
            pack(args.paths, mantissa_bits=args.mantissa_bits)
    except ModelError as e:
        print(f"error: {e.message}" + (f"\nhint: {e.hint}" if e.hint else ""), file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
