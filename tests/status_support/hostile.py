"""Loopback servers that misbehave, for tests/test_status_robust.py.

`Hostile(binds, handler)` listens on every (address, port) of `binds`; each connection reads one
request (`Request`) and hands the socket to `handler(req, conn, stop)`, in a thread of its own. A
handler writes raw bytes, so it can do what no well-behaved server library does: trickle, hang after
the headers, announce or stream 300 MB, send garbage, lie about its encoding. `close()` stops them all
(bounded: every wait inside a handler is on `stop`).

Behaviours for every endpoint alike (`trickle_headers()`, `huge("chunked")`, ...) and `Routes`, a
small router by (kind of endpoint, path) for answers that must look right except for one thing (an
etcd gateway whose member name is not a string, a rank whose counters are +Inf).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from . import _bound

MiB = 1024 * 1024
HUGE = 300 * MiB  # the figure: two such bodies took status to 2 GB RSS


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    address: str
    port: int

    def json(self) -> object:
        return json.loads(self.body or b"{}")


Handler = Callable[[Request, socket.socket, threading.Event], None]


def _read_request(conn: socket.socket, address: str, port: int) -> Optional[Request]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk or len(data) > 65536:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    want = int(headers.get("content-length", "0") or 0)
    while len(body) < want:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return Request(method, path, headers, body, address, port)


class Hostile:
    """Listening sockets on `binds`, each connection served by `handler` in its own thread."""

    def __init__(self, binds: Iterable[tuple[str, int]], handler: Handler):
        self.handler = handler
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []  # handler failures other than the client going away
        self.socks = []
        for address, port in binds:
            sock = _bound(address, port)
            sock.listen(128)
            sock.settimeout(0.1)
            self.socks.append(sock)
            self._thread(self._accept, sock, address, port)

    def _thread(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        with self.lock:
            self.threads.append(t)
        t.start()

    def _accept(self, sock: socket.socket, address: str, port: int) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.conns.append(conn)
            self._thread(self._serve, conn, address, port)

    def _serve(self, conn: socket.socket, address: str, port: int) -> None:
        try:
            conn.settimeout(10)
            req = _read_request(conn, address, port)
            if req is not None:
                self.handler(req, conn, self.stop)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass  # the client gave up on us: what these servers are for
        except OSError as exc:
            if not self.stop.is_set():
                self.errors.append(repr(exc))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        for sock in self.socks:
            sock.close()
        with self.lock:
            conns, threads = list(self.conns), list(self.threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(5)


# ---------------------------------------------------------------------------------------------
# Raw answers


def head(status: str = "200 OK", ctype: str = "application/json", length: Optional[int] = None,
         extra: Iterable[str] = ()) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {ctype}", "Connection: close", *extra]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def respond(conn: socket.socket, body: bytes | str | object = b"", status: str = "200 OK",
            ctype: str = "application/json") -> None:
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)  # NaN/Infinity allowed: liars may send them
    if isinstance(body, str):
        body = body.encode("utf-8")
    conn.sendall(head(status, ctype, len(body)) + body)


def _trickle(conn: socket.socket, data: Iterable[int], interval: float, stop: threading.Event) -> None:
    for byte in data:
        if stop.is_set():
            return
        conn.sendall(bytes([byte]))
        stop.wait(interval)


def _forever(pattern: bytes):
    while True:
        yield from pattern


def trickle_headers(interval: float = 0.1) -> Handler:
    """The status line, then one header byte every `interval`, forever (never a complete header)."""

    def handler(req, conn, stop):
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        _trickle(conn, _forever(b"a"), interval, stop)

    return handler


def trickle_body(interval: float = 0.1, chunked: bool = False) -> Handler:
    """Complete headers (Content-Length 100000, or chunked), then one body byte every `interval`."""

    def handler(req, conn, stop):
        if chunked:
            conn.sendall(head(extra=["Transfer-Encoding: chunked"]))
            _trickle(conn, _forever(b"1\r\n \r\n"), interval, stop)
        else:
            conn.sendall(head(length=100_000))
            _trickle(conn, _forever(b" "), interval, stop)

    return handler


def hang_after_headers() -> Handler:
    """Complete headers announcing 1000 bytes, then nothing."""

    def handler(req, conn, stop):
        conn.sendall(head(length=1000))
        stop.wait(60)

    return handler


def _flood(conn: socket.socket, block: bytes, total: int, stop: threading.Event, chunked: bool = False) -> None:
    sent = 0
    while sent < total and not stop.is_set():
        conn.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
        sent += len(block)
    if chunked and not stop.is_set():
        conn.sendall(b"0\r\n\r\n")


def huge(mode: str, total: int = HUGE) -> Handler:
    """`total` bytes of a JSON-looking body, as fast as the client takes them: mode "length"
    (announced in Content-Length), "chunked", or "close" (no length: the body ends at EOF)."""
    block = b"[" + b"0," * (32 * 1024 - 1)

    def handler(req, conn, stop):
        if mode == "length":
            conn.sendall(head(length=total))
        elif mode == "chunked":
            conn.sendall(head(extra=["Transfer-Encoding: chunked"]))
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        _flood(conn, block, total, stop, chunked=mode == "chunked")

    return handler


_BOMB_MEMBER = None


def gzip_bomb(members: int = 1024) -> Handler:
    """A gzip body (sent though identity was asked for) that inflates to `members` MiB: each gzip
    member is 1 MiB of zeros in about 1 kB, and gzip allows members back to back."""

    def handler(req, conn, stop):
        global _BOMB_MEMBER
        if _BOMB_MEMBER is None:
            c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            _BOMB_MEMBER = c.compress(bytes(MiB)) + c.flush()
        body = _BOMB_MEMBER * members
        conn.sendall(head(length=len(body), extra=["Content-Encoding: gzip"]) + body)

    return handler


GARBAGE = (b"\x1b]0;owned\x07\x1b[2J\x1b[31mSSH-2.0-OpenSSH_9.2\r\n\x08\x08\x9b6n"
           + bytes(range(256)) + b"\r\n\r\n")


def garbage() -> Handler:
    """Not HTTP at all: terminal escape sequences and every byte value, then close."""

    def handler(req, conn, stop):
        conn.sendall(GARBAGE)

    return handler


def accept_only() -> Handler:
    """Accept and close (an openYuanrong worker's port: status only connects)."""

    def handler(req, conn, stop):
        pass

    return handler


# ---------------------------------------------------------------------------------------------
# Answers that look right but for one thing


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def etcd_kv(key: str | bytes, value: str | bytes) -> dict:
    return {"key": b64(key), "value": b64(value), "create_revision": "2", "mod_revision": "2",
            "version": "1", "lease": "7587878787"}


def etcd_answers(workers: Iterable[str], *, members: Optional[object] = None, status: Optional[object] = None,
                 kvs: Optional[object] = None) -> dict[str, object]:
    """What an etcd 3.5 gateway answers (path -> JSON), with the given parts replaced."""
    header = {"cluster_id": "14841639068965178418", "member_id": "10276657743932975437", "revision": "9",
              "raft_term": "2"}
    return {
        "/health": {"health": "true", "reason": ""},
        "/version": {"etcdserver": "3.5.9", "etcdcluster": "3.5.0"},
        "/v3/maintenance/status": status if status is not None else {
            "header": header, "version": "3.5.9", "dbSize": "20480", "leader": "10276657743932975437",
            "raftIndex": "9", "raftTerm": "2"},
        "/v3/cluster/member/list": {"header": header, "members": members if members is not None else [
            {"ID": "10276657743932975437", "name": "etcd-single", "peerURLs": ["http://127.0.0.1:2380"],
             "clientURLs": ["http://127.0.0.1:2379"]}]},
        "/v3/kv/range": {"header": header, "kvs": kvs if kvs is not None else [
            etcd_kv(f"/datasystem/cluster/{w}", "1764460000;ready") for w in workers], "count": "1"},
    }


Route = Callable[[Request, socket.socket, threading.Event], None] | bytes | str | dict | list


class Routes:
    """A handler answering by (kind, path): kind is "etcd", "proxy", "rank" or "worker" (by the port
    the request came to); a route is a handler, or a JSON/bytes body answered with 200. Unknown paths
    get 404."""

    def __init__(self, kinds: dict[int, str], routes: dict[tuple[str, str], Route]):
        self.kinds, self.routes = kinds, routes

    def __call__(self, req: Request, conn: socket.socket, stop: threading.Event) -> None:
        kind = self.kinds.get(req.port, "rank")
        route = self.routes.get((kind, req.path.split("?", 1)[0]))
        if route is None:
            respond(conn, {"error": "not found"}, "404 Not Found")
        elif callable(route):
            route(req, conn, stop)
        else:
            respond(conn, route)
