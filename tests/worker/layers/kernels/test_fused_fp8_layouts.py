"""The fused FP8 kernels compiled for an H100/H200 (sm_90), no GPU needed: their math
before the quantization is their 16-bit kernel's, instruction for instruction.

Triton picks each tensor's register layout from the memory accesses around it (its
coalescing pass), so a kernel that stores e4m3 (1 byte) instead of bf16 could hold its
row in another layout, and `tl.sum` would then add the row's squares in another order:
that gave the fused RMSNorm other bits than the unfused one on an H200 (16 elements a
thread instead of 8), which the interpreter, adding in numpy's order, cannot show. Here
each kernel is compiled as its launch (`_launch`, `silu_and_mul*`) would build it on the
GPU, with the pointer and integer specializations a real launch makes, and the fused
variant's TTGIR up to the 16-bit row is compared with the unfused kernel's: the same
layouts, the same ops, the same reduction; the PTX keeps 16-byte loads, and has no fused
multiply-add.

The compiling runs in a subprocess without TRITON_INTERPRET (conftest sets it for the
interpreter tests, and triton reads it when a kernel is decorated); `python -m` on this
module is that subprocess.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[4]
# (name, width, dtype): the RMSNorm launches compiled, each plain and with the residual.
NORMS = [("4096", 4096, "bfloat16"), ("14336", 14336, "bfloat16"), ("4096f32", 4096, "float32")]
SILU_WIDTH = 14336


def compile_launches() -> dict[str, dict[str, str]]:
    """Each kernel as its entry point launches it on 8 rows, compiled for sm_90: name ->
    {"ttgir", "ptx"}. Runs with TRITON_INTERPRET unset (the subprocess)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from radixmesh.worker.layers.kernels import fp8_quant, rms_norm, silu_mul

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    compiled: dict[str, dict[str, str]] = {}
    name = ""  # the launch being compiled

    def intercept(fn: JITFunction[Any]) -> None:
        # What JITFunction.run does before it compiles, less the device: the binder's
        # specialization (16-byte aligned pointers, ints divisible by 16), the launch's
        # options (num_warps, enable_fp_fusion), then ASTSource and compile.
        def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(
                backend, kwargs, bound, specialization, options
            )
            src = ASTSource(fn, signature, constexprs, attrs)
            kernel = triton.compile(src, target=target, options=options.__dict__)
            compiled[name] = {"ttgir": kernel.asm["ttgir"], "ptx": kernel.asm["ptx"]}

        fn.run = run

    intercept(rms_norm._rms_norm_kernel)
    intercept(silu_mul._silu_and_mul_kernel)
    intercept(silu_mul._silu_and_mul_fp8_kernel)
    intercept(fp8_quant._per_token_fp8_kernel)
    launches: dict[str, Callable[[], object]] = {}
    for key, width, dtype_name in NORMS:
        dtype = getattr(torch, dtype_name)
        x, res = torch.empty(8, width, dtype=dtype), torch.empty(8, width, dtype=dtype)
        w = torch.empty(width, dtype=dtype)
        launches[f"norm{key}"] = partial(rms_norm.rms_norm, x, w, 1e-5)
        launches[f"norm{key}_fp8"] = partial(rms_norm.rms_norm_fp8, x, w, 1e-5)
        launches[f"add{key}"] = partial(rms_norm.fused_add_rms_norm, x, res, w, 1e-5)
        launches[f"add{key}_fp8"] = partial(rms_norm.fused_add_rms_norm_fp8, x, res, w, 1e-5)
    gate_up = torch.empty(8, 2 * SILU_WIDTH, dtype=torch.bfloat16)
    launches["silu"] = partial(silu_mul.silu_and_mul, gate_up)
    launches["silu_fp8"] = partial(silu_mul.silu_and_mul_fp8, gate_up)
    launches["quant"] = partial(fp8_quant.per_token_fp8, torch.empty(8, 4096, dtype=torch.bfloat16))
    for name, launch in launches.items():
        launch()
        assert name in compiled, name
    return compiled


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", __name__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, dict[str, str]] = json.loads(proc.stdout)
    return result


