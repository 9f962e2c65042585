"""Training on transformers' modules: drafters for any target (drafters.py, `trtspec train`) and the demo
family (demo.py: its own target, then its drafters by drafters.py).

`trtspec train`, one stage a module (drafters.py runs them):
    recipe.py      TrainConfig: a run's recipe and budget; the progress callback
    samples.py     1. data: prompts answered by the target, or plain text (data.jsonl)
    features.py    2. the frozen-target pass: draft vocabulary, teacher top-k, captured layers / hidden states
    kinds.py       3. each kind's module, loss and writer; losses.py its losses (eagle3.py: EAGLE-3's head and
                      TTT loss); loop.py the training loop and its checkpoints
    writers.py     4. export in the layouts the methods load
    acceptance.py  5. acceptance measured through the runtime (also the demo family's)

The demo family:
    demo.py         `trtspec models train-demo`: its tokenizer and target, then its drafters by drafters.py
    demo_config.py  its recipe (FamilyConfig); demo_target.py its target's training loop, loss and checkpoint
    data.py         corpus (the stdlib), tokenizer, token windows, held-out prompts
    heads.py        the trainable modules (transformers' LlamaForCausalLM / LlamaDecoderLayer, Medusa and
                    EAGLE-1 heads in the artifacts.heads layouts)
"""
