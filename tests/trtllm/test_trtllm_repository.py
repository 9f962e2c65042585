"""Triton repositories of the trtllm runtimes: protobuf-valid configs, no `${...}` left, the
speculative parameters as the C++ backend parses them, ensemble wiring, launch commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from trtspec.backends import launch_command, launch_script_command
from trtspec.backends import build
from trtspec.backends.trtllm_engine_methods import engine_method
from trtspec.builders.trtllm import memory
from trtspec.convert import params
from trtspec.errors import RepositoryError
from trtspec.repository import pbtxt
from trtspec.repository.trtllm import (OMITTED_PARAMETERS, install_upstream_files, missing_files, relocate_repository,
                                       render_engine_repository, render_llmapi_repository)
from trtspec.backends.trtllm_llmapi_methods import llm_args, ngram_config, speculative_config

# Every ${...} key of the upstream tensorrt_llm/config.pbtxt template (reference §3.3), with the
# parameter key it fills (some template variables fill differently named keys).
TEMPLATE_PARAMS = [
    "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path", "encoder_model_path",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length", "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction", "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks", "exclude_input_in_output", "cancellation_check_period_ms", "stats_check_period_ms",
    "iter_stats_max_iterations", "request_stats_max_iterations", "enable_kv_cache_reuse", "normalize_log_probs",
    "enable_chunked_context", "gpu_device_ids", "participant_ids", "num_nodes", "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes",
    "lora_prefetch_dir", "decoding_mode", "executor_worker_path", "lookahead_window_size", "lookahead_ngram_size",
    "lookahead_verification_set_size", "medusa_choices", "eagle_choices", "gpu_weights_percent",
    "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode", "cuda_graph_cache_size",
    "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path",
]


def cpp_csv_vec_vec_int(s: str) -> list[list[int]]:
    """Python transcription of the backend's utils::csvStrToVecVecInt (reference §3.4)."""
    assert s, "Cannot convert empty string"
    out, pos = [], 0
    while True:
        end = s.find("}", pos)
        if end < 0:  # getline hit EOF without the delimiter -> loop ends
            break
        sub = s[pos:end]
        pos = end + 1
        if not sub:
            break
        if sub[0] == "{":
            sub = sub[1:]
        out.append([int(x) for x in (t.strip() for t in sub.split(",")) if x])
        rest = s[pos:].lstrip()
        comma = rest.find(",")
        pos = len(s) if comma < 0 else len(s) - len(rest) + comma + 1
        while pos < len(s) and s[pos].isspace():
            pos += 1
    assert out
    return out


def memory_plan(spec):
    return memory.memory_plan(spec, engine_method(spec))


def _render(spec, workdir):
    engines = {"target": str(workdir / "e" / "target"), "draft": str(workdir / "e" / "draft")}
    return render_engine_repository(spec, engine_method(spec), engine_dirs=engines, memory=memory_plan(spec))


def _configs(files: dict[str, str], tmp: Path) -> dict[str, object]:
    out = {}
    for rel, text in files.items():
        if rel.endswith("config.pbtxt"):
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            out[rel.split("/")[0]] = pbtxt.read_config(p)  # protobuf parse: any bad field fails
    return out


@pytest.mark.parametrize("method", ["draft-model", "medusa", "eagle", "lookahead", "none"])
def test_engine_repository_parses_and_resolves_every_template_parameter(make_spec, workdir, tmp_path, method):
    spec = make_spec(method)
    files = _render(spec, workdir)
    assert not [rel for rel, text in files.items() if "${" in text]
    cfgs = _configs(files, tmp_path)
    expected = {"preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls", "ensemble"}
    if method == "draft-model":
        expected.add("tensorrt_llm_draft")
    assert set(cfgs) == expected
    for name, cfg in cfgs.items():
        assert cfg.name == name
    llm = cfgs["tensorrt_llm"]
    assert llm.backend == "tensorrtllm" and llm.max_batch_size == 4
    keys = set(llm.parameters)
    # every template parameter is either filled or deliberately omitted, with a reason
    assert set(TEMPLATE_PARAMS) <= keys | set(OMITTED_PARAMETERS)
    assert keys - set(TEMPLATE_PARAMS) == set()
    mode = llm.parameters["decoding_mode"].string_value
    assert mode == {"medusa": "medusa", "eagle": "eagle", "lookahead": "lookahead"}.get(method, "top_k_top_p")
    assert llm.parameters["gpt_model_path"].string_value == str(workdir / "e" / "target")
    assert llm.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    assert ("medusa_choices" in keys) == (method == "medusa")
    assert ("eagle_choices" in keys) == (method == "eagle")
    assert ("lookahead_window_size" in keys) == (method == "lookahead")
    for name in ("preprocessing", "postprocessing"):
        assert cfgs[name].backend == "python"
        assert cfgs[name].parameters["tokenizer_dir"].string_value == str((workdir / "target").resolve())
    assert cfgs["preprocessing"].parameters["multimodal_model_path"].string_value == ""  # read unconditionally
    manifest = json.loads(files["trtspec.repo.json"])
    assert manifest["entry_model"] == ("tensorrt_llm_bls" if method == "draft-model" else "ensemble")


