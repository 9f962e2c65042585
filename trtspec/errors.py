"""One exception type per failure class. The CLI catches TrtspecError once and prints
`error: <message>` / `hint: <hint>`, exiting with the class's exit code."""

from __future__ import annotations


class TrtspecError(Exception):
    """Base of every error trtspec reports to a user (never a bug)."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


class SpecError(TrtspecError):
    """The deployment spec is missing, malformed or inconsistent (exit 2)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, problems: list | None = None):
        super().__init__(message, hint)
        self.problems = list(problems or [])


class PairError(TrtspecError):
    """Target and drafter do not fit together (tokenizer, vocab, lengths) (exit 3)."""

    exit_code = 3


class ModelError(TrtspecError):
    """A checkpoint cannot be read or is of an unsupported architecture (exit 3)."""

    exit_code = 3


class ConvertError(TrtspecError):
    """HF -> TensorRT-LLM checkpoint conversion failed (exit 4)."""

    exit_code = 4


class BuildError(TrtspecError):
    """Building engines or the model repository failed (exit 4)."""

    exit_code = 4


class RepositoryError(TrtspecError):
    """A Triton model repository cannot be emitted or read (exit 4)."""

    exit_code = 4


class ServeError(TrtspecError):
    """The local Triton server could not be started, reached or stopped (exit 5)."""

    exit_code = 5


class DeployError(TrtspecError):
    """Deploying to a running Triton server failed (exit 5)."""

    exit_code = 5


class ClientError(TrtspecError):
    """A request to a Triton server failed: connection, timeout or server error (exit 6)."""

    exit_code = 6


class GenerationError(TrtspecError):
    """A generation request is invalid for the engine (empty prompt, limits) (exit 6)."""

    exit_code = 6


class MemoryBudgetError(TrtspecError):
    """A model or KV cache would not fit the memory this process can still get: refused before it is loaded,
    naming what it needs and what is available (exit 7), instead of the kernel's OOM killer ending the process
    without a word."""

    exit_code = 7


class UsageError(TrtspecError):
    """The command line itself is wrong: an unknown option or command, a flag value out of its range, a
    missing argument, options that need each other (exit 64, EX_USAGE: click's own usage errors exit with
    it too, so that they are told apart from a bad spec, exit 2)."""

    exit_code = 64


EXIT_CODES = {
    0: "success",
    1: "unexpected trtspec error",
    2: "invalid deployment spec (SpecError)",
    3: "model or model pair problem (ModelError, PairError)",
    4: "conversion, build or repository failure (ConvertError, BuildError, RepositoryError)",
    5: "server start/stop or deploy failure (ServeError, DeployError)",
    6: "request failure (ClientError, GenerationError)",
    7: "not enough memory for a model or KV cache, refused before loading it (MemoryBudgetError)",
    64: "bad command line: unknown option, bad flag value, missing argument (UsageError)",
    130: "interrupted (Ctrl-C)",
}
