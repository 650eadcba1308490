#!/usr/bin/env python3
"""Stand-in for vLLM-Ascend's P/D proxy
``examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py``.

Run as ``python3 fake_proxy.py [args]``. Standard library only (no fastapi,
httpx or uvicorn), starts in well under a second.

What was checked against the real script
----------------------------------------
Read from the stored copy of vllm-project/vllm-ascend, path
``examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py``, two
versions:

* commit 0713d90fd7cc6648cc3110a4aa92de6df4c1dcc9 (newest stored; multi-worker
  ``SharedProxyScheduler``). This fake follows it. Its ``parse_args``:
  ``--port`` int 8000, ``--host`` str "localhost", ``--prefiller-hosts`` str
  nargs="+" ["localhost"], ``--prefiller-ports`` int nargs="+" [8001],
  ``--decoder-hosts`` str nargs="+" ["localhost"], ``--decoder-ports`` int
  nargs="+" [8002], ``--max-retries`` int 3, ``--retry-delay`` float 0.001,
  ``--max-waiting-retries`` int 3, ``--waiting-retry-interval`` float 10,
  ``--workers`` int 1, ``--log-level`` str "INFO" with choices
  DEBUG/INFO/WARNING/ERROR/CRITICAL. Then
  ``ValueError("Number of prefiller hosts must match number of prefiller ports")``
  / ``ValueError("Number of decoder hosts must match number of decoder ports")``
  raised uncaught (traceback, exit code 1).
  ``GET /healthcheck`` returns
  ``{"status": "ok", "prefill_instances": N, "decode_instances": M,
  "request_num": K}`` where N/M count DISTINCT backends (keys are ``host:port``
  with "localhost" and "127.0.0.1" rewritten to "0.0.0.0", duplicates dropped)
  and K is the number of requests in flight.
* commit 93dbfa65652d4e77d5c463e567e60edb0e59f7f6 (older, single-process
  ``ProxyState``): same arguments up to ``--retry-delay`` only (no
  ``--max-waiting-retries``, ``--waiting-retry-interval``, ``--workers``,
  ``--log-level``), same ValueError messages, and ``/healthcheck`` returns only
  ``{"status": "ok", "prefill_instances": len(prefillers), "decode_instances":
  len(decoders)}`` (raw list lengths, no de-duplication). Consumers should
  therefore rely on ``status``/``prefill_instances``/``decode_instances`` only.

Behaviour (as in the newest version, simplified)
------------------------------------------------
* ``POST /v1/completions`` and ``POST /v1/chat/completions``: pick a prefiller
  (round robin here; the real one uses a least-loaded heap, which is round robin
  for sequential equal requests) and POST it a copy of the body with
  ``kv_transfer_params = {"do_remote_decode": true, "do_remote_prefill": false,
  "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
  "remote_port": null}``, ``stream: false``, ``max_tokens: 1``,
  ``min_tokens: 1`` (``max_completion_tokens: 1`` if present) and no
  ``stream_options``; headers ``Authorization: Bearer $OPENAI_API_KEY`` and
  ``X-Request-Id``. Retries: ``max(1, --max-retries)`` attempts, delay
  ``--retry-delay * 2**(attempt-1)``, never on HTTP 400. An HTTP error from the
  prefiller is returned with its status and JSON body; an unreachable prefiller
  gives 500 ``Internal Server Error``.
  The prefiller's ``kv_transfer_params`` (if any) are put into the original
  body, which goes to the next decoder (round robin). Its answer is relayed
  (``application/json``, or ``text/event-stream; charset=utf-8`` when
  ``stream`` is true) with ``usage.prompt_tokens_details = {"cached_tokens":
  <prefiller's cached_tokens or 0>}`` patched in wherever ``usage`` is present,
  like the real proxy does. As in the real proxy (a StreamingResponse that has
  already started), a decoder failure yields status 200 with an EMPTY body.
* ``GET /v1/models``: forwarded to the first backend (prefillers, then decoders)
  that answers; else 503 ``{"error": "All backend instances failed to serve
  /v1/models", "failed": [...]}``.
* ``POST /reset_prefix_cache``: forwarded to every backend; 200, or 500
  ``{"failed": [urls]}``.
* ``/instances/add`` and ``/instances/remove`` are NOT implemented (404).
* ``--workers``, ``--max-waiting-retries``, ``--waiting-retry-interval`` are
  accepted and ignored.

Test hooks (environment variables)
----------------------------------
* ``FAKE_PROXY_REPORT_PREFILL=<int>`` / ``FAKE_PROXY_REPORT_DECODE=<int>``:
  report these counts in ``/healthcheck`` instead of the real ones (to simulate
  a proxy that came up with the wrong backend lists).
* SIGTERM / SIGINT: exit 0 at once.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BACKEND_TIMEOUT = 300.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", type=str, default="localhost")
    parser.add_argument("--prefiller-hosts", type=str, nargs="+", default=["localhost"])
    parser.add_argument("--prefiller-ports", type=int, nargs="+", default=[8001])
    parser.add_argument("--decoder-hosts", type=str, nargs="+", default=["localhost"])
    parser.add_argument("--decoder-ports", type=int, nargs="+", default=[8002])
    parser.add_argument("--max-retries", type=int, default=3, help="Maximum number of retries for HTTP requests")
    parser.add_argument(
        "--retry-delay", type=float, default=0.001, help="Base delay (seconds) for exponential backoff retries"
    )
    parser.add_argument(
        "--max-waiting-retries", type=int, default=3, help="Maximum number of retries for waiting nodes to be started"
    )
    parser.add_argument(
        "--waiting-retry-interval",
        type=float,
        default=10,
        help="Check interval (seconds) for waiting nodes to be started",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Number of uvicorn worker processes. Scheduling state is shared across workers.",
    )
    parser.add_argument(
        "--log-level",
        type=str,
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="Log level for the proxy server.",
    )
    args = parser.parse_args(argv)
    if len(args.prefiller_hosts) != len(args.prefiller_ports):
        raise ValueError("Number of prefiller hosts must match number of prefiller ports")
    if len(args.decoder_hosts) != len(args.decoder_ports):
        raise ValueError("Number of decoder hosts must match number of decoder ports")
    args.prefiller_instances = list(zip(args.prefiller_hosts, args.prefiller_ports))
    args.decoder_instances = list(zip(args.decoder_hosts, args.decoder_ports))
    return args


def normalize_host(host: str) -> str:
    return host.replace("localhost", "0.0.0.0").replace("127.0.0.1", "0.0.0.0")


def server_key(host: str, port: int) -> str:
    return f"{normalize_host(host)}:{int(port)}"


def build_server_url(host: str, port: int) -> str:
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            return f"http://[{host}]:{port}"
    except ValueError:
        pass
    return f"http://{host}:{port}"


def _log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} INFO [fake_proxy] {msg}", file=sys.stderr, flush=True)


class Backends:
    def __init__(self, instances):
        self.servers: list[tuple[str, int]] = []
        seen = set()
        for host, port in instances:
            key = server_key(host, port)
            if key not in seen:
                seen.add(key)
                self.servers.append((host, int(port)))
        self._cycle = itertools.cycle(range(len(self.servers))) if self.servers else None
        self._lock = threading.Lock()

    def pick(self) -> tuple[str, int]:
        with self._lock:
            if self._cycle is None:
                raise RuntimeError("No available servers")
            return self.servers[next(self._cycle)]


class UpstreamHTTPError(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


class Proxy:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.prefillers = Backends(args.prefiller_instances)
        self.decoders = Backends(args.decoder_instances)
        self.lock = threading.Lock()
        self.request_num = 0

    def healthcheck(self) -> dict:
        with self.lock:
            n = self.request_num
        p = os.environ.get("FAKE_PROXY_REPORT_PREFILL")
        d = os.environ.get("FAKE_PROXY_REPORT_DECODE")
        return {
            "status": "ok",
            "prefill_instances": int(p) if p not in (None, "") else len(self.prefillers.servers),
            "decode_instances": int(d) if d not in (None, "") else len(self.decoders.servers),
            "request_num": n,
        }

    def adjust(self, delta: int) -> None:
        with self.lock:
            self.request_num = max(0, self.request_num + delta)


def _headers(request_id: str) -> dict:
    return {
        "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY')}",
        "X-Request-Id": request_id,
        "Content-Type": "application/json",
    }


def _open(url: str, payload: dict, request_id: str, max_retries: int, base_delay: float):
    """POST with the real proxy's retry policy; returns an open response."""
    data = json.dumps(payload).encode("utf-8")
    attempts = max(1, max_retries)
    for attempt in range(1, attempts + 1):
        req = urllib.request.Request(url, data=data, headers=_headers(request_id), method="POST")
        try:
            return urllib.request.urlopen(req, timeout=BACKEND_TIMEOUT)
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if exc.code == 400 or attempt == attempts:
                raise UpstreamHTTPError(exc.code, body) from None
            _log(f"Attempt {attempt} failed for {url}: HTTP {exc.code}")
        except (urllib.error.URLError, OSError) as exc:
            if attempt == attempts:
                raise
            _log(f"Attempt {attempt} failed for {url}: {exc}")
        time.sleep(base_delay * (2 ** (attempt - 1)))
    raise RuntimeError("unreachable")


