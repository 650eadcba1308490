"""The flag names `vllm serve` accepts, so a misspelled tuning flag is refused before a deploy
instead of by every rank's argument parser after its container started (data/vllm_flags.txt says
which releases and how the list was made)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .errors import did_you_mean

FLAGS_FILE = Path(__file__).resolve().parent / "data" / "vllm_flags.txt"
RELEASES = "vLLM 0.18.0 and 0.20.2"  # = the header of FLAGS_FILE


@lru_cache(maxsize=1)
def known_flags() -> frozenset[str]:
    lines = FLAGS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(ln.strip() for ln in lines if ln.strip() and not ln.startswith("#"))


def closest_flag(name: str) -> str | None:
    """The known flag `name` most likely misspells, or None. The cutoff is high: the list holds
    many names that differ by one word (`enable-log-requests`, `enable-log-outputs`)."""
    return did_you_mean(name, sorted(known_flags()), cutoff=0.8)
