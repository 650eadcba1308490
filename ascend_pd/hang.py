"""Which instances are broken: dead, hung, or a DP group whose ranks no longer belong together.

Pure (no I/O): `status`, `heal` and the tests feed it what each rank's `/health` and `/metrics` said.

* A rank is **dead** when `/health` or the connection fails.
* A rank is **hung** when it has requests running (`vllm:num_requests_running` > 0) and neither
  `vllm:generation_tokens_total` nor `vllm:request_success_total` has moved for `hang.seconds`,
  whatever `/health` says (vLLM's API server answers 200 while its engine core is stuck: vllm
  #17972, vllm-ascend #8975). This needs history: the tracker remembers, per rank, the counters and
  since when they have been flat while busy. The first poll that sees a rank busy starts its clock
  (nothing before it is known), so a hang is reported within `hang.seconds` + one poll interval.
  One poll alone (`status` without `--watch`) therefore never reports a hang: it says so.
* An instance is **split** when its ranks disagree about the DP group: a rank whose process started
  (`process_start_time_seconds`) more than `vllm.readyTimeoutS` after another's cannot have joined
  the group that one formed (a group forms within its launches' ready deadline or fails), and, with
  history, a rank whose start time changed while the others' did not restarted alone.
* An instance is **broken** when any of these holds for any of its ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Optional

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATION_TOKENS = "vllm:generation_tokens_total"
SUCCESSES = "vllm:request_success_total"
START_TIME = "process_start_time_seconds"

OK, IDLE, BUSY, DEAD, HUNG, UNKNOWN, SPLIT = "ok", "idle", "busy", "dead", "hung", "unknown", "split"


@dataclass(frozen=True)
class Activity:
    """What hang detection reads from one rank's /metrics (sums over label sets)."""

    running: float
    waiting: float
    generation_tokens: float
    successes: float
    start_time: Optional[float]  # epoch seconds; None when the rank does not export it

    @classmethod
    def from_samples(cls, samples: dict) -> "Activity":
        def total(name: str) -> float:
            return sum(v for v in samples.get(name, {}).values() if not math.isnan(v))

        starts = [v for v in samples.get(START_TIME, {}).values() if math.isfinite(v) and v > 0]
        return cls(total(RUNNING), total(WAITING), total(GENERATION_TOKENS), total(SUCCESSES),
                   min(starts) if starts else None)


@dataclass(frozen=True)
class Observation:
    """One rank in one poll: healthy = /health answered 200; activity None = /metrics failed."""

    rank: str
    instance: str
    healthy: bool
    reason: str = ""
    activity: Optional[Activity] = None


@dataclass(frozen=True)
class RankVerdict:
    rank: str
    state: str  # idle, busy, dead, hung, unknown (healthy but /metrics failed)
    evidence: str = ""
    flat_since: Optional[float] = None  # epoch s: since when busy with flat counters


@dataclass(frozen=True)
class InstanceVerdict:
    instance: str
    state: str  # ok, dead, hung, split (the worst, in that order of precedence: dead > hung > split)
    evidence: list[str] = field(default_factory=list)
    ranks: list[RankVerdict] = field(default_factory=list)

    @property
    def broken(self) -> bool:
        return self.state != OK


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")


