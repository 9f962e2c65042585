"""The fused CPU decoder layer of an int8 target (`kernels/decode_layer.cpp`): built once per machine, then one
call per layer instead of ~60 torch ops.

Why: on SmolLM2-135M int8 (2 cores, AVX2) the four int8 matmuls of a layer are ~60 % of a decode step and the
~60 small ops around them (norms, conversions, RoPE, cache writes, attention, silu) the rest; their arithmetic is
tiny, their dispatch is not. The kernel does those in plain loops, row by row (so it is row-exact: a verify
row computes the bits the decode step would), and calls aten::_weight_int8pack_mm for the matmuls.

How it is built: `torch.utils.cpp_extension.load` (the system's C++ compiler and ninja) into
`$TRTSPEC_KERNEL_CACHE` (default `~/.cache/trtspec/kernels`), named by the source's hash, the torch version
and the CPU's flags (it is compiled for this CPU: `-march=native`), so a cached build is never used on another
CPU or torch; concurrent builds wait on torch's lock. ~20-30 s the first time (`make install` does it), a
load after. Where it cannot be built (no compiler), `available()` is False with the reason logged once, and
the runtime keeps its torch path: same model, same row-exactness, slower. `TRTSPEC_FUSED=0` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("kernels") / "decode_layer.cpp"
FLAGS = ["-O3", "-march=native", "-std=c++17"]


def cache_dir() -> Path:
    return Path(os.environ.get("TRTSPEC_KERNEL_CACHE") or Path.home() / ".cache" / "trtspec" / "kernels")


def build_name() -> str:
    """The extension's name: the source, the flags, torch's version and this CPU's flags, hashed."""
    try:
        cpu = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        cpu = ""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), torch.__version__.encode(), cpu.encode()):
        h.update(part)
        h.update(b"\0")
    return f"trtspec_fused_{h.hexdigest()[:16]}"


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether torch.ops.trtspec.decode_layer runs here (building it the first time)."""
    if os.environ.get("TRTSPEC_FUSED", "1") == "0":
        return False
    try:
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        name = build_name()
        where = cache_dir() / name
        where.mkdir(parents=True, exist_ok=True, mode=0o700)  # (a shared library is loaded from it: ours only)
        if not any(where.glob(f"{name}*.so")):
            print(f"trtspec: compiling the fused CPU decode kernel into {where} (once per machine, ~30 s)",
                  file=sys.stderr, flush=True)
        load(name=name, sources=[str(SOURCE)], extra_cflags=FLAGS, build_directory=str(where),
             is_python_module=False, verbose=False)
        return hasattr(torch.ops.trtspec, "decode_layer")
    except Exception as e:  # noqa: BLE001 — any build failure means: keep the torch path
        log.warning("trtspec: the fused CPU decode kernel is unavailable (%s); using the torch path",
                    str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
        return False


def _ninja_on_path() -> None:
    """torch runs `ninja` from PATH: put the `ninja` package's binary (a dependency) there when it is not."""
    import shutil

    if shutil.which("ninja"):
        return
    try:
        import ninja

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    except ImportError:
        pass


def compiler() -> str | None:
    """The C++ compiler torch's build would run (`$CXX`, else `c++`), if there is one."""
    import shutil

    return shutil.which(os.environ.get("CXX") or "c++")


def main() -> None:
    """`python -m trtspec.runtime.fused`: build (or find) the kernel; exit 1 if it cannot be built."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    ok = available()
    print(f"fused CPU decode kernel: {'ready' if ok else 'unavailable'} ({cache_dir() / build_name()})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
