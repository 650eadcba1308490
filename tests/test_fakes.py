"""Tests for the test fakes in tests/fakes: the fake `vllm` CLI, and its P/D hand-over checked through the
release's own PD proxy script (tests/proxy_release.py)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

FAKES = Path(__file__).resolve().parent / "fakes"
VLLM = str(FAKES / "bin" / "vllm")
import proxy_release
from ports import free_port

PROXY = str(proxy_release.for_stack("a3-4node"))

# One Prometheus text-format (0.0.4) line: comment, or `name{labels} value` / `name value`.
HELP_RE = re.compile(r"^# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*$")
TYPE_RE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$")
SAMPLE_RE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)'
    # Labels are optional: prometheus_client's process collector writes `process_start_time_seconds 1.7e+09`.
    r'(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?\})?'
    r" ([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))$"
)
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def free_side_channels(n: int = 2) -> int:
    """The first of n consecutive free ports below the ephemeral range (32768-60999 on Linux). A port
    from bind(0) is ephemeral: its neighbours were never checked, and until the fake binds them any
    outgoing connection of a test running beside it can take them (seen in CI: Address already in use)."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20000, 32768 - n)
        held = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in 20000-32767")


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Strictly parse exposition text; every TYPE'd family's samples must follow it."""
    samples: dict[tuple[str, frozenset], float] = {}
    current_family = current_type = None
    assert text.endswith("\n")
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("# HELP"):
            assert HELP_RE.match(line), line
            continue
        m = TYPE_RE.match(line)
        if m:
            current_family, current_type = m.group(1), m.group(2)
            continue
        assert not line.startswith("#"), line
        m = SAMPLE_RE.match(line)
        assert m, f"bad sample line: {line!r}"
        name = m.group(1)
        # A histogram family's samples are <family>_bucket (with le), _count and _sum.
        own = ({f"{current_family}{s}" for s in ("_bucket", "_count", "_sum")} if current_type == "histogram"
               else {current_family})
        assert name in own, f"{name} outside its family {current_family}"
        assert (name.endswith("_bucket") and current_type == "histogram") == ('le="' in (m.group(2) or "")), line
        labels = frozenset(LABEL_RE.findall(m.group(2) or ""))
        samples[(name, labels)] = float(m.group(3))
    return samples


def base_env(**extra) -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("FAKE_VLLM_") or k.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            del env[k]  # the release proxy's httpx would send its backend calls to an http_proxy
    env["ASCEND_RT_VISIBLE_DEVICES"] = "0"
    env.update({k: str(v) for k, v in extra.items()})
    return env


# Bounds, not speed checks: at a load average of 1000 (other engineers' suites) a python start took >10 s.
START_BOUND_S = 60


def run_vllm(args, env=None, timeout=START_BOUND_S):
    return subprocess.run([VLLM, *args], env=env or base_env(), capture_output=True, text=True, timeout=timeout)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = START_BOUND_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited {proc.returncode}: {out}\n{err}")
        try:
            requests.get(url, timeout=0.5)
            return
        except requests.ConnectionError:
            time.sleep(0.05)
    raise AssertionError(f"{url} did not come up")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class Servers:
    """Starts processes and always stops them."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def vllm(self, *args, env=None, port=None):
        port = port or free_port()
        proc = subprocess.Popen(
            [VLLM, "serve", "/models/fake-model", "--host", "127.0.0.1", "--port", str(port), *args],
            env=env or base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        return port, proc

    def proxy(self, *args, env=None):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, PROXY, "--host", "127.0.0.1", "--port", str(port), *args],
            env=env or base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/healthcheck", proc, timeout=60)  # imports fastapi/uvicorn first
        return port, proc

    def close(self):
        for proc in self.procs:
            stop(proc)


@pytest.fixture
def servers():
    s = Servers()
    try:
        yield s
    finally:
        s.close()


