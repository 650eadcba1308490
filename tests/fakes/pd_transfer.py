"""The KV hand-over between a prefill and a decode rank, faked the way vLLM-Ascend's Mooncake connector
does it, so that a request through the PD proxy proves (or disproves) that both sides took part.

Prefill (kv_producer). The proxy sends it `kv_transfer_params: {"do_remote_decode": true, ...}`; it
computes the prompt, keeps the request's KV blocks and answers with the params a decode needs to pull
them (the connector's `request_finished`):

    {"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [...],
     "remote_engine_id": "<engine_id>_dp<rank>", "remote_request_id": "<id>",
     "remote_host": "<--host>", "remote_port": <side channel>, "remote_ptp_size": <tp>,
     "remote_pcp_size": 1, "remote_dcp_size": 1, "last_token_id": <int>,
     "num_prompt_blocks": <n>, "remote_block_size": <--block-size>}

Its side channel is real: like the connector's KVCacheSendingThread it listens on
`kv_port + dp_rank * tp + t` for every TP rank t (kv_port from the Mooncake entry of the
--kv-transfer-config, MultiConnector children included), on its --host. A port that is taken makes the
rank fail at start, as ZMQ's bind does (`Address already in use`).

Decode (kv_consumer). Given `do_remote_prefill: true`, it connects to `remote_host:remote_port` and
asks for the blocks of `remote_request_id` from `remote_engine_id` (one JSON line each way; the
real connector speaks msgpack over ZMQ, which nobody here inspects). The pull fails when nothing
listens there (a wrong kv port), when the side channel belongs to another engine, when that prefill
holds no such request, or when `remote_ptp_size` differs from the prefill tp_size in the decode's own
kv config; then the request fails as a failed KV load does under vLLM's `kv_load_failure_policy`
"fail" (finish reason `error`, HTTP 500). Without kv_transfer_params the decode computes the prompt
itself: the decode-only fallback, which succeeds and receives nothing.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections import OrderedDict
from typing import Optional


class TransferError(Exception):
    """The decode could not load the KV blocks the prefill announced."""


def mooncake_config(kv: Optional[dict]) -> Optional[dict]:
    """The Mooncake connector's entry of a --kv-transfer-config (itself, or a MultiConnector child)."""
    if not kv:
        return None
    if kv.get("kv_connector") == "MultiConnector":
        children = (kv.get("kv_connector_extra_config") or {}).get("connectors") or []
        return next((c for c in children if "Mooncake" in str(c.get("kv_connector", ""))), None)
    return kv if "Mooncake" in str(kv.get("kv_connector", "")) else None


def engine_id(kv: dict, dp_rank: Optional[int], dp_size: int) -> str:
    """vLLM appends `_dp<rank>` to the configured engine_id (a uuid when none is set) under DP."""
    base = str(kv.get("engine_id") or uuid.uuid4())
    return f"{base}_dp{dp_rank or 0}" if dp_size > 1 or dp_rank else base


class SideChannel:
    """A prefill rank's side-channel listeners and the KV blocks it holds for decodes to pull."""

    def __init__(self, host: str, first_port: int, tp: int, engine: str, max_held: int):
        self.host, self.first_port, self.engine, self.max_held = host, first_port, engine, max_held
        self.held: OrderedDict[str, list[int]] = OrderedDict()
        self.lock = threading.Lock()
        self.socks = []
        for t in range(tp):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, first_port + t))
            except OSError as exc:
                s.close()
                for other in self.socks:
                    other.close()
                raise OSError(exc.errno, f"Mooncake side channel tcp://{host}:{first_port + t}: {exc.strerror}") from None
            s.listen(64)
            self.socks.append(s)
        for s in self.socks:
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def hold(self, request_id: str, blocks: list[int]) -> None:
        with self.lock:
            self.held[request_id] = blocks
            while len(self.held) > self.max_held:  # never pulled: freed, like an expired delayed free
                self.held.popitem(last=False)

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                msg = json.loads(conn.makefile("rb").readline() or b"null")
                answer = self._answer(msg)
            except (OSError, ValueError) as exc:
                answer = {"ok": False, "error": f"bad request: {exc}"}
            try:
                conn.sendall(json.dumps(answer).encode() + b"\n")
            except OSError:
                pass

    def _answer(self, msg) -> dict:
        if not isinstance(msg, dict) or msg.get("op") != "pull":
            return {"ok": False, "error": "unexpected message"}
        if msg.get("engine_id") != self.engine:
            return {"ok": False, "error": f"this side channel serves engine {self.engine!r}, "
                                          f"not {msg.get('engine_id')!r}"}
        with self.lock:
            blocks = self.held.pop(str(msg.get("request_id")), None)
        if blocks is None:
            return {"ok": False, "error": f"engine {self.engine} holds no KV for request {msg.get('request_id')!r}"}
        if list(msg.get("block_ids") or []) != blocks:
            return {"ok": False, "error": "block ids differ from the ones held"}
        return {"ok": True, "engine_id": self.engine, "blocks": len(blocks)}


def pull(params: dict, expected_prefill_tp: Optional[int], timeout: float) -> int:
    """Load the announced blocks from the prefill's side channel; the number of blocks, or TransferError."""
    missing = [k for k in ("remote_engine_id", "remote_host", "remote_port", "remote_block_ids",
                           "remote_request_id") if params.get(k) in (None, "")]
    if missing:
        raise TransferError(f"kv_transfer_params lack {', '.join(missing)}")
    ptp = params.get("remote_ptp_size")
    if expected_prefill_tp is not None and ptp is not None and int(ptp) != expected_prefill_tp:
        raise TransferError(f"remote_ptp_size {ptp} differs from this decode's prefill tp_size {expected_prefill_tp}")
    host, port = str(params["remote_host"]), int(params["remote_port"])
    request = {"op": "pull", "engine_id": params["remote_engine_id"], "request_id": params["remote_request_id"],
               "block_ids": params["remote_block_ids"]}
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(json.dumps(request).encode() + b"\n")
            answer = json.loads(conn.makefile("rb").readline() or b"null")
    except (OSError, ValueError) as exc:
        raise TransferError(f"side channel tcp://{host}:{port}: {exc}") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        raise TransferError(f"side channel tcp://{host}:{port}: "
                            f"{answer.get('error') if isinstance(answer, dict) else answer!r}")
    return int(answer["blocks"])
