"""Clients of a served deployment: `generate_remote` (gRPC streaming against the ensemble), with TLS and
extra headers through `GrpcOptions`."""

from trtspec.client.remote import GrpcOptions, RemoteResult, generate_remote, normalize_url, parse_url, resolve_url

__all__ = ["GrpcOptions", "RemoteResult", "generate_remote", "normalize_url", "parse_url", "resolve_url"]