def _n(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


@dataclass
class _History:
    generation_tokens: float
    successes: float
    start_time: Optional[float]
    flat_since: Optional[float]


class HangTracker:
    """Remembers each rank's counters across polls; `observe` gives every instance's verdict.

    hang_s: `hang.seconds`; split_s: the largest start-time spread a DP group can have
    (`vllm.readyTimeoutS`)."""

    def __init__(self, hang_s: float, split_s: float):
        self.hang_s, self.split_s = hang_s, split_s
        self._history: dict[str, _History] = {}
        self.polls = 0

    def forget(self, instance_ranks: Iterable[str]) -> None:
        """Drop the history of ranks that were restarted on purpose (heal)."""
        for r in instance_ranks:
            self._history.pop(r, None)

    def _rank(self, o: Observation, now: float) -> tuple[RankVerdict, bool]:
        """(verdict, restarted since the last poll)."""
        if not o.healthy:
            self._history.pop(o.rank, None)
            return RankVerdict(o.rank, DEAD, f"{o.rank} dead: {o.reason or '/health failed'}"), False
        a = o.activity
        if a is None:
            return RankVerdict(o.rank, UNKNOWN, f"{o.rank}: /metrics unreadable, hang not judged"), False
        before = self._history.get(o.rank)
        restarted = bool(before and before.start_time is not None and a.start_time is not None
                         and a.start_time != before.start_time)
        moved = (before is None or restarted or a.generation_tokens != before.generation_tokens
                 or a.successes != before.successes)
        if a.running <= 0:
            flat_since = None
        elif moved or before.flat_since is None:
            flat_since = now  # busy, and the counters moved (or nothing is known before now)
        else:
            flat_since = before.flat_since
        self._history[o.rank] = _History(a.generation_tokens, a.successes, a.start_time, flat_since)
        if flat_since is None:
            return RankVerdict(o.rank, IDLE), restarted
        flat = now - flat_since
        if flat >= self.hang_s:
            return RankVerdict(o.rank, HUNG, (
                f"{o.rank} hung: {_n(a.running)} request(s) running, {GENERATION_TOKENS} flat at "
                f"{_n(a.generation_tokens)} and {SUCCESSES} flat at {_n(a.successes)} since "
                f"{_clock(flat_since)} ({flat:.0f}s >= hang.seconds {_n(self.hang_s)})"), flat_since), restarted
        return RankVerdict(o.rank, BUSY, flat_since=flat_since), restarted

    def observe(self, observations: Iterable[Observation], now: float) -> list[InstanceVerdict]:
        """Every instance's verdict from one poll of its ranks (in the order first seen)."""
        by_instance: dict[str, list[Observation]] = {}
        for o in observations:
            by_instance.setdefault(o.instance, []).append(o)
        out = []
        for instance, obs in by_instance.items():
            ranks, restarted = [], []
            for o in obs:
                v, again = self._rank(o, now)
                ranks.append(v)
                if again:
                    restarted.append(o.rank)
            evidence = [v.evidence for v in ranks if v.state in (DEAD, HUNG)]
            split = self._split(obs, restarted)
            state = (DEAD if any(v.state == DEAD for v in ranks) else HUNG if any(v.state == HUNG for v in ranks)
                     else SPLIT if split else OK)
            out.append(InstanceVerdict(instance, state, evidence + split, ranks))
        self.polls += 1
        return out

    def _split(self, obs: list[Observation], restarted: list[str]) -> list[str]:
        starts = {o.rank: o.activity.start_time for o in obs
                  if o.healthy and o.activity is not None and o.activity.start_time is not None}
        why = []
        if len(starts) >= 2:
            first = min(starts, key=starts.get)
            for r, t in starts.items():
                if t - starts[first] > self.split_s:
                    why.append(f"{r} started {t - starts[first]:.0f}s after {first} (process_start_time_seconds; "
                               f"a DP group forms within vllm.readyTimeoutS {_n(self.split_s)}s): not in its DP group")
        if restarted and len(restarted) < len(obs):
            why.append(f"{', '.join(restarted)} restarted since the last poll, the other ranks of the group did not")
        return why


ONE_SHOT_NOTE = ("hang detection needs counters from two polls at least hang.seconds apart: one poll shows dead "
                 "ranks and split groups only; run `status --watch` (or `heal --watch`) to see hangs")


__all__ = ["Activity", "Observation", "RankVerdict", "InstanceVerdict", "HangTracker", "ONE_SHOT_NOTE",
           "OK", "IDLE", "BUSY", "DEAD", "HUNG", "UNKNOWN", "SPLIT"]
