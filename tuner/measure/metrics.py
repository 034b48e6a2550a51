"""llama-server `/metrics`: scrape (Prometheus text, parsed by prometheus_client) and diff.

Counters are compared between two scrapes taken around one measurement; gauges keep the later
value. The drafting figures the cost model needs come out of `drafting_summary`.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tuner.errors import ServerError

PREFIX = "llamacpp:"
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_total"
GAUGES = {
    "n_busy_slots_per_decode",
    "requests_processing",
    "requests_deferred",
    "n_tokens_max",
    "prompt_tokens_seconds",
    "predicted_tokens_seconds",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Flatten Prometheus text into {name or name{label="v"}: value}, minus the llamacpp: prefix."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix(PREFIX)
            if sample.labels:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                name = f"{name}{{{labels}}}"
            values[name] = float(sample.value)
    return values


def scrape(
    client: httpx.Client | None, url: str, headers: dict[str, str] | None = None
) -> dict[str, float]:
    """GET /metrics (the server must run with --metrics)."""
    try:
        if client is None:
            response = httpx.get(f"{url}/metrics", timeout=10, headers=headers)
        else:
            response = client.get(f"{url}/metrics", timeout=10, headers=headers)
    except httpx.HTTPError as exc:
        raise ServerError(f"GET /metrics failed: {exc}") from exc
    if response.status_code == 501 or response.status_code == 404:
        raise ServerError("the server does not expose /metrics; start it with --metrics")
    if response.status_code != 200:
        raise ServerError(f"GET /metrics answered HTTP {response.status_code}")
    return parse_metrics(response.text)


def _base_name(key: str) -> str:
    return key.split("{", 1)[0]


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counter increase between two scrapes; gauges keep their later value."""
    out: dict[str, float] = {}
    for key, value in after.items():
        if _base_name(key) in GAUGES:
            out[key] = value
        else:
            out[key] = value - before.get(key, 0.0)
    return out


_POSITION = re.compile(r'position="(\d+)"')


def drafting_summary(diff: dict[str, float]) -> dict[str, Any]:
    """Drafts, draft tokens, accepted tokens (total and per position) and decode calls."""
    per_position: dict[int, float] = {}
    for key, value in diff.items():
        if _base_name(key) == PER_POSITION and (match := _POSITION.search(key)):
            per_position[int(match.group(1))] = value
    positions = [per_position[i] for i in sorted(per_position)]
    drafts = diff.get("spec_decode_num_drafts_total", 0.0)
    return {
        "drafts": drafts,
        "draft_tokens": diff.get("spec_decode_num_draft_tokens_total", 0.0),
        "accepted_tokens": diff.get("spec_decode_num_accepted_tokens_total", 0.0),
        "accepted_per_position": positions,
        # a_i: share of drafts whose first i+1 draft tokens were all accepted
        "accept_rates": [p / drafts for p in positions] if drafts else [],
        "tokens_predicted": diff.get("tokens_predicted_total", 0.0),
        "n_decode": diff.get("n_decode_total", 0.0),
        "busy_slots_per_decode": diff.get("n_busy_slots_per_decode", 0.0),
    }