# ----------------------------------------------------------------------------- fake vllm: parsing


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
        (["--port", "eighty"], "argument --port: invalid int value"),
        (["--tensor-parallel-size=1.5"], "argument --tensor-parallel-size: invalid int value"),
        (["--max-model-len"], "argument --max-model-len: expected one argument"),
        (["--host", "--port", "1"], "argument --host: expected one argument"),
        (["--gpu-memory-utilization", "lots"], "argument --gpu-memory-utilization: invalid float value"),
        (["--enforce-eager=yes"], "argument --enforce-eager: ignored explicit argument"),
        (["--tensor-parallel"], "unrecognized arguments: --tensor-parallel"),  # no abbreviations
        (["extra-positional"], "unrecognized arguments: extra-positional"),
        (["--kv-transfer-config", '{"kv_role": "kv_producer"}'], "kv_connector"),
        (["--kv-transfer-config", '{"kv_connector": "M", "kv_role": "kv_sender"}'], "kv_role"),
        (["--kv-transfer-config", '["kv_producer"]'], "--kv-transfer-config"),
    ],
)
def test_vllm_rejects_bad_arguments(args, needle):
    r = run_vllm(["serve", "/m", *args])
    assert r.returncode == 2, r
    assert needle in r.stderr
    assert "vllm serve: error:" in r.stderr


@pytest.mark.parametrize(
    "flag",
    [
        "--kv-transfer-config",
        "--additional-config",
        "--speculative-config",
        "--compilation-config",
        "--model-loader-extra-config",
    ],
)
@pytest.mark.parametrize("form", ["separate", "inline"])
def test_vllm_rejects_bad_json(flag, form):
    bad = "{'single': quotes}"
    args = [flag, bad] if form == "separate" else [f"{flag}={bad}"]
    r = run_vllm(["serve", "/m", *args])
    assert r.returncode == 2
    assert f"argument {flag}: invalid JSON" in r.stderr


def test_vllm_requires_model_and_serve():
    r = run_vllm(["serve", "--port", "1"])
    assert r.returncode == 2 and "model_tag" in r.stderr
    r = run_vllm(["bench", "/m"])
    assert r.returncode == 2 and "invalid choice" in r.stderr


@pytest.mark.parametrize(
    "devices, tp, needle",
    [
        (None, 1, "ASCEND_RT_VISIBLE_DEVICES is not set"),
        ("0", 2, "needs exactly 2"),
        ("0,1,2", 2, "needs exactly 2"),
        ("0,0", 2, "more than once"),
        ("0,x", 2, "not a comma-separated list of integers"),
    ],
)
def test_vllm_device_count_checked(devices, tp, needle):
    env = base_env()
    env.pop("ASCEND_RT_VISIBLE_DEVICES")
    if devices is not None:
        env["ASCEND_RT_VISIBLE_DEVICES"] = devices
    r = run_vllm(["serve", "/m", "--port", str(free_port()), "--tensor-parallel-size", str(tp)], env=env)
    assert r.returncode == 1
    assert needle in r.stderr


def test_vllm_exit_at_start_hook():
    r = run_vllm(
        ["serve", "/m", "--data-parallel-size", "2", "--data-parallel-rank", "1", "--port", str(free_port())],
        env=base_env(FAKE_VLLM_EXIT_AT_START=7),
    )
    assert r.returncode == 7
    assert "Traceback" in r.stderr
    assert "fake-vllm argv: vllm serve /m --data-parallel-size 2" in r.stdout


# ----------------------------------------------------------------------------- fake vllm: HTTP


