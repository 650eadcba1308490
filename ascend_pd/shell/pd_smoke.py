"""A smoke completion that proves the P/D path, not only that something answered.

    pd_smoke.py URL MODEL TIMEOUT_S RANKS_JSON MAX_TOKENS [KEY_FILE]     (RANKS_JSON: {"prefill": [url], "decode": [url]})

KEY_FILE: the proxy's key (ascend-pd:proxy.auth), sent as `Authorization: Bearer`; empty or absent: none.

Reads `/metrics` of every rank, sends one chat completion through the proxy at URL, reads `/metrics`
again, and passes only when (1) the answer has text, (2) a prefill rank finished a request and a
decode rank's `vllm:external_prefix_cache_hits_total` (KV received through the connector) rose
meanwhile, and (3) all of it took at most TIMEOUT_S. Otherwise it says which side did not take part:
a decode-only fallback (the proxy's prefill hand-over gave the decode nothing to load), an HTTP 200
with an empty body (the proxy's answer when its decoder failed), a failed decode, a bypassed prefill.
Prints one line (stdout when it passes, stderr when not) and exits 0 or 1. Standard library only: it
runs inside the container (`python -c`), and `ascend_pd.status` imports `judge` from it.

Other traffic moves the counters too; it can make the check pass only when that traffic itself went
through prefill and decode, which proves the same path.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SERVED = ("stop", "length")  # finished reasons of a request a rank completed
FAILED = ("abort", "error")
_LINE = re.compile(r'^(vllm:[a-z_]+)(\{[^}]*\})?\s+(\S+)')
_REASON = re.compile(r'finished_reason="([a-z]+)"')


def counters(text: str) -> dict:
    """The request counters of one rank's /metrics text, summed over label sets (engine, model)."""
    c = dict.fromkeys(("running", "waiting", "served", "failed", "prompt_tokens", "generation_tokens",
                       "external_hits"), 0.0)
    names = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
             "vllm:prompt_tokens_total": "prompt_tokens", "vllm:generation_tokens_total": "generation_tokens",
             "vllm:external_prefix_cache_hits_total": "external_hits"}
    for line in text.split("\n"):
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        name = m.group(1)
        if name == "vllm:request_success_total":
            reason = _REASON.search(m.group(2) or "")
            key = "served" if reason is None or reason.group(1) in SERVED else "failed"
            c[key] += value
        elif name in names:
            c[names[name]] += value
    return c


def _rose(before: dict, after: dict, key: str) -> list:
    """URLs whose counter `key` went up (a rank that restarted in between starts from zero)."""
    out = []
    for url, b in before.items():
        a = after.get(url)
        if a is not None and b is not None and a[key] > b[key]:
            out.append(url)
    return out


