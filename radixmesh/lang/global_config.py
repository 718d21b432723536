"""Process-wide settings of the language, with SGLang's names (`sgl.global_config`).

One mutable object, as in SGLang, so programs that set `sgl.global_config.verbosity` or
read `sgl.global_config.default_backend` keep working. `set_default_backend` writes
`default_backend`; a value assigned directly (an Engine, a Runtime, a backend name) is
resolved the same way when a program runs.
"""

from __future__ import annotations

from typing import Any


class GlobalConfig:
    def __init__(self) -> None:
        # 0: print nothing; 2: print each program's final text when its run ends.
        self.verbosity = 0
        # What `run` / `run_batch` use when no `backend=` is given.
        self.default_backend: Any = None
        # Sent with every generation of the in-process and cluster backends.
        self.skip_special_tokens_in_output = True
        # radixmesh's detokenizer never inserts spaces between special tokens; kept for
        # programs that set it (False is what it does; True is accepted and changes nothing).
        self.spaces_between_special_tokens_in_out = True
        # run_batch prefills the program's traced constant prefix before the batch.
        self.enable_precache_with_tracing = True
        # join("concate_and_append") appends the branches' text to the source state; the
        # next model call reuses the cached source prefix and prefills the branches' text.
        self.enable_parallel_encoding = True


global_config = GlobalConfig()

__all__ = ["GlobalConfig", "global_config"]
