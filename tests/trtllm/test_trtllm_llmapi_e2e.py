"""Issue 13, finding 4 at the real boundary: a real Triton (the bundled 2.51, CPU) loads an llmapi repository
that was moved away from where it was built through trtspec's entry point (config.pbtxt default_model_filename),
which resolves model.yaml and hands over to the container's model.py (a stand-in here: it answers with the
model path it was given, and imports helpers.py beside it as the real one does)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from trtspec.backends.trtllm_llmapi_methods import llm_args
from trtspec.repository.trtllm import render_llmapi_repository, write_files

STAND_IN = '''import os

import triton_python_backend_utils as pb_utils
import yaml
from helpers import OUTPUT


class TritonPythonModel:
    def initialize(self, args):
        with open(os.environ["LLM_CONFIG_PATH"]) as f:
            self.model = yaml.safe_load(f)["model"]

    def execute(self, requests):
        out = pb_utils.Tensor(OUTPUT, __import__("numpy").array([self.model.encode()], dtype=object))
        return [pb_utils.InferenceResponse(output_tensors=[out]) for _ in requests]
'''


@pytest.mark.e2e
def test_a_moved_llmapi_repository_loads_its_checkpoint_where_it_is_now(make_spec, workdir, tmp_path):
    import tritonclient.grpc as grpcclient

    from trtspec.serve import TritonServer

    spec = make_spec("none", name="api", kind="trtllm-llmapi", serving="streaming = false")
    built = workdir / "model_repository" / "api"
    write_files(built, render_llmapi_repository(spec, llm_args(spec), built))
    version = built / "tensorrt_llm" / "1"
    (version / "model.py").write_text(STAND_IN)                    # what install-upstream copies in
    (version / "helpers.py").write_text('OUTPUT = "text_output"\n')
    moved = tmp_path / "mounted"
    shutil.copytree(workdir / "target", moved / "target")
    shutil.copytree(built, moved / "model_repository" / "api")
    shutil.rmtree(built)
    shutil.rmtree(workdir / "target")  # nothing is left where it was built
    server = TritonServer(moved / "model_repository" / "api", ready_timeout=120)
    server.start()
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"hi"], dtype=object))
        got = client.infer("tensorrt_llm", [text]).as_numpy("text_output")
        assert got[0].decode() == str(moved / "target")
    finally:
        code = server.stop()
    assert code == 0, server.failure_report()
