"""The server command lines for the trtllm repositories, to run INSIDE the Triton TRT-LLM container.

Each trtllm backend (trtspec.backends) picks its own: `mpirun_command` (trtllm-engine) returns the same
command TensorRT-LLM's `scripts/launch_triton_server.py` builds (TensorRT-LLM
`triton_backend/scripts/launch_triton_server.py`), but as a foreground process the caller owns (the
script itself `Popen`s and returns at once); `llmapi_command` (trtllm-llmapi) is that script's world-size-1
command, the way TensorRT-LLM's llmapi docs launch it (tensorrtllm_backend docs/llmapi.md):

    leader mode (world_size = TP x PP, one TRT-LLM model):
        mpirun --allow-run-as-root -n 1 tritonserver --model-repository=R <ports>
            --disable-auto-complete-config --backend-config=python,shm-region-prefix-name=prefix0_ :
          -n 1 tritonserver ... --model-control-mode=explicit --load-model=tensorrt_llm ... : ...
    draft-model (two TRT-LLM models) -> orchestrator mode, `--multi-model`:
        env TRTLLM_ORCHESTRATOR=1 TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1 mpirun -n 1 tritonserver ...
            --pinned-memory-pool-byte-size=0 --enable-peer-access=false --cuda-memory-pool-byte-size=<gpu>:0 ...
          (the executors spawn their own TP x PP workers on `gpu_device_ids`)
    draft-model + use_draft_logits -> fast logits: orchestrator with spawning disabled,
        world_size = 1 + draft ranks + target ranks, `participant_ids` in the configs.
    trtllm-llmapi -> mpirun --allow-run-as-root -n 1 tritonserver ... --disable-auto-complete-config
            --backend-config=python,shm-region-prefix-name=prefix0_
        (one rank: the llmapi model.py clears the inherited MPI job variables before the LLM API spawns its
        tensor_parallel_size x pipeline_parallel_size workers; a bare tritonserver has no MPI world to
        spawn them from).

The BLS model (draft-model) reads the other models' configs over gRPC at localhost:8001
(`tensorrt_llm_bls/1/model.py`: model_config_api_baseurl = "localhost:8001/v2/models/"), so
inside the container gRPC must stay on 8001 for draft-model; map it outside with `docker -p`.

Safe defaults, as for the bundled server (trtspec/serve/server.py): every rank binds `host`
(127.0.0.1 unless told otherwise; a container published with `docker -p` needs 0.0.0.0), and the
model-repository, shared-memory, trace and logging APIs are restricted to the header
`trtspec-admin-key`. The key is never written into a file: by default the argv holds the reference
ADMIN_KEY_REF, which `launch_shell`/`launch_script` render as the shell expansion of
$TRTSPEC_ADMIN_KEY (a secret of the deployment; `launch_script` makes a random one when it is unset,
which keeps the API closed). `admin_key=None` leaves those APIs open.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.errors import RepositoryError
from trtspec.repository.server_flags import ADMIN_KEY_ENV, bind_args, restricted_args
from trtspec.repository.trtllm.common import CONTAINER_LAUNCH
from trtspec.repository.trtllm.engine import DRAFT, TARGET
from trtspec.spec import Spec

if TYPE_CHECKING:  # (the backend passes the method's row in)
    from trtspec.builders.trtllm.method import EngineMethod

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
BIND_HOST_ENV = "TRTSPEC_BIND_HOST"
ADMIN_KEY_REF = "${%s}" % ADMIN_KEY_ENV      # stands for the key in an argv; rendered by launch_shell
HOST_REF = "${%s}" % BIND_HOST_ENV           # stands for the bind address (launch_script: 127.0.0.1 unless set)
_REFS = {ADMIN_KEY_REF: '"${%s:?set %s: the key of the restricted model-repository API}"' % (ADMIN_KEY_ENV,
                                                                                              ADMIN_KEY_ENV),
         HOST_REF: '"${%s:-127.0.0.1}"' % BIND_HOST_ENV}


def mpirun_world_size(spec: Spec, method: EngineMethod) -> int:
    """MPI processes `mpirun_command` starts (what launch_triton_server.py calls --world_size)."""
    if method.draft_engine(spec):
        return 1 + spec.gpu.tensor_parallel + spec.world_size if method.fast_logits(spec) else 1
    return spec.world_size


def _ports(spec: Spec, http: int | None, grpc: int | None, metrics: int | None) -> tuple[int, int, int]:
    ports = (http if http is not None else spec.serving.http_port,
             grpc if grpc is not None else spec.serving.grpc_port,
             metrics if metrics is not None else spec.serving.metrics_port)
    if 0 in ports:
        raise RepositoryError("port 0 (pick a free one) must be resolved before building the launch command",
                              hint="pass http_port/grpc_port/metrics_port explicitly")
    return ports


def _server_args(spec: Spec, repo_dir: str | Path, ports: tuple[int, int, int], host: str, admin_key: str | None,
                 log_file: str | None) -> tuple[list[str], list[str]]:
    """(--model-repository + ports + bind + admin-key flags, log flags): what every tritonserver process gets."""
    http, grpc, metrics = ports
    args = [f"--model-repository={Path(repo_dir).resolve()}", f"--grpc-port={grpc}", f"--http-port={http}",
            f"--metrics-port={metrics}", *bind_args(host), *(restricted_args(admin_key) if admin_key else [])]
    return args, (["--log-verbose=3", f"--log-file={log_file}"] if log_file else [])


def llmapi_command(spec: Spec, repo_dir: str | Path, *, tritonserver: str = TRITONSERVER,
                   http_port: int | None = None, grpc_port: int | None = None, metrics_port: int | None = None,
                   log_file: str | None = None, host: str = "127.0.0.1",
                   admin_key: str | None = ADMIN_KEY_REF) -> list[str]:
    """argv serving the llmapi repository `repo_dir` as upstream's launch_triton_server.py does with world size
    1 (`mpirun --allow-run-as-root -n 1 tritonserver ... --disable-auto-complete-config --backend-config=
    python,shm-region-prefix-name=prefix0_`; the LLM API spawns its TP x PP workers from that MPI world), bound
    to `host`, its model-repository API restricted to `admin_key` (default: ADMIN_KEY_REF, for `launch_shell`;
    a real key to run the argv directly; None: open)."""
    args, log_args = _server_args(spec, repo_dir, _ports(spec, http_port, grpc_port, metrics_port), host,
                                  admin_key, log_file)
    return ["mpirun", "--allow-run-as-root", "-n", "1", tritonserver, *args, *log_args,
            "--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix0_"]


def mpirun_command(spec: Spec, method: EngineMethod, repo_dir: str | Path, *, tritonserver: str = TRITONSERVER,
                   http_port: int | None = None, grpc_port: int | None = None, metrics_port: int | None = None,
                   log_file: str | None = None, host: str = "127.0.0.1",
                   admin_key: str | None = ADMIN_KEY_REF) -> list[str]:
    """argv that serves the engine repository `repo_dir` under mpirun, one tritonserver per rank (see the
    module docstring; `method`: the spec's method's row, trtspec/backends/trtllm_engine_methods.py); `host` and
    `admin_key` as in `llmapi_command`."""
    ports = _ports(spec, http_port, grpc_port, metrics_port)
    dtm = method.draft_engine(spec)
    if dtm and ports[1] != 8001:
        raise RepositoryError(f"draft-model serving needs gRPC on port 8001 inside the container (got {ports[1]}): "
                              "the BLS model reads model configs from localhost:8001",
                              hint="keep grpc 8001 in the container and publish it elsewhere (docker -p)")
    args, log_args = _server_args(spec, repo_dir, ports, host, admin_key, log_file)
    spawn = dtm and not method.fast_logits(spec)
    world = mpirun_world_size(spec, method)
    trtllm_models = [TARGET, DRAFT] if dtm else [TARGET]
    cmd: list[str] = []
    if dtm:
        cmd += ["env", "TRTLLM_ORCHESTRATOR=1", f"TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES={1 if spawn else 0}"]
    cmd += ["mpirun", "--allow-run-as-root"]
    for rank in range(world):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1", tritonserver, *args]
        if rank == 0:
            cmd += log_args
        else:
            cmd += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in trtllm_models)]
        if spawn:
            cmd += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
                    *(f"--cuda-memory-pool-byte-size={g}:0" for g in range(spec.gpu.count))]
        cmd += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
    return cmd


def launch_shell(cmd: list[str]) -> str:
    """`cmd` as one shell line, ADMIN_KEY_REF / HOST_REF rendered as quoted expansions of
    $TRTSPEC_ADMIN_KEY (required) / $TRTSPEC_BIND_HOST (default 127.0.0.1): no secret in the text."""
    words = []
    for arg in cmd:
        parts, rest = [], arg
        while True:
            hits = [(rest.find(ref), ref) for ref in _REFS if ref in rest]
            if not hits:
                break
            at, ref = min(hits)
            if at:
                parts.append(shlex.quote(rest[:at]))
            parts.append(_REFS[ref])
            rest = rest[at + len(ref):]
        if rest or not parts:
            parts.append(shlex.quote(rest))
        words.append("".join(parts))
    return " ".join(words)


def launch_script(cmd: list[str], name: str) -> str:
    """The bundle's launch.sh (the image's CMD): binds $TRTSPEC_BIND_HOST (127.0.0.1 when unset; a
    container published with `docker -p` needs 0.0.0.0, and says so), restricts the model-repository
    API to $TRTSPEC_ADMIN_KEY (pass it as a secret; a random key when unset keeps the API closed)."""
    return (f"""#!/usr/bin/env bash
