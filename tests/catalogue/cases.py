"""The bad-input catalogue: every case is an input a user can get wrong and the one-line error it must give.

Four groups: `spec` (trtspec.toml), `checkpoint` (the model dirs it points at), `cli` (flags, files, URLs) run
through `trtspec.cli.main`, and `request` (gRPC against one served deployment). A CLI case names its exit code
and a regex its first `error:` line must match (a `hint:` line must follow); a request case names the gRPC
status (`in-stream`: the error arrives on the stream of a decoupled model, which carries only a message) and a
regex for the message. `xfail` marks a case whose expected behaviour is not there yet (a known defect).

tests/catalogue/test_catalogue.py runs the cases; `python -m tests.catalogue.render` writes docs/errors.md from
this list and the real messages in samples.json (`make catalogue` re-captures those first). Plain data and a
few set-up functions: importable without pytest.

Placeholders: argv may hold {spec} (the case's spec file), {tmp} (its temp dir), {pem} (an existing file that
is no PEM), {closed_port} (a free port nothing listens on) and {grpc_url} (the served deployment); request
inputs may hold $prompt, $long (over max_input_len tokens, under the byte bound) and $huge (over the bound).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

GROUPS = ("spec", "checkpoint", "cli", "request")
DROP = object()  # a spec patch value that removes the key

# Every spec/checkpoint/cli case starts from this spec, written into a private copy of the tiny family
# (tests/runtime/family.py); it is valid, and `trtspec check` passes on it.
BASE_SPEC: dict[str, Any] = {
    "schema": 1,
    "model": {"name": "cat", "target": "target", "dtype": "float32"},
    "speculative": {"method": "draft-model", "draft": "draft", "num_draft_tokens": 4},
    "limits": {"max_batch_size": 4, "max_input_len": 64, "max_output_len": 64},
    "runtime": {"kind": "torch", "device": "cpu"},
}
MEDUSA = {"speculative": {"method": "medusa", "draft": DROP, "heads": "medusa", "num_draft_tokens": 3}}
EAGLE = {"speculative": {"method": "eagle", "draft": DROP, "heads": "eagle"}}
CHECK = ("check", "-c", "{spec}")
LOOKAHEAD = {"speculative": {"method": "lookahead", "draft": DROP}}  # target-only cases: no draft to disagree with
LOCAL = ("generate", "--local", "-c", "{spec}", "--no-stream", "-p", "w1", "-n", "4")  # in-process; a later -n wins


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    group: str
    input: str                      # the bad input, as docs/errors.md shows it
    expect: str                     # regex (re.search) for the first `error:` line / the request's error message
    exit: int | None = None         # CLI exit code
    status: str | None = None       # request: "in-stream" or a gRPC status code name (unary calls)
    xfail: str | None = None        # why the expected behaviour is not there yet (strict xfail)
    spec: dict | bytes | None = None               # a patch of BASE_SPEC, or the spec file's raw bytes
    setup: Callable[[Path], None] | None = None    # changes the case's copy of the family (checkpoint cases)
    argv: tuple[str, ...] = ()                     # CLI arguments (spec/checkpoint default: CHECK)
    model: str = "ensemble"                        # request: the model called
    inputs: tuple = ()                             # request: (name, value, Triton dtype) ...
    parameters: dict | None = None                 # request parameters
    unary: bool = False                            # request: ModelInfer instead of the stream

    @property
    def outcome(self) -> str:
        return f"exit {self.exit}" if self.exit is not None else f"gRPC {self.status}"


def spec_text(patch: dict | None = None) -> str:
    """BASE_SPEC with `patch` merged in (DROP removes a key), as TOML."""
    return toml(merge(BASE_SPEC, patch or {}))


def merge(base: dict, patch: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in patch.items():
        if value is DROP:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def toml(data: dict) -> str:
    """A small TOML writer for spec dicts (scalars, lists, nested tables)."""
    lines, tables = [], []
    for key, value in data.items():
        (tables if isinstance(value, dict) else lines).append((key, value))
    out = [f"{_key(k)} = {_value(v)}" for k, v in lines]
    for key, value in tables:
        out += _table(_key(key), value)
    return "\n".join(out) + "\n"


def _table(name: str, data: dict) -> list[str]:
    out = ["", f"[{name}]"] + [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, value in data.items():
        if isinstance(value, dict):
            out += _table(f"{name}.{_key(key)}", value)
    return out


def _key(key: str) -> str:
    return key if key.replace("_", "a").replace("-", "a").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(value)  # JSON string escapes are TOML basic-string escapes


# ---------------------------------------------------------------------------- checkpoint set-ups


def _edit(role: str, **changes) -> Callable[[Path], None]:
    def setup(family: Path) -> None:
        path = family / role / "config.json"
        cfg = json.loads(path.read_text())
        cfg.update(changes)
        path.write_text(json.dumps(cfg))
    return setup


def _write(relpath: str, content: bytes | str) -> Callable[[Path], None]:
    def setup(family: Path) -> None:
        path = family / relpath
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return setup


def _remove(relpath: str) -> Callable[[Path], None]:
    return lambda family: (family / relpath).unlink()


def _bin_only(family: Path) -> None:
    (family / "target" / "model.safetensors").unlink()
    (family / "target" / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # never unpickled


def _missing_shard(family: Path) -> None:
    target = family / "target"
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (target / "model.safetensors").rename(target / shards[0])
    index = {"weight_map": {"model.embed_tokens.weight": shards[0], "lm_head.weight": shards[1]}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))


def _other_tokenizer(family: Path) -> None:
    data = json.loads((family / "target" / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["v1"] = vocab.pop("w1")
    (family / "draft" / "tokenizer.json").write_text(json.dumps(data))


# ------------------------------------------------------------------------------------------ cases

P = "$prompt"


def _req(text: Any = P, max_tokens: Any = 8, **more) -> tuple:
    """An ensemble request: text_input, max_tokens and `more` (name=(value, dtype)); None leaves one out."""
    inputs = []
    if text is not None:
        inputs.append(("text_input", [[text]], "BYTES"))
    if max_tokens is not None:
        inputs.append(("max_tokens", [[max_tokens]], "INT32"))
    inputs += [(name, [[value]] if not isinstance(value, list) else value, dtype)
               for name, (value, dtype) in more.items()]
    return tuple(inputs)


CASES: list[Case] = [
    # --------------------------------------------------------------------------------- spec
    Case("spec-unknown-key", "spec", "`speculative.bogus = 1`", r"^error: speculative\.bogus = 1: unknown key", 2,
         spec={"speculative": {"bogus": 1}}),
    Case("spec-unknown-section", "spec", "a `[servng]` table (misspelt)", r"^error: servng: unknown key", 2,
         spec={"servng": {"grpc_port": 1}}),
    Case("spec-wrong-type", "spec", "`num_draft_tokens = \"four\"`",
         r"^error: speculative\.num_draft_tokens = 'four': Input should be a valid integer", 2,
         spec={"speculative": {"num_draft_tokens": "four"}}),
    Case("spec-section-not-table", "spec", "`model = 5`", r"^error: model = 5: Input should be a valid dictionary", 2,
         spec={"model": 5}),
    Case("spec-bool-as-int", "spec", "`limits.max_batch_size = true`",
         r"^error: limits\.max_batch_size = True: Input should be a valid integer", 2,
         spec={"limits": {"max_batch_size": True}}),
    Case("spec-bad-method", "spec", "`method = \"medussa\"`",
         r"^error: speculative\.method = 'medussa': Input should be 'draft-model', 'medusa'", 2,
         spec={"speculative": {"method": "medussa"}}),
    Case("spec-bad-dtype", "spec", "`model.dtype = \"int3\"`", r"^error: model\.dtype = 'int3': Input should be", 2,
         spec={"model": {"dtype": "int3"}}),
    Case("spec-k-too-large", "spec", "`num_draft_tokens = 99`",
         r"^error: speculative\.num_draft_tokens = 99: Input should be less than or equal to 64", 2,
         spec={"speculative": {"num_draft_tokens": 99}}),
    Case("spec-k-zero", "spec", "`num_draft_tokens = 0`",
         r"^error: speculative\.num_draft_tokens = 0: Input should be greater than or equal to 1", 2,
         spec={"speculative": {"num_draft_tokens": 0}}),
    Case("spec-negative-batch", "spec", "`limits.max_batch_size = -1`",
         r"^error: limits\.max_batch_size = -1: Input should be greater than or equal to 1", 2,
         spec={"limits": {"max_batch_size": -1}}),
    Case("spec-name-dotdot", "spec", "`model.name = \"..\"`",
         r"^error: model\.name = '\.\.': not usable as a directory name: is a relative directory", 2,
         spec={"model": {"name": ".."}}),
    Case("spec-name-slash", "spec", "`model.name = \"a/b\"`",
         r"^error: model\.name = 'a/b': not usable as a directory name: contains a path separator", 2,
         spec={"model": {"name": "a/b"}}),
    Case("spec-name-nul", "spec", "`model.name = \"a\\u0000b\"`",
         r"^error: model\.name = 'a\\x00b': not usable as a directory name: contains a NUL byte", 2,
         spec={"model": {"name": "a\0b"}}),
    Case("spec-ensemble-empty", "spec", "`serving.ensemble_name = \"\"`",
         r"^error: serving\.ensemble_name = '': not usable as a directory name: is empty", 2,
         spec={"serving": {"ensemble_name": ""}}),
    Case("spec-ensemble-reserved", "spec", "`serving.ensemble_name = \"preprocessing\"`",
         r"^error: serving\.ensemble_name = 'preprocessing': is the name of another model", 2,
         spec={"serving": {"ensemble_name": "preprocessing"}}),
    Case("spec-ports-clash", "spec", "`http_port = grpc_port = 9000`",
         r"^error: serving\.grpc_port = \{.*\}: http, grpc and metrics ports must differ", 2,
         spec={"serving": {"http_port": 9000, "grpc_port": 9000}}),
    Case("spec-serving-host", "spec", "`serving.host = \"0.0.0.0\"` (the bind address is `serve --host`)",
         r"^error: serving\.host = '0\.0\.0\.0': unknown key", 2, spec={"serving": {"host": "0.0.0.0"}}),
    Case("spec-missing-draft", "spec", "method `draft-model` without `draft`",
         r"^error: speculative\.draft: method 'draft-model' needs a draft checkpoint", 2,
         spec={"speculative": {"draft": DROP}}),
    Case("spec-draft-for-lookahead", "spec", "method `lookahead` with a `draft`",
         r"^error: speculative\.draft = '.*': only used by method 'draft-model' \(method is 'lookahead'\)", 2,
         spec={"speculative": {"method": "lookahead"}}),
    Case("spec-missing-heads", "spec", "method `medusa` without `heads`",
         r"^error: speculative\.heads: method 'medusa' needs its heads dir", 2,
         spec={"speculative": {"method": "medusa", "draft": DROP}}),
    Case("spec-tree-orphan", "spec", "`choices = [[0], [1, 0]]` (parent [1] missing)",
         r"^error: speculative\.choices\[1\] = \[1, 0\]: parent path \[1\] is not listed before it", 2,
         spec=MEDUSA | {"speculative": MEDUSA["speculative"] | {"choices": [[0], [1, 0]]}}),
    Case("spec-tree-over-k", "spec", "a 4-node tree with `num_draft_tokens = 3`",
         r"^error: speculative\.num_draft_tokens = 3: the tree in speculative\.choices has 4 nodes", 2,
         spec={"speculative": MEDUSA["speculative"] | {"choices": [[0], [1], [0, 0], [0, 1]]}}),
    Case("spec-min-k-over-k", "spec", "`adaptive.min_draft_tokens = 8` with K = 4",
         r"^error: speculative\.adaptive\.min_draft_tokens = 8: exceeds speculative\.num_draft_tokens \(4\)", 2,
         spec={"speculative": {"adaptive": {"min_draft_tokens": 8}}}),
    Case("spec-lookahead-ngram-1", "spec", "lookahead with `ngram = 1`",
         r"^error: speculative\.lookahead\.ngram = 1: lookahead needs n-grams of length >= 2", 2,
         spec={"speculative": {"method": "lookahead", "draft": DROP, "lookahead": {"ngram": 1}}}),
    Case("spec-schema-missing", "spec", "no `schema` key", r"^error: schema: Field required", 2,
         spec={"schema": DROP}),
    Case("spec-schema-future", "spec", "`schema = 2`", r"^error: schema = 2: unsupported schema version", 2,
         spec={"schema": 2}),
    Case("spec-trtllm-on-cpu", "spec", "`runtime.kind = \"trtllm-engine\"` with `gpu.type = \"cpu\"`",
         r"^error: gpu\.type = 'cpu': runtime 'trtllm-engine' needs a GPU", 2,
         spec={"runtime": {"kind": "trtllm-engine"}}),
    Case("spec-torch-tensor-parallel", "spec", "`gpu.tensor_parallel = 2` on the torch runtime",
         r"^error: gpu\.tensor_parallel = 2: the torch runtime runs on one device", 2,
         spec={"gpu": {"count": 2, "tensor_parallel": 2}}),
    Case("spec-not-toml", "spec", "a file that is not TOML (`[model`)", r"^error: .*: not valid TOML: ", 2,
         spec=b"schema = 1\n[model\n"),
    Case("spec-not-utf8", "spec", "a file that is not UTF-8", r"^error: .*: not UTF-8 text", 2,
         spec=b"\xff\xfe[model]\n"),
    Case("spec-target-not-found", "spec", "`model.target` a dir that does not exist",
         r"^error: model\.target = '.*/nope': directory not found", 2, spec={"model": {"target": "nope"}}),
    Case("spec-target-tilde-user", "spec", "`model.target = \"~nosuchuser/m\"`",
         r"^error: model\.target = '~nosuchuser/m': cannot expand ~nosuchuser: no such user", 2,
         spec={"model": {"target": "~nosuchuser/m"}}),
    Case("spec-target-nul", "spec", "`model.target = \"a\\u0000b\"`",
         r"^error: model\.target = 'a\\x00b': contains a NUL byte", 2, spec={"model": {"target": "a\0b"}}),
    # --------------------------------------------------------------------------- checkpoint
    Case("ckpt-no-config", "checkpoint", "target dir without `config.json`",
         r"^error: model\.target = '.*/target': no config\.json in the directory", 2,
         setup=_remove("target/config.json")),
    Case("ckpt-config-broken-json", "checkpoint", "`config.json` is not JSON",
         r"^error: .*/target/config\.json: invalid JSON: ", 3, setup=_write("target/config.json", "{")),
    Case("ckpt-config-not-object", "checkpoint", "`config.json` holds a JSON list",
         r"^error: .*/target/config\.json: holds a JSON list, not an object", 3,
         setup=_write("target/config.json", "[1, 2]")),
    Case("ckpt-config-not-object-local", "checkpoint", "`config.json` holds a JSON list (`generate --local`)",
         r"^error: .*/target/config\.json: holds a JSON list, not an object", 3,
         setup=_write("target/config.json", "[1, 2]"), argv=LOCAL),
    Case("ckpt-config-not-object-convert", "checkpoint", "`config.json` holds a JSON list (`convert`)",
         r"^error: .*/target/config\.json: holds a JSON list, not an object", 4, spec=LOOKAHEAD,
         setup=_write("target/config.json", "[1, 2]"), argv=("convert", "-c", "{spec}", "--out", "{tmp}/converted")),
    Case("ckpt-config-not-utf8", "checkpoint", "`config.json` is not UTF-8",
         r"^error: .*/target/config\.json: not UTF-8 text", 3, setup=_write("target/config.json", b"\xff\xfe{}")),
    Case("ckpt-config-not-utf8-convert", "checkpoint", "`config.json` is not UTF-8 (`convert`)",
         r"^error: .*/target/config\.json: not UTF-8 text", 4, spec=LOOKAHEAD,
         setup=_write("target/config.json", b"\xff\xfe{}"),
         argv=("convert", "-c", "{spec}", "--out", "{tmp}/converted")),
    Case("ckpt-unsupported-arch", "checkpoint", "`architectures = [\"GPT2LMHeadModel\"]`",
         r"^error: model\.target = '.*': architecture GPT2LMHeadModel is not supported", 3,
         spec=LOOKAHEAD, setup=_edit("target", architectures=["GPT2LMHeadModel"])),
    Case("ckpt-vocab-vs-weights", "checkpoint", "target `vocab_size = 97`, weights hold 96 rows",
         r"^error: model\.target = '.*': config\.json vocab_size = 97 disagrees with the weights: "
         r"model\.embed_tokens\.weight", 3, spec=LOOKAHEAD, setup=_edit("target", vocab_size=97)),
    Case("ckpt-layers-vs-weights", "checkpoint", "target `num_hidden_layers = 3`, weights hold 2",
         r"^error: model\.target = '.*': config\.json num_hidden_layers = 3 disagrees with the weights: .*"
         r"2 decoder layer\(s\)", 3, spec=LOOKAHEAD, setup=_edit("target", num_hidden_layers=3)),
    Case("ckpt-heads-vs-weights", "checkpoint", "target `num_attention_heads = 8`, q_proj sized for 4",
         r"^error: model\.target = '.*': config\.json num_attention_heads = 8 disagrees with the weights: .*q_proj",
         3, spec=LOOKAHEAD, setup=_edit("target", num_attention_heads=8)),
    Case("ckpt-truncated-weights", "checkpoint", "`model.safetensors` is 16 bytes of garbage",
         r"^error: model\.target = '.*': .*model\.safetensors: not a readable safetensors file", 3,
         spec=LOOKAHEAD, setup=_write("target/model.safetensors", b"\xff" * 16)),
    Case("ckpt-missing-shard", "checkpoint", "a safetensors index listing a shard that is missing",
         r"^error: model\.target = '.*': .*lists model-00002-of-00002\.safetensors, which is missing", 3,
         spec=LOOKAHEAD, setup=_missing_shard),
    Case("ckpt-short-positions", "checkpoint", "target `max_position_embeddings = 32` < 64 + 64 + K",
         r"^error: limits\.max_output_len = 64: max_input_len \+ max_output_len \+ num_draft_tokens = 132 exceeds "
         r"the target's max_position_embeddings \(32\)", 3, spec=LOOKAHEAD,
         setup=_edit("target", max_position_embeddings=32)),
    Case("ckpt-no-tokenizer", "checkpoint", "target dir without `tokenizer.json`",
         r"^error: model\.tokenizer = '.*/target': no tokenizer\.json found", 3,
         setup=_remove("target/tokenizer.json")),
    Case("ckpt-tokenizer-broken-json", "checkpoint", "`tokenizer.json` is not JSON",
         r"^error: .*/target/tokenizer\.json: invalid JSON: ", 3, setup=_write("target/tokenizer.json", "{")),
    Case("ckpt-tokenizer-not-object", "checkpoint", "`tokenizer.json` holds a JSON string",
         r"^error: .*/target/tokenizer\.json: holds a JSON string, not an object", 3,
         setup=_write("target/tokenizer.json", '"tok"')),
    Case("ckpt-draft-vocab", "checkpoint", "draft `vocab_size = 97` (target: 96)",
         r"^error: speculative\.draft = '.*': vocab_size 97 differs from the target's 96", 3,
         setup=_edit("draft", vocab_size=97)),
    Case("ckpt-draft-tokenizer", "checkpoint", "draft with a tokenizer of another vocabulary",
         r"^error: speculative\.draft = '.*': its tokenizer differs from the target's", 3, setup=_other_tokenizer),
    Case("ckpt-medusa-no-weights", "checkpoint", "Medusa heads dir without `medusa_lm_head.safetensors`",
         r"^error: speculative\.heads = '.*': no medusa_lm_head\.safetensors", 3, spec=MEDUSA,
         setup=_remove("medusa/medusa_lm_head.safetensors")),
    Case("ckpt-medusa-heads-count", "checkpoint", "`medusa_num_heads = 4`, weights hold 3 heads",
         r"^error: speculative\.heads = '.*': config\.json medusa_num_heads = 4 disagrees with the weights", 3,
         spec=MEDUSA, setup=_edit("medusa", medusa_num_heads=4)),
    Case("ckpt-eagle-hidden", "checkpoint", "EAGLE head `hidden_size = 32` (target: 64)",
         r"^error: speculative\.heads = '.*': hidden_size 32 differs from the target's 64", 3, spec=EAGLE,
         setup=_edit("eagle", hidden_size=32)),
    Case("ckpt-bin-only", "checkpoint", "only `pytorch_model.bin` weights (`generate --local`)",
         r"^error: .*/target: only PyTorch \.bin weights found", 3, setup=_bin_only, argv=LOCAL),
    # ---------------------------------------------------------------------------------- cli
    Case("cli-no-spec-file", "cli", "`check -c nope.toml` (no such file)",
         r"^error: spec file not found: .*nope\.toml", 2,
         argv=("check", "-c", "{tmp}/nope.toml")),
    Case("cli-init-exists", "cli", "`init` over an existing file", r"^error: .*spec\.toml already exists", 2,
         argv=("init", "{spec}")),
    Case("cli-unknown-option", "cli", "`check --bogus`", r"^error: No such option '--bogus'", 64,
         argv=("check", "--bogus")),
    Case("cli-unknown-option-suggests", "cli", "`check --jsn` (a typo)",
         r"^error: No such option '--jsn'\. Did you mean '--json'\?", 64, argv=("check", "--jsn")),
    Case("cli-unknown-command", "cli", "`trtspec chek`", r"^error: No such command 'chek'", 64, argv=("chek",)),
    Case("cli-unknown-global-option", "cli", "`trtspec --bogus check`", r"^error: No such option '--bogus'", 64,
         argv=("--bogus", "check")),
    Case("cli-missing-value", "cli", "`check -c` (no value)", r"^error: Option '-c' requires an argument", 64,
         argv=("check", "-c")),
    Case("cli-flag-out-of-range", "cli", "`generate -n 0`",
         r"^error: Invalid value for '-n' / '--max-tokens': 0 is not in the range x>=1", 64,
         argv=LOCAL + ("-n", "0")),
    Case("cli-cert-without-key", "cli", "`serve --grpc-server-cert` without `--grpc-server-key`",
         r"^error: --grpc-server-cert and --grpc-server-key go together", 64,
         argv=("serve", "-c", "{spec}", "--foreground", "--grpc-server-cert", "{pem}")),
    Case("cli-empty-prompt", "cli", "`generate -p \"  \"`", r"^error: the prompt is empty", 6,
         argv=LOCAL + ("-p", "  ")),
    Case("cli-too-many-tokens", "cli", "`generate --local -n 100000` (max_output_len 64)",
         r"^error: max_new_tokens = 100000 must be an integer in 1\.\.64", 6, argv=LOCAL + ("-n", "100000")),
    Case("cli-k-too-large", "cli", "`generate --local --num-draft-tokens 99` (K = 4)",
         r"^error: num_draft_tokens = 99 must be in 0\.\.4", 6, argv=LOCAL + ("--num-draft-tokens", "99")),
    Case("cli-temperature-nan", "cli", "`generate --local --temperature nan`",
         r"^error: bad sampling setting: temperature = nan", 6, argv=LOCAL + ("--temperature", "nan")),
    Case("cli-top-p-nan", "cli", "`generate --local --top-p nan`", r"^error: bad sampling setting: top_p = nan", 6,
         argv=LOCAL + ("--top-p", "nan")),
    Case("cli-seed-overflow", "cli", "`generate --local --seed 18446744073709551616` (2^64)",
         r"^error: bad sampling setting: seed = 18446744073709551616", 6,
         argv=LOCAL + ("--temperature", "1", "--seed", str(2**64))),
    Case("cli-url-scheme", "cli", "`generate --url bogus://h:1`", r"^error: unknown scheme 'bogus' in 'bogus://h:1'", 6,
         argv=("generate", "-c", "{spec}", "-p", "w1", "--url", "bogus://h:1")),
    Case("cli-url-no-port", "cli", "`generate --url localhost`", r"^error: bad server address 'localhost'", 6,
         argv=("generate", "-c", "{spec}", "-p", "w1", "--url", "localhost")),
    Case("cli-url-refused", "cli", "`generate --url` a port nothing listens on",
         r"^error: cannot reach Triton at 127\.0\.0\.1:\S+: connection refused", 6,
         argv=("generate", "-c", "{spec}", "-p", "w1", "--url", "127.0.0.1:{closed_port}", "--timeout", "10")),
    Case("cli-plain-url-with-ssl", "cli", "`generate --url grpc://... --ssl`",
         r"^error: 'grpc://127\.0\.0\.1:\S+' is plaintext \(grpc://\) but TLS options were given", 6,
         argv=("generate", "-c", "{spec}", "-p", "w1", "--url", "grpc://127.0.0.1:{closed_port}", "--ssl",
               "--timeout", "10")),
    Case("cli-bad-header", "cli", "`generate -H nonsense`", r"^error: bad header 'nonsense'", 6,
         argv=("generate", "-c", "{spec}", "-p", "w1", "-H", "nonsense")),
    Case("cli-half-mtls", "cli", "`generate --private-key K` without `--certificate-chain`",
         r"^error: mutual TLS needs both --private-key and --certificate-chain", 6,
         argv=("generate", "-c", "{spec}", "-p", "w1", "--url", "127.0.0.1:{closed_port}", "--private-key", "{pem}")),
    Case("cli-serve-not-built", "cli", "`serve` before `build`",
         r"^error: no model repository for 'cat' at model_repository/cat", 5, argv=("serve", "-c", "{spec}")),
    Case("cli-serve-short-admin-key", "cli", "`serve --admin-key abc`",
         r"^error: the admin key must be 16-256 characters", 5, argv=("serve", "-c", "{spec}", "--admin-key", "abc")),
    Case("cli-serve-bad-host", "cli", "`serve --host 'bad!host'`", r"^error: bad bind address 'bad!host'", 5,
         argv=("serve", "-c", "{spec}", "--host", "bad!host")),
    Case("cli-deploy-not-built", "cli", "`deploy` before `build`",
         r"^error: no built model repository for 'cat' at .*model_repository/cat", 5,
         argv=("deploy", "-c", "{spec}", "--url", "127.0.0.1:{closed_port}", "--server-repo", "{tmp}/server")),
    # ------------------------------------------------------------------------------ request
    Case("req-empty-prompt", "request", "`text_input = \"\"`", r"the prompt is empty$", status="in-stream",
         inputs=_req("")),
    Case("req-blank-prompt", "request", "`text_input` only whitespace", r"the prompt is empty$", status="in-stream",
         inputs=_req("  \n\t")),
    Case("req-no-text-input", "request", "no `text_input`", r"input 'text_input' is required$", status="in-stream",
         inputs=_req(None)),
    Case("req-no-max-tokens", "request", "no `max_tokens` (but a `temperature`)", r"input 'max_tokens' is required$",
         status="in-stream", inputs=_req(max_tokens=None, temperature=(0.0, "FP32"))),
    Case("req-no-inputs", "request", "no inputs at all", r"request has 0 inputs$", status="in-stream"),
    Case("req-huge-prompt", "request", "a 120 kB prompt",
         r"the prompt has 120000 bytes, more than the \d+ bytes allowed for max_input_len=\d+ tokens$",
         status="in-stream", inputs=_req("$huge")),
    Case("req-long-prompt", "request", "a prompt of more than max_input_len tokens",
         r"the prompt has \d+ tokens, more than max_input_len=\d+$", status="in-stream", inputs=_req("$long")),
    Case("req-max-tokens-zero", "request", "`max_tokens = 0`",
         r"max_tokens must be > 0 and at most max_output_len=\d+ \(an INT32 in 1\.\.\d+\)$", status="in-stream",
         inputs=_req(max_tokens=0)),
    Case("req-max-tokens-negative", "request", "`max_tokens = -5`", r"max_tokens must be > 0 and at most",
         status="in-stream", inputs=_req(max_tokens=-5)),
    Case("req-max-tokens-huge", "request", "`max_tokens = 1000000000`",
         r"max_tokens=1000000000 exceeds max_output_len=\d+$", status="in-stream", inputs=_req(max_tokens=10**9)),
    Case("req-max-tokens-fp32", "request", "`max_tokens` sent as FP32",
         r"inference input 'max_tokens' data-type is 'FP32', but model 'ensemble' expects 'INT32'$",
         status="in-stream", inputs=(("text_input", [[P]], "BYTES"), ("max_tokens", [[8.0]], "FP32"))),
    Case("req-text-int32", "request", "`text_input` sent as INT32",
         r"inference input 'text_input' data-type is 'INT32', but model 'ensemble' expects 'BYTES'$",
         status="in-stream", inputs=(("text_input", [[5]], "INT32"), ("max_tokens", [[8]], "INT32"))),
    Case("req-temperature-nan", "request", "`temperature = NaN`",
         r"input 'temperature' must be a finite number, got nan$", status="in-stream",
         inputs=_req(temperature=(float("nan"), "FP32"))),
    Case("req-temperature-negative", "request", "`temperature = -1`",
         r"bad sampling setting: temperature = -1\.0$", status="in-stream", inputs=_req(temperature=(-1.0, "FP32"))),
    Case("req-top-p-zero", "request", "`top_p = 0`", r"bad sampling setting: top_p = 0\.0$", status="in-stream",
         inputs=_req(top_p=(0.0, "FP32"))),
    Case("req-top-p-inf", "request", "`top_p = inf`", r"input 'top_p' must be a finite number, got inf$",
         status="in-stream", inputs=_req(top_p=(float("inf"), "FP32"))),
    Case("req-top-k-negative", "request", "`top_k = -3`", r"bad sampling setting: top_k = -3$", status="in-stream",
         inputs=_req(top_k=(-3, "INT32"))),
    Case("req-k-too-large", "request", "`num_draft_tokens = 99` (the spec's K: 4)",
         r"num_draft_tokens must be in 0\.\.4 \(0: no speculation\)$", status="in-stream",
         inputs=_req(num_draft_tokens=(99, "INT32"))),
    Case("req-k-negative", "request", "`num_draft_tokens = -1`", r"num_draft_tokens must be in 0\.\.4",
         status="in-stream", inputs=_req(num_draft_tokens=(-1, "INT32"))),
    Case("req-end-id-out-of-vocab", "request", "`end_id = 1000000000`",
         r"end_id = 1000000000 must be -1 \(none\) or a token id in \[0, \d+\)$", status="in-stream",
         inputs=_req(end_id=(10**9, "INT32"))),
    Case("req-unknown-input", "request", "an input `foo` the model does not have",
         r"unexpected inference input 'foo' for model 'ensemble'$", status="in-stream",
         inputs=_req(foo=(1, "INT32"))),
    Case("req-unknown-parameter", "request", "request parameter `bogus`",
         r"unknown parameter 'bogus'; known inputs: end_id, max_tokens, ", status="in-stream", inputs=_req(),
         parameters={"bogus": 1}),
    Case("req-batch-2", "request", "two prompts in one request (`[2, 1]`)",
         r"send one prompt per request \('text_input' has batch size 2\); concurrent requests are batched",
         status="in-stream", inputs=(("text_input", [[P], [P]], "BYTES"), ("max_tokens", [[8], [8]], "INT32"))),
    Case("req-batch-over-max", "request", "five prompts (over max_batch_size 4)",
         r"inference request batch-size must be <= 4 for 'ensemble'$", status="in-stream",
         inputs=(("text_input", [[P]] * 5, "BYTES"), ("max_tokens", [[8]] * 5, "INT32"))),
    Case("req-bad-shape", "request", "`text_input` of shape `[1, 2]`",
         r"unexpected shape for input 'text_input' for model 'ensemble'\. Expected \[-1,1\], got \[1,2\]",
         status="in-stream", inputs=(("text_input", [[P, P]], "BYTES"), ("max_tokens", [[8]], "INT32"))),
    Case("req-unknown-model", "request", "model `nope`", r"Request for unknown model: 'nope' is not found$",
         status="NOT_FOUND", model="nope", inputs=_req(), unary=True),
    Case("req-unary-to-stream", "request", "a unary ModelInfer to the (decoupled) ensemble",
         r"ModelInfer RPC doesn't support models with decoupled transaction policy$", status="UNIMPLEMENTED",
         inputs=_req(), unary=True),
    Case("req-pre-empty", "request", "direct `preprocessing` call, empty `QUERY`", r"^the prompt is empty$",
         status="INVALID_ARGUMENT", model="preprocessing", unary=True,
         inputs=(("QUERY", [[""]], "BYTES"), ("REQUEST_OUTPUT_LEN", [[8]], "INT32"))),
    Case("req-post-negative-id", "request", "direct `postprocessing` call, token id -3",
         r"^input 'TOKENS_BATCH' holds token id -3, outside 0\.\.\d+$", status="INVALID_ARGUMENT",
         model="postprocessing", unary=True,
         inputs=(("TOKENS_BATCH", [[[-3]]], "INT32"), ("SEQUENCE_LENGTH", [[1]], "INT32"))),
    Case("req-post-empty-ids", "request", "direct `postprocessing` call, `TOKENS_BATCH` of shape `[1, 1, 0]`",
         r"^input 'TOKENS_BATCH' of shape \[1, 1, 0\] holds no ids: send at least one beam of at least one id",
         status="INVALID_ARGUMENT", model="postprocessing", unary=True,
         inputs=(("TOKENS_BATCH", "$empty_ids", "INT32"), ("SEQUENCE_LENGTH", [[0]], "INT32"))),
    Case("req-gen-length-past-ids", "request", "direct `tensorrt_llm` call, `input_lengths` 9 for 3 ids",
         r"^input_lengths 9 is outside 0\.\.3 \(the ids in input_ids\)$", status="in-stream", model="tensorrt_llm",
         inputs=(("input_ids", [[5, 6, 7]], "INT32"), ("input_lengths", [[9]], "INT32"),
                 ("request_output_len", [[4]], "INT32"))),
    Case("req-gen-id-out-of-vocab", "request", "direct `tensorrt_llm` call, token id 1000000",
         r"^prompt token ids must be in \[0, \d+\)$", status="in-stream", model="tensorrt_llm",
         inputs=(("input_ids", [[5, 10**6, 7]], "INT32"), ("input_lengths", [[3]], "INT32"),
                 ("request_output_len", [[4]], "INT32"))),
    Case("req-cli-max-tokens", "request", "`trtspec generate --url ... -n 100000`",
         r"^error: server error: in ensemble 'ensemble', max_tokens=100000 exceeds max_output_len=\d+$", 6,
         argv=("generate", "--url", "{grpc_url}", "-p", "def f():", "-n", "100000")),
]
