"""The flag names `vllm serve` accepts in some release ascend-pd knows, so a misspelled tuning flag is
refused before a deploy instead of by every rank's argument parser after its container started. The
lists are the releases' own (data/releases/, `serve_flags`); a role is further held to the list of the
release its image runs (releases.py)."""

from __future__ import annotations

from .errors import did_you_mean
from .releases import all_serve_flags, vllm_versions


def known_flags() -> frozenset[str]:
    return all_serve_flags()


def releases_label() -> str:
    """`vLLM 0.18.0, 0.20.2 and 0.23.0`: whose flags known_flags holds."""
    return vllm_versions()


def closest_flag(name: str) -> str | None:
    """The known flag `name` most likely misspells, or None. The cutoff is high: the list holds
    many names that differ by one word (`enable-log-requests`, `enable-log-outputs`)."""
    return did_you_mean(name, sorted(known_flags()), cutoff=0.8)
