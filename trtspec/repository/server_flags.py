"""The tritonserver flags every server trtspec runs carries, the bundled one (trtspec.serve.server) and the
TensorRT-LLM container's (trtspec.repository.trtllm.launch): where it binds, and the admin key that guards
the APIs which change the server. Defined once, below both, so the two cannot drift apart.

The restricted APIs are model-repository (load/unload: a load runs the `model.py` a client uploads),
shared-memory, trace and logging (they open files and regions by name). A request to them must carry the
header `trtspec-admin-key: <key>`; over gRPC Triton expects it as `triton-grpc-protocol-trtspec-admin-key`.
"""

from __future__ import annotations

from collections.abc import Sequence

LOOPBACK = "127.0.0.1"
ADMIN_HEADER = "trtspec-admin-key"                       # HTTP header of the restricted APIs
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"  # its gRPC form (Triton adds the prefix)
ADMIN_KEY_ENV = "TRTSPEC_ADMIN_KEY"
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")


def bind_args(host: str) -> list[str]:
    """HTTP, gRPC and metrics all listen on `host`."""
    return [f"--http-address={host}", f"--grpc-address={host}", f"--metrics-address={host}"]


def restricted_args(key: str, apis: Sequence[str] = RESTRICTED_APIS) -> list[str]:
    """tritonserver flags that require `trtspec-admin-key: <key>` for `apis` over HTTP and gRPC."""
    group = ",".join(apis)
    return [f"--http-restricted-api={group}:{ADMIN_HEADER}={key}",
            f"--grpc-restricted-protocol={group}:{ADMIN_HEADER}={key}"]


def admin_headers(key: str | None, protocol: str = "http") -> dict[str, str]:
    """The header a restricted request must carry ({} without a key)."""
    if not key:
        return {}
    return {ADMIN_HEADER if protocol == "http" else GRPC_ADMIN_HEADER: key}
