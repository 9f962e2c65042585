"""Clients of a served deployment: `generate_remote` (gRPC streaming against the ensemble)."""

from trtspec.client.remote import RemoteResult, generate_remote, normalize_url, resolve_url

__all__ = ["RemoteResult", "generate_remote", "normalize_url", "resolve_url"]
