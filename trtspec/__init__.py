"""trtspec: from Hugging Face checkpoints to a speculative-decoding service on Triton."""

__version__ = "0.1.0"
