"""The engine-core process of a fake vLLM rank: what a hang looks like from outside.

vLLM's API server (the process that answers /health and /metrics) hands every request to an
EngineCore process and waits for its tokens. When the engine core stops making progress (a stuck
collective, a stopped process), the API server still answers /health 200 and /metrics, with
requests running and the token and success counters flat: vllm #17972. fake_vllm.py starts this
process when FAKE_VLLM_ENGINE_PROCESS=1, so a test can SIGSTOP it (its pid is in the rank's log
line `EngineCore pid N`) and get exactly that.

Protocol, one line each way over a socketpair: `<id> <tokens>` in, `<id>` back once the "tokens"
are generated (FAKE_VLLM_ENGINE_STEP_S seconds per token, default 0). The engine exits when its
API server goes away (EOF), as vLLM's does.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time


class EngineCore:
    def __init__(self, step_s: float = 0.0):
        parent, child = socket.socketpair()
        # Forked before the API server starts any thread: the child runs only _serve.
        self.pid = os.fork()
        if self.pid == 0:
            parent.close()
            _serve(child, step_s)
            os._exit(0)
        child.close()
        self._sock = parent
        self._send_lock = threading.Lock()
        self._waiting: dict[str, threading.Event] = {}
        self._ids = itertools.count()
        threading.Thread(target=self._replies, daemon=True).start()

    def generate(self, tokens: int) -> None:
        """Block until the engine has produced `tokens` tokens (forever, if it is stopped)."""
        rid, done = str(next(self._ids)), threading.Event()
        self._waiting[rid] = done
        with self._send_lock:
            self._sock.sendall(f"{rid} {tokens}\n".encode())
        done.wait()

    def _replies(self) -> None:
        for line in self._sock.makefile("rb"):
            event = self._waiting.pop(line.decode().strip(), None)
            if event:
                event.set()
        os._exit(1)  # the engine core died: so does the API server (EngineDeadError)


def _serve(sock: socket.socket, step_s: float) -> None:
    out = sock.makefile("wb", buffering=0)
    for line in sock.makefile("rb"):
        rid, tokens = line.decode().split()
        time.sleep(step_s * int(tokens))
        out.write(f"{rid}\n".encode())
