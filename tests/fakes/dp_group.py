"""The data-parallel handshake of a vLLM DP group, faked: what makes a group start and die as a whole.

A real DP group (every rank launched with the same --data-parallel-address, --data-parallel-rpc-port
and --data-parallel-size N) forms through its master, DP rank 0, which listens on the RPC port at
that address. No engine is ready before every rank has joined, so no rank's API server answers
/health before the whole group runs. Once formed, the group's collectives need every member: when
one rank dies, the other engines die with it (EngineDeadError) and their servers exit. A rank started
again cannot join the group the others still form; a group whose master is gone cannot form.

fake_vllm.py calls `join()` before it starts serving when FAKE_VLLM_DP_GROUP=1 (tests that launch
one node of a multi-node group alone leave it off). The wire protocol is a private one, a line each:

    member -> master:  join <rank> <size>
    master -> member:  ok | refused <reason> | formed
    master -> members: broken <rank>      (then the master closes every connection)

A member that reads `broken`, or loses its connection, exits with status 1.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

RETRY_S = 0.2


def _log(msg: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [dp_group.py] {msg}", flush=True)


def _die(msg: str) -> None:
    print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [core.py] EngineDeadError: {msg}", file=sys.stderr, flush=True)
    os._exit(1)


class Master:
    """Rank 0's side: accept `size` members (itself included), then watch them."""

    def __init__(self, address: str, port: int, size: int):
        self.size = size
        self.members: dict[int, socket.socket] = {}
        self.formed = False
        self.lock = threading.Lock()
        self.sock = socket.create_server((address, port), reuse_port=False)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._member, args=(conn,), daemon=True).start()

    def _member(self, conn: socket.socket) -> None:
        f = conn.makefile("rwb", buffering=0)
        try:
            words = f.readline().decode().split()
            rank, size = int(words[1]), int(words[2])
        except (ValueError, IndexError, OSError):
            conn.close()
            return
        with self.lock:
            why = ("the group has already formed" if self.formed else f"size {size} != {self.size}"
                   if size != self.size else f"rank {rank} has already joined" if rank in self.members else "")
            if why:
                f.write(f"refused {why}\n".encode())
                conn.close()
                return
            self.members[rank] = conn
            f.write(b"ok\n")
            if len(self.members) == self.size:
                self.formed = True
                for c in self.members.values():
                    c.sendall(b"formed\n")
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        with self.lock:
            if not self.formed:  # left while forming: it may join again
                self.members.pop(rank, None)
                return
            for other, c in self.members.items():
                if other != rank:
                    try:
                        c.sendall(f"broken {rank}\n".encode())
                        c.close()
                    except OSError:
                        pass
            self.members.clear()


def join(opts: dict, derived: dict) -> None:
    """Block until this rank's DP group has formed, then watch it in the background (exit when it
    breaks). A group of one (no --data-parallel-size > 1) forms at once."""
    size = int(opts.get("--data-parallel-size") or 1)
    address = opts.get("--data-parallel-address")
    port = opts.get("--data-parallel-rpc-port")
    rank = derived.get("rank") or 0
    if size <= 1 or not address or not port:
        return
    if rank == 0:
        try:
            Master(address, int(port), size)
        except OSError as exc:
            _die(f"DP master cannot listen on {address}:{port}: {exc}")
    _log(f"DP rank {rank}/{size}: joining the group at {address}:{port}")
    while True:
        try:
            conn = socket.create_connection((address, int(port)), timeout=2)
            conn.settimeout(None)
            f = conn.makefile("rwb", buffering=0)
            f.write(f"join {rank} {size}\n".encode())
            answer = f.readline().decode().strip()
        except OSError:
            time.sleep(RETRY_S)
            continue
        if answer != "ok":
            conn.close()
            time.sleep(RETRY_S)  # a master still forming an older group, or a full one
            continue
        if f.readline().decode().strip() != "formed":
            conn.close()
            time.sleep(RETRY_S)
            continue
        break
    _log(f"DP rank {rank}/{size}: group formed")

    def watch() -> None:
        line = b""
        try:
            line = f.readline()
        except OSError:
            pass
        _die(f"DP group broken ({line.decode().strip() or 'the master is gone'}): this engine stops")

    threading.Thread(target=watch, daemon=True).start()
