"""The TensorRT-LLM converter stays Llama-family: Mistral converts (as TensorRT-LLM's Llama converter takes it),
Qwen2/Qwen3 are refused with a pointer to trtllm-llmapi."""

from __future__ import annotations

import json

import pytest
import torch

from tests.architectures import models
from trtspec.convert import ConvertJob, read_checkpoint, run_job
from trtspec.errors import ConvertError


def test_mistral_converts_as_llama(tmp_path):
    from safetensors.torch import load_file

    models.save(tmp_path / "m", "mistral", seed=1, tokenizer=False, sliding_window=8)
    run_job(ConvertJob("target", "llama", tmp_path / "m", None, tmp_path / "ckpt", dtype="float32"))
    # TensorRT-LLM's model map runs MistralForCausalLM checkpoints with its Llama model
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["architecture"] == "MistralForCausalLM"
    back, src = read_checkpoint(tmp_path / "ckpt").target, load_file(str(tmp_path / "m" / "model.safetensors"))
    assert set(back) == set(src) and all(torch.equal(back[k], src[k]) for k in src)


@pytest.mark.parametrize("model_type,name", [("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM")])
def test_other_architectures_are_refused_with_a_pointer_to_llmapi(tmp_path, model_type, name):
    models.save(tmp_path / "m", model_type, seed=1, tokenizer=False)
    with pytest.raises(ConvertError) as err:
        run_job(ConvertJob("target", "llama", tmp_path / "m", None, tmp_path / "ckpt"))
    assert name in err.value.message and "trtllm-llmapi" in err.value.hint
    assert not (tmp_path / "ckpt").exists()
