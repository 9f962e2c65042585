"""Where a server listens and where its clients connect: bind addresses (loopback unless told otherwise), the
endpoints of a started server, and free ports.

HTTP, gRPC and metrics bind 127.0.0.1 by default (`host=` binds elsewhere; the CLI warns). A client on this
machine reaches a server bound to a wildcard address through the loopback of the same family.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any

from trtspec.errors import ServeError
from trtspec.repository.server_flags import LOOPBACK


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect_host(bind: str) -> str:
    """Where a client on this machine reaches a server bound to `bind` (the IPv4 wildcard -> 127.0.0.1, the IPv6
    one -> ::1)."""
    try:
        address = ipaddress.ip_address(bind) if bind else None
    except ValueError:
        return bind
    if address is None or address.is_unspecified:
        return "::1" if address is not None and address.version == 6 else LOOPBACK
    return bind


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def check_host(host: str) -> str:
    """A bind address: an IP literal or a host name (no ports, schemes or spaces)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", host):
        raise ServeError(f"bad bind address {host!r}",
                         hint="pass an IP address (127.0.0.1, 0.0.0.0, ::1) or a host name")
    return host


@dataclasses.dataclass(frozen=True)
class Endpoints:
    host: str                  # where clients on this machine connect
    http_port: int
    grpc_port: int
    metrics_port: int
    bind: str = LOOPBACK       # the address the server listens on
    grpc_tls: bool = False

    @property
    def http_url(self) -> str:
        return f"{url_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{url_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{url_host(self.host)}:{self.metrics_port}/metrics"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "http_url": self.http_url, "grpc_url": self.grpc_url,
                "metrics_url": self.metrics_url}



def free_port(exclude: Iterable[int] = ()) -> int:
    """A TCP port nobody listens on now (the kernel's pick), not in `exclude`."""
    exclude = set(exclude)
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port
    raise ServeError("could not find a free TCP port")  # pragma: no cover


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0