def test_medusa_and_eagle_choices_in_brace_form(make_spec, workdir, tmp_path):
    spec = make_spec("medusa")
    llm = _configs(_render(spec, workdir), tmp_path / "m")["tensorrt_llm"]
    s = llm.parameters["medusa_choices"].string_value
    assert s == "{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 0, 1}, {0, 0, 0, 0}"
    assert cpp_csv_vec_vec_int(s) == spec.speculative.choices
    assert json.loads("[" + s.replace("{", "[").replace("}", "]") + "]") == spec.speculative.choices  # model.py
    eagle = make_spec("eagle")
    e = _configs(_render(eagle, workdir), tmp_path / "e")["tensorrt_llm"].parameters["eagle_choices"].string_value
    assert e == "{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}"  # default: a chain of num_draft_tokens
    assert cpp_csv_vec_vec_int(e) == params.chain(4)
    assert params.eagle_tree_params(params.chain(4)) == {"max_draft_len": 4, "num_eagle_layers": 4,
                                                         "max_non_leaves_per_layer": 1}
    tree = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    assert params.max_non_leaves_per_layer(tree) == 2
    with pytest.raises(ValueError):
        params.brace_choices([])


def test_lookahead_parameters(make_spec, workdir, tmp_path):
    llm = _configs(_render(make_spec("lookahead"), workdir), tmp_path)["tensorrt_llm"]
    p = {k: v.string_value for k, v in llm.parameters.items() if k.startswith("lookahead_")}
    assert p == {"lookahead_window_size": "4", "lookahead_ngram_size": "3", "lookahead_verification_set_size": "4"}
    assert llm.parameters["max_attention_window_size"].string_value == str(768 + 15)


def test_draft_model_layout(make_spec, workdir, tmp_path):
    spec = make_spec("draft-model")
    cfgs = _configs(_render(spec, workdir), tmp_path)
    draft, target, bls = cfgs["tensorrt_llm_draft"], cfgs["tensorrt_llm"], cfgs["tensorrt_llm_bls"]
    assert draft.parameters["gpt_model_path"].string_value == str(workdir / "e" / "draft")
    assert bls.parameters["tensorrt_llm_model_name"].string_value == "tensorrt_llm"
    assert bls.parameters["tensorrt_llm_draft_model_name"].string_value == "tensorrt_llm_draft"
    assert "num_draft_tokens" in {i.name for i in bls.input} and "use_draft_logits" in {i.name for i in bls.input}
    for cfg in (draft, target, bls):
        assert not cfg.model_transaction_policy.decoupled  # BLS speculation is non-streaming
    for cfg in (draft, target):
        assert cfg.parameters["exclude_input_in_output"].string_value == "false"
        assert cfg.parameters["enable_kv_cache_reuse"].string_value == "true"
        assert cfg.parameters["gpu_device_ids"].string_value == "0"
        assert "participant_ids" not in cfg.parameters
    plan = memory_plan(spec)
    assert float(target.parameters["kv_cache_free_gpu_mem_fraction"].string_value) == plan.fraction("target")
    assert float(draft.parameters["kv_cache_free_gpu_mem_fraction"].string_value) == plan.fraction("draft")
    assert target.parameters["max_tokens_in_paged_kv_cache"].string_value == \
        draft.parameters["max_tokens_in_paged_kv_cache"].string_value


