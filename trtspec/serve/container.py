"""The TensorRT-LLM container's server as a deployment's server (trtspec.serve.Server): inside the Triton
TensorRT-LLM image, `tritonserver` on `model_repository/<name>/` (under mpirun, one rank per GPU, for
trtllm-engine), as a foreground process this one waits for; its exit code is the command's.

The argv comes from the deployment's backend (`launch(admin_key)`, trtspec.repository.trtllm.launch).
Shown (`command`), it references $TRTSPEC_ADMIN_KEY instead of holding a key; run, it gets the key
given or a random one (model control closed), unless model control is left open. Before it runs,
NVIDIA's `model.py` files are copied in from the container (trtspec.repository.trtllm.upstream).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError
from trtspec.repository.trtllm.launch import ADMIN_KEY_REF, TRITONSERVER, launch_shell
from trtspec.repository.trtllm.upstream import install_upstream_files
from trtspec.serve.access import new_admin_key
from trtspec.spec import Spec


class ContainerServer:
    detaches = False  # it runs in this terminal (the container's foreground process)

    def __init__(self, spec: Spec, runtime: str, repo_dir: Path, launch: Callable[[str | None], list[str]], *,
                 admin_key: str | None = None, open_model_control: bool = False):
        self.spec, self.runtime, self.repo_dir, self.launch = spec, runtime, Path(repo_dir), launch
        self.admin_key, self.open_model_control = admin_key, open_model_control

    def command(self) -> dict[str, Any]:
        """{"argv", "shell"} as it would run, the key never printed (the command reads $TRTSPEC_ADMIN_KEY)."""
        argv = self.launch(None if self.open_model_control else ADMIN_KEY_REF)
        return {"argv": argv, "shell": launch_shell(argv)}

    def start_background(self) -> dict[str, Any]:
        raise ServeError(f"runtime {self.runtime!r} serves in the foreground only",
                         hint="run `trtspec serve` as the container's command")

    def check(self) -> None:
        """The repository is built and this is the TRT-LLM container (the bundled CPU server has no
        tensorrtllm backend)."""
        if not self.repo_dir.is_dir():
            raise ServeError(f"no model repository at {self.repo_dir}", hint="run `trtspec build -c <spec>` first")
        if not Path(TRITONSERVER).is_file():
            raise ServeError(f"runtime {self.runtime!r} serves from the Triton TensorRT-LLM container ({TRITONSERVER} "
                             "is not here; the bundled CPU server has no tensorrtllm backend)",
                             hint=f"docker run --gpus all --shm-size 2g -v $PWD:/work -w /work "
                                  f"{self.spec.runtime.trtllm.image} trtspec serve -c <spec>   "
                                  "(or --print-command to see the command)")

    def run(self, echo: Callable[..., None], as_json: bool = False) -> int:
        self.check()
        key = None if self.open_model_control else self.admin_key or new_admin_key()
        argv = self.launch(key)
        install_upstream_files(self.repo_dir)
        shown = [a.replace(key, "***") for a in argv] if key else argv
        echo(f"serving {self.spec.name!r} ({self.spec.method}, world size {self.spec.world_size}): "
             f"{shlex.join(shown)}", err=True)
        return subprocess.call(argv)
