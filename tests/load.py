"""A steady stream of completions through the PD proxy while a change rolls, as clients send them:
which requests failed, how, and the latency percentiles (tests/integration/test_rollout.py on the
engine model, tests/realengine/test_scenarios.py on the real `pulumi up`)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import requests

from proxy_key import TEST_PROXY_KEY

RATE_PER_S = 20
REQUEST_TIMEOUT_S = 30  # a request that hangs shows as a latency far above the 1 s bound


@dataclass
class Outcome:
    start: float
    latency: float
    status: int  # 0: no HTTP answer
    ok: bool
    detail: str = ""


@dataclass
class Load:
    """Requests at a fixed rate, each in its own thread, until stopped."""

    url: str
    model: str
    outcomes: list[Outcome] = field(default_factory=list)
    key: str = TEST_PROXY_KEY  # the proxy's (proxy.auth); a proxy without auth ignores it

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=128)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self) -> None:
        t0 = time.monotonic()
        status, ok, detail = 0, False, ""
        try:
            r = requests.post(f"{self.url}/v1/completions", timeout=REQUEST_TIMEOUT_S,
                              headers={"Authorization": f"Bearer {self.key}"},
                              json={"model": self.model, "prompt": "hello there", "max_tokens": 4})
            status = r.status_code
            text = ""
            if status == 200:
                try:
                    text = r.json()["choices"][0]["text"]
                except (ValueError, KeyError, IndexError, TypeError):
                    detail = f"200 with body {r.text[:80]!r}"
            ok = status == 200 and bool(text)
            if not ok and not detail:
                detail = f"{status} {r.text[:80]!r}"
        except requests.RequestException as exc:
            detail = type(exc).__name__
        with self._lock:
            self.outcomes.append(Outcome(t0, time.monotonic() - t0, status, ok, detail))

    def _run(self) -> None:
        period, next_at = 1.0 / RATE_PER_S, time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._one)
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)

    def report(self, what: str) -> str:
        lat = sorted(o.latency for o in self.outcomes)
        p99 = lat[max(0, int(len(lat) * 0.99) - 1)] if lat else 0.0
        failed = [o for o in self.outcomes if not o.ok]
        line = (f"{what}: {len(self.outcomes)} requests, {len(failed)} failed, p99 {p99 * 1000:.0f} ms, "
                f"slowest failure {max((o.latency for o in failed), default=0) * 1000:.0f} ms, "
                f"failed statuses {sorted({o.status for o in failed})}")
        print("\n" + line)
        return line

    def percentile(self, q: float) -> float:
        """The q-quantile (0..1) of the requests' latencies, in seconds (nearest rank)."""
        lat = sorted(o.latency for o in self.outcomes)
        return lat[min(len(lat) - 1, max(0, int(round(len(lat) * q + 0.5)) - 1))] if lat else 0.0
