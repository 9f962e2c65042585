"""`trtspec generate`: in-process (--local) or from a Triton server (--url) over gRPC."""

from __future__ import annotations

import json
import sys

import click

from trtspec.cli.options import config_option, grpc_client_options, json_option
from trtspec.errors import GenerationError


def _read_prompt(prompt: str) -> str:
    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        raise GenerationError("the prompt is empty", hint="pass --prompt TEXT, or pipe text in with --prompt -")
    return text


def _stats_line(d: dict) -> str:
    parts = [f"{d.get('new_tokens', 0)} tokens in {d.get('seconds', 0):.2f}s"]
    if d.get("seconds"):
        parts.append(f"{d['new_tokens'] / d['seconds']:.1f} tok/s")
    if d.get("ttft_seconds") is not None:
        parts.append(f"TTFT {d['ttft_seconds'] * 1000:.0f} ms")
    if d.get("drafted"):
        parts.append(f"acceptance {d['acceptance_rate']:.2f} ({d['accepted']}/{d['drafted']})")
    if d.get("tokens_per_step"):
        parts.append(f"{d['tokens_per_step']:.2f} tokens/step")
    if d.get("drafter"):
        parts.append(f"drafter {d['drafter']}")
    return "[" + ", ".join(parts) + "]"


@click.command()
@config_option
@click.option("--local", is_flag=True, help="Generate in-process with the torch runtime (no server needed).")
@click.option("--url", envvar="TRTSPEC_URL", metavar="HOST:PORT",
              help="Triton gRPC endpoint to stream from: HOST:PORT or grpc:// (plaintext), grpcs:// or https:// "
                   "(TLS). Default: the server `trtspec serve` started for the spec.")
@click.option("-p", "--prompt", required=True, help="Prompt text; '-' reads it from stdin.")
@click.option("-n", "--max-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="Most new tokens to generate.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="0 is greedy; > 0 samples (speculation stays lossless).")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="0 disables top-k.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True),
              help="Nucleus sampling mass.")
@click.option("--seed", type=int, help="Seed for sampling (reproducible outputs).")
@click.option("--num-draft-tokens", type=click.IntRange(min=0),
              help="Draft tokens per step (default: the spec's, adaptive). 0 disables speculation.")
@click.option("--no-spec", is_flag=True, help="Plain decoding, no speculation (same as --num-draft-tokens 0).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--chat", is_flag=True,
              help="The prompt is a user message: render it with the tokenizer's chat template (the server "
                   "does it for --url) and stop at the generation config's EOS.")
@click.option("--system", metavar="TEXT", help="With --chat: a system message before the user's.")
@click.option("--task", metavar="NAME", help="A routed spec (method routed): the task that picks the drafter, a "
              "drafter's name or a key of speculative.router.routes (default: the router decides). Ignored by a "
              "spec with one drafter.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print tokens as they arrive.")
@click.option("--timeout", default=120.0, show_default=True, type=float, help="Seconds to wait for a server.")
@grpc_client_options
@json_option
def generate(config, local, url, prompt, max_tokens, temperature, top_k, top_p, seed, num_draft_tokens,
             no_spec, stop, chat, system, task, stream, timeout, as_json, grpc_options) -> None:
    """Generate a completion with speculative decoding, printing the text and its stats
    (tokens/s, time to first token, acceptance, tokens per step).

    \b
    Examples:
      trtspec generate --local -c examples/demo/eagle.toml -p "def main():"
      trtspec generate --url localhost:8001 -p "import os" --max-tokens 64
      trtspec generate --url grpcs://llm.example:443 --root-certs ca.pem -H authorization="Bearer $T" -p "x"
      echo "class Foo:" | trtspec generate -c trtspec.toml -p - --json
      trtspec generate --local -c examples/smollm2/plain.toml --chat -p "What is a Python generator?"
    """
    text = _read_prompt(prompt)
    if system and not chat:
        raise click.UsageError("--system needs --chat")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    messages = messages if chat else None
    k = 0 if no_spec else num_draft_tokens
    show = stream and not as_json
    on_text = _echo_after_prompt(text + "\n" if chat else text) if show else None
    if local:
        result = _local(config, text, max_tokens, temperature, top_k, top_p, seed, k, stop, on_text, messages, task)
    else:
        result = _remote(config, url, text, max_tokens, temperature, top_k, top_p, seed, k, stop, stream,
                         timeout, on_text, grpc_options, messages, task)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    if not show:
        click.echo(result["text"], nl=False)
    click.echo()
    click.secho(_stats_line(result), fg="cyan", err=True)