# written by trtspec: serves {name}
#   {BIND_HOST_ENV}  address to bind (default 127.0.0.1; 0.0.0.0 to publish the ports with docker -p)
#   {ADMIN_KEY_ENV}  key of the model-repository API (header trtspec-admin-key), from a secret;
#                      unset: a random key, i.e. model control closed
set -euo pipefail
if [ -z "${{{ADMIN_KEY_ENV}:-}}" ]; then
  {ADMIN_KEY_ENV}="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
fi
case "${{{BIND_HOST_ENV}:-127.0.0.1}}" in
  127.*|::1|localhost) ;;
  *) echo "warning: binding {BIND_HOST_ENV}=${{{BIND_HOST_ENV}}}: reachable from other machines; """
            f"""inference has no authentication (use a firewall or an authenticating proxy)" >&2 ;;
esac
exec {launch_shell(cmd)}
""")


def launch_script_command(spec: Spec, method: EngineMethod, repo_dir: str | Path) -> list[str]:
    """The equivalent call of the container's launch_triton_server.py for an engine repository (returns at
    once; for docs/CMD)."""
    cmd = ["python3", CONTAINER_LAUNCH, f"--model_repo={Path(repo_dir)}",
           f"--world_size={mpirun_world_size(spec, method)}", f"--http_port={spec.serving.http_port}",
           f"--grpc_port={spec.serving.grpc_port}", f"--metrics_port={spec.serving.metrics_port}"]
    if method.draft_engine(spec):
        cmd += ["--multi-model", f"--tensorrt_llm_model_name={TARGET},{DRAFT}"]
        if method.fast_logits(spec):
            cmd.append("--disable-spawn-processes")
    return cmd
