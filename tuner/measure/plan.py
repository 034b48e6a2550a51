"""What a profile measures and how it reports progress: the policies of a spec (plain, always
draft, a threshold), the llama-server launch each needs, and the events a progress display gets.

An attached server is measured as its operator configured it: its policy is unknown, so its
levels carry its label instead (Attached).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuner.measure.launcher import LaunchConfig
from tuner.measure.load import LevelFigures
from tuner.measure.spec import ProfileSpec
from tuner.policy import Policy


@dataclass(frozen=True)
class Attached:
    """A running server the tuner did not start, measured as it is configured."""

    label: str

    @property
    def config_name(self) -> str:
        return self.label


Target = Policy | Attached  # what one level measures


def profile_policies(spec: ProfileSpec, plain: bool = True) -> list[Policy]:
    """plain (unless not: a running server tuned without a plain server beside it) and always
    draft, and the spec's threshold when it names one."""
    policies = [Policy.plain(), Policy.always()] if plain else [Policy.always()]
    if spec.speculative.threshold:
        policies.append(Policy.threshold(spec.speculative.threshold))
    return policies


def launch_config(spec: ProfileSpec, policy: Policy, port: int | None = None) -> LaunchConfig:
    """The llama-server launch of a policy: the spec's server, its drafting arguments and the
    threshold flag where the policy has one."""
    args = list(spec.server.args)
    if policy.drafting:
        n_max = policy.n_max or spec.speculative.n_max
        args += [*spec.speculative.args, "--spec-draft-n-max", str(n_max)]
    return LaunchConfig(
        binary=spec.server.binary,
        model=spec.server.model,
        n_parallel=spec.server.n_parallel,
        ctx_size=spec.server.ctx_size,
        threads=spec.server.threads,
        args=args,
        env=dict(spec.server.env),
        max_slots=policy.max_slots if policy.is_threshold else None,
        port=port if port is not None else spec.server.port,
    )


@dataclass
class ProgressEvent:
    """What the profiler is doing, for a progress display."""

    kind: str  # plan | server | repeat | level | kernel | message
    total: int = 0  # plan: repeats planned in all
    advance: int = 0  # repeats done by this event
    config: str = ""
    concurrency: int = 0
    repeat: int = 0
    figures: LevelFigures | None = None
    text: str = ""
    depth: int = 0  # context depth of the level (tokens per stream)


Observer = Callable[[ProgressEvent], None]


def quiet(_: ProgressEvent) -> None:
    """An observer that shows nothing."""
