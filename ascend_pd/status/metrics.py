"""Prometheus text exposition, read: samples by name and labels, counters checked."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Optional


# A Prometheus counter (`*_total`) is a finite count; larger than this is nonsense, and sums of such
# values would overflow to inf.
MAX_COUNTER = float(2 ** 63)


# ---------------------------------------------------------------------------------------------
# Prometheus text format (0.0.4; OpenMetrics' `# EOF` tolerated)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:[ \t]*\{(.*)\})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*$")
_LABEL_NAME = re.compile(r"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsParseError(ValueError):
    """A malformed /metrics answer (the message quotes at most 200 characters of the line)."""


def _parse_labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    labels, pos = [], 0
    while True:
        while pos < len(text) and text[pos] in " \t,":
            pos += 1
        if pos >= len(text):
            return tuple(sorted(labels))
        m = _LABEL_NAME.match(text, pos)
        if not m:
            raise MetricsParseError(f"bad labels in {line[:200]!r}")
        pos, value = m.end(), []
        while True:
            if pos >= len(text):
                raise MetricsParseError(f"unterminated label value in {line[:200]!r}")
            ch = text[pos]
            if ch == "\\" and pos + 1 < len(text):
                value.append(_ESCAPES.get(text[pos + 1], "\\" + text[pos + 1]))
                pos += 2
            elif ch == '"':
                pos += 1
                break
            else:
                value.append(ch)
                pos += 1
        labels.append((m.group(1), "".join(value)))
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] != ",":
            raise MetricsParseError(f"expected ',' between labels in {line[:200]!r}")


def parse_prometheus(text: str, *, deadline: Optional[float] = None
                     ) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted label pairs -> value}. Comments (HELP/TYPE) are skipped, `_created`
    samples (creation timestamps, not counts) are dropped; a malformed line raises MetricsParseError.
    `deadline` (time.monotonic()): raise TimeoutError when parsing is not done by then."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    # Lines end at "\n" only (the text format's rule); str.splitlines would also cut at \r, \x1c-\x1e,
    # \x85 and \u2028 inside a label value. A "\r\n" line ending is stripped below.
    for i, raw in enumerate(text.split("\n")):
        if deadline is not None and not i % 1024 and time.monotonic() > deadline:
            raise TimeoutError(f"not parsed by the deadline ({i} lines done)")
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise MetricsParseError(f"bad sample line {raw[:200]!r}")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if name.endswith("_created"):
            continue
        try:
            number = float(value)
        except ValueError:
            raise MetricsParseError(f"bad value {value[:40]!r} in {raw[:200]!r}") from None
        out.setdefault(name, {})[_parse_labels(labels or "", raw)] = number
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
