"""The twin server's tokenizer: deterministic, stateless and reversible, with no vocabulary file.

A twin has no model, so its text is counted, not understood: runs of ASCII characters become one
token per 4 characters (the last piece of a run may be shorter), and every byte of anything else
(UTF-8) is a token of its own. A token id encodes its piece exactly, so detokenize is the inverse
of tokenize on any text and token lists of the twin's own making; ids it never made (another
model's tokenizer) detokenize to nothing. Ids stay below 2^30, int32 like llama.cpp's.

- id 0 is the start-of-text token (BOS, added with `add_special`), empty as text;
- an ASCII piece of length L (1..4) with characters c_0..c_(L-1) is
  OFFSET[L] + sum c_i * 128^i, the offsets keeping the four lengths apart;
- a byte b of a non-ASCII character is BYTE_BASE + b.

The chat template is ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n`, then the assistant's
opening), as SmolLM2's; generated text cycles through a fixed sentence, 4 characters a token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BOS = 0
PIECE = 4  # ASCII characters per token
OFFSETS = (0, 1, 1 + 128, 1 + 128 + 128**2, 1 + 128 + 128**2 + 128**3)  # by piece length
BYTE_BASE = OFFSETS[4] + 128**4  # non-ASCII bytes, one token each
TOP = BYTE_BASE + 256
BOS_TEXT = "<|im_start|>"
EOS_TEXT = "<|im_end|>"
GENERATED = " the sea was calm and the ship sailed on through the night, while the crew slept."


def _ascii_id(piece: str) -> int:
    value = 0
    for i, ch in enumerate(piece):
        value += ord(ch) * 128**i
    return OFFSETS[len(piece)] + value


def tokenize(text: str, add_special: bool = False) -> list[int]:
    """Token ids of text (BOS first with add_special)."""
    tokens = [BOS] if add_special else []
    run: list[str] = []

    def flush() -> None:
        joined = "".join(run)
        tokens.extend(_ascii_id(joined[i : i + PIECE]) for i in range(0, len(joined), PIECE))
        run.clear()

    for ch in text:
        if ord(ch) < 128:
            run.append(ch)
            continue
        flush()
        tokens.extend(BYTE_BASE + b for b in ch.encode("utf-8"))
    flush()
    return tokens


def piece_bytes(token: int) -> bytes:
    """The bytes of one token (empty for BOS and for ids the twin never makes)."""
    if token >= BYTE_BASE:
        return bytes([token - BYTE_BASE]) if token < TOP else b""
    for length in (4, 3, 2, 1):
        if token >= OFFSETS[length]:
            value = token - OFFSETS[length]
            return bytes((value // 128**i) % 128 for i in range(length))
    return b""


def detokenize(tokens: Iterable[int]) -> str:
    """Text of token ids (a byte sequence cut inside a character reads as U+FFFD)."""
    return b"".join(piece_bytes(int(t)) for t in tokens).decode("utf-8", errors="replace")


def count(text: str, add_special: bool = False) -> int:
    """How many tokens tokenize(text) makes."""
    return len(tokenize(text, add_special))


def apply_template(messages: Sequence[Mapping[str, Any]]) -> str:
    """A chat as ChatML text, ending with the assistant's opening."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        parts.append(f"{BOS_TEXT}{message.get('role', 'user')}\n{content or ''}{EOS_TEXT}\n")
    return "".join(parts) + f"{BOS_TEXT}assistant\n"


# Whole pieces only, so a request's text tokenizes back to its tokens across the cycles.
_GENERATED_IDS = tokenize(GENERATED + " " * (-len(GENERATED) % PIECE))


def generated(start: int, n: int) -> list[int]:
    """Tokens start .. start + n - 1 of a request's output."""
    size = len(_GENERATED_IDS)
    return [_GENERATED_IDS[(start + i) % size] for i in range(n)]
