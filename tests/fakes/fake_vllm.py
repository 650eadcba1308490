#!/usr/bin/env python3
"""Stand-in for the ``vllm`` CLI (``vllm serve``) on machines without NPUs.

Run it through the wrapper ``tests/fakes/bin/vllm`` (put ``tests/fakes/bin`` first
on ``PATH``), exactly as a launcher would run the real CLI::

    ASCEND_RT_VISIBLE_DEVICES=0,1 vllm serve /models/foo --host 127.0.0.1 --port 8100 \
        --tensor-parallel-size 2 --served-model-name foo \
        --kv-transfer-config '{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer"}'

Standard library only, starts in well under a second.

Argument parsing (strict, modelled on vLLM's ``FlexibleArgumentParser``)
-----------------------------------------------------------------------
* Only ``vllm serve MODEL_PATH [flags]`` is supported (``-h``/``--help`` prints a
  usage text and exits 0). Both ``--flag value`` and ``--flag=value`` work; as in
  vLLM, underscores in a flag name are turned into dashes (``--max_model_len``
  == ``--max-model-len``). Abbreviated flags are NOT accepted (vLLM sets
  ``allow_abbrev=False``).
* Exit code 2 with ``usage: ...`` / ``vllm serve: error: ...`` on stderr (naming the
  flag) for: unknown flags or extra positionals, a flag missing its value, a
  non-integer for an int flag, a non-number for a float flag, a value given to a
  boolean flag (``--enforce-eager=1``), a missing MODEL_PATH, invalid JSON (or a
  JSON value that is not an object) for ``--kv-transfer-config``,
  ``--additional-config``, ``--speculative-config``, ``--compilation-config``
  (an integer level is also accepted there) and ``--model-loader-extra-config``,
  and a ``--kv-transfer-config`` without ``"kv_connector"`` or whose ``"kv_role"``
  is not one of ``kv_producer``/``kv_consumer``/``kv_both`` (real vLLM validates
  the dataclass inside argparse, hence exit 2 as well).
* Known flags: --host str, --port int, --data-parallel-size int,
  --data-parallel-rank int, --data-parallel-address str,
  --data-parallel-rpc-port int, --data-parallel-size-local int,
  --tensor-parallel-size int, --seed int, --served-model-name str [str ...],
  --max-model-len int, --max-num-batched-tokens int, --max-num-seqs int,
  --block-size int, --gpu-memory-utilization float, --quantization str,
  --safetensors-load-strategy str, --tokenizer-mode str, --tool-call-parser str,
  --reasoning-parser str, the JSON flags above, and the boolean flags
  --enable-expert-parallel, --enforce-eager, --async-scheduling,
  --disable-hybrid-kv-cache-manager, --enable-prefix-caching,
  --trust-remote-code, --enable-auto-tool-choice, each also in its
  ``--no-...`` form (vLLM uses ``argparse.BooleanOptionalAction``).
  ``--served-model-name`` takes one or more names like vLLM (``nargs="+"``);
  the first is the one used in metrics labels.
* Defaults as in vLLM: host None (= all interfaces), port 8000, tp 1.

Checks after parsing (exit code 1, message on stderr, like an engine start failure)
----------------------------------------------------------------------------------
* ``ASCEND_RT_VISIBLE_DEVICES`` must be set and hold exactly N distinct
  comma-separated integers, N = ``--tensor-parallel-size`` (default 1). When
  ``--data-parallel-size-local`` is given WITHOUT ``--data-parallel-rank`` (one
  process running several local DP engines) N = tp * dp-size-local.
* ``--data-parallel-rank`` must be < ``--data-parallel-size``;
  ``--data-parallel-size-local`` must be <= ``--data-parallel-size``.
* ``--gpu-memory-utilization`` must be in (0, 1]; ``--port`` in 0..65535;
  ``--enable-auto-tool-choice`` needs ``--tool-call-parser``.
* Port already in use -> ``OSError: [Errno 98] Address already in use``, exit 1.

HTTP interface (the vLLM OpenAI server routes used by the project)
------------------------------------------------------------------
* ``GET /health`` -> 200, empty body. ``GET /version`` -> ``{"version": ...}``.
* ``GET /v1/models`` -> ``{"object": "list", "data": [{"id": NAME, "object":
  "model", "created": INT, "owned_by": "vllm", "root": MODEL_PATH, "parent":
  null, "max_model_len": INT-or-null, "permission": [...]}]}``, one entry per
  served model name (the model path when ``--served-model-name`` is absent).
* ``POST /v1/chat/completions`` and ``POST /v1/completions``: a ``"model"`` that
  is not a served name -> 404 ``{"error": {"message": "The model `x` does not
  exist.", "type": "NotFoundError", "param": null, "code": 404}}``; a missing
  ``"model"`` means the first served name (as in recent vLLM). Bad bodies -> 400
  ``BadRequestError``. Otherwise a ``chat.completion`` / ``text_completion``
  object with ``finish_reason: "length"``, non-empty content and ``usage``.
  ``"stream": true`` gives SSE chunks (chunked transfer encoding) ending in
  ``data: [DONE]``; ``stream_options.include_usage`` adds a usage chunk.
* ``POST /reset_prefix_cache`` -> 200, empties the fake prefix cache.
* ``GET /metrics`` -> Prometheus text format 0.0.4 (``Content-Type: text/plain;
  version=0.0.4; charset=utf-8``), byte-for-byte the layout prometheus_client's
  ``generate_latest`` gives: for a counter family the HELP/TYPE lines name
  ``<name>_total`` (``# TYPE vllm:prefix_cache_queries_total counter``), then the
  ``_total`` samples, then a separate ``<name>_created`` gauge family with
  HELP/TYPE lines and creation timestamps. Labels sorted by name. Families, in
  vLLM's registration order:
    gauges   vllm:num_requests_running, vllm:num_requests_waiting
    counters vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total,
             vllm:external_prefix_cache_queries_total,
             vllm:external_prefix_cache_hits_total, vllm:prompt_tokens_total,
             vllm:generation_tokens_total,
             vllm:request_success_total (extra label finished_reason in
             stop/length/abort/error)
  Every sample carries ``engine="<--data-parallel-rank or 0>"`` and
  ``model_name="<first served name>"``.

Counters
--------
* Initial values: env ``FAKE_VLLM_COUNTERS``, a JSON object mapping a sample name
  to a number, e.g. ``{"vllm:prefix_cache_queries_total": 1000,
  "vllm:prefix_cache_hits_total": 250}``. Default: everything 0.
* ``POST /fake/counters`` (test-only) with the same kind of JSON object SETS
  those values (others unchanged) and answers 200 with all current values.
  ``GET /fake/counters`` returns the current values.
* Accepted keys: the seven ``..._total`` names above, the two gauges, and for
  request_success either ``vllm:request_success_total`` (= finished_reason
  "length", the reason this fake always finishes with) or
  ``vllm:request_success_total{finished_reason="stop"}`` (stop/length/abort).
  Unknown keys: 400 from the endpoint, exit 1 for the env var.
* Each completion request (chat or plain, streamed or not) adds:
    prompt text   chat: ``"\\n".join(f"{role}: {content}")`` over the messages
                  (list contents: their "text" parts joined); plain: the prompt
                  (a list of strings is joined with "\\n").
    P = prompt tokens = max(1, ceil(len(prompt text) / 4))
    M = completion tokens = "max_completion_tokens", else "max_tokens", else 16
    prompt_tokens_total += P; generation_tokens_total += M;
    request_success_total{finished_reason="length"} += 1
    prefix cache (unless --no-enable-prefix-caching): the prompt text is cut
      into blocks of 4*B characters (B = --block-size, default 128); the hits
      H = B * (number of leading full blocks among the first (P-1) tokens whose
      chained hash was seen before by this process); then those blocks are
      remembered. prefix_cache_queries_total += P; prefix_cache_hits_total += H.
    external prefix cache (only with --kv-transfer-config):
      external_prefix_cache_queries_total += P; and if the request carries
      ``kv_transfer_params.do_remote_prefill`` true and the role is kv_consumer
      or kv_both, external_prefix_cache_hits_total += P - H.
  vllm:num_requests_running is 1 per request in flight (0 at rest).
* The P/D hand-over (``pd_transfer.py``): a kv_producer with a Mooncake entry in
  its --kv-transfer-config listens on its side-channel ports and answers a
  request carrying ``kv_transfer_params.do_remote_decode`` with the Mooncake
  connector's ``kv_transfer_params`` (engine, host, side-channel port, block
  ids); a kv_consumer given ``do_remote_prefill`` pulls those blocks from that
  side channel, and when the pull fails it answers HTTP 500 and counts
  ``finished_reason="error"``. Otherwise ``kv_transfer_params`` is null.

Test hooks (environment variables)
----------------------------------
* ``FAKE_VLLM_EXIT_AT_START=<code>``: after argv is printed and arguments are
  parsed/validated, print a fake traceback to stderr and exit with <code>.
  Optional ``FAKE_VLLM_EXIT_RANKS=1,3`` restricts that to those
  ``--data-parallel-rank`` values (default: every process).
* ``FAKE_VLLM_DP_GROUP=1``: form the DP group before serving, and exit when it breaks
  (``dp_group.py``: a group starts and dies as a whole, as vLLM's does).
* ``FAKE_VLLM_STARTUP_DELAY=<seconds>``: sleep (simulated model loading) before
  the port is bound.
* ``FAKE_VLLM_COUNTERS``: see above. ``FAKE_VLLM_LOG_EVERY``: ignored.
* ``FAKE_VLLM_FAULT=transfer-fail``: a decode (kv_consumer) fails every KV load
  from prefill (HTTP 500, finished_reason "error"); through the PD proxy that is
  an HTTP 200 with an empty body. ``FAKE_VLLM_FAULT=no-kv-params``: a prefill
  (kv_producer) answers without kv_transfer_params, so the decode computes the
  prompt itself (the decode-only fallback). ``FAKE_VLLM_FAULT=ignore-kv``: a
  decode takes no KV from prefill even when the request carries it, and computes
  the prompt itself (a consumer whose connector is not loading: the fallback as
  decode's side sees it). Each applies only to its side.
  ``POST /fake/fault`` (test-only) ``{"fault": "<one of them>" | null}`` switches
  the fault of a running rank.
* ``FAKE_VLLM_REQUEST_DELAY=<seconds>``: each completion stays in flight that
  long (``vllm:num_requests_running`` counts it meanwhile).
* ``FAKE_VLLM_ENGINE_PROCESS=1``: completions are generated by a separate engine-core process
  (``engine_core.py``; ``FAKE_VLLM_ENGINE_STEP_S`` seconds per token): SIGSTOP it and the rank
  hangs as vLLM's do, /health 200, requests running, counters flat.
* ``/metrics`` also carries ``process_start_time_seconds`` (prometheus_client's process
  collector, in vLLM's default registry): when this API server process started.
* ``/metrics`` also carries vLLM's (>= 0.11) latency histograms (``FAKE_VLLM_HISTOGRAMS=0``: not), with
  vLLM's names, bucket layouts and prometheus_client's layout (``_bucket`` per ``le`` then ``_count``,
  ``_sum``, then a separate ``_created`` gauge family), after request_success:
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` and
  ``vllm:e2e_request_latency_seconds``. Each completion observes, measured on this process's
  clock: TTFT = time until its KV was loaded and ``FAKE_VLLM_REQUEST_DELAY`` passed; e2e = time
  until its last token; M-1 inter-token latencies of (e2e - TTFT) / (M-1) each.
* SIGTERM / SIGINT: exit 0 at once (also during the startup delay).

Stdout gets, in order: ``fake-vllm argv: vllm serve ...`` (the full command
line), an ``INFO ... vLLM API server version ...`` line, an ``INFO ...
fake-vllm: host=... port=... dp_rank=... devices=...`` line and, once listening,
``INFO ... Starting vLLM API server 0 on http://HOST:PORT`` and
``INFO:     Application startup complete.``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pd_transfer

FAKE_VERSION = "0.0.0+fake"
PROG = "vllm serve"
USAGE = "usage: vllm serve [model_tag] [options]"

STR, INT, FLOAT, JSON, BOOL, STR_LIST = "str", "int", "float", "json", "bool", "str+"

FLAG_TYPES: dict[str, str] = {
    "--host": STR,
    "--port": INT,
    "--data-parallel-size": INT,
    "--data-parallel-rank": INT,
    "--data-parallel-address": STR,
    "--data-parallel-rpc-port": INT,
    "--data-parallel-size-local": INT,
    "--tensor-parallel-size": INT,
    "--seed": INT,
    "--served-model-name": STR_LIST,
    "--max-model-len": INT,
    "--max-num-batched-tokens": INT,
    "--max-num-seqs": INT,
    "--block-size": INT,
    "--gpu-memory-utilization": FLOAT,
    "--quantization": STR,
    "--safetensors-load-strategy": STR,
    "--model-loader-extra-config": JSON,
    "--tokenizer-mode": STR,
    "--tool-call-parser": STR,
    "--reasoning-parser": STR,
    "--additional-config": JSON,
    "--speculative-config": JSON,
    "--compilation-config": JSON,
    "--kv-transfer-config": JSON,
}
BOOL_FLAGS = [
    "--enable-expert-parallel",
    "--enforce-eager",
    "--async-scheduling",
    "--disable-hybrid-kv-cache-manager",
    "--enable-prefix-caching",
    "--trust-remote-code",
    "--enable-auto-tool-choice",
]
for _b in BOOL_FLAGS:
    FLAG_TYPES[_b] = BOOL
    FLAG_TYPES["--no-" + _b[2:]] = BOOL

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
# vLLM's FINISH_REASON_STRINGS (v1/engine): "error" is a request the engine failed, e.g. a KV load
# that failed under kv_load_failure_policy "fail".
FINISH_REASONS = ("stop", "length", "abort", "error")
# vLLM's KVTransferConfig.kv_port default: the Mooncake side channels start here when none is given.
DEFAULT_KV_PORT = 14579
# FAKE_VLLM_FAULT values: how one side of the P/D path breaks (each only on its side's ranks).
FAULTS = {
    "transfer-fail": "kv_consumer",  # decode: every KV load from prefill fails
    "no-kv-params": "kv_producer",  # prefill: answers without kv_transfer_params (connector not producing)
    "ignore-kv": "kv_consumer",  # decode: takes no KV from prefill and computes the prompt itself
}
SIDE_CHANNEL_TIMEOUT_S = 5.0
MAX_HELD_TRANSFERS = 16000  # the Mooncake connector's bounded request dict

COUNTER_FAMILIES = [
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    (
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, "
        "in terms of number of queried tokens.",
    ),
    (
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, "
        "in terms of number of cached tokens.",
    ),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
]
REQUEST_SUCCESS = ("vllm:request_success", "Count of successfully processed requests.")
GAUGE_FAMILIES = [
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
]
# vLLM's (vllm/v1/metrics/loggers.py, >= 0.11) latency histograms and their buckets, in its registration
# order. vllm:time_per_output_token_seconds (the inter-token latency's name before 0.11) is hidden since 0.12.
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
HISTOGRAM_FAMILIES = [
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
      80.0, 160.0, 640.0, 2560.0)),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
]


class UsageError(Exception):
    """An argparse-style error: exit code 2."""


class StartupError(Exception):
    """A failure after parsing (engine/config start-up): exit code 1."""


def _log(msg: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [fake_vllm.py] {msg}", flush=True)


# --------------------------------------------------------------------------- parsing


def _looks_like_negative_number(tok: str) -> bool:
    try:
        float(tok)
        return tok.startswith("-")
    except ValueError:
        return False


def _is_option(tok: str) -> bool:
    return tok.startswith("-") and tok != "-" and not _looks_like_negative_number(tok)


def _convert(flag: str, kind: str, raw: str):
    if kind == INT:
        try:
            return int(raw)
        except ValueError:
            raise UsageError(f"argument {flag}: invalid int value: {raw!r}") from None
    if kind == FLOAT:
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"argument {flag}: invalid float value: {raw!r}") from None
    if kind == JSON:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UsageError(f"argument {flag}: invalid JSON value: {raw!r} ({exc})") from None
        if flag == "--compilation-config" and isinstance(value, int) and not isinstance(value, bool):
            return {"level": value}
        if not isinstance(value, dict):
            raise UsageError(f"argument {flag}: expected a JSON object, got: {raw!r}")
        return value
    return raw


def parse_serve_args(argv: list[str]) -> dict:
    """Parse ``serve`` arguments (argv without the leading 'serve')."""
    opts: dict = {}
    positionals: list[str] = []
    unknown: list[str] = []
    i = 0
    only_positionals = False
    while i < len(argv):
        tok = argv[i]
        i += 1
        if only_positionals or not _is_option(tok):
            if positionals:
                unknown.append(tok)  # argparse reports extras in command-line order
            else:
                positionals.append(tok)
            continue
        if tok == "--":
            only_positionals = True
            continue
        if tok in ("-h", "--help"):
            raise SystemExit(_help())
        if not tok.startswith("--"):
            unknown.append(tok)
            continue
        if "=" in tok:
            key, value = tok.split("=", 1)
            has_inline = True
        else:
            key, value, has_inline = tok, None, False
        key = "--" + key[2:].replace("_", "-")
        kind = FLAG_TYPES.get(key)
        if kind is None:
            unknown.append(tok)
            continue
        if kind == BOOL:
            if has_inline:
                raise UsageError(f"argument {key}: ignored explicit argument {value!r}")
            if key.startswith("--no-"):
                opts["--" + key[5:]] = False
            else:
                opts[key] = True
            continue
        if kind == STR_LIST:
            values = [value] if has_inline else []
            while not has_inline and i < len(argv) and not _is_option(argv[i]):
                values.append(argv[i])
                i += 1
            if not values:
                raise UsageError(f"argument {key}: expected at least one argument")
            opts[key] = values
            continue
        if not has_inline:
            if i >= len(argv) or _is_option(argv[i]):
                raise UsageError(f"argument {key}: expected one argument")
            value = argv[i]
            i += 1
        opts[key] = _convert(key, kind, value)

    if not positionals:
        raise UsageError("the following arguments are required: model_tag")
    if unknown:
        raise UsageError("unrecognized arguments: " + " ".join(unknown))

    kv = opts.get("--kv-transfer-config")
    if kv is not None:
        if not kv.get("kv_connector"):
            raise UsageError('argument --kv-transfer-config: "kv_connector" is required')
        if kv.get("kv_role") not in KV_ROLES:
            raise UsageError(
                f"argument --kv-transfer-config: Unsupported kv_role: {kv.get('kv_role')!r}. "
                f"Supported roles are {list(KV_ROLES)}"
            )
    opts["model"] = positionals[0]
    return opts


def _help() -> int:
    print(USAGE)
    print("\nfake vllm serve (tests/fakes/fake_vllm.py). Known options:")
    for flag, kind in FLAG_TYPES.items():
        print(f"  {flag} {'' if kind == BOOL else kind.upper()}")
    return 0


def validate(opts: dict, env) -> dict:
    """Post-parse checks (exit 1). Returns derived settings."""
    tp = opts.get("--tensor-parallel-size", 1)
    if tp < 1:
        raise StartupError(f"tensor_parallel_size must be >= 1, got {tp}")
    dp = opts.get("--data-parallel-size", 1)
    rank = opts.get("--data-parallel-rank")
    dp_local = opts.get("--data-parallel-size-local")
    if dp < 1:
        raise StartupError(f"data_parallel_size must be >= 1, got {dp}")
    if rank is not None and not 0 <= rank < dp:
        raise StartupError(f"data_parallel_rank ({rank}) must be in [0, data_parallel_size={dp})")
    if dp_local is not None and not 1 <= dp_local <= dp:
        raise StartupError(
            f"data_parallel_size_local ({dp_local}) must be in [1, data_parallel_size={dp}]"
        )
    expected = tp * (dp_local if (dp_local is not None and rank is None) else 1)
    raw = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        raise StartupError(
            f"ASCEND_RT_VISIBLE_DEVICES is not set; this process needs {expected} NPU(s) "
            f"(tensor_parallel_size={tp})"
        )
    parts = [p.strip() for p in raw.split(",")]
    try:
        devices = [int(p) for p in parts]
    except ValueError:
        raise StartupError(
            f"ASCEND_RT_VISIBLE_DEVICES={raw!r} is not a comma-separated list of integers"
        ) from None
    if len(set(devices)) != len(devices):
        raise StartupError(f"ASCEND_RT_VISIBLE_DEVICES={raw!r} lists a device more than once")
    if len(devices) != expected:
        raise StartupError(
            f"ASCEND_RT_VISIBLE_DEVICES={raw!r} holds {len(devices)} device(s) but this process "
            f"needs exactly {expected} (tensor_parallel_size={tp}"
            + (f", data_parallel_size_local={dp_local}" if expected != tp else "")
            + ")"
        )
    gmu = opts.get("--gpu-memory-utilization")
    if gmu is not None and not 0 < gmu <= 1:
        raise StartupError(f"GPU memory utilization must be in (0, 1], got {gmu}")
    port = opts.get("--port", 8000)
    if not 0 <= port <= 65535:
        raise StartupError(f"port must be 0-65535, got {port}")
    if opts.get("--enable-auto-tool-choice") and not opts.get("--tool-call-parser"):
        raise StartupError(
            "When `--enable-auto-tool-choice` is set, `--tool-call-parser` must be set as well"
        )
    block = opts.get("--block-size", 128)
    if block < 1:
        raise StartupError(f"block_size must be >= 1, got {block}")
    return {"tp": tp, "devices": devices, "rank": rank, "port": port, "block": block}


# --------------------------------------------------------------------------- state


def _float_to_go_string(d: float) -> str:
    """prometheus_client.utils.floatToGoString."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _escape_label(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class State:
    def __init__(self, opts: dict, derived: dict):
        self.lock = threading.Lock()
        self.model_path = opts["model"]
        self.names = opts.get("--served-model-name") or [self.model_path]
        self.model_name = self.names[0]
        self.engine = str(derived["rank"]) if derived["rank"] is not None else "0"
        self.max_model_len = opts.get("--max-model-len")
        self.block = derived["block"]
        self.prefix_caching = opts.get("--enable-prefix-caching", True)
        kv = opts.get("--kv-transfer-config")
        self.kv_role = kv["kv_role"] if kv else None
        self.tp = derived["tp"]
        self.mooncake = pd_transfer.mooncake_config(kv)
        self.engine_id = (pd_transfer.engine_id(kv, derived["rank"], opts.get("--data-parallel-size", 1))
                          if kv else str(uuid.uuid4()))
        self.kv_port = int((self.mooncake or {}).get("kv_port") or (kv or {}).get("kv_port") or DEFAULT_KV_PORT)
        self.side_port = self.kv_port + (derived["rank"] or 0) * self.tp
        extra = (self.mooncake or {}).get("kv_connector_extra_config") or {}
        tp_size = (extra.get("prefill") or {}).get("tp_size") if isinstance(extra, dict) else None
        self.expected_prefill_tp = int(tp_size) if isinstance(tp_size, int) else None
        self.side_channel: "pd_transfer.SideChannel | None" = None  # producers, once started
        self.fault = os.environ.get("FAKE_VLLM_FAULT") or None
        self.request_delay = float(os.environ.get("FAKE_VLLM_REQUEST_DELAY") or 0)
        self.next_block = 0
        self.host = opts.get("--host")
        self.port = derived["port"]
        self.created = time.time()
        self.seen_blocks: set[str] = set()
        self.values: dict[str, float] = {}
        for name, _ in COUNTER_FAMILIES:
            self.values[name + "_total"] = 0.0
        for reason in FINISH_REASONS:
            self.values[self._success_key(reason)] = 0.0
        for name, _ in GAUGE_FAMILIES:
            self.values[name] = 0.0
        # name -> [count per bucket (not cumulative; the last is +Inf), sum, count]; FAKE_VLLM_HISTOGRAMS=0: none
        self.histograms: dict[str, list] | None = None
        if os.environ.get("FAKE_VLLM_HISTOGRAMS") != "0":
            self.histograms = {name: [[0] * (len(buckets) + 1), 0.0, 0]
                               for name, _, buckets in HISTOGRAM_FAMILIES}

    def observe(self, name: str, value: float, times: int = 1) -> None:
        if self.histograms is None or times < 1:
            return
        buckets = next(b for n, _, b in HISTOGRAM_FAMILIES if n == name)
        index = next((i for i, le in enumerate(buckets) if value <= le), len(buckets))
        with self.lock:
            h = self.histograms[name]
            h[0][index] += times
            h[1] += value * times
            h[2] += times

    def observe_request(self, ttft: float, e2e: float, tokens: int) -> None:
        self.observe("vllm:time_to_first_token_seconds", ttft)
        self.observe("vllm:inter_token_latency_seconds", (e2e - ttft) / max(tokens - 1, 1), tokens - 1)
        self.observe("vllm:e2e_request_latency_seconds", e2e)

    @staticmethod
    def _success_key(reason: str) -> str:
        return f'vllm:request_success_total{{finished_reason="{reason}"}}'

    def normalise_key(self, key: str) -> str:
        if key == "vllm:request_success_total":
            return self._success_key("length")
        if key.startswith("vllm:request_success_total{"):
            for reason in FINISH_REASONS:
                if key.replace(" ", "").replace("'", '"') == self._success_key(reason):
                    return self._success_key(reason)
        if key in self.values:
            return key
        raise KeyError(key)

    def set_values(self, mapping) -> None:
        if not isinstance(mapping, dict):
            raise ValueError("expected a JSON object mapping sample names to numbers")
        updates = {}
        for key, value in mapping.items():
            try:
                norm = self.normalise_key(key)
            except KeyError:
                raise ValueError(
                    f"unknown metric sample {key!r}; known: {sorted(self.values)}"
                ) from None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"value for {key!r} must be a number, got {value!r}")
            updates[norm] = float(value)
        with self.lock:
            self.values.update(updates)

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.values)

    def prefix_hits(self, text: str, prompt_tokens: int) -> int:
        chars = 4 * self.block
        nblocks = (prompt_tokens - 1) // self.block
        hashes = []
        h = ""
        for b in range(nblocks):
            h = hashlib.sha256((h + text[b * chars:(b + 1) * chars]).encode()).hexdigest()
            hashes.append(h)
        with self.lock:
            hits = 0
            for h in hashes:
                if h in self.seen_blocks:
                    hits += 1
                else:
                    break
            self.seen_blocks.update(hashes)
        return hits * self.block

    def faulty(self, fault: str) -> bool:
        return self.fault == fault and self.kv_role in (FAULTS[fault], "kv_both")

    def allocate_blocks(self, n: int) -> list[int]:
        with self.lock:
            first = self.next_block
            self.next_block += n
        return list(range(first, first + n))

    def failed(self) -> None:
        with self.lock:
            self.values[self._success_key("error")] += 1

    def account(self, text: str, prompt_tokens: int, completion_tokens: int, remote_prefill: bool) -> None:
        hits = self.prefix_hits(text, prompt_tokens) if self.prefix_caching else 0
        with self.lock:
            v = self.values
            if self.prefix_caching:
                v["vllm:prefix_cache_queries_total"] += prompt_tokens
                v["vllm:prefix_cache_hits_total"] += hits
            if self.kv_role is not None:
                v["vllm:external_prefix_cache_queries_total"] += prompt_tokens
                if remote_prefill and self.kv_role in ("kv_consumer", "kv_both"):
                    v["vllm:external_prefix_cache_hits_total"] += prompt_tokens - hits
            v["vllm:prompt_tokens_total"] += prompt_tokens
            v["vllm:generation_tokens_total"] += completion_tokens
            v[self._success_key("length")] += 1

    def running(self, delta: int) -> None:
        with self.lock:
            self.values["vllm:num_requests_running"] += delta

    def render_metrics(self) -> bytes:
        vals = self.snapshot()
        eng, mn = _escape_label(self.engine), _escape_label(self.model_name)
        base = f'engine="{eng}",model_name="{mn}"'
        created = _float_to_go_string(self.created)
        out: list[str] = []
        for name, doc in GAUGE_FAMILIES:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
            out.append(f"{name}{{{base}}} {_float_to_go_string(vals[name])}\n")
        for name, doc in COUNTER_FAMILIES:
            out.append(f"# HELP {name}_total {doc}\n# TYPE {name}_total counter\n")
            out.append(f"{name}_total{{{base}}} {_float_to_go_string(vals[name + '_total'])}\n")
            out.append(f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n")
            out.append(f"{name}_created{{{base}}} {created}\n")
        name, doc = REQUEST_SUCCESS
        out.append(f"# HELP {name}_total {doc}\n# TYPE {name}_total counter\n")
        for reason in FINISH_REASONS:
            labels = f'engine="{eng}",finished_reason="{reason}",model_name="{mn}"'
            value = _float_to_go_string(vals[self._success_key(reason)])
            out.append(f"{name}_total{{{labels}}} {value}\n")
        out.append(f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n")
        for reason in FINISH_REASONS:
            labels = f'engine="{eng}",finished_reason="{reason}",model_name="{mn}"'
            out.append(f"{name}_created{{{labels}}} {created}\n")
        if self.histograms is not None:
            with self.lock:
                hists = {n: (list(h[0]), h[1], h[2]) for n, h in self.histograms.items()}
            for name, doc, buckets in HISTOGRAM_FAMILIES:
                counts, total, count = hists[name]
                out.append(f"# HELP {name} {doc}\n# TYPE {name} histogram\n")
                cumulative = 0
                for le, n in zip([*buckets, math.inf], counts):
                    cumulative += n
                    out.append(f'{name}_bucket{{engine="{eng}",le="{_float_to_go_string(le)}",model_name="{mn}"}} '
                               f"{_float_to_go_string(cumulative)}\n")
                out.append(f"{name}_count{{{base}}} {_float_to_go_string(count)}\n")
                out.append(f"{name}_sum{{{base}}} {_float_to_go_string(total)}\n")
                out.append(f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n")
                out.append(f"{name}_created{{{base}}} {created}\n")
        out.append("# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
                   "# TYPE process_start_time_seconds gauge\n"
                   f"process_start_time_seconds {_float_to_go_string(round(PROCESS_START, 2))}\n")
        return "".join(out).encode("utf-8")


# --------------------------------------------------------------------------- HTTP


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, etype: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.etype = status, etype


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise BadRequest("message content must be a string or a list of content parts")


def _fake_text(n: int) -> str:
    words = ["fake", "token", "from", "the", "stand-in", "vllm", "server"]
    return " ".join(words[i % len(words)] for i in range(n))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    state: State  # set on the class before serving

    def log_message(self, fmt, *args):  # uvicorn-style access log on stdout
        print(f"INFO:     {self.client_address[0]}:{self.client_address[1]} - {fmt % args}", flush=True)

    # helpers
    def _send(self, status: int, body: bytes, ctype: str | None = "application/json") -> None:
        self.send_response(status)
        if ctype:
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"))

    def _error(self, status: int, message: str, etype: str) -> None:
        self._json(status, {"error": {"message": message, "type": etype, "param": None, "code": status}})

    def _read_json(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"JSON decode error: {exc}") from None

    # routes
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        st = self.state
        if path == "/health":
            self._send(200, b"", None)
        elif path == "/version":
            self._json(200, {"version": FAKE_VERSION})
        elif path == "/v1/models":
            data = [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": st.model_path,
                    "parent": None,
                    "max_model_len": st.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid4().hex}",
                            "object": "model_permission",
                            "created": int(time.time()),
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
                for name in st.names
            ]
            self._json(200, {"object": "list", "data": data})
        elif path == "/metrics":
            self._send(200, st.render_metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/fake/counters":
            self._json(200, st.snapshot())
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        try:
            if path in ("/v1/chat/completions", "/v1/completions"):
                self._completion(chat=path == "/v1/chat/completions")
            elif path == "/fake/counters":
                body = self._read_json()
                try:
                    self.state.set_values(body)
                except ValueError as exc:
                    raise BadRequest(str(exc)) from None
                self._json(200, self.state.snapshot())
            elif path == "/fake/fault":
                body = self._read_json()
                fault = body.get("fault") if isinstance(body, dict) else None
                if not (isinstance(body, dict) and set(body) == {"fault"} and (fault is None or fault in FAULTS)):
                    raise BadRequest(f'expected {{"fault": null or one of {sorted(FAULTS)}}}')
                self.state.fault = fault
                self._json(200, {"fault": fault})
            elif path == "/reset_prefix_cache":
                with self.state.lock:
                    self.state.seen_blocks.clear()
                self._send(200, b"", None)
            else:
                self._json(404, {"detail": "Not Found"})
        except BadRequest as exc:
            self._error(exc.status, str(exc), exc.etype)

    def _completion(self, chat: bool) -> None:
        st = self.state
        t0 = time.monotonic()
        body = self._read_json()
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if model is None:
            model = st.model_name
        if model not in st.names:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list")
            lines = []
            for m in messages:
                if not isinstance(m, dict) or "role" not in m:
                    raise BadRequest("each message must be an object with a 'role'")
                lines.append(f"{m['role']}: {_content_text(m.get('content'))}")
            text = "\n".join(lines)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) and prompt:
                text = "\n".join(prompt)
            elif isinstance(prompt, str):
                text = prompt
            else:
                raise BadRequest("'prompt' must be a string or a list of strings")
        prompt_tokens = max(1, math.ceil(len(text) / 4))
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = 16
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        if st.max_model_len is not None and prompt_tokens + max_tokens > st.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {st.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or completion."
            )
        kv_in = body.get("kv_transfer_params")
        kv_out = None
        if (isinstance(kv_in, dict) and kv_in.get("do_remote_decode") and st.side_channel is not None
                and not st.faulty("no-kv-params")):
            nblocks = math.ceil(prompt_tokens / st.block)
            blocks = st.allocate_blocks(nblocks)
            request_id = self.headers.get("X-Request-Id") or uuid.uuid4().hex
            st.side_channel.hold(request_id, blocks)
            kv_out = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": blocks,
                "remote_engine_id": st.engine_id,
                "remote_request_id": request_id,
                "remote_host": st.side_channel.host,
                "remote_port": st.side_port,
                "remote_ptp_size": st.tp,
                "remote_pcp_size": 1,
                "remote_dcp_size": 1,
                "last_token_id": prompt_tokens % 32000,
                "num_prompt_blocks": nblocks,
                "remote_block_size": st.block,
            }
        remote = (isinstance(kv_in, dict) and bool(kv_in.get("do_remote_prefill"))
                  and st.kv_role in ("kv_consumer", "kv_both") and not st.faulty("ignore-kv"))
        st.running(+1)
        try:
            # A decode loads the prompt's KV from the prefill before it generates a token (the
            # Mooncake connector's request waits for remote KVs first), so the pull comes first.
            if remote:
                try:
                    if st.faulty("transfer-fail"):
                        raise pd_transfer.TransferError("transfer failed (FAKE_VLLM_FAULT=transfer-fail)")
                    pd_transfer.pull(kv_in, st.expected_prefill_tp, SIDE_CHANNEL_TIMEOUT_S)
                except pd_transfer.TransferError as exc:
                    st.failed()
                    print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [mooncake_connector.py] KV load from "
                          f"{kv_in.get('remote_engine_id')!r} failed: {exc}", file=sys.stderr, flush=True)
                    raise BadRequest(f"Request failed: KV transfer from prefill failed: {exc}", 500,
                                     "InternalServerError") from None
            if st.request_delay > 0:
                time.sleep(st.request_delay)
            t_first = time.monotonic()
            if ENGINE is not None:
                ENGINE.generate(max_tokens)
            st.account(text, prompt_tokens, max_tokens, remote)
            st.observe_request(t_first - t0, time.monotonic() - t0, max_tokens)
        finally:
            st.running(-1)
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + max_tokens,
            "completion_tokens": max_tokens,
            "prompt_tokens_details": None,
        }
        created = int(time.time())
        content = _fake_text(max_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}" if chat else f"cmpl-{uuid.uuid4().hex}"
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(chat, rid, created, model, content, usage if include_usage else None)
            return
        if chat:
            resp = {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": content,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "kv_transfer_params": kv_out,
            }
        else:
            resp = {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": content,
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "kv_transfer_params": kv_out,
            }
        self._json(200, resp)

    def _stream(self, chat, rid, created, model, content, usage) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def emit(data: str) -> None:
            payload = f"data: {data}\n\n".encode("utf-8")
            self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")

        obj = "chat.completion.chunk" if chat else "text_completion"
        pieces = content.split(" ")
        if chat:
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            emit(json.dumps({"id": rid, "object": obj, "created": created, "model": model, "choices": [first]}))
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            text = piece if n == 0 else " " + piece
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                          "finish_reason": "length" if last else None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None,
                          "finish_reason": "length" if last else None, "stop_reason": None}
            emit(json.dumps({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}))
        if usage is not None:
            emit(json.dumps({"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage}))
        emit("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _make_server(host: str | None, port: int) -> ThreadingHTTPServer:
    bind_host = host if host else "0.0.0.0"
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True
        allow_reuse_address = True

    return Server((bind_host, port), Handler)


ENGINE = None  # the engine-core process (FAKE_VLLM_ENGINE_PROCESS=1)
PROCESS_START = time.time()


def _exit_now(signum, frame):  # noqa: ARG001
    try:
        sys.stdout.flush()
    finally:
        os._exit(0)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
    print("fake-vllm argv: " + shlex.join(["vllm"] + argv), flush=True)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.replace(" serve [model_tag] [options]", " {serve} ..."), file=sys.stderr)
        return 0 if argv else 2
    if argv[0] != "serve":
        print("usage: vllm [-h] [-v] {serve} ...", file=sys.stderr)
        print(f"vllm: error: argument subparser: invalid choice: {argv[0]!r} (choose from 'serve')",
              file=sys.stderr)
        return 2
    try:
        opts = parse_serve_args(argv[1:])
    except UsageError as exc:
        print(USAGE, file=sys.stderr)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        derived = validate(opts, os.environ)
        fault = os.environ.get("FAKE_VLLM_FAULT")
        if fault and fault not in FAULTS:
            raise StartupError(f"FAKE_VLLM_FAULT={fault!r} is not one of {sorted(FAULTS)}")
        state = State(opts, derived)
        initial = os.environ.get("FAKE_VLLM_COUNTERS")
        if initial:
            try:
                state.set_values(json.loads(initial))
            except (json.JSONDecodeError, ValueError) as exc:
                raise StartupError(f"FAKE_VLLM_COUNTERS is invalid: {exc}") from None
    except StartupError as exc:
        print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [fake_vllm.py] {exc}", file=sys.stderr)
        print(f"ValueError: {exc}", file=sys.stderr, flush=True)
        return 1

    host = opts.get("--host")
    rank = derived["rank"]
    _log(f"vLLM API server version {FAKE_VERSION}")
    _log(
        f"fake-vllm: model={opts['model']} served_model_name={state.names} host={host or '0.0.0.0'} "
        f"port={derived['port']} dp_rank={rank if rank is not None else 0} "
        f"dp_size={opts.get('--data-parallel-size', 1)} tp={derived['tp']} "
        f"devices={','.join(map(str, derived['devices']))} kv_role={state.kv_role}"
    )

    exit_code = os.environ.get("FAKE_VLLM_EXIT_AT_START")
    if exit_code:
        ranks = os.environ.get("FAKE_VLLM_EXIT_RANKS")
        selected = True
        if ranks:
            selected = str(rank if rank is not None else 0) in {r.strip() for r in ranks.split(",")}
        if selected:
            print("Traceback (most recent call last):", file=sys.stderr)
            print('  File "vllm/v1/engine/core.py", line 1, in run_engine_core', file=sys.stderr)
            print(f"RuntimeError: fake engine core failed at start (FAKE_VLLM_EXIT_AT_START={exit_code})",
                  file=sys.stderr, flush=True)
            return int(exit_code)

    delay = float(os.environ.get("FAKE_VLLM_STARTUP_DELAY") or 0)
    if delay > 0:
        _log(f"Loading model weights (fake, {delay}s)")
        time.sleep(delay)

    if os.environ.get("FAKE_VLLM_DP_GROUP") == "1":  # serve only once the whole DP group runs
        import dp_group

        dp_group.join(opts, derived)

    if state.mooncake is not None and state.kv_role in ("kv_producer", "kv_both"):
        try:  # the connector binds its side channels while the engine starts, before the API server
            state.side_channel = pd_transfer.SideChannel(
                host or "0.0.0.0", state.side_port, state.tp, state.engine_id, MAX_HELD_TRANSFERS)
        except OSError as exc:
            print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [mooncake_connector.py] zmq.error.ZMQError: "
                  f"Address already in use ({exc})", file=sys.stderr, flush=True)
            return 1
        _log(f"Mooncake side channel of engine {state.engine_id} on {host or '0.0.0.0'}:"
             f"{state.side_port}-{state.side_port + state.tp - 1}")

    global ENGINE
    if os.environ.get("FAKE_VLLM_ENGINE_PROCESS") == "1":
        from engine_core import EngineCore

        ENGINE = EngineCore(float(os.environ.get("FAKE_VLLM_ENGINE_STEP_S") or 0))
        _log(f"EngineCore pid {ENGINE.pid}")
    Handler.state = state
    try:
        server = _make_server(host, derived["port"])
    except OSError as exc:
        print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [fake_vllm.py] OSError: {exc}", file=sys.stderr)
        print(f"OSError: {exc}", file=sys.stderr, flush=True)
        return 1
    actual_port = server.server_address[1]
    state.port = actual_port
    shown = host or "0.0.0.0"
    if ":" in shown:
        shown = f"[{shown}]"
    _log(f"Starting vLLM API server 0 on http://{shown}:{actual_port}")
    print("INFO:     Started server process [%d]" % os.getpid(), flush=True)
    print("INFO:     Waiting for application startup.", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
