"""What Prometheus costs for a stack of 64 ranks: `venv/bin/python tests/bench_prometheus.py`.

The committed a2-8node stack on loopback (127.0.5.1-8), its prefill moved to tp 1 / dp 8 per node so the
stack has 64 ranks (32 prefill, 32 decode), each a fake vLLM rank serving vLLM's metric names and
latency histograms under traffic; etcd too. Debian's Prometheus scrapes them with the files
`render --out` writes, at `--interval` seconds. After `--warmup` seconds it measures, over
`--measure` seconds: the CPU time and RSS of the Prometheus process (from /proc), its head series,
and how long each rule group took to evaluate against the evaluation interval (Prometheus' own
`prometheus_rule_group_last_duration_seconds`, sampled every interval, the maximum kept).

Not a test (pytest does not collect it): a measurement to rerun on the machine that will run
Prometheus. docs/operations.md quotes its output.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_support import (Procs, a2_8node_on_loopback, have_etcd, plan_of, start_etcd,  # noqa: E402
                            start_ranks)
from test_monitoring import start_prometheus  # noqa: E402

from ascend_pd.monitoring import Monitoring, write_monitoring  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2 ** 20


def own_metrics(api) -> dict[str, float]:
    """Prometheus' own /metrics (it does not scrape itself here): sample line -> value."""
    text = api.session.get(f"{api.url}/metrics", timeout=5).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def traffic(plan, stop: threading.Event, counts: list) -> None:
    """A trickle of completions to random ranks, so counters and histograms move."""
    s = requests.Session()
    s.trust_env = False
    ranks = list(plan.ranks)
    while not stop.is_set():
        r = random.choice(ranks)
        try:
            s.post(f"http://{r.address}:{r.port}/v1/completions", timeout=5,
                   json={"model": plan.cfg.model.served_name, "prompt": "x " * random.randint(10, 400),
                         "max_tokens": random.randint(1, 8)})
            counts[0] += 1
        except requests.RequestException:
            pass
        stop.wait(0.02)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interval", type=int, default=5, help="scrape and evaluation interval, seconds")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--measure", type=int, default=60)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-prom-"))
    values = a2_8node_on_loopback(tmp, first=0)
    for i, node in enumerate(values["nodes"]):
        node["address"] = f"127.0.5.{i + 1}"
    values["prefill"].update(dp=8, tp=1)
    plan = plan_of(values, "bench")
    m = Monitoring(scrapeIntervalS=args.interval, rateWindowS=max(60, 4 * args.interval), nodeExporterPort=None)
    write_monitoring(plan, m, tmp / "monitoring")
    procs = Procs(tmp / "logs")
    stop = threading.Event()
    counts = [0]
    try:
        if have_etcd():
            start_etcd(plan, procs)
        t = time.monotonic()
        start_ranks(plan, procs, wait=180)
        print(f"{len(plan.ranks)} fake ranks up in {time.monotonic() - t:.0f}s", flush=True)
        senders = [threading.Thread(target=traffic, args=(plan, stop, counts), daemon=True) for _ in range(2)]
        for th in senders:
            th.start()
        api = start_prometheus(procs, tmp / "monitoring" / "prometheus.yml", tmp / "prom-data")
        pid = procs.procs["prometheus"].pid
        time.sleep(args.warmup)
        c0, t0, peak, worst = cpu_s(pid), time.monotonic(), 0.0, {}
        while time.monotonic() - t0 < args.measure:
            peak = max(peak, rss_mib(pid))
            for sample, v in own_metrics(api).items():
                if sample.startswith("prometheus_rule_group_last_duration_seconds{"):
                    g = sample.split('rule_group="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1]
                    worst[g] = max(worst.get(g, 0.0), v)
            time.sleep(args.interval)
        used = (cpu_s(pid) - c0) / (time.monotonic() - t0)
        targets = len(api.query("up"))
        down = len(api.query("up == 0"))
        series = own_metrics(api)["prometheus_tsdb_head_series"]
        print(f"targets {targets} ({down} down), head series {series:.0f}, completions sent {counts[0]}")
        print(f"interval {args.interval}s: CPU {100 * used:.1f}% of one core, RSS {rss_mib(pid):.0f} MiB "
              f"(peak {peak:.0f} MiB)")
        for g, d in sorted(worst.items()):
            print(f"rule group {g}: slowest evaluation {1000 * d:.1f} ms of the {args.interval}s interval")
        return 0
    finally:
        stop.set()
        procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
