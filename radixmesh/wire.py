"""Wire-type helpers shared by the two gRPC servers (worker and router).

Only the servers' edges import this; inside, everything is plain values.
"""

from __future__ import annotations

from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import TokenizerLike, validate_messages
from radixmesh.v1 import common_pb2


def input_ids_from_proto(
    inp: common_pb2.Input, tok: TokenizerLike, *, max_text_bytes: int | None = None
) -> list[int]:
    """The request's `Input` oneof (token ids, text or chat messages) -> token ids; text
    (all messages' content together) past `max_text_bytes` UTF-8 bytes is refused before
    it is tokenized."""
    kind = inp.WhichOneof("kind")
    if max_text_bytes is not None and kind in ("text", "messages"):
        texts = [inp.text] if kind == "text" else [m.content for m in inp.messages.messages]
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        if size > max_text_bytes:
            raise InvalidArgument(
                f"input.{kind}", f"{size} bytes of text; at most {max_text_bytes} are allowed"
            )
    if kind is None:
        raise InvalidArgument("input", "empty input: set token_ids, text or messages")
    if kind == "token_ids":
        if not inp.token_ids.ids:
            raise InvalidArgument("input.token_ids", "the token id list is empty")
        return list(inp.token_ids.ids)
    if kind == "text":
        if not inp.text:
            raise InvalidArgument("input.text", "the text is empty")
        return tok.encode(inp.text)
    messages = [{"role": m.role, "content": m.content} for m in inp.messages.messages]
    try:
        checked = validate_messages(messages)
    except InvalidArgument as e:
        raise InvalidArgument("input.messages", e.message) from None
    return tok.encode_chat(checked)
