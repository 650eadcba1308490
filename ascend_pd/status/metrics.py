"""Prometheus text exposition, read with prometheus_client's parser (the library vLLM writes it with):
samples by name and labels, counters checked, within a deadline and a line-length bound."""

from __future__ import annotations

import json
import math
import time
from typing import Iterator, Optional

from prometheus_client.parser import text_fd_to_metric_families


# A Prometheus counter (`*_total`) is a finite count; larger than this is nonsense, and sums of such
# values would overflow to inf.
MAX_COUNTER = float(2 ** 63)

# The library's parser slices the rest of a line once per label and once per quote, so one line costs
# the square of its length: measured, a 256 KiB line of labels takes 2.7 s and a 4 MiB one would take
# minutes, all between two deadline checks (16 KiB: 0.06 s).
# vLLM's longest lines (histogram buckets with model_name) are a few hundred characters.
MAX_LINE_CHARS = 16 * 1024


class MetricsParseError(ValueError):
    """A malformed /metrics answer (the message quotes at most 200 characters of the line)."""


class _Lines:
    """The lines of `text` for the library's parser (which iterates its `fd`), ending at "\\n" only (the
    text format's rule; str.splitlines would also cut at \\r, \\x1c-\\x1e, \\x85 and \\u2028 inside a
    label value). Remembers the line it gave last, refuses one longer than MAX_LINE_CHARS and raises
    TimeoutError once `deadline` (time.monotonic()) has passed."""

    def __init__(self, text: str, deadline: Optional[float]):
        self.text, self.deadline = text, deadline
        self.number, self.line = 0, ""

    def __iter__(self) -> Iterator[str]:
        for self.number, self.line in enumerate(self.text.split("\n"), 1):
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise TimeoutError(f"not parsed by the deadline ({self.number - 1} lines done)")
            if len(self.line) > MAX_LINE_CHARS:
                raise MetricsParseError(f"line {self.number} is longer than {MAX_LINE_CHARS} characters: "
                                        f"{self.line[:200]!r}")
            yield self.line


def _float(value) -> float:
    """The library gives an int for an integer text: one of 400 digits is inf as a float, as float() reads it."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def parse_prometheus(text: str, *, deadline: Optional[float] = None
                     ) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted label pairs -> value}, parsed by prometheus_client. `_created` samples
    (creation timestamps, not counts) are dropped; a malformed line raises MetricsParseError quoting it.
    `deadline` (time.monotonic()): raise TimeoutError when parsing is not done by then.

    The library reads a counter family in OpenMetrics' terms: `# TYPE x counter` followed by samples
    named `x` gives them as `x_total` (vLLM's counters are written `x_total` already)."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    lines = _Lines(text, deadline)
    try:
        for family in text_fd_to_metric_families(lines):
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = _float(s.value)
    except (ValueError, LookupError, TypeError) as exc:  # the parser's ValueError; the others: a bug net
        if isinstance(exc, MetricsParseError):
            raise
        raw = lines.line
        what = "comment" if raw.lstrip().startswith("#") else "sample"
        raise MetricsParseError(f"bad {what} line {raw[:200]!r}") from None
    return out


def _format_value(v: float) -> str:
    return {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}.get(repr(v), repr(v))


def _check_counters(samples: dict[str, dict]) -> None:
    """Every counter (a `*_total` sample) must be a finite count in [0, 2**63): `+Inf`, `NaN` or a
    negative counter raises MetricsParseError naming the sample (gauges may legitimately be NaN)."""
    for name, series in samples.items():
        if not name.endswith("_total"):
            continue
        for labels, v in series.items():
            if not (math.isfinite(v) and 0 <= v < MAX_COUNTER):
                shown = ",".join(f"{k}={json.dumps(val[:60])}" for k, val in labels)[:200]
                raise MetricsParseError(f"counter {name}{{{shown}}} is {_format_value(v)}, not a count")


def metric_sum(samples: dict[str, dict], name: str) -> float:
    """Sum of a sample name over all its label sets (NaN samples skipped); 0 when absent."""
    return sum(v for v in samples.get(name, {}).values() if not math.isnan(v))
