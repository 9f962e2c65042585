"""`trtspec models import` of a tiny Qwen2 GGUF in the tensor types of a real Q4_K_M file (Q4_K, Q5_0, Q6_K, Q8_0,
F32), whole and as llama.cpp split files: every tensor equals the `gguf` package's dequantization of what was
written and transformers' own GGUF loading; the tensors are streamed (memory of one row block, not the model);
a missing, damaged or foreign split part is one error naming it and leaves nothing."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.architectures import models
from tests.artifacts.test_gguf import MERGES, SPECIALS, TEMPLATE, _vocab
from trtspec.artifacts import gguf as importer, gguf_tensors
from trtspec.errors import ConvertError

HIDDEN, FFN, HEADS, KV = 256, 512, 4, 2  # K-quant rows hold whole 256-value super-blocks


def _random_blocks(rows: int, cols: int, qtype, rng: np.random.Generator) -> np.ndarray:
    """Well-formed Q4_K / Q6_K rows (gguf-py only decodes these): random quants and scales, small finite f16
    super-block scales."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, size=(raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        raw[:, :4] = scales  # d, dmin
    else:
        raw[:, -2:] = scales[:, :2]  # Q6_K: d is last
    return raw.reshape(rows, cols // block * size)


def write_qwen2(path: Path, hf_dir: Path, *, split_max_tensors: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """A Qwen2 GGUF of the checkpoint in hf_dir; returns (the first file, {HF name: the values the file holds})."""
    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text())
    w = {k: v.float().numpy() for k, v in models_state(hf_dir).items()}
    rng = np.random.default_rng(5)
    tokens = _vocab()
    writer = gguf.GGUFWriter(str(path), "qwen2", split_max_tensors=split_max_tensors,
                             small_first_shard=bool(split_max_tensors))
    writer.add_name("tiny test qwen2")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    Q = gguf.GGMLQuantizationType
    held: dict[str, np.ndarray] = {}

    def put(name: str, hf: str, qtype=Q.F32) -> None:
        arr = np.ascontiguousarray(w[hf], dtype=np.float32)
        if qtype in (Q.Q4_K, Q.Q6_K):
            data = _random_blocks(arr.shape[0], arr.shape[1], qtype, rng)
        else:
            data = arr if qtype == Q.F32 else gguf.quants.quantize(arr, qtype)
        writer.add_tensor(name, data, raw_dtype=None if qtype == Q.F32 else qtype)
        held[hf] = gguf.quants.dequantize(data, qtype).reshape(arr.shape)

    put("token_embd.weight", "model.embed_tokens.weight", Q.Q8_0)
    put("output_norm.weight", "model.norm.weight")
    put("output.weight", "lm_head.weight", Q.Q6_K)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight")
        put(f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight")
        for gg, hf, q in (("attn_q", "q_proj", Q.Q4_K), ("attn_k", "k_proj", Q.Q5_0), ("attn_v", "v_proj", Q.Q8_0)):
            put(f"blk.{i}.{gg}.weight", p + f"self_attn.{hf}.weight", q)
            put(f"blk.{i}.{gg}.bias", p + f"self_attn.{hf}.bias")
        put(f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", Q.Q4_K)
        put(f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", Q.Q5_0)
        put(f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", Q.Q6_K)
        put(f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", Q.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    first = sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf")) if split_max_tensors else [path]
    return first[0], held


def models_state(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(hf_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """(hf dir, whole GGUF, its held values, first split part)."""
    root = tmp_path_factory.mktemp("qwen2gguf")
    models.save(root / "hf", "qwen2", seed=4, tokenizer=False, vocab_size=len(_vocab()), hidden_size=HIDDEN,
                intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HIDDEN // HEADS,
                bos_token_id=0, eos_token_id=2)
    whole, held = write_qwen2(root / "tiny.gguf", root / "hf")
    (root / "split").mkdir()
    first, held_split = write_qwen2(root / "split" / "tiny.gguf", root / "hf", split_max_tensors=7)
    assert all(np.array_equal(held[k], held_split[k]) for k in held)  # the same random blocks (same seed)
    return root / "hf", whole, held, first


def _load(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_k_quants_import_to_the_values_gguf_decodes_and_transformers_loads(qwen, tmp_path):
    from transformers import AutoModelForCausalLM

    _, whole, held, _ = qwen
    m = importer.import_gguf(whole, tmp_path / "out")
    got = _load(tmp_path / "out")
    assert m["inputs"]["gguf"]["tensor_types"] == {"F32": 11, "Q4_K": 6, "Q5_0": 4, "Q6_K": 3, "Q8_0": 3}
    assert set(got) == set(held)
    for k, v in held.items():
        assert torch.equal(got[k], torch.from_numpy(v)), k
    assert held["model.layers.0.self_attn.q_proj.weight"].std() > 0.01  # random blocks decode to real values
    ref = AutoModelForCausalLM.from_pretrained(str(whole.parent), gguf_file=whole.name, dtype=torch.float32)
    for k, v in ref.state_dict().items():
        assert torch.equal(got[k], v), k
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is False and cfg["eos_token_id"] == 2


def test_bfloat16_is_a_cast_of_the_decoded_values(qwen, tmp_path):
    _, whole, held, _ = qwen
    importer.import_gguf(whole, tmp_path / "bf16", "bfloat16")
    got = _load(tmp_path / "bf16")
    for k, v in held.items():
        assert torch.equal(got[k], torch.from_numpy(v).to(torch.bfloat16)), k


def test_tensors_stream_a_row_block_at_a_time(qwen, tmp_path, monkeypatch):
    """The import used to hold every tensor in float32 at once (the model's size); streaming holds one block."""
    _, whole, held, _ = qwen
    importer.import_gguf(whole, tmp_path / "default")
    monkeypatch.setattr(gguf_tensors, "BLOCK_BYTES", 8 << 10)
    write, grew = gguf_tensors.write, []

    def traced(*args, **kw):
        tracemalloc.start()  # numpy's buffers are traced
        try:
            return write(*args, **kw)
        finally:
            grew.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()

    monkeypatch.setattr(gguf_tensors, "write", traced)
    importer.import_gguf(whole, tmp_path / "streamed")
    model_bytes = sum(v.nbytes for v in held.values())
    assert model_bytes > 4_000_000 and len(grew) == 1 and grew[0] < model_bytes / 10, (grew, model_bytes)
    streamed = (tmp_path / "streamed" / "model.safetensors").read_bytes()
    assert streamed == (tmp_path / "default" / "model.safetensors").read_bytes()  # blocks do not change a byte


def test_split_files_import_from_their_first_part(qwen, tmp_path):
    _, whole, _, first = qwen
    files = sorted(first.parent.glob("tiny-*-of-*.gguf"))
    assert len(files) >= 4 and first.name.endswith(f"-00001-of-{len(files):05d}.gguf")
    importer.import_gguf(whole, tmp_path / "whole")
    m = importer.import_gguf(first, tmp_path / "split")
    a, b = _load(tmp_path / "whole"), _load(tmp_path / "split")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [p["name"] for p in m["inputs"]["source"]["parts"]] == [f.name for f in files]
    assert m["inputs"]["source"]["bytes"] == sum(f.stat().st_size for f in files)
    assert m["inputs"]["gguf"]["split_count"] == len(files)
    # the first part holds no tensor (small_first_shard): the untied head is found in a later part
    assert json.loads((tmp_path / "split" / "config.json").read_text())["tie_word_embeddings"] is False
    assert importer.import_gguf(first, tmp_path / "split")["skipped"] is True


def _copy_split(first: Path, to: Path) -> list[Path]:
    to.mkdir()
    out = []
    for f in sorted(first.parent.glob("tiny-*-of-*.gguf")):
        (to / f.name).write_bytes(f.read_bytes())
        out.append(to / f.name)
    return out


def test_a_missing_split_part_is_named_and_nothing_is_written(qwen, tmp_path):
    files = _copy_split(qwen[3], tmp_path / "src")
    files[2].unlink()
    with pytest.raises(ConvertError, match=rf"split GGUF part {files[2].name} is missing") as exc:
        importer.import_gguf(files[0], tmp_path / "out")
    assert "every part" in exc.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_damaged_or_foreign_split_part_is_named(qwen, tmp_path):
    files = _copy_split(qwen[3], tmp_path / "src")
    good = files[1].read_bytes()
    files[1].write_bytes(good[: len(good) // 3])  # truncated
    with pytest.raises(ConvertError, match=rf"{files[1].name}: cannot read it as GGUF"):
        importer.import_gguf(files[0], tmp_path / "out")
    files[1].write_bytes(files[2].read_bytes())  # another part under this name
    with pytest.raises(ConvertError, match=rf"{files[1].name}: its split keys say part 2 of {len(files)}, "
                                           rf"expected part 1"):
        importer.import_gguf(files[0], tmp_path / "out")
    with pytest.raises(ConvertError, match="part 2 of a split GGUF") as exc:
        importer.import_gguf(files[1], tmp_path / "out")
    assert files[0].name in exc.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
