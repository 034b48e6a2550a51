"""What a measurement takes from llama-server's `/metrics`: the difference of two scrapes
taken around it, and the drafting figures the cost model needs (`drafting_summary`); the draft
length a server drafts at (`draft_length`).

Scraping and parsing are the client's (tuner.measure.client: prometheus_client's text parser,
labels kept as dicts; `Metrics.since` is the difference of two scrapes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.measure.client import Metrics, MetricSample

__all__ = ["draft_length", "drafting_summary"]

PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_total"


def drafting_summary(diff: Metrics | Mapping[str, float]) -> dict[str, Any]:
    """Drafts, draft tokens, accepted tokens (total and per position) and decode calls (from a
    difference of scrapes, or plain {name: value} counters without labels)."""
    if not isinstance(diff, Metrics):
        diff = Metrics(tuple(MetricSample(k, {}, float(v)) for k, v in diff.items()))
    by_position = {int(k): v for k, v in diff.by_label(PER_POSITION, "position").items()}
    positions = [by_position[i] for i in sorted(by_position)]
    drafts = diff.value("spec_decode_num_drafts_total")
    return {
        "drafts": drafts,
        "draft_tokens": diff.value("spec_decode_num_draft_tokens_total"),
        "accepted_tokens": diff.value("spec_decode_num_accepted_tokens_total"),
        "accepted_per_position": positions,
        # a_i: share of drafts whose first i+1 draft tokens were all accepted
        "accept_rates": [p / drafts for p in positions] if drafts else [],
        "tokens_predicted": diff.value("tokens_predicted_total"),
        "n_decode": diff.value("n_decode_total"),
        "busy_slots_per_decode": diff.value("n_busy_slots_per_decode"),
    }


def draft_length(scrape: Metrics) -> int | None:
    """The most tokens the server drafts at a time (its n_max), by the positions of its accepted
    tokens per draft position; None before it has drafted (llama-server sizes that family when
    a request that drafted finishes) or where the scrape has no such family."""
    if not scrape.value("spec_decode_num_drafts_total"):
        return None
    return len(scrape.by_label(PER_POSITION, "position")) or None
