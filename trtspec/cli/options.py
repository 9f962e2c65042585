"""Options shared by several commands."""

from __future__ import annotations

import click

from trtspec import backends

config_option = click.option(
    "-c", "--config", "config", default="trtspec.toml", show_default=True, envvar="TRTSPEC_CONFIG",
    type=click.Path(dir_okay=False), help="Deployment spec to read.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")

runtime_option = click.option("--runtime", type=click.Choice(backends.kinds()),
                              help="Override runtime.kind of the spec.")


def with_runtime(spec, runtime: str | None):
    """The spec with runtime.kind overridden (a GPU runtime implies device cuda, and an H100 if the spec says cpu)."""
    if not runtime or backends.for_spec(spec).name == runtime:
        return spec
    from trtspec.check import spec_from_dict

    data = spec.to_dict()
    data["runtime"]["kind"] = runtime
    if backends.get(runtime).capabilities.gpu:
        data["runtime"]["device"] = "cuda"
        if data["gpu"]["type"] == "cpu":
            data["gpu"]["type"] = "h100"
    return spec_from_dict(data, source=spec.source)


def grpc_client_options(f):
    """--ssl, --root-certs, --private-key, --certificate-chain and -H/--header for a command that talks
    gRPC; the command receives them as one `grpc_options` (trtspec.client.connect.GrpcOptions)."""
    import functools

    @functools.wraps(f)
    def wrapper(*args, ssl, root_certs, private_key, certificate_chain, headers, **kwargs):
        from trtspec.client.connect import GrpcOptions

        kwargs["grpc_options"] = GrpcOptions.make(ssl=ssl, root_certs=root_certs, private_key=private_key,
                                                  certificate_chain=certificate_chain, headers=headers)
        return f(*args, **kwargs)

    path = click.Path(exists=True, dir_okay=False)
    for option in reversed([
        click.option("--ssl", is_flag=True, envvar="TRTSPEC_SSL",
                     help="gRPC over TLS (also implied by grpcs:// or https:// in the URL; never downgraded)."),
        click.option("--root-certs", type=path, envvar="TRTSPEC_ROOT_CERTS",
                     help="PEM file of the CA(s) to trust for the server's certificate (default: system roots)."),
        click.option("--private-key", type=path, envvar="TRTSPEC_PRIVATE_KEY",
                     help="Client key (PEM) for mutual TLS."),
        click.option("--certificate-chain", type=path, envvar="TRTSPEC_CERTIFICATE_CHAIN",
                     help="Client certificate chain (PEM) for mutual TLS."),
        click.option("-H", "--header", "headers", multiple=True, metavar="NAME=VALUE",
                     help="Extra gRPC header for every call, e.g. for an auth proxy (repeatable)."),
    ]):
        wrapper = option(wrapper)
    return wrapper


admin_key_option = click.option(
    "--admin-key", envvar="TRTSPEC_ADMIN_KEY", metavar="KEY",
    help="Key of the server's restricted model-repository API (header trtspec-admin-key; env TRTSPEC_ADMIN_KEY).")
