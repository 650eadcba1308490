"""The P/D smoke judgement (ascend_pd/shell/pd_smoke.py) on counters and answers, without processes:
each way a request can come back without both sides having served it."""

from __future__ import annotations

import json

import pytest

from ascend_pd.shell.pd_smoke import counters, judge

RANKS = {"prefill": ["http://p:1", "http://p:2"], "decode": ["http://d:1", "http://d:2"]}
ZERO = dict.fromkeys(("running", "waiting", "served", "failed", "prompt_tokens", "generation_tokens",
                      "external_hits"), 0.0)


def state(**changes: dict) -> dict:
    """Counters of every rank; `changes` maps 'p1'/'d2'... to what rose on that rank."""
    out = {u: dict(ZERO) for urls in RANKS.values() for u in urls}
    for key, rose in changes.items():
        out[f"http://{key[0]}:{key[1]}"].update(rose)
    return out


def chat(message: dict) -> bytes:
    return json.dumps({"choices": [{"message": message}]}).encode()


OK_BODY = chat({"role": "assistant", "content": "Hi there"})


def test_both_sides_served():
    ok, msg = judge(RANKS, state(), state(p2={"served": 1}, d1={"served": 1, "external_hits": 5}),
                    200, OK_BODY, 0.4, 10)
    assert ok and msg == "prefill http://p:2 and decode http://d:1 in 0.4s: 'Hi there'"


@pytest.mark.parametrize("message, ok", [
    ({"role": "assistant", "content": "Hi there"}, True),
    ({"role": "assistant", "content": None, "reasoning": "thinking about hello"}, True),
    ({"role": "assistant", "content": "", "reasoning_content": "old-style reasoning"}, True),
    ({"role": "assistant", "content": "", "reasoning": None}, False),
])
def test_text_from_content_or_reasoning(message, ok):
    after = state(p1={"served": 1}, d1={"served": 1, "external_hits": 5})
    good, msg = judge(RANKS, state(), after, 200, chat(message), 0.1, 10)
    assert good is ok, msg
    if not ok:
        assert msg.startswith("the completion has no text")


def test_decode_only_fallback():
    """Prefill served, but the decode computed the prompt itself: nothing was handed over."""
    ok, msg = judge(RANKS, state(), state(p1={"served": 1}, d2={"served": 1}), 200, OK_BODY, 0.1, 10)
    assert not ok
    assert msg == ("decode-only fallback 'Hi there': decode rank http://d:2 computed the prompt itself; no decode "
                   "rank received KV from prefill (vllm:external_prefix_cache_hits_total did not rise)")


def test_bypassed_prefill():
    ok, msg = judge(RANKS, state(), state(d1={"served": 2}), 200, OK_BODY, 0.1, 10)
    assert not ok and msg == "decode-only answer 'Hi there': no prefill rank of 2 served the request (prefill bypassed)"


def test_empty_200_names_the_failed_decode():
    ok, msg = judge(RANKS, state(), state(p1={"served": 1}, d2={"failed": 3}), 200, b"", 0.3, 10)
    assert not ok and msg == "HTTP 200 with an empty body: the decode side failed (decode rank http://d:2 failed the request)"
    ok, msg = judge(RANKS, state(), state(p1={"served": 1}), 200, b"", 0.3, 10)
    assert not ok and msg == "HTTP 200 with an empty body: the decode side failed (no decode rank finished it)"


def test_http_error_says_which_side():
    ok, msg = judge(RANKS, state(), state(), 500, b"Internal Server Error", 0.1, 10)
    assert not ok and msg == "HTTP 500 from the proxy (no prefill rank served it): 'Internal Server Error'"


def test_late_answer_fails_whatever_it_holds():
    after = state(p1={"served": 1}, d1={"served": 1, "external_hits": 5})
    ok, msg = judge(RANKS, state(), after, 200, OK_BODY, 12.5, 10)
    assert not ok and msg == "the answer took 12.5s, more than the 10s deadline"


def test_unreadable_metrics_leave_the_path_unproven():
    before = {u: None for u in RANKS["prefill"]} | {u: dict(ZERO) for u in RANKS["decode"]}
    after = state(d1={"served": 1, "external_hits": 5})
    ok, msg = judge(RANKS, before, after, 200, OK_BODY, 0.1, 10)
    assert not ok and "/metrics of no prefill rank was readable before and after" in msg
    # A restarted rank (counters back to 0) never counts as having served.
    ok, _ = judge(RANKS, state(p1={"served": 9}, d1={"external_hits": 9}), state(p1={"served": 1}), 200, OK_BODY, 0.1, 10)
    assert not ok


def test_counters_read_vllm_metric_names():
    text = "\n".join([
        '# TYPE vllm:num_requests_running gauge',
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
        'vllm:num_requests_waiting{engine="1",model_name="m"} NaN',
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0',
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0',
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 1.0',
        'vllm:request_success_total{engine="0",finished_reason="error",model_name="m"} 3.0',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 75.0',
        'vllm:external_prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9',
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0',
        'vllm:generation_tokens_total{engine="0",model_name="m"} 7.0',
    ])
    assert counters(text) == {"running": 2, "waiting": 1, "served": 7, "failed": 4, "prompt_tokens": 100,
                              "generation_tokens": 7, "external_hits": 75}
