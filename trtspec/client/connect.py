"""Reaching a Triton server's gRPC endpoint: its address, TLS, extra headers, and what a failed connection
means.

Addresses keep their scheme: `HOST:PORT` and `grpc://HOST:PORT` are plaintext, `grpcs://` and
`https://` are TLS (never silently downgraded). `GrpcOptions` carries TLS material (`ssl`, root
certificates, a client key and certificate chain for mutual TLS) and extra headers (e.g. for an
auth proxy), sent with every call.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from trtspec.errors import ClientError

PLAIN_SCHEMES = ("grpc", "http")
TLS_SCHEMES = ("grpcs", "https")


def parse_url(url: str) -> tuple[str | None, str]:
    """(scheme or None, 'host:port') of 'grpcs://host:port', 'host:port' or ':port'."""
    url = url.strip()
    scheme = None
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if match:
        scheme = match.group(1).lower()
        if scheme not in PLAIN_SCHEMES + TLS_SCHEMES:
            raise ClientError(f"unknown scheme {scheme!r} in {url!r}",
                              hint="use HOST:PORT or grpc:// (plaintext), grpcs:// or https:// (TLS)")
        url = url[match.end():]
    url = url.rstrip("/")
    if url.startswith(":"):
        url = "localhost" + url
    if ":" not in url or not url.rpartition(":")[2].isdigit():
        raise ClientError(f"bad server address {url!r}",
                          hint="use HOST:PORT of Triton's gRPC endpoint, e.g. localhost:8001")
    return scheme, url


def normalize_url(url: str) -> str:
    """'grpc://host:port', 'host:port' or ':port' -> 'host:port' (what tritonclient expects), for callers
    that speak plaintext only: a TLS address is refused rather than silently downgraded."""
    scheme, hostport = parse_url(url)
    if scheme in TLS_SCHEMES:
        raise ClientError(f"{url!r} asks for TLS, which this call does not speak",
                          hint="pass HOST:PORT; for gRPC over TLS use `trtspec generate --url grpcs://...`")
    return hostport


@dataclasses.dataclass(frozen=True)
class GrpcOptions:
    """How to talk to a gRPC endpoint: TLS (`ssl`, PEM files: the CA to trust, and a client key and
    certificate chain for mutual TLS) and headers sent with every call (names are lower-cased: gRPC
    metadata keys are)."""

    ssl: bool = False
    root_certs: str | None = None
    private_key: str | None = None
    certificate_chain: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def make(cls, *, ssl: bool = False, root_certs: str | None = None, private_key: str | None = None,
             certificate_chain: str | None = None, headers: Mapping[str, str] | Sequence[str] = ()) -> "GrpcOptions":
        """From CLI-style values: `headers` as {name: value} or ["NAME=VALUE", ...]."""
        pairs = []
        for item in (headers.items() if isinstance(headers, Mapping) else headers):
            if isinstance(item, str):
                name, sep, value = item.partition("=")
                if not sep:
                    raise ClientError(f"bad header {item!r}", hint="pass headers as NAME=VALUE")
            else:
                name, value = item
            name = name.strip().lower()
            if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name) or name.startswith("grpc-"):
                raise ClientError(f"bad header name {name!r}",
                                  hint="letters, digits, '-', '_' and '.'; not a reserved grpc-* name")
            if any(c in value for c in "\r\n\0"):
                raise ClientError(f"bad value for header {name!r}: no line breaks")
            pairs.append((name, value))
        return cls(ssl, root_certs, private_key, certificate_chain, tuple(pairs))

    @property
    def tls_material(self) -> bool:
        return any((self.root_certs, self.private_key, self.certificate_chain))


class HeaderPlugin:
    """A tritonclient plugin that adds fixed headers to every request (client.register_plugin)."""

    def __init__(self, headers: Mapping[str, str]):
        self.headers = dict(headers)

    def __call__(self, request) -> None:
        request.headers = {**(request.headers or {}), **self.headers}


def use_tls(url: str, options: GrpcOptions | None) -> tuple[str, bool]:
    """('host:port', TLS?) for `url` with `options`; a ClientError for a contradiction, never a silent
    plaintext fallback: grpcs:// / https:// are TLS; HOST:PORT is TLS with --ssl or TLS files; an
    explicit grpc:// with TLS options is refused."""
    options = options or GrpcOptions()
    scheme, hostport = parse_url(url)
    wants = options.ssl or options.tls_material
    if scheme in PLAIN_SCHEMES and wants:
        raise ClientError(f"{url!r} is plaintext ({scheme}://) but TLS options were given",
                          hint="use grpcs://HOST:PORT (or a bare HOST:PORT) for TLS, or drop --ssl/--root-certs")
    tls = scheme in TLS_SCHEMES or wants
    if bool(options.private_key) != bool(options.certificate_chain):
        raise ClientError("mutual TLS needs both --private-key and --certificate-chain",
                          hint="pass the client's certificate chain (PEM) with its key, or neither for one-way TLS")
    for what, path in (("root certificates", options.root_certs), ("private key", options.private_key),
                       ("certificate chain", options.certificate_chain)):
        if path and not Path(path).is_file():
            raise ClientError(f"{what} file not found: {path}", hint="pass a PEM file")
    return hostport, tls