def build_prefill_request(req_data: dict) -> dict:
    payload = req_data.copy()
    payload["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    payload["stream"] = False
    payload["max_tokens"] = 1
    payload["min_tokens"] = 1
    if "max_completion_tokens" in payload:
        payload["max_completion_tokens"] = 1
    payload.pop("stream_options", None)
    return payload


def _patch_cached_tokens(obj, cached) -> bool:
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return False
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        details = {}
    usage["prompt_tokens_details"] = details
    details["cached_tokens"] = cached
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    proxy: Proxy

    def log_message(self, fmt, *args):
        print(f"INFO:     {self.client_address[0]}:{self.client_address[1]} - {fmt % args}", file=sys.stderr, flush=True)

    def _send(self, status: int, body: bytes, ctype: str | None = "application/json") -> None:
        self.send_response(status)
        if ctype:
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"))

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/healthcheck":
            self._json(200, self.proxy.healthcheck())
        elif path == "/v1/models":
            self._models()
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path == "/v1/completions":
            self._completions("/completions", raw)
        elif path == "/v1/chat/completions":
            self._completions("/chat/completions", raw)
        elif path == "/reset_prefix_cache":
            self._reset_prefix_cache()
        else:
            self._json(404, {"detail": "Not Found"})

    def _models(self):
        failures = []
        for host, port in self.proxy.prefillers.servers + self.proxy.decoders.servers:
            url = build_server_url(host, port) + "/v1/models"
            try:
                req = urllib.request.Request(url, headers=_headers(str(uuid.uuid4())))
                with urllib.request.urlopen(req, timeout=3.0) as resp:
                    self._send(200, resp.read())
                    return
            except (urllib.error.URLError, OSError) as exc:
                _log(f"GET /models from {host}:{port} failed: {exc}")
                failures.append(f"{host}:{port}")
        self._json(503, {"error": "All backend instances failed to serve /v1/models", "failed": failures})

    def _reset_prefix_cache(self):
        failures = []
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        for host, port in self.proxy.prefillers.servers + self.proxy.decoders.servers:
            base = build_server_url(host, port)
            url = f"{base}/reset_prefix_cache" + (f"?{query}" if query else "")
            try:
                req = urllib.request.Request(url, data=b"", headers=_headers(str(uuid.uuid4())), method="POST")
                with urllib.request.urlopen(req, timeout=BACKEND_TIMEOUT) as resp:
                    resp.read()
            except (urllib.error.URLError, OSError) as exc:
                _log(f"reset_prefix_cache failed for {base}: {exc}")
                failures.append(base)
        if failures:
            self._json(500, {"failed": failures})
        else:
            self._send(200, b"", None)

    def _completions(self, api: str, raw: bytes):
        proxy, args = self.proxy, self.proxy.args
        try:
            req_data = json.loads(raw)
            if not isinstance(req_data, dict):
                raise ValueError("body is not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            _log(f"Error occurred in disagg prefill proxy server - /v1{api} endpoint: {exc}")
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        request_id = str(uuid.uuid4())
        proxy.adjust(+1)
        try:
            try:
                p_host, p_port = proxy.prefillers.pick()
                p_url = build_server_url(p_host, p_port) + "/v1" + api
                with _open(p_url, build_prefill_request(req_data), request_id,
                           args.max_retries, args.retry_delay) as resp:
                    p_json = json.loads(resp.read() or b"{}")
            except UpstreamHTTPError as exc:
                try:
                    body = json.loads(exc.body)
                except ValueError:
                    body = {"error": {"message": exc.body.decode("utf-8", "replace") or "upstream error"}}
                self._json(exc.status, body)
                return
            except Exception as exc:  # unreachable prefiller etc.
                _log(f"Error occurred in disagg prefill proxy server - /v1{api} endpoint: {exc!r}")
                self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
                return
            kv = p_json.get("kv_transfer_params") if isinstance(p_json, dict) else None
            if kv:
                req_data["kv_transfer_params"] = kv
            usage = (p_json.get("usage") or {}) if isinstance(p_json, dict) else {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            cached = cached if isinstance(cached, int) else 0
            stream = bool(req_data.get("stream", False))
            self._relay_decoder(api, req_data, request_id, stream, cached)
        finally:
            proxy.adjust(-1)

    def _relay_decoder(self, api, req_data, request_id, stream, cached):
        proxy, args = self.proxy, self.proxy.args
        ctype = "text/event-stream; charset=utf-8" if stream else "application/json"
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def write(chunk: bytes) -> None:
            if chunk:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")

        try:
            d_host, d_port = proxy.decoders.pick()
            d_url = build_server_url(d_host, d_port) + "/v1" + api
            with _open(d_url, req_data, request_id, args.max_retries, args.retry_delay) as resp:
                if not stream:
                    body = resp.read()
                    try:
                        obj = json.loads(body)
                        if _patch_cached_tokens(obj, cached):
                            body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
                    except ValueError:
                        pass
                    write(body)
                else:
                    for line in resp:
                        text = line.decode("utf-8", "replace").strip()
                        if text.startswith("data: ") and text != "data: [DONE]":
                            try:
                                obj = json.loads(text[len("data: "):])
                                if not obj.get("choices") and _patch_cached_tokens(obj, cached):
                                    line = b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"
                            except ValueError:
                                pass
                        write(line)
                        self.wfile.flush()
        except Exception as exc:  # noqa: BLE001 - mirrors the real proxy: log, end the stream
            _log(f"Error during streaming from decoder: {exc!r} while handling request {request_id}")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _exit_now(signum, frame):  # noqa: ARG001
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
    args = parse_args(argv)  # ValueError propagates, as in the real script
    proxy = Proxy(args)
    Handler.proxy = proxy
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True
        allow_reuse_address = True

    server = Server((args.host, args.port), Handler)
    port = server.server_address[1]
    _log(
        f"Initialized {len(proxy.prefillers.servers)} prefill clients and "
        f"{len(proxy.decoders.servers)} decode clients in worker {os.getpid()}."
    )
    print(f"INFO:     Uvicorn running on {build_server_url(args.host, port)} (Press CTRL+C to quit)",
          file=sys.stderr, flush=True)
    server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
