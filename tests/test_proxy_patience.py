"""The launches' calls to the PD proxy that decide whether an instance is drained before it stops
(shell/rollout_lib.sh `proxy_call_patient`), run by bash against a loopback proxy that misbehaves:
one slow answer is asked again, an error is asked again until the patience ends, and a proxy that
takes no connection is not waited for."""

from __future__ import annotations

import subprocess
import threading
import time

from ascend_pd.shell import library, params
from status_support.hostile import Hostile, respond

ADDRESS, PORT = "127.0.9.61", 18620  # this module's own loopback address
ANSWER = {"current_prefill_instances": ["127.0.9.62:17100"], "current_decode_instances": []}
PATIENCE_S = 8


def call(port: int = PORT, patience_s: int = PATIENCE_S) -> tuple[int, str, float]:
    """(exit code, output, seconds) of `proxy_call_patient remove 127.0.9.62:17100`."""
    text = params(proxy_url=f"http://{ADDRESS}:{port}", proxy_type="prefill", proxy_patience_s=patience_s) \
        + library("rollout_lib") + 'proxy_call_patient remove 127.0.9.62:17100\n'
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + text], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, time.monotonic() - t0


class Proxy:
    """/instances/remove answered by `answer(n)` for the n-th call (from 1)."""

    def __init__(self, answer):
        self.calls, self._lock = [], threading.Lock()

        def handler(req, conn, stop):
            with self._lock:
                self.calls.append((req.path, req.json()))
                n = len(self.calls)
            answer(n, conn, stop)

        self.server = Hostile([(ADDRESS, PORT)], handler)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.close()


def test_one_slow_answer_is_asked_again():
    def answer(n, conn, stop):
        if n == 1 and stop.wait(7):  # past curl's 5 s
            return
        respond(conn, ANSWER)

    with Proxy(answer) as proxy:
        rc, out, took = call()
    assert rc == 0 and '"current_prefill_instances"' in out, (rc, out)
    assert [c[0] for c in proxy.calls] == ["/instances/remove"] * 2
    assert proxy.calls[1][1] == {"type": "prefill", "instances": ["127.0.9.62:17100"]}
    assert 5 <= took < PATIENCE_S + 5, took


def test_an_error_is_asked_again_until_the_patience_ends():
    with Proxy(lambda n, conn, stop: respond(conn, {"error": "busy"}, "500 Internal Server Error")) as proxy:
        rc, out, took = call(patience_s=3)
    assert rc == 22 and out == "", (rc, out)  # curl -f: the HTTP error
    assert len(proxy.calls) >= 3, proxy.calls  # about one a second
    assert 2 <= took < 3 + 5, took  # bash's SECONDS counts whole seconds: the patience ends up to 1 s early


def test_a_proxy_that_takes_no_connection_is_not_waited_for():
    rc, out, took = call(port=PORT + 1)  # nothing listens there
    assert rc == 7 and out == "", (rc, out)
    assert took < 2, took