def grpc_client(url: str, options: GrpcOptions | None = None):
    """(tritonclient.grpc client, 'host:port', TLS?) for `url` (see `use_tls`), with `options.headers`."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    options = options or GrpcOptions()
    hostport, tls = use_tls(url, options)
    try:
        client = grpcclient.InferenceServerClient(
            hostport, ssl=tls, root_certificates=options.root_certs if tls else None,
            private_key=options.private_key if tls else None,
            certificate_chain=options.certificate_chain if tls else None)
    except InferenceServerException as exc:
        raise connection_error(hostport, exc, tls) from None
    if options.headers:
        client.register_plugin(HeaderPlugin(dict(options.headers)))
    return client, hostport, tls


def resolve_url(url: str | None, config: str | None = None) -> str:
    """`url` if given (its scheme kept: grpcs:// stays TLS, and an explicit grpc:// stays plaintext, so that
    `use_tls` refuses it with --ssl rather than trying TLS), else the gRPC endpoint of the server
    `trtspec serve` started for the spec at `config` (grpcs:// when it serves TLS), else localhost and
    the spec's serving.grpc_port."""
    if url:
        scheme, hostport = parse_url(url)
        return f"{scheme}://{hostport}" if scheme else hostport
    from trtspec.spec import load_spec
    from trtspec.state import read_state, state_path

    spec = load_spec(config or "trtspec.toml")
    state = read_state(state_path(spec.name))
    if state and state.get("grpc_url"):
        hostport = normalize_url(state["grpc_url"])
        return f"grpcs://{hostport}" if state.get("grpc_tls") else hostport
    if spec.serving.grpc_port:
        return f"localhost:{spec.serving.grpc_port}"
    raise ClientError(f"no running server recorded for {spec.name!r} and serving.grpc_port is 0",
                      hint="start one with `trtspec serve`, or pass --url HOST:PORT")


def error_text(exc: Exception) -> str:
    text = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    return " ".join((text or type(exc).__name__).split())


def connection_error(url: str, exc: Exception, tls: bool = False) -> ClientError:
    text = error_text(exc)
    low = text.lower()
    if tls and any(w in low for w in ("ssl", "handshake", "certificate", "tls")):
        return ClientError(f"TLS to Triton at {url} failed: {text[:200]}",
                           hint="check --root-certs (the CA that signed the server's certificate, which must name "
                                "the host you connect to) and that the server speaks TLS")
    if "connect" in low or "unavailable" in low or "socket closed" in low:
        what = "TLS connection failed" if tls else "connection refused"
        return ClientError(f"cannot reach Triton at {url}: {what}",
                           hint="start the server (`trtspec serve`) or check --url HOST:PORT (the gRPC port); "
                                + ("a plaintext server needs a plain HOST:PORT" if tls
                                   else "a TLS server needs grpcs://HOST:PORT or --ssl"))
    return ClientError(f"Triton at {url}: {text}")

