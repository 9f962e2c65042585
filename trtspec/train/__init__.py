"""Training trtspec's own checkpoints on transformers' modules: the demo family today, drafters later.

    data.py    corpus (the stdlib), tokenizer, token windows, held-out prompts
    heads.py   the trainable modules (transformers' LlamaForCausalLM / LlamaDecoderLayer, Medusa and EAGLE-1
               heads in the artifacts.heads layouts) and their losses
    demo.py    the demo-family recipe (`trtspec models train-demo`), acceptance measured by the runtime
"""