def _echo_after_prompt(prompt: str):
    """A text callback that shows the prompt (dimmed) with the first text, so errors print on a clean line."""
    shown = False

    def on_text(piece: str) -> None:
        nonlocal shown
        if not shown:
            click.secho(prompt, nl=False, dim=True)
            shown = True
        click.echo(piece, nl=False)

    return on_text


def _local(config, text, max_tokens, temperature, top_k, top_p, seed, k, stop, on_text, messages=None,
           task=None) -> dict:
    from trtspec import methods
    from trtspec.check import load_spec
    from trtspec.runtime import SamplingParams

    engine = methods.engine(load_spec(config))
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            seed=seed, stop=tuple(stop), num_draft_tokens=k)
    if messages is None:
        prompt = text
    else:
        from trtspec.artifacts.tokenizer import chat_prompt_ids

        prompt = chat_prompt_ids(engine.tokenizer, messages)
    ids = engine._encode(prompt)
    drafter = engine.route(ids, task)  # (an unknown task fails here, before anything is generated)
    if on_text is None:
        d = engine.generate(ids, params, task).to_dict()
    else:
        d = _stream_local(engine, ids, params, on_text, task)
    d["new_tokens"] = len(d["tokens"])
    d["method"] = engine.method if (k is None or k > 0) else "none"
    if engine.routed:
        d["drafter"] = engine.drafter_names[drafter]
    return d


def _stream_local(engine, text, params, on_text, task=None) -> dict:
    """Stream in-process, printing text as steps complete; returns the same fields as generate()."""
    import time

    from trtspec.runtime.stats import RequestStats

    start = time.perf_counter()
    stats, tokens, pieces, ttft, reason = RequestStats(), [], [], None, None
    for event in engine.stream(text, params, task):
        if ttft is None and event.tokens:
            ttft = time.perf_counter() - start
        stats.observe(event)
        tokens.extend(event.tokens)
        pieces.append(event.text)
        reason = event.finish_reason
        on_text(event.text)
    return {"text": "".join(pieces), "tokens": tokens, "steps": stats.steps, "drafted": stats.drafted,
            "accepted": stats.accepted, "draft_seconds": stats.draft_seconds, "verify_seconds": stats.verify_seconds,
            "ttft_seconds": ttft, "finish_reason": reason, "seconds": time.perf_counter() - start,
            "acceptance_rate": stats.acceptance_rate, "tokens_per_step": stats.tokens_per_step}


def _remote(config, url, text, max_tokens, temperature, top_k, top_p, seed, k, stop, stream, timeout,
            on_text, grpc_options=None, messages=None, task=None) -> dict:
    from trtspec.check import load_spec
    from trtspec.client import generate_remote, resolve_url

    if not url:
        load_spec(config)  # the spec's full validation, as every command gives it (resolve_url reads its shape)
    result = generate_remote(resolve_url(url, config), text, max_tokens=max_tokens, stream=stream,
                             temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, num_draft_tokens=k,
                             stop=list(stop), timeout=timeout, on_text=on_text, options=grpc_options,
                             messages=messages, task=task)
    return result.to_dict()


def register(main: click.Group) -> None:
    main.add_command(generate)
