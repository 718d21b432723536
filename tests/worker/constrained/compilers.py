"""Compilers for the compile pool's tests, built in its processes from a CompilerSpec:
one that echoes, one that sleeps, one that spins on the CPU, one that allocates."""

from __future__ import annotations

import time

from radixmesh.worker.constrained.grammar import CompilerSpec, GrammarError


class Misbehaving:
    """`compile_serialized(kind, "action:argument")`, whatever the kind: echo the
    argument, fail with it as the message, sleep or spin that many seconds, allocate that
    many bytes."""

    def compile_serialized(self, kind: str, text: str, max_bytes: int) -> str:
        action, _, arg = text.partition(":")
        if action == "echo":
            return arg
        if action == "fail":
            raise GrammarError(arg)
        if action == "sleep":
            time.sleep(float(arg))
            return "slept"
        if action == "spin":
            deadline = time.monotonic() + float(arg)
            while time.monotonic() < deadline:
                pass
            return "spun"
        if action == "allocate":
            block = bytearray(int(arg))
            return f"allocated {len(block)}"
        raise GrammarError(f"unknown action {action}")


SPEC = CompilerSpec(__name__, "Misbehaving", ())
