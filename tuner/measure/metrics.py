"""llama-server's `/metrics` as the tuner reads it: a scrape parsed by prometheus_client's text
parser into `Metrics` (the llamacpp: prefix dropped, labels kept as dicts), the difference of
two scrapes taken around a measurement (`Metrics.since`), and what a measurement takes from it:
the drafting figures the cost model needs (`drafting_summary`) and the draft length a server
drafts at (`draft_length`). Scraping is the client's (tuner.measure.client)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MetricSample", "Metrics", "draft_length", "drafting_summary", "parse_metrics"]

PREFIX = "llamacpp:"
# Gauges keep their later value in a difference; a maximum is not a sum either, whatever its
# TYPE line says (llama-server declares n_tokens_max a counter).
GAUGES = {"n_tokens_max_total", "n_tokens_max"}


@dataclass(frozen=True)
class MetricSample:
    """One Prometheus sample: its name without the llamacpp: prefix, its labels, its value."""

    name: str
    labels: Mapping[str, str]
    value: float
    gauge: bool = False


@dataclass(frozen=True)
class Metrics:
    """One /metrics scrape (or the difference of two)."""

    samples: tuple[MetricSample, ...] = ()

    def value(self, name: str, default: float = 0.0, **labels: str) -> float:
        """The sample of that name whose labels are exactly `labels` (none: the unlabelled one)."""
        for s in self.samples:
            if s.name == name and dict(s.labels) == labels:
                return s.value
        return default

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """A labelled family as {label value: value}, e.g. accepted tokens by draft position."""
        return {
            s.labels[label]: s.value for s in self.samples if s.name == name and label in s.labels
        }

    def __getitem__(self, name: str) -> float:
        """The unlabelled sample of that name (KeyError when there is none)."""
        for s in self.samples:
            if s.name == name and not s.labels:
                return s.value
        raise KeyError(name)

    def get(self, name: str, default: float | None = None) -> float | None:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return any(s.name == name and not s.labels for s in self.samples)

    def since(self, before: Metrics) -> Metrics:
        """What happened between two scrapes: counters' increase, gauges' later value."""
        earlier = {(s.name, _label_key(s.labels)): s.value for s in before.samples}
        return Metrics(
            tuple(
                s
                if s.gauge
                else MetricSample(
                    s.name, s.labels, s.value - earlier.get((s.name, _label_key(s.labels)), 0.0)
                )
                for s in self.samples
            )
        )


def _label_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def parse_metrics(text: str) -> Metrics:
    """Prometheus text (llama-server's /metrics) into Metrics."""
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name.removeprefix(PREFIX)
            gauge = family.type == "gauge" or name in GAUGES
            samples.append(MetricSample(name, dict(s.labels), float(s.value), gauge))
    return Metrics(tuple(samples))


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