def test_vllm_serves_openai_api_and_metrics(servers):
    kv = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer"})
    port, proc = servers.vllm(
        "--served-model-name", "qwen", "--tensor_parallel_size", "2", "--data-parallel-size", "4",
        "--data-parallel-rank=3", "--max-model-len", "4096", "--enforce-eager", "--no-enable-prefix-caching",
        "--kv-transfer-config", kv, "--additional-config", '{"ascend_scheduler_config": {"enabled": true}}',
        env=base_env(ASCEND_RT_VISIBLE_DEVICES="4,5"),
    )
    base = f"http://127.0.0.1:{port}"

    r = requests.get(f"{base}/health", timeout=5)
    assert r.status_code == 200 and r.content == b""

    models = requests.get(f"{base}/v1/models", timeout=5).json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == "qwen" and card["root"] == "/models/fake-model"
    assert card["owned_by"] == "vllm" and card["max_model_len"] == 4096 and card["parent"] is None

    r = requests.post(f"{base}/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]}, timeout=5)
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "The model `other` does not exist.", "type": "NotFoundError", "param": None, "code": 404,
    }

    msgs = [{"role": "user", "content": "a" * 34}]  # "user: " + 34 chars = 40 chars -> 10 tokens
    r = requests.post(f"{base}/v1/chat/completions", json={"model": "qwen", "messages": msgs, "max_tokens": 5}, timeout=5)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": None}

    r = requests.post(f"{base}/v1/completions", json={"model": "qwen", "prompt": "abcdefgh", "max_tokens": 2}, timeout=5)
    assert r.json()["object"] == "text_completion" and r.json()["usage"]["prompt_tokens"] == 2

    r = requests.get(f"{base}/metrics", timeout=5)
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    m = parse_metrics(r.text)
    lab = frozenset({("engine", "3"), ("model_name", "qwen")})
    assert m[("vllm:prompt_tokens_total", lab)] == 12
    assert m[("vllm:generation_tokens_total", lab)] == 7
    assert m[("vllm:prefix_cache_queries_total", lab)] == 0  # prefix caching disabled
    assert m[("vllm:external_prefix_cache_queries_total", lab)] == 12
    assert m[("vllm:request_success_total", lab | {("finished_reason", "length")})] == 2
    assert m[("vllm:num_requests_running", lab)] == 0
    assert "# TYPE vllm:prompt_tokens_total counter" in r.text
    assert "# TYPE vllm:prompt_tokens_created gauge" in r.text

    stop(proc)
    assert proc.returncode == 0
    out = proc.stdout.read()
    assert "Starting vLLM API server" in out and "devices=4,5" in out and "dp_rank=3" in out


def test_vllm_counters_env_and_set_endpoint(servers):
    port, _ = servers.vllm(
        "--block-size", "4",
        env=base_env(FAKE_VLLM_COUNTERS=json.dumps({"vllm:prefix_cache_queries_total": 100, "vllm:prefix_cache_hits_total": 40})),
    )
    base = f"http://127.0.0.1:{port}"
    lab = frozenset({("engine", "0"), ("model_name", "/models/fake-model")})
    m = parse_metrics(requests.get(f"{base}/metrics", timeout=5).text)
    assert m[("vllm:prefix_cache_queries_total", lab)] == 100
    assert m[("vllm:prefix_cache_hits_total", lab)] == 40

    values = {
        "vllm:prefix_cache_queries_total": 1000,
        "vllm:prefix_cache_hits_total": 250,
        "vllm:external_prefix_cache_queries_total": 800,
        "vllm:external_prefix_cache_hits_total": 600,
        "vllm:request_success_total": 9,
        'vllm:request_success_total{finished_reason="stop"}': 2,
    }
    r = requests.post(f"{base}/fake/counters", json=values, timeout=5)
    assert r.status_code == 200
    assert requests.post(f"{base}/fake/counters", json={"vllm:nope_total": 1}, timeout=5).status_code == 400
    m = parse_metrics(requests.get(f"{base}/metrics", timeout=5).text)
    assert m[("vllm:prefix_cache_queries_total", lab)] == 1000
    assert m[("vllm:prefix_cache_hits_total", lab)] == 250
    assert m[("vllm:external_prefix_cache_queries_total", lab)] == 800
    assert m[("vllm:external_prefix_cache_hits_total", lab)] == 600
    assert m[("vllm:request_success_total", lab | {("finished_reason", "length")})] == 9
    assert m[("vllm:request_success_total", lab | {("finished_reason", "stop")})] == 2
    assert ("vllm:prefix_cache_queries_created", lab) in m

    # Prefix cache model: 17 tokens, block 4 -> (17-1)//4 = 4 full blocks; repeat hits all 4.
    prompt = "x" * 68
    for _ in range(2):
        requests.post(f"{base}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=5).raise_for_status()
    m = parse_metrics(requests.get(f"{base}/metrics", timeout=5).text)
    assert m[("vllm:prefix_cache_queries_total", lab)] == 1000 + 2 * 17
    assert m[("vllm:prefix_cache_hits_total", lab)] == 250 + 16
    assert m[("vllm:prompt_tokens_total", lab)] == 34




def producer(kv_port: int, **extra) -> str:
    """A prefill rank's --kv-transfer-config as the plan renders it (MultiConnector, engine_id)."""
    mooncake = {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": str(kv_port),
                "kv_connector_extra_config": {"prefill": {"dp_size": 2, "tp_size": 2},
                                              "decode": {"dp_size": 2, "tp_size": 1}}}
    return json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_producer", "engine_id": "3",
                       "kv_connector_extra_config": {"connectors": [mooncake]}, **extra})


