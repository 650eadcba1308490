"""Wall time and size of `logs --tail 50` (8 nodes, 40 ranks) and `bundle` on the a2 layout over loopback
sshd fake nodes (tests/preflight_nodes.py), each rank's log 5000 lines of 200 bytes. Run as root in a
private namespace:
  unshare --net --pid --fork --mount-proc bash -c \
    'ip link set lo up && PYTHONPATH=.:tests exec venv/bin/python tests/measure_logs.py'"""

from __future__ import annotations

import io
import sys
import tarfile
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml

from ascend_pd import bundle, logsources
from ascend_pd.__main__ import main
from ascend_pd.loader import load_stack
from ascend_pd.plan import build_plan
from preflight_nodes import FakeCluster, SilentListener

STACK, STATE, LINES = "a2-8node", "/mnt/state", 5000


def measure(repeat: int = 3) -> None:
    with tempfile.TemporaryDirectory(prefix="apd-logs-measure-") as tmp:
        c = FakeCluster(STACK, Path(tmp))
        f = c.project / f"Pulumi.{STACK}.yaml"
        doc = yaml.safe_load(f.read_text())
        doc["config"]["ascend-pd:stateDir"] = STATE
        f.write_text(yaml.safe_dump(doc))
        c.plan = build_plan(load_stack(STACK, c.project), STACK)
        c.extra_setup = "mount --bind {fake} /mnt\n"
        line = "INFO 12-05 12:00:00 [core.py:123] " + "x" * 160
        for s in logsources.sources(c.plan):
            if s.path.startswith(STATE):
                p = c.nodes[s.node].fake / "state" / s.path[len(STATE) + 1:]
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text("".join(f"{line} {i}\n" for i in range(LINES)))
        c.start_all()
        argv = ["logs", "--stack-file", str(f), "--identity", str(c.key), "--tail", "50"]
        try:
            def logs(label: str) -> None:
                for _ in range(repeat):
                    out, err = io.StringIO(), io.StringIO()
                    t0 = time.monotonic()
                    with redirect_stdout(out), redirect_stderr(err):
                        rc = main(argv)
                    print(f"logs --tail 50, {label}: {time.monotonic() - t0:.2f} s, rc {rc}, "
                          f"{len(out.getvalue().splitlines())} lines, {len(out.getvalue().encode())} bytes", flush=True)

            def bund(label: str) -> None:
                for _ in range(repeat):
                    path = Path(tmp) / "b.tar.gz"
                    t0 = time.monotonic()
                    res = bundle.make_bundle(c.plan, c.targets(), path, timeout_s=60, stack_file=f)
                    with tarfile.open(path) as tar:
                        raw = sum(m.size for m in tar.getmembers())
                    print(f"bundle (2000 lines per log), {label}: {time.monotonic() - t0:.2f} s, {res.size} bytes "
                          f"compressed ({raw} raw), {res.files} files, {len(res.missing)} not collected", flush=True)

            logs("all nodes up")
            bund("all nodes up")
            victim = "d2"
            c.stop(victim)
            hung = SilentListener(c.nodes[victim].address)
            try:
                logs(f"{victim} hung at the SSH banner")
                bund(f"{victim} hung at the SSH banner")
            finally:
                hung.close()
        finally:
            c.stop_all()


if __name__ == "__main__":
    measure(*(int(a) for a in sys.argv[1:2]))
