"""Locating the `tritonserver` bundled in the nvidia-pytriton wheel, and preparing what it needs to run
Python-backend models on this machine:

- a backend directory `<work>/backends/python/` of symlinks to the wheel's `libtriton_python.so`,
  `triton_python_backend_utils.py` and the stub built for the running Python (symlinks keep the
  wheel's `$ORIGIN` RPATHs working; a stub beside the model is not found);
- `LD_LIBRARY_PATH` starting with this Python's `LIBDIR` (else the stub binds no libpython and the
  server hangs in "loading" forever) and `PATH` starting with the virtualenv's `bin` (the stub's
  embedded Python finds the venv's site-packages through `python3` on PATH).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
from pathlib import Path

from trtspec.errors import ServeError


@dataclasses.dataclass(frozen=True)
class TritonInstall:
    """Paths of the server binary and Python backend inside the installed pytriton wheel."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    def stub(self, python_version: str) -> Path:
        return self.root / "python_backend_stubs" / python_version / "triton_python_backend_stub"


def find_triton(root: str | Path | None = None) -> TritonInstall:
    """The bundled server (or `root`, a `tritonserver` tree laid out like pytriton's)."""
    if root is None:
        root = os.environ.get("TRTSPEC_TRITON_ROOT")
    if root is None:
        try:
            import pytriton  # noqa: F401  (only to find the wheel)
        except ImportError:
            raise ServeError("the bundled Triton server is not installed (package nvidia-pytriton)",
                             hint="pip install 'nvidia-pytriton>=0.5' (Linux x86_64), or set TRTSPEC_TRITON_ROOT "
                                  "to a tritonserver tree") from None
        root = Path(pytriton.__file__).parent / "tritonserver"
    install = TritonInstall(Path(root))
    if not install.binary.is_file():
        raise ServeError(f"no tritonserver binary at {install.binary}",
                         hint="reinstall nvidia-pytriton or fix TRTSPEC_TRITON_ROOT")
    return install


def prepare_backends(install: TritonInstall, backends_dir: Path, python_version: str | None = None) -> Path:
    """Fill `backends_dir/python/` with symlinks to the Python backend and the matching stub."""
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = install.stub(version)
    if not stub.is_file():
        have = sorted(p.name for p in (install.root / "python_backend_stubs").glob("*"))
        raise ServeError(f"the bundled Triton has no Python backend stub for Python {version}",
                         hint=f"run trtspec with one of Python {', '.join(have) or '(none)'}")
    python_dir = Path(backends_dir) / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    links = {
        "libtriton_python.so": install.python_backend / "libtriton_python.so",
        "triton_python_backend_utils.py": install.python_backend / "triton_python_backend_utils.py",
        "triton_python_backend_stub": stub,
    }
    for name, source in links.items():
        link = python_dir / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == source:
                continue
            link.unlink()
        link.symlink_to(source)
    return Path(backends_dir)


def server_env(base: dict[str, str] | None = None, python_executable: str | None = None) -> dict[str, str]:
    """Environment for the server: this Python's LIBDIR first on LD_LIBRARY_PATH, its bin first on PATH."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ld = [p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
    bindir = str(Path(python_executable or sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")]) if env.get("PATH") else bindir
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
