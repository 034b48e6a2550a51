"""Preflight: every configuration a run will use answers one short request before the run spends
minutes, so a server that cannot run here fails in seconds, its death named, nothing stored."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

from tuner.measure.launcher import ManagedServer
from tuner.measure.plan import Observer, ProgressEvent, launch_config, quiet
from tuner.measure.spec import ProfileSpec
from tuner.policy import Policy


def preflight(
    spec: ProfileSpec, policies: list[Policy], log_dir: Path, observer: Observer = quiet
) -> None:
    """Launch each configuration once and have it answer one short request, drafting on where it
    drafts, before a run spends minutes on it.

    A build that crashes on this machine (an illegal instruction in the first draft step, say)
    fails here within seconds, with its signal named, and no run is created.
    """
    folder = log_dir / "preflight" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    timeout_s = min(60.0, spec.workload.request_timeout_s)
    for policy in policies:
        started = time.monotonic()
        server = ManagedServer(
            launch_config(spec, policy),
            folder / f"{policy.config_name}.log",
            start_timeout_s=spec.server.start_timeout_s,
            name=f"llama-server ({policy.config_name})",
        )
        with server:
            timings = server.answer_one(
                "at its preflight request (one short completion, before anything is measured)",
                timeout_s=timeout_s,
            )
        drafted = int(timings.get("draft_n") or 0)
        note = f", {drafted} draft tokens" if policy.drafting else ""
        observer(
            ProgressEvent(
                "message",
                text=f"preflight: {policy.config_name} answered in "
                f"{time.monotonic() - started:.1f} s{note}",
            )
        )
        if policy.drafting and drafted == 0:
            observer(
                ProgressEvent(
                    "message",
                    text=f"note: {policy.config_name} drafted nothing in its preflight request; "
                    "check speculative.args if drafting was expected",
                )
            )
