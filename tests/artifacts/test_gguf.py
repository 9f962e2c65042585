"""`trtspec models import`: GGUF -> HF checkpoint on small GGUF files written here with the `gguf` package
(a tiny Llama with a byte-level BPE tokenizer and a chat template, tensors in F32, Q8_0 and Q4_1): the import's
logits equal transformers' own GGUF loading, exact weights where the file is exact, the tokenizer, template and
EOS carried over, a manifest, idempotence, atomicity and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tests.architectures import models
from trtspec.artifacts import gguf as importer
from trtspec.errors import ConvertError

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("Ġ", "t"), ("Ġt", "he"), ("o", "r"), ("i", "n"), ("Ġ", "a"), ("e", "r")]
TEMPLATE = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")


def _vocab() -> list[str]:
    from tokenizers.pre_tokenizers import ByteLevel

    tokens = SPECIALS + sorted(ByteLevel.alphabet())
    return tokens + [a + b for a, b in MERGES]


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf q/k row order (transformers' loader undoes it)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, hf_dir: Path, tied: bool = True) -> Path:
    """A llama.cpp-style GGUF of the HF checkpoint in hf_dir (written by transformers)."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    w = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    tokens = _vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_dimension_count(cfg["head_dim"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    Q = gguf.GGMLQuantizationType

    def put(name: str, arr: np.ndarray, qtype=None) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype is None:
            writer.add_tensor(name, arr)
        else:
            writer.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    put("token_embd.weight", w["model.embed_tokens.weight"], Q.Q8_0)
    put("output_norm.weight", w["model.norm.weight"])
    if not tied:
        put("output.weight", w["lm_head.weight"], Q.Q8_0)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", w[p + "input_layernorm.weight"])
        put(f"blk.{i}.ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", _permute(w[p + "self_attn.q_proj.weight"], nh))
        put(f"blk.{i}.attn_k.weight", _permute(w[p + "self_attn.k_proj.weight"], nkv))
        put(f"blk.{i}.attn_v.weight", w[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", w[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_gate.weight", w[p + "mlp.gate_proj.weight"], Q.Q4_1)
        put(f"blk.{i}.ffn_up.weight", w[p + "mlp.up_proj.weight"], Q.Q4_1)
        put(f"blk.{i}.ffn_down.weight", w[p + "mlp.down_proj.weight"], Q.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path]:
    """(the HF checkpoint, its GGUF)."""
    root = tmp_path_factory.mktemp("gguf")
    models.save(root / "hf", "llama", seed=3, tokenizer=False, vocab_size=len(_vocab()),
                tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    return root / "hf", write_gguf(root / "tiny.gguf", root / "hf")


@pytest.fixture(scope="module")
def imported(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "tiny"
    importer.import_gguf(source[1], out)
    return out


def _transformers_gguf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def test_imported_logits_equal_transformers_gguf_loading(source, imported):
    from transformers import AutoModelForCausalLM

    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.llama import Llama

    ref_model = _transformers_gguf(source[1])
    ids = torch.randint(0, len(_vocab()), (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = ref_model(ids).logits
        hf = AutoModelForCausalLM.from_pretrained(imported, dtype=torch.float32).eval()(ids).logits
    ours = Llama.from_dir(imported, max_seq=32)
    inp = chain_inputs([0], 24)
    got, _ = ours.forward(ours.new_cache(1), inp.positions, inp.start, inp.mask, tokens=ids)
    assert ref.abs().max() > 1.0
    assert torch.equal(hf, ref)  # the checkpoint is the model transformers loads from the GGUF
    assert (got - ref).abs().max().item() <= 1e-4
    assert ours.lm_head is ours.embed  # tied: stored once


def test_exact_tensors_round_trip_and_the_checkpoint_is_complete(source, imported):
    from safetensors.torch import load_file

    hf, back = load_file(str(source[0] / "model.safetensors")), load_file(str(imported / "model.safetensors"))
    assert "lm_head.weight" not in back  # a tied head is the embedding, stored once
    for k in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
              "model.layers.0.self_attn.o_proj.weight", "model.norm.weight"):  # F32 in the file: exact
        assert torch.equal(back[k], hf[k]), k
    q4 = back["model.layers.0.mlp.up_proj.weight"] - hf["model.layers.0.mlp.up_proj.weight"]
    assert 0 < q4.abs().max() < 0.25 * hf["model.layers.0.mlp.up_proj.weight"].abs().max()  # 4-bit, dequantized
    cfg = json.loads((imported / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["dtype"] == "float32"
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] is True
    assert json.loads((imported / "generation_config.json").read_text())["eos_token_id"] == 2


def test_the_tokenizer_and_its_chat_template_come_along(source, imported):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(imported)
    ref = AutoTokenizer.from_pretrained(str(source[1].parent), gguf_file=source[1].name)
    assert json.loads((imported / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    assert not (imported / "chat_template.jinja").exists()
    text = "the other hell in tin"
    assert tok(text)["input_ids"] == ref(text)["input_ids"] and len(tok(text)["input_ids"]) < len(text)
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2


def test_the_manifest_records_source_tensors_dtype_and_versions(source, imported):
    from trtspec.artifacts.fs import sha256_file

    m = json.loads((imported / "trtspec.import.json").read_text())
    assert m["kind"] == "import" and m["dtype"] == "float32"
    assert m["inputs"]["source"]["sha256"] == sha256_file(source[1])
    assert m["inputs"]["gguf"]["tensor_types"] == {"F32": 13, "Q4_1": 6, "Q8_0": 1}
    assert m["tensors"]["count"] == 2 * 9 + 2
    assert m["tensors"]["names"]["model.embed_tokens.weight"] == [len(_vocab()), 64]
    assert {"gguf", "transformers", "torch", "trtspec"} <= set(m["versions"])
    assert set(m["outputs"]) == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                 "tokenizer_config.json"}


def test_importing_again_is_a_no_op_and_another_dtype_needs_force(source, tmp_path):
    out = tmp_path / "m"
    importer.import_gguf(source[1], out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert importer.import_gguf(source[1], out)["skipped"] is True
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with pytest.raises(ConvertError, match="another file or dtype"):
        importer.import_gguf(source[1], out, "bfloat16")
    m = importer.import_gguf(source[1], out, "bfloat16", force=True)
    assert m["dtype"] == "bfloat16" and "skipped" not in m
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
    (out / "config.json").write_text("{}")  # a changed file is not "already imported"
    with pytest.raises(ConvertError, match="was changed"):
        importer.import_gguf(source[1], out, "bfloat16")


def test_bad_sources_are_one_error_and_leave_nothing(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(ConvertError, match="not a GGUF file"):
        importer.import_gguf(tmp_path / "x.gguf", tmp_path / "out")
    (tmp_path / "y.gguf").write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then garbage
    with pytest.raises(ConvertError, match="cannot read"):
        importer.import_gguf(tmp_path / "y.gguf", tmp_path / "out")
    with pytest.raises(ConvertError, match="not found"):
        importer.import_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf", "y.gguf"]  # no out, no temp dirs


def test_cli_imports_and_reports(source, tmp_path):
    from trtspec.cli import main

    out = tmp_path / "cli"
    r = CliRunner().invoke(main, ["models", "import", str(source[1]), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["dtype"] == "float32" and (out / "model.safetensors").is_file()
    r = CliRunner().invoke(main, ["models", "import", str(source[1]), "--out", str(out)])
    assert r.exit_code == 0 and "already imported" in r.output
    (tmp_path / "bad.gguf").write_bytes(b"nope")
    r = CliRunner().invoke(main, ["models", "import", str(tmp_path / "bad.gguf"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 4 and "error:" in r.output and "hint:" in r.output
