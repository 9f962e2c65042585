"""The fused CPU decoder layer (`kernels/decode_layer.cpp`) of float32, bfloat16, int8 and W8A8 models: built once per
machine, then one call per layer instead of ~60 torch ops.

Why: on SmolLM2-135M (2 cores, AVX2) the ~60 small ops around a layer's four matmuls (norms, casts, RoPE, cache
writes, attention, silu) were ~40 % of an int8 decode step and ~25 % of an fp32 one; their arithmetic is tiny,
their dispatch is not. The kernel does those in plain loops, row by row (so it is row-exact: a verify row
computes the bits the decode step would), and calls its own int8 matmul (kernels/int8_mm.h: activations rounded to
int16 per row, exact integer sums, each weight read once for all the rows of a pass) or oneDNN's prepacked linear
(bfloat16 weights with bf16 activations, or float32: the kernel runtime/linear.py's Linear uses, in the same row
blocks, which keep it row-exact) for the matmuls. Built with -fopenmp: at::parallel_for (the int8 matmul's tiles,
attention's heads) is OpenMP, and without it runs on one thread (measured: the int8 matmul at half speed); the OpenMP
calls bind to the libgomp torch itself loads.

How it is built: `torch.utils.cpp_extension.load` (the system's C++ compiler and ninja) into a private (0700)
directory under `$TRTSPEC_KERNEL_CACHE` (default `$XDG_CACHE_HOME` or `~/.cache`, then `trtspec/kernels`; the temp
dir, per user, where that is not writable), named by the source's hash, the torch version and the CPU's flags (it is
compiled for this CPU: `-march=native`), so a cached build is never used on another CPU or torch, and by where the
source, torch and the Python headers lie, so two checkouts never rebuild each other's (`build_name`); concurrent builds
wait on an flock, which the OS releases when its holder dies, so a build killed midway (Ctrl-C, the OOM killer)
cannot leave a lock that hangs every later build (torch's own lock file can). ~10-30 s the first time (`make
install` and a CPU `trtspec build` do it, so a server does not compile at model load), a load after. Where it cannot
be built (no compiler), `available()` is False with the reason logged once, and the runtime keeps its torch path:
same models (float32 within 1e-4; int8 up to the bf16 rounding of torch's int8 kernel's activations, against
int16 here), slower.
`TRTSPEC_FUSED=0` turns it off. `TRTSPEC_KERNEL_FLAGS` appends compiler flags (and names another build): with
`-mno-avx512f`, an AVX-512 machine builds and runs the AVX2 + FMA kernel of the fleet's AVX2-only machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

from trtspec.runtime import dtypes

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("kernels") / "decode_layer.cpp"  # it includes the headers beside it
FLAGS = ["-O3", "-march=native", "-std=c++17", "-fopenmp"]  # -fopenmp: at::parallel_for is OpenMP (torch's own libgomp)
OPS = ("decode_layer_int8", "decode_layer_w8a8", "decode_layer_w4a8", "decode_layer_f32", "decode_layer_bf16",
       "int8_mm", "w8a8_mm", "w4a8_mm")


def flags() -> list[str]:
    """The compiler flags: FLAGS, then those of $TRTSPEC_KERNEL_FLAGS (shell words; the later flag wins)."""
    return [*FLAGS, *shlex.split(os.environ.get("TRTSPEC_KERNEL_FLAGS", ""))]


def cache_dir() -> Path:
    """Where builds go: $TRTSPEC_KERNEL_CACHE, else $XDG_CACHE_HOME (default ~/.cache)/trtspec/kernels."""
    if os.environ.get("TRTSPEC_KERNEL_CACHE"):
        return Path(os.environ["TRTSPEC_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtspec" / "kernels"


def private_dir(path: Path) -> Path:
    """`path`, created 0700 if missing; refused (OSError) unless it is ours and nobody else may write to it: a
    shared library is loaded from it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st, parent = path.stat(), path.parent.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"{path} is not a private directory of this user (owner uid {st.st_uid}, "
                      f"mode {st.st_mode & 0o777:o})")
    if parent.st_mode & 0o002 and not parent.st_mode & 0o1000:  # others could rename it away (no sticky bit)
        raise OSError(f"{path.parent} is writable by everyone")
    return path


def build_dir(name: str) -> Path:
    """The build's private directory: under cache_dir(), or (a read-only or unusable home, as in some CI
    containers) under the temp dir, per user."""
    try:
        return private_dir(cache_dir() / name)
    except OSError as e:
        fallback = Path(tempfile.gettempdir()) / f"trtspec-kernels-{os.getuid()}"
        log.info("trtspec: %s; building the fused kernel under %s", e, fallback)
        private_dir(fallback)
        return private_dir(fallback / name)


