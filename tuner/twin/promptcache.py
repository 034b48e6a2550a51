"""The twin server's prompt cache: the last prompts served, for the prefix a new request need not
evaluate again (llama-server's slots keep their prompts' KV and reuse the longest common prefix)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class PromptCache:
    """The last prompts, for the prefix a new request need not evaluate again."""

    def __init__(self, size: int) -> None:
        self._prompts: deque[tuple[int, ...]] = deque(maxlen=size)

    def take(self, tokens: Sequence[int]) -> int:
        """Tokens of this prompt already held (the longest common prefix), and remember it."""
        prompt = tuple(tokens)
        best = max((_common_prefix(p, prompt) for p in self._prompts), default=0)
        self._prompts.append(prompt)
        return best


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix (binary search over slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
