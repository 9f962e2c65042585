"""Training on transformers' modules: drafters for any target (drafters.py, `trtspec train`) and the demo
family (demo.py: its own target, then its drafters by drafters.py).

    data.py    corpus (the stdlib), tokenizer, token windows, held-out prompts
    heads.py   the trainable modules (transformers' LlamaForCausalLM / LlamaDecoderLayer, Medusa and EAGLE-1
               heads in the artifacts.heads layouts)
    demo.py    the demo family (`trtspec models train-demo`): its tokenizer and target, then its drafters by
               drafters.py; acceptance measured by the runtime
"""
