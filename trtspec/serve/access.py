"""Who may change a server: the admin key of its restricted APIs, and TLS of its gRPC endpoint.

The APIs that change the server (model-repository: load/unload, which runs the `model.py` a client uploads;
shared-memory, trace and logging, which open files and regions by name) are restricted to requests carrying
the header `trtspec-admin-key` (gRPC: `triton-grpc-protocol-trtspec-admin-key`, the form Triton expects; the
flags: trtspec.repository.server_flags). The key is given, or a random one per start; a server started with
open model control leaves them open. Health, metadata, model config, statistics and inference stay open. The
key is on the server's command line, so local users who can read /proc see it; against other hosts and web
pages (which cannot add the header) it holds.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from pathlib import Path

from trtspec.errors import ServeError

_KEY_RE = re.compile(r"[A-Za-z0-9._~-]{16,256}")


def new_admin_key() -> str:
    return secrets.token_urlsafe(32)


def check_admin_key(key: str) -> str:
    """Keys go into Triton's `<apis>:<header>=<key>` flags: 16-256 URL-safe characters."""
    if not _KEY_RE.fullmatch(key or ""):
        raise ServeError("the admin key must be 16-256 characters of A-Z a-z 0-9 . _ ~ -",
                         hint="e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return key


@dataclasses.dataclass(frozen=True)
class GrpcTls:
    """TLS of the server's gRPC endpoint (PEM files). With `client_ca` clients must present a
    certificate signed by it (mutual TLS). Triton's HTTP endpoint has no TLS: put a proxy in front."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def args(self) -> list[str]:
        for what, path in (("certificate", self.cert), ("key", self.key), ("client CA", self.client_ca)):
            if path is not None and not Path(path).is_file():
                raise ServeError(f"gRPC TLS {what} file not found: {path}", hint="pass PEM files")
        args = ["--grpc-use-ssl=true", f"--grpc-server-cert={Path(self.cert).resolve()}",
                f"--grpc-server-key={Path(self.key).resolve()}"]
        if self.client_ca is not None:
            args += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={Path(self.client_ca).resolve()}"]
        return args
