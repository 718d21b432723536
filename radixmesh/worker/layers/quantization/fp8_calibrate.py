"""GPTQ-style error-compensated FP8 weights, calibrated offline into an FP8 checkpoint.

Plain FP8 rounds every weight to the nearest e4m3 value at its row's scale (amax / 448,
fp8_scales.py), each weight on its own. GPTQ (Frantar et al., 2022) rounds the columns of
a linear layer's weight W [out, in] one after another and moves each column's rounding
error onto the columns not yet rounded, in the proportions that keep the layer's output
on real inputs closest: with H = 2 X^T X over calibration inputs X [tokens, in] and U the
upper Cholesky factor of H^-1, rounding column j with error e = (w_j - q_j) / U[j, j]
subtracts e * U[j, k] from every later column k. Rows are independent given H, so a fused
weight (q/k/v, gate/up) is calibrated as one. H gets `DAMP` x its mean diagonal on the
diagonal, so that directions the text never excites stay solvable. Columns go in blocks
of `BLOCK` whose updates to the later columns are applied at once (the "lazy batch"
form, the same result as column by column up to float rounding; within a block, in
sub-blocks of `SUB_BLOCK` the same way), and by default in order of decreasing H
diagonal, the inputs with the most energy first (GPTQ's "act order"): measured on the
bundled SmolLM2, that moved the next-token distributions on text left out of the
calibration 3-14% less far from float32's than the natural order (20-25% at amax / 448
and 1% damping; docs/quantization.md).
With per-channel scales the order costs nothing at inference: the stored weight is the
same [out, in] matrix either way.

Scales: the checkpoint stores its own per-channel scales, so each row's is chosen rather
than kept at the engine's amax / 448. An e4m3 scale sets no precision (3 mantissa bits
at any scale) but decides where each weight falls between two e4m3 values: amax / 448
times 2^(k / 8) for k < 8 (`SCALE_CANDIDATES`) are eight roundings of the row spread over
one octave, which holds every distinct rounding (doubling a scale shifts every value by
one binade and rounds it alike), and none clips a weight. The rows are solved at all
eight scales at once (stacked as one [8 x out, in] weight: rows are independent given H)
and each row keeps the scale whose calibrated row leaves the least error on the layer's
output, (W - Q) H (W - Q)^T on the damped H. That error comes out of the solve exactly,
not as an estimate: the rounding leaves W - Q = E U with E the scaled errors e_k, and
U H U^T = I, so it is each row's sum of e_k^2. Measured on text left out of the
calibration, the search moved the next-token distributions 9-27% less far from float32's
(KL) than amax / 448 did, and the whole calibration of the bundled model took 47-49 s
against 36 s (docs/quantization.md); `write_checkpoint(scale_candidates=1)` (the
command's `--scale-candidates 1`) keeps amax / 448. Damping: 10% of H's mean diagonal,
not GPTQ's usual 1%: on the same held-out text 1% left the distributions further from
float32's on both halves, and 3% and 30% measured like 10%. Measured and not adopted: 16
scales (little closer, twice the solver's time), 4 (a worse held-out perplexity), and
asymmetric calibration (each layer aimed at the float model's output on the float
model's inputs, GPTAQ-style), which fit the calibration tokens and moved the held-out
distributions further.

The result is the engine's per-channel FP8 format exactly (float8_e4m3fn [out, in],
float32 `weight_scale` [out]), so every kernel path (`_scaled_mm`, the small-batch
kernels, the CPU's dequantize-once) runs it unchanged. A weight pushed past its scale's
range saturates at +-448. Where H is diagonal no error moves, and at amax / 448 the
result is plain FP8's, bit for bit.

Layers are calibrated in the order they run, as GPTQ does: one forward pass over the
calibration sequences (one ragged batch through the model's own layers and the torch
attention backend) with a pre-hook on every decoder linear layer, which forms H from the
input the layer is about to multiply, calibrates the layer and writes its dequantized FP8
weight back before the layer runs. So each layer (q/k/v, o, gate/up and down within a
decoder layer too) sees inputs computed through every earlier one already quantized, and
corrects the error those left in its inputs as well as its own.

The calibration text: `calibration_text.PASSAGES` (new prose and well-known public-domain
passages, each its own sequence; that module says why both), or passages a user gives.

How a user gets it: an offline command that writes a stored FP8 checkpoint,

    python -m radixmesh.worker.layers.quantization.fp8_calibrate smollm2 out/smollm2-fp8

(any full-precision spec the engine loads: the bundled GGUF, an HF directory, a hub id),
which the engine then loads like any other FP8 checkpoint (`quantization_config` with
`quant_method` "fp8": the stored values and per-channel scales, with no option named;
docs/quantization.md). Not a method calibrating at load (`quantization="fp8-gptq"`): the
engine quantizes each tensor in its layer's weight loader as it arrives, so the
full-precision model is never held on the device and each tensor-parallel rank reads only
its own slices, while calibration needs the whole full-precision model and a forward pass
over a text, and a row-parallel rank's slice of a row cannot be calibrated alone (the
error moves along the whole row). At load it would also cost every start the calibration
(under a minute on 2 CPU cores for the bundled 135M model, far more for an 8B one) and
tie the served weights to that run; offline it is paid once, and the checkpoint can be
inspected, shared and sliced by tensor parallelism like any FP8 checkpoint. The
embeddings, the LM head and the norms are copied as the source stores them.

Everything runs in float32 (H and its factors in float64) on `device`, CPU by default.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixmesh.worker.layers.quantization.fp8_scales import FP8, FP8_MAX, quantize_rows

if TYPE_CHECKING:
    from radixmesh.tokenizer import ByteTokenizer, Tokenizer
    from radixmesh.worker.model.llama import LlamaForCausalLM

# H's diagonal gets DAMP x its mean: 10%, where GPTQ's usual is 1% (with the scale search,
# measured on text left out of the calibration: 3%, 10% and 30% alike, each a little
# closer to float32 than 1%; docs/quantization.md).
DAMP = 0.1
# Columns rounded between two updates of the later columns.
BLOCK = 128
# Columns rounded one by one between two updates of the rest of their block (a schedule
# only: the same result as BLOCK alone, up to float rounding, with less memory traffic).
SUB_BLOCK = 16
# Columns in order of decreasing H diagonal (GPTQ's act order) unless told otherwise.
ACT_ORDER = True
# Scales tried per row, amax / 448 times 2^(k / SCALE_CANDIDATES) for k < SCALE_CANDIDATES:
# spread evenly over one octave in log scale, the whole range of distinct roundings (a
# factor 2 shifts every value by one e4m3 binade and rounds it alike); none clips a weight.
SCALE_CANDIDATES = 8
# Most tokens in one calibration sequence: a longer passage is cut into pieces.
SEQ_LEN = 512
# The checkpoint file the command writes (one file; the engine reads any *.safetensors).
WEIGHTS_FILE = "model.safetensors"
# Files of a source directory not copied: rewritten, replaced, or the GGUF cache's marker.
_NOT_COPIED = ("config.json", "model.safetensors.index.json", "radixmesh_source.json")


def _check(name: str, ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {message}")


def scale_ratios(candidates: int = SCALE_CANDIDATES) -> tuple[float, ...]:
    """The multiples of amax / 448 tried as a row's scale: 2^(k / candidates), k < candidates
    (1 candidate: amax / 448 alone, the engine's scale)."""
    _check("scale_candidates", candidates >= 1, f"must be at least 1, got {candidates}")
    return tuple(2.0 ** (k / candidates) for k in range(candidates))


SCALE_RATIOS = scale_ratios()


def _check_options(damp: float, block: int, ratios: Sequence[float] = (1.0,)) -> None:
    _check("damp", math.isfinite(damp) and damp >= 0, f"must be a finite value >= 0, got {damp}")
    _check("block", block >= 1, f"must be at least 1, got {block}")
    _check(
        "ratios",
        len(ratios) >= 1 and all(math.isfinite(r) and r > 0 for r in ratios),
        f"must be one or more finite values > 0, got {tuple(ratios)}",
    )


# Every e4m3 code's value (byte -> float32): a lookup converts a column several times
# faster than PyTorch's CPU float8 conversion does.
_E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(FP8).float()


def round_e4m3(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w [rows] or [rows, cols] (float32) at per-row `scale` [rows] -> its e4m3 values, as
    plain FP8 rounds them (fp8_scales.quantize_rows)."""
    s = scale if w.dim() == 1 else scale[:, None]
    return (w / s).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def gptq_fp8(
    w: torch.Tensor,
    h: torch.Tensor,
    scale: torch.Tensor | None = None,
    *,
    damp: float = DAMP,
    block: int = BLOCK,
    act_order: bool = ACT_ORDER,
    ratios: Sequence[float] = SCALE_RATIOS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] -> (FP8 [out, in], float32 scales [out]), W ~= q * scale[:, None]: the
    columns rounded one by one, each one's error moved onto the columns still to come in
    the proportions H [in, in] (2 X^T X of the layer's inputs) gives. `scale`: one per
    row, kept; by default each row gets, of amax / 448 times each of `ratios`, the scale
    whose calibrated row leaves the smallest error on the layer's output, (W - Q) H
    (W - Q)^T with H damped as the solver damps it. W is not modified."""
    _check_options(damp, block, ratios)
    _check("weight", w.dim() == 2, f"must be [out, in], got shape {tuple(w.shape)}")
    rows, cols = w.shape
    _check("hessian", h.shape == (cols, cols), f"must be [{cols}, {cols}], got {tuple(h.shape)}")
    w32 = w.detach().float()
    if scale is None:
        base = quantize_rows(w32)[1]
        scales = torch.cat([base * r for r in ratios])
    else:
        _check("scale", scale.shape == (rows,), f"must be [{rows}], got {tuple(scale.shape)}")
        scales = scale.to(device=w32.device, dtype=torch.float32)
    h = h.to(device=w32.device, dtype=torch.float64)
    order = None
    if act_order:
        order = torch.argsort(h.diagonal(), descending=True, stable=True)
        h = h[order][:, order]
        w32 = w32[:, order]
    u = _inverse_cholesky(h, damp).float()
    # Every candidate scale's rows solved at once, stacked [candidates * out, in]: rows are
    # independent given H.
    candidates = scales.numel() // rows
    qt, loss = _solve(w32.repeat(candidates, 1), u, scales, block)
    if candidates > 1:
        pick = loss.view(candidates, rows).argmin(0) * rows
        pick += torch.arange(rows, device=w32.device)
        qt, scales = qt[:, pick], scales[pick]
    if order is not None:
        qt = qt[torch.argsort(order)]
    return qt.t().contiguous(), scales.contiguous()


def _solve(
    w: torch.Tensor, u: torch.Tensor, scale: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ over the columns of w [rows, cols] (float32) at per-row `scale` [rows], with U
    [cols, cols] the upper Cholesky factor of the damped H^-1: (the e4m3 values transposed
    [cols, rows], each row's output error [rows]). The error is exact, not estimated: the
    rounding leaves W - Q = E U, E the columns' scaled errors e_k = (w_k - q_k) / U[k, k],
    and U H U^T = I, so (W - Q) H (W - Q)^T = E E^T, each row's sum of its e_k^2."""
    rows, cols = w.shape
    diag = u.diagonal().tolist()
    values = _E4M3_VALUES.to(w.device)
    # Transposed, so that a column of W (a row here) and a block of columns are contiguous.
    work = w.t().contiguous()  # [in, out]
    qt = torch.empty((cols, rows), dtype=FP8, device=w.device)
    loss = torch.zeros(rows, dtype=torch.float32, device=w.device)
    for start in range(0, cols, block):
        end = min(start + block, cols)
        for sub in range(start, end, SUB_BLOCK):
            sub_end = min(sub + SUB_BLOCK, end)
            wb = work[sub:sub_end]  # a view: each row turns into its column's error, in place
            for j in range(sub_end - sub):
                k = sub + j
                col = wb[j]
                qk = round_e4m3(col, scale)
                qt[k] = qk
                deq = values.index_select(0, qk.view(torch.uint8).int()).mul_(scale)
                err = col.sub_(deq).div_(diag[k])
                # A rank-1 update as a GEMM: addr_ ran 5-100x slower on the 2-core machine.
                wb[j + 1 :].addmm_(u[k, k + 1 : sub_end, None], err[None], alpha=-1.0)
            work[sub_end:end].addmm_(u[sub:sub_end, sub_end:end].t(), wb, alpha=-1.0)
        errors = work[start:end]
        loss += (errors * errors).sum(0)
        work[end:].addmm_(u[start:end, end:].t(), errors, alpha=-1.0)
    return qt, loss


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """The upper triangular U with U^T U = (H + damp * mean(diag H) * I)^-1, H's inverse's
    Cholesky factor, from one factorization: with J the reversal of rows (or columns),
    J H J = L L^T gives H = R R^T with R = J L J upper triangular, so H^-1 = R^-T R^-1
    and U = R^-1 = J L^-1 J. A column H knows nothing of (a zero diagonal) gets 1 on its
    diagonal."""
    h = damped(h, damp)
    lower = torch.linalg.cholesky(h.flip(0, 1))
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    return torch.linalg.solve_triangular(lower, eye, upper=False).flip(0, 1)


def damped(h: torch.Tensor, damp: float) -> torch.Tensor:
    """H with damp x its mean diagonal added to the diagonal (a copy); a zero diagonal
    entry (a column no input touches) becomes 1 first."""
    h = h.clone()
    diag = h.diagonal()
    diag[diag <= 0] = 1.0
    diag += damp * float(diag.mean())
    return h


def hessian(x: torch.Tensor) -> torch.Tensor:
    """2 X^T X [in, in] (float64) of a layer's input rows x [..., in]."""
    x = x.reshape(-1, x.shape[-1]).float()
    return 2 * (x.t() @ x).double()


@torch.no_grad()
def calibrate(
    model: LlamaForCausalLM,
    sequences: Sequence[Sequence[int]],
    *,
    damp: float = DAMP,
    block: int = BLOCK,
    act_order: bool = ACT_ORDER,
    ratios: Sequence[float] = SCALE_RATIOS,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Calibrate every decoder linear layer of a loaded, unquantized model (float32, one
    rank, not packed for the CPU) on `sequences` of token ids, in one forward pass.

    Returns {parameter name (ours, e.g. "model.layers.0.self_attn.qkv_proj.weight"):
    (FP8 values, float32 scales [out])}; the model is left holding each layer's
    dequantized FP8 weight (the numbers a CPU worker computes with). `progress(done,
    total)` is called after each layer."""
    from radixmesh.worker.layers.quantization import quantizable_layers

    _check_options(damp, block, ratios)
    _check("sequences", bool(sequences), "no calibration tokens")
    _check("sequences", all(len(s) > 0 for s in sequences), "an empty sequence")
    linears = quantizable_layers(model)
    _check(
        "model",
        bool(linears)
        and all(m.linear_method is None and m.packed_weight is None for m in linears)
        and all(m.tp.size == 1 for m in linears),
        "calibrate an unquantized model on one rank, before packing its weights",
    )
    dtype = linears[0].weight.dtype
    _check("model", dtype == torch.float32, f"must be float32, got {dtype}")
    names = {id(m): f"{n}.weight" for n, m in model.named_modules()}
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(linear: nn.Module, args: tuple[Any, ...]) -> None:
        weight = linear.weight
        assert isinstance(weight, torch.Tensor)
        h = hessian(args[0])
        q, scale = gptq_fp8(weight, h, damp=damp, block=block, act_order=act_order, ratios=ratios)
        weight.copy_(q.float() * scale[:, None])
        out[names[id(linear)]] = (q, scale)
        if progress is not None:
            progress(len(out), len(linears))

    handles = [m.register_forward_pre_hook(hook) for m in linears]
    try:
        _forward(model, sequences)
    finally:
        for handle in handles:
            handle.remove()
    missing = [names[id(m)] for m in linears if names[id(m)] not in out]
    if missing:
        raise RuntimeError(f"layers the forward pass never reached: {missing}")
    return out


def _forward(model: LlamaForCausalLM, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """The model's final hidden states [T, hidden] over `sequences` as one ragged batch of
    prompts, through the torch attention backend and a KV pool of its own."""
    from radixmesh.worker.attention.registry import create_attention_backend
    from radixmesh.worker.forward_batch import ForwardBatch
    from radixmesh.worker.kvcache.pool import KVPool

    device = model.lm_head.weight.device
    lengths = [len(s) for s in sequences]
    total = sum(lengths)
    pool = KVPool(
        num_slots=total + 1,  # slot 0 stays unused, as in the engine
        num_layers=model.arch.num_hidden_layers,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.arch.head_size,
        dtype=torch.float32,
        device=device,
    )
    req_to_token = torch.zeros(len(sequences), max(lengths), dtype=torch.int64, device=device)
    slots = torch.arange(1, total + 1, dtype=torch.int64, device=device)
    for row, piece in enumerate(slots.split(lengths)):
        req_to_token[row, : len(piece)] = piece
    batch = ForwardBatch.build(
        input_ids=[t for s in sequences for t in s],
        out_cache_loc=slots,
        req_rows=list(range(len(sequences))),
        prefix_lens=[0] * len(sequences),
        extend_lens=lengths,
        req_to_token=req_to_token,
    )
    attn = create_attention_backend("torch", pool, model.arch.attention_scale)
    attn.prepare(batch)
    hidden: torch.Tensor = model(batch, attn)
    return hidden


def checkpoint_tensors(
    model: LlamaForCausalLM, calibrated: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """`calibrate`'s result under the checkpoint's names: each fused weight split back into
    its pieces (q/k/v, gate/up), each piece's `weight` (FP8) and `weight_scale` ([out]
    float32), the layout per-channel FP8 checkpoints store (model/hf.py reads it back)."""
    arch = model.arch
    q_rows = arch.num_attention_heads * arch.head_size
    kv_rows = arch.num_key_value_heads * arch.head_size
    mlp_rows = arch.intermediate_size
    pieces = {
        "qkv_proj": [("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)],
        "gate_up_proj": [("gate_proj", mlp_rows), ("up_proj", mlp_rows)],
    }
    for name, (q, scale) in calibrated.items():
        base, fused = name.removesuffix(".weight").rsplit(".", 1)
        parts = pieces.get(fused, [(fused, q.shape[0])])
        sizes = [n for _, n in parts]
        for (part, _), qp, sp in zip(parts, q.split(sizes), scale.split(sizes), strict=True):
            yield f"{base}.{part}.weight", qp.contiguous()
            yield f"{base}.{part}.weight_scale", sp.contiguous()


def calibration_sequences(
    tokenizer: Tokenizer | ByteTokenizer, passages: Iterable[str], seq_len: int = SEQ_LEN
) -> list[list[int]]:
    """Each passage's token ids as a sequence of its own (a longer one cut into pieces of
    `seq_len`), so that every sequence starts where a text starts."""
    _check("seq_len", seq_len >= 2, f"must be at least 2, got {seq_len}")
    sequences = []
    for passage in passages:
        ids = tokenizer.encode(passage)
        sequences += [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]
    _check("passages", bool(sequences), "no calibration text")
    return sequences


def passages_of(text: str) -> list[str]:
    """A calibration file's passages: its blocks of text between blank lines."""
    blocks = [b.strip() for b in text.replace("\r\n", "\n").split("\n\n")]
    return [b for b in blocks if b]


def source_dir(spec: str) -> Path:
    """The Hugging Face directory behind a full-precision model spec (a GGUF's converted
    copy); a dummy preset or an FP8 checkpoint is a ValueError naming `model`."""
    from radixmesh.worker.model import loader

    src = loader.resolve_model(spec)
    if src.kind not in ("hf", "gguf") or src.path is None:
        raise ValueError(f"model: {spec!r} has no stored weights to calibrate ({src.kind})")
    if loader.load_quantization(spec) is not None:
        raise ValueError(f"model: {spec!r} is already quantized; calibrate from full precision")
    if src.kind == "gguf":
        from radixmesh.worker.model import gguf

        return gguf.ensure_converted(src.path)
    return Path(src.path)


def load_for_calibration(spec: str, device: str = "cpu") -> LlamaForCausalLM:
    """Model `spec` in float32 on `device`, unquantized and unpacked: what `calibrate`
    takes."""
    from radixmesh.worker.model import loader
    from radixmesh.worker.model.llama import LlamaForCausalLM

    arch = loader.load_arch_config(spec)
    model = LlamaForCausalLM(arch, dtype=torch.float32, device=device)
    model.load_weights(loader.iter_weights(spec, arch, dtype=torch.float32, device=device))
    return model.eval()


def write_checkpoint(
    spec: str,
    out_dir: str | Path,
    *,
    passages: Sequence[str] | None = None,
    seq_len: int = SEQ_LEN,
    damp: float = DAMP,
    block: int = BLOCK,
    act_order: bool = ACT_ORDER,
    scale_candidates: int = SCALE_CANDIDATES,
    device: str = "cpu",
    log: Callable[[str], None] | None = None,
) -> Path:
    """Calibrate model `spec` on `passages` (default: calibration_text.PASSAGES) and write
    an FP8 checkpoint to `out_dir`: config.json with a `quantization_config` (quant_method
    "fp8", dynamic activations, per-channel scales, and how it was calibrated), the
    source's other files (tokenizer, generation config, chat template) and one safetensors
    file: the calibrated FP8 weights with their scales, beside every other tensor as the
    source stores it. Safetensors files already in `out_dir` are removed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from radixmesh.worker.layers.quantization.calibration_text import PASSAGES
    from radixmesh.worker.model import hf, loader

    ratios = scale_ratios(scale_candidates)
    _check_options(damp, block, ratios)
    out = Path(out_dir)
    src = source_dir(spec)
    _check("out_dir", out.resolve() != src.resolve(), "must not be the source directory")
    sequences = calibration_sequences(
        loader.load_tokenizer(spec), PASSAGES if passages is None else passages, seq_len
    )
    model = load_for_calibration(spec, device)

    def progress(done: int, total: int) -> None:
        if log is not None and (done % 16 == 0 or done == total):
            log(f"calibrated {done}/{total} linear layers")

    calibrated = calibrate(
        model,
        sequences,
        damp=damp,
        block=block,
        act_order=act_order,
        ratios=ratios,
        progress=progress,
    )
    tensors = {name: t.cpu() for name, t in checkpoint_tensors(model, calibrated)}
    del model, calibrated
    for path in hf.weight_files(src):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 -- safe_open handles are not iterable
                if name not in tensors:
                    tensors[name] = f.get_tensor(name)

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in _NOT_COPIED:
            shutil.copy2(path, out / path.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "calibration": {
            "method": "gptq",
            "sequences": len(sequences),
            "tokens": sum(len(s) for s in sequences),
            "damp": damp,
            "block": block,
            "act_order": act_order,
            "scale_candidates": scale_candidates,
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Calibrate a model's FP8 weights (GPTQ-style error compensation) and "
        "write them as an FP8 checkpoint the engine loads as stored."
    )
    ap.add_argument("model", help="a full-precision model: smollm2, an HF directory, a hub id")
    ap.add_argument("out_dir", help="the directory the FP8 checkpoint is written to")
    ap.add_argument(
        "--text",
        help="a UTF-8 file to calibrate on, passages separated by blank lines "
        "(default: the bundled passages)",
    )
    ap.add_argument("--seq-len", type=int, default=SEQ_LEN, help="most tokens in a sequence")
    ap.add_argument("--damp", type=float, default=DAMP, help="added to H's diagonal, x its mean")
    ap.add_argument("--block", type=int, default=BLOCK, help="columns per lazy update")
    ap.add_argument(
        "--natural-order",
        action="store_true",
        help="round columns in their own order instead of by decreasing H diagonal",
    )
    ap.add_argument(
        "--scale-candidates",
        type=int,
        default=SCALE_CANDIDATES,
        help="scales tried per row, amax / 448 x 2^(k / N) for k < N "
        "(1: amax / 448 alone, the engine's scale)",
    )
    ap.add_argument("--device", default="cpu", help="where to calibrate (cpu, cuda)")
    args = ap.parse_args(argv)
    passages = passages_of(Path(args.text).read_text(encoding="utf-8")) if args.text else None
    out = write_checkpoint(
        args.model,
        args.out_dir,
        passages=passages,
        seq_len=args.seq_len,
        damp=args.damp,
        block=args.block,
        act_order=not args.natural_order,
        scale_candidates=args.scale_candidates,
        device=args.device,
        log=lambda line: print(line, flush=True),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