def consumer(kv_port: int) -> str:
    mooncake = {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "kv_port": str(kv_port),
                "kv_connector_extra_config": {"prefill": {"dp_size": 2, "tp_size": 2},
                                              "decode": {"dp_size": 2, "tp_size": 1}}}
    return json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_consumer",
                       "kv_connector_extra_config": {"connectors": [mooncake]}})


def pd_pair(servers, **decode_env):
    """Prefill DP rank 1 of 2 (tp 2, kv_port K: side channels K+2, K+3) and one decode rank."""
    kv_port = free_side_channels()
    p_port, _ = servers.vllm("--served-model-name", "m", "--tensor-parallel-size", "2", "--data-parallel-size", "2",
                             "--data-parallel-rank", "1", "--kv-transfer-config", producer(kv_port - 2),
                             env=base_env(ASCEND_RT_VISIBLE_DEVICES="2,3"))
    d_port, _ = servers.vllm("--served-model-name", "m", "--kv-transfer-config", consumer(kv_port + 50),
                             "--no-enable-prefix-caching", env=base_env(**decode_env))
    return kv_port, p_port, d_port


def prefill_params(p_port: int, prompt: str, request_id: str = "req-1") -> dict:
    r = requests.post(f"http://127.0.0.1:{p_port}/v1/completions", timeout=5, headers={"X-Request-Id": request_id},
                      json={"model": "m", "prompt": prompt, "max_tokens": 1,
                            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}})
    r.raise_for_status()
    return r.json()["kv_transfer_params"]


def test_prefill_announces_its_kv_like_the_mooncake_connector(servers):
    kv_port, p_port, _ = pd_pair(servers)
    params = prefill_params(p_port, "x" * 600)  # 150 tokens: 2 blocks of 128
    assert params == {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0, 1],
        "remote_engine_id": "3_dp1", "remote_request_id": "req-1", "remote_host": "127.0.0.1",
        "remote_port": kv_port, "remote_ptp_size": 2, "remote_pcp_size": 1, "remote_dcp_size": 1,
        "last_token_id": 150, "num_prompt_blocks": 2, "remote_block_size": 128,
    }
    for t in (0, 1):  # one side channel per TP rank: kv_port + dp_rank * tp + t
        socket.create_connection(("127.0.0.1", kv_port + t), timeout=2).close()
    plain = requests.post(f"http://127.0.0.1:{p_port}/v1/completions", timeout=5,
                          json={"model": "m", "prompt": "x", "max_tokens": 1}).json()
    assert plain["kv_transfer_params"] is None  # not a P/D request