def layouts(ttgir: str) -> list[str]:
    return re.findall(r"^#\w+ = (#ttg\.\w+<.*>)$", ttgir, re.M)


LOC, SSA = re.compile(r" loc\(.*"), re.compile(r"%[\w#]+")


def body(ttgir: str) -> list[str]:
    """The kernel's ops, one a line, with their attributes and types; SSA names,
    locations and the constants' definitions left out."""
    ops, inside = [], False
    for line in ttgir.splitlines():
        code = LOC.sub("", line).strip()
        if code.startswith("tt.func"):
            inside = True
        elif code.startswith("tt.return"):
            break
        elif inside and code and "arith.constant" not in code:
            ops.append(SSA.sub("%", code))
    return ops


def until_normed_row(ttgir: str) -> list[str]:
    """`body` up to the normed row: its rounding to the 16-bit dtype after the rsqrt (for
    float32 rows, not rounded: the weight multiply, the second multiply after it). The
    part that the fused kernel must share with the unfused one."""
    ops = body(ttgir)
    rsqrt = next(i for i, op in enumerate(ops) if "math.rsqrt" in op)
    ends = [i for i, op in enumerate(ops) if i > rsqrt and "arith.truncf" in op]
    if not ends:
        ends = [i for i, op in enumerate(ops) if i > rsqrt and "arith.mulf" in op][1:]
    return ops[: ends[0] + 1]


def memory(ptx: str) -> Counter[str]:
    return Counter(re.findall(r"\b(?:ld|st)\.global[.\w]*", ptx))


def f32_math(ptx: str) -> Counter[str]:
    return Counter(re.findall(r"\b(?:fma|rsqrt|sqrt|div|ex2)\.[.\w]*", ptx))


def e4m3_casts(ptx: str) -> Counter[str]:
    return Counter(re.findall(r"\bcvt\.[.\w]*e4m3[.\w]*", ptx))


def blocked(per_thread: int, warps: int) -> str:
    return (
        f"#ttg.blocked<{{sizePerThread = [{per_thread}], threadsPerWarp = [32], "
        f"warpsPerCTA = [{warps}], order = [0]}}>"
    )


# (name, block, the row's layout: elements a thread, warps)
NORM_LAYOUTS = [("4096", 4096, (8, 8)), ("14336", 16384, (8, 16)), ("4096f32", 4096, (4, 8))]


