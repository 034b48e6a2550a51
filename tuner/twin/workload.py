"""The twin's inputs: what a request asks for (`Request`, its seed by index: `request_seed`) and
when requests arrive (`Workload`: a closed level, open-loop offsets, Poisson, bursts or a mix of
lengths and classes; `arrival_offsets`, the one place arrival times are drawn, Poisson through
tuner.measure.arrivals as `tuner validate --arrivals poisson` draws them). Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.twin.bursts import gamma_offsets, mmpp_offsets


@dataclass(frozen=True)
class Request:
    """What one request asks for.

    prompt_tokens: the prompt's whole length (what the slot's context holds when it starts
    generating: the context depth); cached_tokens: how many of them the slot already holds
    (a cached prefix, the padding of a deep level), not evaluated again (at least one prompt
    token is always evaluated, as in llama-server); max_tokens: tokens to generate (n_predict;
    no stop strings in a twin); seed: the request's sampling seed, which seeds its synthetic
    acceptance; content: the acceptance class its prompt marks (a class name of the world's
    [[acceptance.classes]], as World.marked_class reads a prompt; "" unmarked: the class by
    its seed's share, else the world's own acceptance)."""

    prompt_tokens: int = 32
    max_tokens: int = 128
    seed: int = 0
    cached_tokens: int = 0
    content: str = ""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be 1 or more, not {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be 1 or more, not {self.max_tokens}")
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise ValueError(
                f"cached_tokens must be within 0..prompt_tokens, not {self.cached_tokens}"
            )

    @property
    def evaluated_tokens(self) -> int:
        """Prompt tokens the server evaluates (llama-server re-evaluates at least one)."""
        return max(1, self.prompt_tokens - self.cached_tokens)


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of request `index` of a workload seeded `seed` (32 bits, stable)."""
    digest = hashlib.blake2b(f"twin:{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class Workload:
    """Requests and when they arrive (virtual seconds from the start)."""

    requests: tuple[Request, ...]
    arrivals: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.requests) != len(self.arrivals):
            raise ValueError("a workload needs one arrival time per request")
        if any(t < 0 for t in self.arrivals):
            raise ValueError("arrival times are 0 or more")

    @classmethod
    def closed(
        cls,
        streams: int,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> Workload:
        """A closed level as the tuner measures one: `streams` requests released together.

        depth > 0: each request holds exactly `depth` tokens, of which all but the prompt are
        cached (the tuner prefills each stream's padding before it measures)."""
        if streams < 1:
            raise ValueError(f"a closed level has 1 or more streams, not {streams}")
        lengths = _lengths(output_tokens, streams)
        return cls(
            tuple(
                _request(prompt_tokens, depth, lengths[i], request_seed(seed, i))
                for i in range(streams)
            ),
            (0.0,) * streams,
        )

    @classmethod
    def open_loop(
        cls,
        offsets: Sequence[float],
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> Workload:
        """Requests arriving at the given offsets, each generating its length."""
        lengths = _lengths(output_tokens, len(offsets))
        return cls(
            tuple(
                _request(prompt_tokens, depth, lengths[i], request_seed(seed, i))
                for i in range(len(offsets))
            ),
            tuple(float(t) for t in offsets),
        )

    @classmethod
    def poisson(
        cls,
        rate: float,
        duration_s: float,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
    ) -> Workload:
        """Poisson arrivals as `tuner validate --arrivals poisson` sends them (conditioned on
        their count: exactly round(rate x duration) of them)."""
        offsets = arrival_offsets("poisson", rate, duration_s, seed)
        return cls.open_loop(offsets, output_tokens, prompt_tokens, depth, seed)

    @classmethod
    def bursty(
        cls,
        rate: float,
        duration_s: float,
        output_tokens: int | Sequence[int] = 128,
        prompt_tokens: int = 32,
        depth: int = 0,
        seed: int = 0,
        *,
        process: str = "gamma",
        cv: float = 2.0,
        peak: float = 8.0,
        busy_share: float = 0.2,
        busy_s: float = 30.0,
    ) -> Workload:
        """Bursty arrivals (tuner.twin.bursts), conditioned on their count as `poisson` is:
        process "gamma" (gaps of coefficient of variation cv) or "mmpp" (busy spells at peak
        times the quiet rate, busy_share of the time, busy_s seconds each on average)."""
        return cls.open_loop(
            arrival_offsets(
                process,
                rate,
                duration_s,
                seed,
                cv=cv,
                peak=peak,
                busy_share=busy_share,
                busy_s=busy_s,
            ),
            output_tokens,
            prompt_tokens,
            depth,
            seed,
        )

    @classmethod
    def mixed(
        cls,
        offsets: Sequence[float],
        prompt_tokens: Sequence[int],
        output_tokens: Sequence[int],
        contents: Sequence[str] | None = None,
        seed: int = 0,
    ) -> Workload:
        """Requests of lengths (and acceptance classes, "" unmarked) of their own, arriving at
        the given offsets; request seeds from `seed` as every workload's."""
        count = len(offsets)
        marks = list(contents) if contents is not None else [""] * count
        if not len(prompt_tokens) == len(output_tokens) == len(marks) == count:
            raise ValueError("a mixed workload needs one prompt, output and class per arrival")
        return cls(
            tuple(
                Request(
                    int(prompt_tokens[i]), int(output_tokens[i]), request_seed(seed, i), 0, marks[i]
                )
                for i in range(count)
            ),
            tuple(float(t) for t in offsets),
        )


ARRIVALS = ("poisson", "gamma", "mmpp")


def arrival_offsets(
    process: str,
    rate: float,
    duration_s: float,
    seed: int,
    *,
    cv: float = 2.0,
    peak: float = 8.0,
    busy_share: float = 0.2,
    busy_s: float = 30.0,
) -> list[float]:
    """Arrival times of one of ARRIVALS, each conditioned on round(rate x duration) arrivals:
    poisson as `tuner validate --arrivals poisson` draws them, gamma and mmpp from
    tuner.twin.bursts (their parameters ignored by the processes that have none)."""
    from tuner.measure.arrivals import poisson_offsets

    if process == "poisson":
        return poisson_offsets(rate, duration_s, seed)
    if process == "gamma":
        return gamma_offsets(rate, duration_s, cv, seed)
    if process == "mmpp":
        return mmpp_offsets(rate, duration_s, seed, peak=peak, busy_share=busy_share, busy_s=busy_s)
    raise ValueError(f"unknown arrival process {process!r}; known: {', '.join(ARRIVALS)}")


def _lengths(output_tokens: int | Sequence[int], count: int) -> list[int]:
    if isinstance(output_tokens, int):
        return [output_tokens] * count
    lengths = [int(n) for n in output_tokens]
    if len(lengths) != count:
        raise ValueError(f"{len(lengths)} output lengths for {count} requests")
    return lengths


def _request(prompt_tokens: int, depth: int, max_tokens: int, seed: int) -> Request:
    if depth > 0:
        prompt = max(depth, prompt_tokens)
        return Request(prompt, max_tokens, seed, cached_tokens=prompt - prompt_tokens)
    return Request(prompt_tokens, max_tokens, seed)