def test_decode_pulls_the_announced_kv_and_fails_on_anything_else(servers):
    kv_port, p_port, d_port = pd_pair(servers)
    lab = frozenset({("engine", "0"), ("model_name", "m")})

    def decode(params: dict) -> requests.Response:
        return requests.post(f"http://127.0.0.1:{d_port}/v1/completions", timeout=15,
                             json={"model": "m", "prompt": "y" * 400, "max_tokens": 3, "kv_transfer_params": params})

    good = prefill_params(p_port, "y" * 400, "req-ok")
    r = decode(good)
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
    m = parse_metrics(requests.get(f"http://127.0.0.1:{d_port}/metrics", timeout=5).text)
    assert m[("vllm:external_prefix_cache_hits_total", lab)] == 100  # the whole prompt came from prefill
    assert decode(good).status_code == 500  # pulled once: the prefill freed those blocks

    bad = [
        {**prefill_params(p_port, "y" * 400, "req-e"), "remote_engine_id": "0_dp1"},  # another engine
        {**prefill_params(p_port, "y" * 400, "req-p"), "remote_port": kv_port + 7},  # not its side channel
        {**prefill_params(p_port, "y" * 400, "req-t"), "remote_ptp_size": 4},  # prefill tp disagrees
        {**prefill_params(p_port, "y" * 400, "req-r"), "remote_request_id": "never-prefilled"},
    ]
    reasons = []
    for params in bad:
        r = decode(params)
        assert r.status_code == 500, r.text
        reasons.append(r.json()["error"]["message"])
    assert "serves engine '3_dp1', not '0_dp1'" in reasons[0]
    assert f"tcp://127.0.0.1:{kv_port + 7}" in reasons[1]
    assert "remote_ptp_size 4 differs from this decode's prefill tp_size 2" in reasons[2]
    assert "holds no KV for request 'never-prefilled'" in reasons[3]
    m = parse_metrics(requests.get(f"http://127.0.0.1:{d_port}/metrics", timeout=5).text)
    assert m[("vllm:request_success_total", lab | {("finished_reason", "error")})] == 5
    assert m[("vllm:external_prefix_cache_hits_total", lab)] == 100

    # Without kv_transfer_params the decode computes the prompt itself: served, nothing received.
    r = requests.post(f"http://127.0.0.1:{d_port}/v1/completions", timeout=5,
                      json={"model": "m", "prompt": "z", "max_tokens": 2})
    assert r.status_code == 200


def test_decode_fault_switched_at_runtime_ignores_the_kv(servers):
    """POST /fake/fault switches a running decode to ignore-kv: it computes the prompt itself (no external
    hits, no pull), then back; a bad switch is refused and changes nothing."""
    _, p_port, d_port = pd_pair(servers)
    lab = frozenset({("engine", "0"), ("model_name", "m")})
    url = f"http://127.0.0.1:{d_port}"

    def served(request_id: str) -> dict:
        params = prefill_params(p_port, "w" * 400, request_id)
        r = requests.post(f"{url}/v1/completions", timeout=15,
                          json={"model": "m", "prompt": "w" * 400, "max_tokens": 2, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        return parse_metrics(requests.get(f"{url}/metrics", timeout=5).text)

    def hits(m: dict) -> tuple[float, float]:
        return m[("vllm:external_prefix_cache_hits_total", lab)], m[("vllm:external_prefix_cache_queries_total", lab)]

    assert hits(served("a")) == (100, 100)
    assert requests.post(f"{url}/fake/fault", json={"fault": "ignore-kv"}, timeout=5).json() == {"fault": "ignore-kv"}
    assert hits(served("b")) == (100, 200)  # queried, nothing received: decode computed the 100 tokens itself
    for bad in ({"fault": "melt"}, {"fault": "ignore-kv", "x": 1}, ["ignore-kv"]):
        assert requests.post(f"{url}/fake/fault", json=bad, timeout=5).status_code == 400
    assert requests.post(f"{url}/fake/fault", json={"fault": None}, timeout=5).json() == {"fault": None}
    assert hits(served("c")) == (200, 300)


def test_vllm_latency_histograms_have_vllm_names_and_layout(servers):
    port, _ = servers.vllm("--served-model-name", "h", env=base_env(FAKE_VLLM_REQUEST_DELAY="0.05"))
    base = f"http://127.0.0.1:{port}"
    for _ in range(3):
        requests.post(f"{base}/v1/completions", json={"model": "h", "prompt": "p" * 40, "max_tokens": 5},
                      timeout=10).raise_for_status()
    text = requests.get(f"{base}/metrics", timeout=5).text
    m = parse_metrics(text)
    lab = frozenset({("engine", "0"), ("model_name", "h")})
    for name, per_request in (("vllm:time_to_first_token_seconds", 1), ("vllm:inter_token_latency_seconds", 4),
                              ("vllm:e2e_request_latency_seconds", 1)):
        assert f"# TYPE {name} histogram" in text
        buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in m.items() if k[0] == f"{name}_bucket"))
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and buckets[-1][0] == float("inf")  # cumulative, ending with +Inf
        assert counts[-1] == m[(f"{name}_count", lab)] == 3 * per_request
        assert m[(f"{name}_sum", lab)] > 0
    ttft = {le: v for (n, k), v in m.items() if n == "vllm:time_to_first_token_seconds_bucket"
            for le in [dict(k)["le"]]}
    assert ttft["0.04"] == 0 and ttft["2560.0"] == 3  # every TTFT waited the 0.05 s request delay
    port, _ = servers.vllm("--served-model-name", "h", env=base_env(FAKE_VLLM_HISTOGRAMS="0"))
    assert "histogram" not in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def test_taken_side_channel_port_fails_the_start():
    kv_port = free_side_channels()
    holder = socket.socket()
    holder.bind(("127.0.0.1", kv_port + 1))
    holder.listen(1)
    try:
        r = run_vllm(["serve", "/m", "--host", "127.0.0.1", "--port", str(free_port()), "--tensor-parallel-size", "2",
                      "--data-parallel-size", "2", "--data-parallel-rank", "1", "--kv-transfer-config",
                      producer(kv_port - 2)], env=base_env(ASCEND_RT_VISIBLE_DEVICES="0,1"))
    finally:
        holder.close()
    assert r.returncode == 1
    assert "ZMQError: Address already in use" in r.stderr and f"127.0.0.1:{kv_port + 1}" in r.stderr