@pytest.mark.parametrize("variant", ["norm", "add"])
@pytest.mark.parametrize(("key", "block", "layout"), NORM_LAYOUTS)
def test_fused_rms_norm_has_the_unfused_layout_and_ops(
    compiled: dict[str, dict[str, str]],
    variant: str,
    key: str,
    block: int,
    layout: tuple[int, int],
) -> None:
    plain, fused = compiled[f"{variant}{key}"], compiled[f"{variant}{key}_fp8"]
    # One layout for every tensor, the same in both: 16 bytes of the row a thread.
    assert layouts(plain["ttgir"]) == layouts(fused["ttgir"]) == [blocked(*layout)]
    for k in (plain, fused):
        assert "ttg.convert_layout" not in k["ttgir"]
        reduces = re.findall(r"\}\) : \((tensor<\w+, #\w+>)\) -> f32", k["ttgir"])
        assert reduces[0] == f"tensor<{block}xf32, #blocked>"  # the sum of squares
    # The sum of squares, rsqrt and the weight multiply: the same ops on the same types.
    assert until_normed_row(fused["ttgir"]) == until_normed_row(plain["ttgir"])
    # Contraction off, IEEE division, the same rsqrt.
    plain_math, fused_math = f32_math(plain["ptx"]), f32_math(fused["ptx"])
    assert plain_math == Counter({"div.rn.f32": 1, "rsqrt.approx.ftz.f32": 1})
    assert fused_math["rsqrt.approx.ftz.f32"] == 1 and "fma" not in fused["ptx"]


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("norm4096", {"ld.global.v4.b32": 4, "st.global.v4.b32": 2}),
        ("add4096", {"ld.global.v4.b32": 6, "st.global.v4.b32": 4}),
        ("norm14336", {"ld.global.v4.b32": 8, "st.global.v4.b32": 4}),
        ("add14336", {"ld.global.v4.b32": 12, "st.global.v4.b32": 8}),
        # e4m3: 8 bytes a thread (the layout of the 16-bit row), and the scale.
        ("norm4096_fp8", {"ld.global.v4.b32": 4, "st.global.v2.b32": 2, "st.global.b32": 1}),
        (
            "add4096_fp8",
            {
                "ld.global.v4.b32": 6,
                "st.global.v4.b32": 2,
                "st.global.v2.b32": 2,
                "st.global.b32": 1,
            },
        ),
        ("norm14336_fp8", {"ld.global.v4.b32": 8, "st.global.v2.b32": 4, "st.global.b32": 1}),
        (
            "add14336_fp8",
            {
                "ld.global.v4.b32": 12,
                "st.global.v4.b32": 4,
                "st.global.v2.b32": 4,
                "st.global.b32": 1,
            },
        ),
    ],
)
def test_rms_norm_accesses_stay_vectorized(
    compiled: dict[str, dict[str, str]], name: str, want: dict[str, int]
) -> None:
    assert memory(compiled[name]["ptx"]) == Counter(want)


def test_fused_silu_and_mul_has_the_unfused_layout(compiled: dict[str, dict[str, str]]) -> None:
    plain, fused = compiled["silu"], compiled["silu_fp8"]
    assert layouts(plain["ttgir"]) == layouts(fused["ttgir"]) == [blocked(8, 4)]
    assert "ttg.convert_layout" not in plain["ttgir"] + fused["ttgir"]
    # The product is elementwise (its ops in any layout give the same bits); its math is
    # the same instructions in both, no contraction.
    assert f32_math(plain["ptx"]) == Counter({"div.rn.f32": 8, "ex2.approx.f32": 8})
    assert f32_math(fused["ptx"])["ex2.approx.f32"] == 16  # two passes
    assert "fma" not in plain["ptx"] + fused["ptx"]
    assert memory(plain["ptx"]) == Counter({"ld.global.v4.b32": 2, "st.global.v4.b32": 1})
    assert memory(fused["ptx"]) == Counter(
        {"ld.global.v4.b32": 4, "st.global.v2.b32": 1, "st.global.b32": 1}
    )


def test_quantization_kernel_compiles_as_the_fused_quantization(
    compiled: dict[str, dict[str, str]],
) -> None:
    """The unfused path's second kernel: no contraction either, the same cast to e4m3."""
    quant = compiled["quant"]
    assert layouts(quant["ttgir"]) == [blocked(8, 4)]
    assert "fma" not in quant["ptx"] and "add.f32" not in quant["ptx"]  # all add.rn
    assert f32_math(quant["ptx"]) == Counter({"div.rn.f32": 9})  # the scale, 8 values
    assert e4m3_casts(quant["ptx"]) == Counter({"cvt.rn.satfinite.e4m3x2.f32": 4})
    for name in ("norm4096_fp8", "add4096_fp8", "silu_fp8"):
        assert set(e4m3_casts(compiled[name]["ptx"])) == {"cvt.rn.satfinite.e4m3x2.f32"}
    assert memory(quant["ptx"]) == Counter(
        {"ld.global.v4.b32": 2, "st.global.v2.b32": 1, "st.global.b32": 1}
    )


if __name__ == "__main__":
    json.dump(compile_launches(), sys.stdout)
