"""Read the seed guides (shared/seeds) as data: their launch commands, templates and proxy lists.

The fidelity tests compare the plan against what the guides literally say, so a change to a stack
file or to the plan that drops a seed flag or env var fails a test instead of a cluster.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
A2_SEED = SEEDS / "000_0a22b36af722bebe.txt"
A3_SEED = SEEDS / "003_bf33d34a3622391c.txt"


@dataclass
class Template:
    env: dict[str, str]  # export NAME=VALUE lines before `vllm serve`
    argv: list[str]  # `vllm serve ...` tokens, positional $N left as written


@dataclass
class Launch:
    dp_size: int
    tp_size: int
    dp_size_local: int
    dp_rank_start: int
    dp_address: str
    dp_rpc_port: int
    vllm_start_port: int


def _template(block: str) -> Template:
    head, _, tail = block.partition("vllm serve ")
    env = {m.group(1): m.group(2).strip('"') for m in re.finditer(r"export (\w+)=(\S+)", head)}
    # A2 blocks are multi-line with `\` continuations; the A3 guide flattened them onto one line.
    tokens = shlex.split("vllm serve " + tail.replace("\\\n", " ").replace(" \\ ", " "))
    return Template(env=env, argv=tokens)


def templates(seed: Path) -> dict[str, Template]:
    """{"prefill": Template, "decode": Template} from a guide's run_dp_template.sh blocks."""
    text = seed.read_text()
    if seed == A2_SEED:
        p_start = text.index("P节点\n\nrun_dp_template.sh")
        p_end = text.index("server.sh：P节点")
        d_start = text.index("D节点\n\nrun_dp_template.sh")
        d_end = text.index("server.sh：D节点")
        blocks = {"prefill": text[p_start:p_end], "decode": text[d_start:d_end]}
    else:
        lines = text.splitlines()
        p = next(i for i, line in enumerate(lines) if line.startswith("创建 Prefill 启动脚本"))
        d = next(i for i, line in enumerate(lines) if line.startswith("创建 Decode 启动脚本"))
        blocks = {"prefill": lines[p + 2], "decode": lines[d + 2]}
    out = {}
    for role, block in blocks.items():
        # Keep only the vllm serve command itself: up to the closing quote of the last JSON argument.
        serve = block[block.index("vllm serve ") :]
        head = block[: block.index("vllm serve ")]
        end = max(serve.rfind("}'"), serve.rfind('}"'))
        tail_after = serve[end + 2 :]
        # The A2 decode block has one more flag (--additional-config '{...}') after the kv config.
        extra = re.match(r"\s*\\\s*(--[\w-]+\s+'[^']*')", tail_after)
        serve = serve[: end + 2] + (" " + extra.group(1) if extra else "")
        out[role] = _template(head + serve)
    return out


def launches(seed: Path) -> dict[str, list[Launch]]:
    """The per-node `python launch_online_dp.py ...` commands, by role, in node order."""
    text = seed.read_text()
    found = []
    for m in re.finditer(r"python launch_online_dp\.py ([^\n]+)", text):
        args = shlex.split(m.group(1).replace("${", "<").replace("}", ">"))
        kv = dict(zip(args[::2], args[1::2]))
        found.append(Launch(
            dp_size=int(kv["--dp-size"]), tp_size=int(kv["--tp-size"]),
            dp_size_local=int(kv["--dp-size-local"]), dp_rank_start=int(kv["--dp-rank-start"]),
            dp_address=kv["--dp-address"], dp_rpc_port=int(kv["--dp-rpc-port"]),
            vllm_start_port=int(kv["--vllm-start-port"]),
        ))
    half = len(found) // 2  # both guides list the prefill nodes first, then the decode nodes
    return {"prefill": found[:half], "decode": found[half:]}


def launch_online_dp(launch: Launch) -> list[dict]:
    """What vllm-ascend's examples/external_online_dp/launch_online_dp.py computes per local rank."""
    return [
        {
            "devices": tuple(range(i * launch.tp_size, (i + 1) * launch.tp_size)),
            "port": launch.vllm_start_port + i,
            "dp_size": launch.dp_size,
            "dp_rank": launch.dp_rank_start + i,
            "dp_address": launch.dp_address,
            "rpc_port": launch.dp_rpc_port,
            "tp": launch.tp_size,
        }
        for i in range(launch.dp_size_local)
    ]


def proxy_lists(seed: Path) -> dict[str, list[str]]:
    """The proxy.sh host/port lists, placeholders kept (`<P0_IP>` or `${P0_IP}` -> `P0_IP`)."""
    text = seed.read_text()
    start = text.index("load_balance_proxy_server_example.py \\")
    block = text[start : start + 3000]
    block = block[: block.index("&") if "&" in block else len(block)]
    tokens = shlex.split(block.replace("\\\n", " ").replace(" \\ ", " ").replace("${", "<").replace("}", ">"))
    out: dict[str, list[str]] = {}
    key = None
    for tok in tokens:
        tok = tok.strip("<>")
        if re.fullmatch(r"--[a-z-]+", tok):
            key = tok[2:]
            out[key] = []
        elif key and re.fullmatch(r"[A-Z0-9]+_IP|[0-9.]+", tok):
            out[key].append(tok)
        elif key:
            break  # end of the proxy command (redirect, prose)
    return out
