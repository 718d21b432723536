"""A Hugging Face hub cache written by the tests: a small random Llama checkpoint saved by
transformers (safetensors, config.json, a byte-level BPE tokenizer trained here, a chat
template) under `models--<org>--<name>/snapshots/<commit>` with `refs/main` pointing at
it, the layout huggingface_hub reads. No network is needed or used."""

from __future__ import annotations

from pathlib import Path

REPO = "test-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
_CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Once upon a time there was a radix tree that cached every prompt it saw.",
    "user: hello there\nassistant: general kenobi\n",
] * 20


def snapshot_dir(cache: Path, repo: str = REPO, commit: str = COMMIT) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


def write_tiny_llama(
    cache: Path, repo: str = REPO, commit: str = COMMIT, *, weights: bool = True
) -> Path:
    """Save the checkpoint (or, weights=False, only its config and tokenizer files) into
    the hub cache `cache`; returns the snapshot directory."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_CORPUS, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    snap = snapshot_dir(cache, repo, commit)
    snap.mkdir(parents=True, exist_ok=True)
    if weights:
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(snap, safe_serialization=True)
    else:
        config.save_pretrained(snap)
    tok.save_pretrained(snap)
    refs = snap.parent.parent / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(commit)
    return snap
