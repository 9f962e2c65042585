"""Clients of a served deployment: `generate_remote` (gRPC streaming against the ensemble; remote.py), with
TLS and extra headers through `GrpcOptions` (the address, TLS and headers: connect.py)."""

from trtspec.client.connect import GrpcOptions, normalize_url, parse_url, resolve_url
from trtspec.client.remote import RemoteResult, generate_remote

__all__ = ["GrpcOptions", "RemoteResult", "generate_remote", "normalize_url", "parse_url", "resolve_url"]