def test_fast_logits_multi_gpu(make_spec, workdir, tmp_path):
    spec = make_spec("draft-model", trtllm="use_draft_logits = true\n",
                     gpu='type = "h100"\ncount = 4\ntensor_parallel = 2')
    cfgs = _configs(_render(spec, workdir), tmp_path)
    t, d = cfgs["tensorrt_llm"].parameters, cfgs["tensorrt_llm_draft"].parameters
    assert t["speculative_decoding_fast_logits"].string_value == "true"
    assert d["participant_ids"].string_value == "1,2" and t["participant_ids"].string_value == "3,4"
    assert t["gpu_device_ids"].string_value == "0,1" and d["gpu_device_ids"].string_value == "2,3"
    cmd = launch_command(spec, workdir / "repo")
    assert cmd[:3] == ["env", "TRTLLM_ORCHESTRATOR=1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0"]
    assert cmd.count("/opt/tritonserver/bin/tritonserver") == 5  # orchestrator + 2 draft + 2 target ranks
    assert "--load-model=tensorrt_llm_draft" in cmd and cmd.count(":") == 4


def test_ensemble_wiring_is_consistent(make_spec, workdir, tmp_path):
    cfgs = _configs(_render(make_spec("medusa"), workdir), tmp_path)
    ens = cfgs["ensemble"]
    assert ens.platform == "ensemble"
    available = {i.name for i in ens.input}
    for step in ens.ensemble_scheduling.step:
        model = cfgs[step.model_name]
        ins, outs = {i.name for i in model.input}, {o.name for o in model.output}
        for key, value in step.input_map.items():
            assert key in ins, (step.model_name, key)
            assert value in available, (step.model_name, value)
        for key, value in step.output_map.items():
            assert key in outs, (step.model_name, key)
            available.add(value)
    assert {o.name for o in ens.output} <= available
    required = {i.name for i in cfgs["tensorrt_llm"].input if not i.optional}
    mapped = set(ens.ensemble_scheduling.step[1].input_map)
    assert required <= mapped


def test_streaming_sets_decoupled(make_spec, workdir, tmp_path):
    cfgs = _configs(_render(make_spec("eagle"), workdir), tmp_path)
    assert cfgs["tensorrt_llm"].model_transaction_policy.decoupled
    assert cfgs["tensorrt_llm_bls"].model_transaction_policy.decoupled
    off = _configs(_render(make_spec("eagle", name="nostream", serving="streaming = false"), workdir), tmp_path / "n")
    assert not off["tensorrt_llm"].model_transaction_policy.decoupled


