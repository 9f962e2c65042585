"""Everything about model files on disk, in one layer below the runtime, converter, builders and trainer.

    hf.py         THE reader of HF config.json files (ModelConfig, through transformers.AutoConfig), RoPE
    weights.py    THE safetensors loader (single file or sharded index) and header-only shapes
    heads.py      Medusa and EAGLE head layouts: one reader and one writer each
    tokenizer.py  tokenizer loading and fingerprints, chat templates
    gguf.py       GGUF -> HF checkpoint import (`trtspec models import`)
    pair.py       does the drafter fit the target, and does each config describe its weights
    fs.py         atomic JSON/directory writes, digests, tool versions
    manifest.py   the one manifest shape (build locks, conversions, repositories, the demo family)

Nothing here imports the runtime, the converter, the builders or the CLI.
"""