def judge(ranks: dict, before: dict, after: dict, status: int, body: bytes, latency: float, timeout_s: float):
    """(ok, message). `ranks` is {"prefill": [url], "decode": [url]}; `before`/`after` map a rank URL
    to its `counters()` or None (unreadable); `status`/`body` are the proxy's answer."""
    seen = {role: [u for u in urls if before.get(u) is not None and after.get(u) is not None]
            for role, urls in ranks.items()}
    prefill_in = {u: before[u] for u in seen["prefill"]}
    decode_in = {u: before[u] for u in seen["decode"]}
    served_p = _rose(prefill_in, after, "served")
    failed_d = _rose(decode_in, after, "failed")
    kv_d = _rose(decode_in, after, "external_hits")
    served_d = _rose(decode_in, after, "served")
    if latency > timeout_s:
        return False, f"the answer took {latency:.1f}s, more than the {timeout_s:g}s deadline"
    decode_failed = f"decode rank {failed_d[0]} failed the request" if failed_d else ""
    if status != 200:
        side = decode_failed or ("prefill took part" if served_p else "no prefill rank served it")
        return False, f"HTTP {status} from the proxy ({side}): {body[:120].decode(errors='replace')!r}"
    text = ""
    try:
        msg = json.loads(body)["choices"][0]["message"]
        # Reasoning models may answer only in `reasoning` (vLLM >= 0.17) or `reasoning_content` (older).
        text = " ".join(str(msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or "").split())
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        if body.strip():
            return False, f"no chat completion in the answer: {body[:120].decode(errors='replace')!r}"
    if not body.strip():
        side = decode_failed or "no decode rank finished it"
        return False, f"HTTP 200 with an empty body: the decode side failed ({side})"
    if not text:
        return False, f"the completion has no text: {body[:120].decode(errors='replace')!r}"
    for role in ("prefill", "decode"):
        if not seen[role]:
            return False, (f"'{text[:40]}', but /metrics of no {role} rank was readable before and after: "
                           f"the P/D path is unproven")
    if not served_p:
        return False, (f"decode-only answer '{text[:40]}': no prefill rank of {len(seen['prefill'])} served the "
                       f"request (prefill bypassed)")
    if not kv_d:
        who = f"decode rank {served_d[0]}" if served_d else "a decode rank"
        return False, (f"decode-only fallback '{text[:40]}': {who} computed the prompt itself; no decode rank "
                       f"received KV from prefill (vllm:external_prefix_cache_hits_total did not rise)")
    return True, f"prefill {served_p[0]} and decode {kv_d[0]} in {latency:.1f}s: '{text[:60]}'"


def _metrics(url: str, timeout: float):
    try:
        with _DIRECT.open(url + "/metrics", timeout=timeout) as resp:
            return counters(resp.read(8 * 1024 * 1024).decode("utf-8", "replace"))
    except Exception:  # noqa: BLE001 - an unreadable rank is judged as such
        return None


def _all_metrics(ranks: dict, timeout: float) -> dict:
    urls = [u for urls in ranks.values() for u in urls]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(urls)))) as pool:
        return dict(zip(urls, pool.map(lambda u: _metrics(u, timeout), urls)))


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via http_proxy


def main(url: str, model: str, timeout_s: str, ranks_json: str, max_tokens: str = "16", key_file: str = "") -> int:
    timeout, ranks = float(timeout_s), json.loads(ranks_json)
    headers = {"Content-Type": "application/json"}
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as f:
                headers["Authorization"] = "Bearer " + f.read().strip()
        except OSError as exc:
            print(f"smoke completion failed via {url}: cannot read the proxy's key {key_file} ({exc.strerror})",
                  file=sys.stderr)
            return 1
    started = time.monotonic()
    phase = min(5.0, timeout / 4)  # each /metrics round; the completion gets the rest
    before = _all_metrics(ranks, phase)
    req = urllib.request.Request(url + "/v1/chat/completions", headers=headers,
                                 data=json.dumps({
                                     "model": model, "messages": [{"role": "user", "content": "hello"}],
                                     "max_tokens": int(max_tokens), "temperature": 0, "stream": False,
                                     "chat_template_kwargs": {"enable_thinking": False}}).encode())
    t0 = time.monotonic()
    try:
        with _DIRECT.open(req, timeout=max(1.0, timeout - (t0 - started) - phase)) as resp:
            status, body = resp.status, resp.read(1024 * 1024)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(1024 * 1024)
    except Exception as exc:  # noqa: BLE001 - the operator sees the reason
        slow = isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)
        why = f"no answer within {timeout:g}s" if slow else repr(exc)
        print(f"smoke completion failed via {url}: {why}"[:300], file=sys.stderr)
        return 1
    latency = time.monotonic() - t0
    after = _all_metrics(ranks, max(0.5, min(phase, timeout - (time.monotonic() - started))))
    ok, message = judge(ranks, before, after, status, body, latency, timeout)
    print(f"smoke completion {'ok' if ok else 'failed'} via {url}: {message}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