def test_launch_commands(make_spec, workdir):
    single = launch_command(make_spec("medusa"), workdir / "repo", http_port=9000)
    assert single[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert f"--model-repository={(workdir / 'repo').resolve()}" in single and "--http-port=9000" in single
    assert ":" not in single
    tp4 = launch_command(make_spec("lookahead", gpu='type = "h100"\ncount = 4\ntensor_parallel = 4'), "r")
    assert tp4.count("-n") == 4 and tp4.count("--load-model=tensorrt_llm") == 3
    dtm = launch_command(make_spec("draft-model"), "r")
    assert dtm[:3] == ["env", "TRTLLM_ORCHESTRATOR=1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1"]
    assert "--cuda-memory-pool-byte-size=0:0" in dtm and dtm.count("-n") == 1
    with pytest.raises(RepositoryError, match="8001"):
        launch_command(make_spec("draft-model"), "r", grpc_port=9001)
    script = launch_script_command(make_spec("draft-model"), "/models/x")
    assert "--multi-model" in script and "--world_size=1" in script
    llmapi = launch_command(make_spec("draft-model", name="api", kind="trtllm-llmapi"), "r")
    # under `mpirun -n 1`, as upstream's launch_triton_server.py runs the llmapi model (was: bare)
    assert llmapi[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]


def test_upstream_files_and_relocation(make_spec, build_opts, workdir, record, tmp_path):
    spec = make_spec("draft-model")
    res = build(spec, build_opts())
    repo = Path(res.repository)
    assert sorted(missing_files(repo)) == sorted(str(repo / p) for p in (
        "preprocessing/1/model.py", "postprocessing/1/model.py", "tensorrt_llm_bls/1/model.py",
        "tensorrt_llm_bls/1/lib/decode.py", "tensorrt_llm_bls/1/lib/triton_decoder.py"))
    fake_root = tmp_path / "all_models"
    for rel in ("preprocessing/1/model.py", "postprocessing/1/model.py", "tensorrt_llm_bls/1/model.py",
                "tensorrt_llm_bls/1/lib/decode.py", "tensorrt_llm_bls/1/lib/triton_decoder.py"):
        p = fake_root / "inflight_batcher_llm" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# stand-in for the container's {rel}\n")
    with pytest.raises(RepositoryError) as err:
        install_upstream_files(repo, tmp_path / "nowhere")
    assert "Triton TensorRT-LLM container" in err.value.hint and "(and 4 more)" in err.value.message
    assert len(missing_files(repo)) == 5
    assert len(install_upstream_files(repo, fake_root)) == 5 and missing_files(repo) == []
    # a re-emitted repository keeps the files copied from the container
    build(spec, build_opts(force=True))
    assert missing_files(repo) == []
    changed = relocate_repository(repo, engines="/engines/x", tokenizer="/tok")
    assert len(changed) == 4
    llm = pbtxt.read_config(repo / "tensorrt_llm_draft" / "config.pbtxt")
    assert llm.parameters["gpt_model_path"].string_value == "/engines/x/draft"
    assert llm.parameters["tokenizer_dir"].string_value == "/tok"


def test_llmapi_repository(make_spec, workdir, tmp_path, build_opts):
    spec = make_spec("draft-model", name="api", kind="trtllm-llmapi")
    files = render_llmapi_repository(spec, llm_args(spec))
    assert not [r for r, t in files.items() if "${" in t]
    cfg = _configs(files, tmp_path)["tensorrt_llm"]
    assert cfg.backend == "python" and cfg.max_batch_size == 0  # max_batch_size/decoupled: model.yaml and config
    data = yaml.safe_load(files["tensorrt_llm/1/model.yaml"])
    assert data["backend"] == "pytorch" and data["model"] == str((workdir / "target").resolve())
    # spelled as TensorRT-LLM 1.2 parses it (trtspec/backends/trtllm_versions.py)
    assert data["speculative_config"] == {"decoding_type": "DraftTarget", "max_draft_len": 4,
                                          "speculative_model_dir": str((workdir / "draft").resolve())}
    assert data["disable_overlap_scheduler"] is True
    assert data["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert (data["tensor_parallel_size"], data["pipeline_parallel_size"]) == (1, 1)
    res = build(spec, build_opts())
    assert (Path(res.repository) / "tensorrt_llm" / "1" / "model.yaml").is_file() and res.rebuilt == ["repository"]
    assert build(spec, build_opts()).rebuilt == []
    dry = build(spec, build_opts(dry_run=True))
    assert dry.dry_run and "decoding_type: DraftTarget" in dry.plan[0]["shell"]


def test_llmapi_eagle_needs_an_eagle3_head(make_spec, workdir):
    spec = make_spec("eagle", name="api-eagle", kind="trtllm-llmapi")
    with pytest.raises(RepositoryError, match="EAGLE-1/2 head"):
        render_llmapi_repository(spec, llm_args(spec))
    cfg = json.loads((workdir / "eagle" / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    (workdir / "eagle" / "config.json").write_text(json.dumps(cfg))
    sc = speculative_config(spec)  # EAGLE-3 as TensorRT-LLM 1.2 spells it
    assert {k: sc[k] for k in ("decoding_type", "eagle3_one_model", "max_draft_len", "speculative_model_dir")} == {
        "decoding_type": "Eagle", "eagle3_one_model": True, "max_draft_len": 4,
        "speculative_model_dir": str((workdir / "eagle").resolve())}


def test_llmapi_refuses_medusa_and_lookahead_and_maps_ngram(make_spec):
    spec = make_spec("medusa")  # a trtllm-engine spec; the llmapi mapping still refuses the method
    with pytest.raises(RepositoryError, match="PyTorch backend"):
        speculative_config(spec)
    with pytest.raises(RepositoryError, match="TensorRT engines only"):  # Jacobi lookahead
        speculative_config(make_spec("lookahead"))
    ng = ngram_config(make_spec("ngram", kind="trtllm-llmapi"))
    assert ng["decoding_type"] == "NGram" and ng["max_matching_ngram_size"] == 2
    assert speculative_config(make_spec("ngram", kind="trtllm-llmapi")) == ng


def test_no_config_is_written_from_a_template():
    """Every config.pbtxt comes from the protobuf (trtspec.repository.pbtxt): no template text."""
    src = Path(__file__).resolve().parents[2] / "trtspec" / "repository" / "trtllm"
    for py in src.glob("*.py"):
        text = py.read_text()
        assert not re.search(r"(string_value|data_type|backend):\s*\"?[A-Z_a-z]", text), py