def build_name() -> str:
    """The extension's name: the source (and the headers beside it) and where it lies, the flags, torch's version
    and where it is installed, the Python headers, and this CPU's flags, hashed. The paths count because torch's
    build file names them: two checkouts or environments of the same source sharing one build dir rewrite it in
    turn, and each rewrite recompiles (~6 s at every engine load, measured with a worktree beside the main
    checkout)."""
    cpu = dtypes.cpu_flags()
    where = [str(SOURCE.resolve()), str(Path(torch.__file__).resolve().parent), sysconfig.get_paths()["include"]]
    h = hashlib.sha256()
    sources = [SOURCE.read_bytes()] + [p.read_bytes() for p in sorted(SOURCE.parent.glob("*.h"))]
    for part in (*sources, " ".join(flags()).encode(), torch.__version__.encode(), cpu.encode(),
                 "\0".join(where).encode()):
        h.update(part)
        h.update(b"\0")
    return f"trtspec_fused_{h.hexdigest()[:16]}"


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether torch.ops.trtspec.decode_layer_* run here (building them the first time)."""
    if os.environ.get("TRTSPEC_FUSED", "1") == "0":
        return False
    try:
        load_extension(build_name(), [SOURCE], flags(), "the fused CPU decode kernel")
        return all(hasattr(torch.ops.trtspec, op) for op in OPS)
    except Exception as e:  # noqa: BLE001 — any build failure means: keep the torch path
        log.warning("trtspec: the fused CPU decode kernel is unavailable (%s); using the torch path", _reason(e))
        return False


def load_extension(name: str, sources: list[Path], flags: list[str], what: str,
                   include_dirs: tuple[Path, ...] = ()) -> None:
    """Build (the first time) and load the C++ extension `name` from `sources` in its private build dir
    (`build_dir`), holding the build lock; raises whatever the build raises."""
    from torch.utils.cpp_extension import load

    _ninja_on_path()
    where = build_dir(name)
    if not any(where.glob(f"{name}*.so")):
        print(f"trtspec: compiling {what} into {where} (once per machine, ~30 s)", file=sys.stderr, flush=True)
    with _build_lock(where):
        load(name=name, sources=[str(p) for p in sources], extra_cflags=flags,
             extra_include_paths=[str(d) for d in include_dirs], build_directory=str(where),
             is_python_module=False, verbose=False)


@contextlib.contextmanager
def _build_lock(where: Path):
    """Holds an flock on `where` while torch builds or loads there. torch's `cpp_extension` waits, without end,
    on a file named `lock` that a killed build leaves behind; every trtspec build holds this flock first, so a
    `lock` found while holding it is such a leftover, and is removed."""
    with open(where / "build.flock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = where / "lock"
            if stale.exists():
                log.warning("trtspec: removing %s, left by a kernel build that was killed", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _reason(e: Exception) -> str:
    """One line saying why a build failed: the compiler's first error, else the exception's last line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first_error = next((ln for ln in lines if "error:" in ln), None)
    return first_error or (lines[-1] if lines else type(e).__name__)


def layer_args(lw, eps: float) -> tuple | None:
    """(op, weight arguments) running decoder layer `lw` (runtime.llama.LayerWeights) fused, or None where it
    cannot: no input norm (an EAGLE layer), or linears other than int8, W8A8 or W4A8 on trtspec's kernels (all four) or
    bfloat16 or float32 prepacked for oneDNN (all four, one dtype). Biases are passed as float32."""
    from trtspec.runtime.llama import Linear
    from trtspec.runtime.quant import Int8Linear, W4A8Linear, W8A8Linear

    lins = (lw.qkv, lw.o, lw.gate_up, lw.down)
    if lw.attn_norm is None:
        return None
    args: list = [lw.attn_norm, lw.mlp_norm, float(eps)]
    if all(isinstance(x, Int8Linear) and x.own for x in lins):
        name = "decode_layer_int8"
        for x in lins:
            args += [x.q, x.s, None if x.b is None else x.b.float()]
    elif all(isinstance(x, W8A8Linear) and x.own for x in lins):
        name = "decode_layer_w8a8"
        for x in lins:
            args += [x.q, x.s, x.b]
    elif all(isinstance(x, W4A8Linear) and x.own for x in lins):
        name = "decode_layer_w4a8"
        for x in lins:
            args += [x.q, x.s, x.b]
    elif all(isinstance(x, Linear) and x.w.dtype == lins[0].w.dtype and x.packed is not None for x in lins):
        name = {torch.float32: "decode_layer_f32", torch.bfloat16: "decode_layer_bf16"}.get(lins[0].w.dtype)
        if name is None:
            return None
        for x in lins:
            args += [x.packed, torch.tensor(x.rows, dtype=torch.long), None if x.b is None else x.b.float()]
    else:
        return None
    return name, tuple(args) + (lw.q_norm, lw.k_norm)


def _ninja_on_path() -> None:
    """torch runs `ninja` from PATH: put the `ninja` package's binary (a dependency) there when it is not."""
    if shutil.which("ninja"):
        return
    try:
        import ninja

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    except ImportError:
        pass


def compiler() -> str | None:
    """The C++ compiler torch's build would run (`$CXX`, else `c++`), if there is one."""
    return shutil.which(os.environ.get("CXX") or "c++")


def main() -> None:
    """`python -m trtspec.runtime.fused`: build (or find) the kernel; exit 1 if it cannot be built."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    ok = available()
    print(f"fused CPU decode kernel: {'ready' if ok else 'unavailable'} (under {cache_dir()})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