def test_unknown_fault_is_refused():
    r = run_vllm(["serve", "/m"], env=base_env(FAKE_VLLM_FAULT="decode-slow"))
    assert r.returncode == 1 and "FAKE_VLLM_FAULT='decode-slow' is not one of" in r.stderr


# ----------------------------------------------------------------------------- through the release proxy


def test_release_proxy_routes_prefill_then_decode(servers):
    _, p_port, d_port = pd_pair(servers)
    port, _ = servers.proxy(
        "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(p_port),
        "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(d_port),
    )
    base = f"http://127.0.0.1:{port}"
    msgs = [{"role": "user", "content": "b" * 74}]  # 80 chars -> 20 tokens
    r = requests.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": msgs, "max_tokens": 7}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 7

    pm = parse_metrics(requests.get(f"http://127.0.0.1:{p_port}/metrics", timeout=5).text)
    dm = parse_metrics(requests.get(f"http://127.0.0.1:{d_port}/metrics", timeout=5).text)
    plab, dlab = frozenset({("engine", "1"), ("model_name", "m")}), frozenset({("engine", "0"), ("model_name", "m")})
    assert pm[("vllm:generation_tokens_total", plab)] == 1  # the proxy asks prefill for max_tokens=1
    assert pm[("vllm:prompt_tokens_total", plab)] == 20
    assert dm[("vllm:generation_tokens_total", dlab)] == 7
    assert dm[("vllm:external_prefix_cache_hits_total", dlab)] == 20  # the KV came from prefill

    r = requests.post(f"{base}/v1/completions", timeout=30, stream=True, json={
        "model": "m", "prompt": "hello", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}})
    events = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert events[-1] == "data: [DONE]"


def test_release_proxy_gives_an_empty_200_when_decode_fails(servers):
    """vllm-ascend #13140, reproduced: the decode fails after the proxy has started its answer."""
    _, p_port, d_port = pd_pair(servers, FAKE_VLLM_FAULT="transfer-fail")
    port, _ = servers.proxy(
        "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(p_port),
        "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(d_port),
    )
    r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                      json={"model": "m", "prompt": "hello", "max_tokens": 3})
    assert r.status_code == 200 and r.content == b""
    dm = parse_metrics(requests.get(f"http://127.0.0.1:{d_port}/metrics", timeout=5).text)
    lab = frozenset({("engine", "0"), ("model_name", "m"), ("finished_reason", "error")})
    assert dm[("vllm:request_success_total", lab)] >= 1
