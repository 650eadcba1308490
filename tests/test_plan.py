"""The plan against the seed guides: rank layout, proxy lists, every flag and env var of each role.

What the guides say is repository data (tests/seed_facts, read by seed_reader), never the guides
themselves: a plain clone runs these tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ascend_pd.__main__ import main
from ascend_pd.loader import load_stack
from ascend_pd.plan import UNSET_ENV, build_plan
from ascend_pd.scripts import launch, node_scripts
from seed_reader import corrected, launch_online_dp, launches, proxy_lists, templates, worker_flags

STACKS = ("a2-8node", "a3-4node")


def plan_of(stack):
    return build_plan(load_stack(stack), stack)


def placeholder_addresses(plan) -> dict[str, str]:
    """The seeds' P0_IP/D1_IP placeholders are our nodes p0/d1."""
    return {f"{n.name.upper()}_IP": n.address for n in plan.nodes}


@pytest.mark.parametrize("stack", STACKS)
def test_rank_counts(stack):
    plan = plan_of(stack)
    expected = {"a2-8node": (8, 32, 5), "a3-4node": (2, 2, 2)}[stack]
    assert (len(plan.ranks_of("prefill")), len(plan.ranks_of("decode")), len(plan.instances)) == expected


@pytest.mark.parametrize("stack", STACKS)
def test_rank_layout_equals_launch_online_dp(stack):
    """Devices, ports, DP ranks and sizes per node are what launch_online_dp.py computes for the
    seed's own per-node arguments; the DP address is the instance's first node."""
    plan = plan_of(stack)
    ips = placeholder_addresses(plan)
    seed = launches(stack)
    seed_dp_address_bugs = []
    for role in ("prefill", "decode"):
        nodes = getattr(plan.cfg, role).nodes
        assert len(seed[role]) == len(nodes)
        for node, seed_launch in zip(nodes, seed[role]):
            expected = launch_online_dp(seed_launch)
            inst = next(i for i in plan.instances_of(role) if node in i.nodes)
            got = inst.ranks_on(node)
            assert [(r.devices, r.port, r.dp_size, r.dp_rank, r.rpc_port, r.tp) for r in got] == [
                (e["devices"], e["port"], e["dp_size"], e["dp_rank"], e["rpc_port"], e["tp"]) for e in expected
            ]
            first = plan.node(inst.nodes[0]).address
            assert all(r.dp_address == first for r in got)
            if ips[seed_launch.dp_address] != first:
                seed_dp_address_bugs.append((role, node))
    # The A2 guide gives each decode node its own address as --dp-address; a DP32 group over 4 nodes
    # has one master (the A3 guide's FAQ says so too). Only those three lines differ.
    assert seed_dp_address_bugs == ([("decode", "d1"), ("decode", "d2"), ("decode", "d3")] if stack == "a2-8node" else [])


@pytest.mark.parametrize("stack", STACKS)
def test_proxy_lists_equal_the_seed(stack):
    plan = plan_of(stack)
    ips = placeholder_addresses(plan)
    seed = proxy_lists(stack)
    assert [h for h, _ in plan.proxy.prefillers] == [ips[h] for h in seed["prefiller-hosts"]]
    assert [p for _, p in plan.proxy.prefillers] == seed["prefiller-ports"]
    assert [h for h, _ in plan.proxy.decoders] == [ips[h] for h in seed["decoder-hosts"]]
    assert [p for _, p in plan.proxy.decoders] == seed["decoder-ports"]
    assert plan.proxy.port == seed["port"]
    # The seeds bind <D0_IP> (not on that node) or 0.0.0.0; the plan binds the proxy node's address.
    argv = list(plan.proxy.argv)
    assert argv[argv.index("--host") + 1] == plan.node(plan.cfg.proxy.node).address
    # Everything the proxy lists is a rank, in rank order.
    assert plan.proxy.prefillers + plan.proxy.decoders == tuple((r.address, r.port) for r in plan.ranks)



@pytest.mark.parametrize("stack", STACKS)
def test_proxy_runs_the_release_script_through_the_launcher_unless_turned_off(stack):
    cfg = load_stack(stack)
    plan = build_plan(cfg, stack)
    launcher = f"{plan.run_dir}/pd_proxy_launch.py"
    admins = ",".join([n.address for n in plan.nodes] + ["127.0.0.1"])
    # proxy.auth (default): the key from a file the program writes (never argv), the admin routes for
    # the cluster's nodes; keepRemovedOut (default): the fixes.
    assert plan.proxy.argv[:7] == (cfg.proxy.python, launcher, "--api-key-file",
                                   f"{plan.run_dir}/secrets/proxy-api-key", "--admin-from", admins, cfg.proxy.script)
    proxy = next(s for s in node_scripts(plan, plan.proxy.node) if s.name == "proxy")
    assert 'cat >"$run_dir/pd_proxy_launch.py" <<' in proxy.create  # written before it starts

    def variant(**proxy_settings):
        changed = cfg.model_copy(update={"proxy": cfg.proxy.model_copy(update=proxy_settings)})
        p = build_plan(changed, stack)
        return p, next(s for s in node_scripts(p, p.proxy.node) if s.name == "proxy")

    as_shipped, as_shipped_script = variant(keep_removed_out=False)  # the access rules, not the fixes
    assert as_shipped.proxy.argv[:8] == plan.proxy.argv[:6] + ("--as-shipped", cfg.proxy.script)
    open_plan, open_script = variant(auth=False)
    assert open_plan.proxy.argv[:3] == (cfg.proxy.python, launcher, cfg.proxy.script)
    neither, neither_script = variant(auth=False, keep_removed_out=False)
    assert neither.proxy.argv[:2] == (cfg.proxy.python, cfg.proxy.script)
    assert neither.proxy.argv[2:] == plan.proxy.argv[7:]
    assert "pd_proxy_launch" not in neither_script.create
    # Switching any of them restarts the proxy: the running process's identity differs.
    specs = {dict(s.processes)["proxy"] for s in (proxy, as_shipped_script, open_script, neither_script)}
    assert len(specs) == 4


def _flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 3  # vllm serve MODEL
    while i < len(argv):
        tok = argv[i]
        assert tok.startswith("--"), (tok, argv)
        if "=" in tok:
            key, _, value = tok.partition("=")
            out[key] = value
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[tok] = argv[i + 1]
            i += 2
        else:
            out[tok] = None
            i += 1
    return out


def _same(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except (ValueError, TypeError):
        return a == b


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_every_seed_flag_is_rendered(stack, role):
    plan = plan_of(stack)
    seed = corrected(stack, role, templates(stack)[role])  # what the release reads (seed_facts/release_corrections.json)
    assert seed.model.rstrip("/") == plan.cfg.model.path.rstrip("/")
    seed_flags = seed.flags
    for rank in plan.ranks_of(role):
        flags = _flags(list(rank.argv))
        assert rank.argv[:3] == ("vllm", "serve", plan.cfg.model.path)
        for flag, value in seed_flags.items():
            assert flag in flags, f"{flag} from the seed's {role} template is not rendered"
            if value is None or (isinstance(value, str) and value.startswith("$")):
                continue  # bare flag, or a positional filled by launch_online_dp ($2..$7)
            if flag == "--host":
                assert flags[flag] == rank.address  # seed: <IP_ADDRESS> / 0.0.0.0
            elif flag == "--kv-transfer-config":
                # A copy with the template's "$4" (decode lookup_rpc_port) filled as the shell would.
                expected = json.loads(json.dumps(value).replace('"$4"', f'"{rank.dp_rank}"'))
                mooncake = expected["kv_connector_extra_config"]["connectors"][0]
                # A3: the seed's kv_port lies inside the AscendDirect range; the stack moved it.
                mooncake["kv_port"] = str(getattr(plan.cfg, role).kv_port)
                if role == "prefill":
                    expected["engine_id"] = str(rank.instance)  # unique per prefill instance
                assert json.loads(flags[flag]) == expected
            elif isinstance(value, dict):  # a JSON-valued flag
                assert json.loads(flags[flag]) == value, (flag, flags[flag], value)
            else:
                assert _same(flags[flag], value), (flag, flags[flag], value)
        # Nothing beyond the seed but the derived DP flags the template passes positionally.
        assert set(flags) - set(seed_flags) == set()


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_every_seed_env_var_is_set(stack, role):
    plan = plan_of(stack)
    seed = corrected(stack, role, templates(stack)[role])
    derived = {
        "$local_ip": lambda r, n: n.address,
        "$nic_name": lambda r, n: n.nic,
        "$1": lambda r, n: r.visible_devices,
        "${local_ip}:18481": lambda r, n: f"{n.address}:18481",
    }
    for rank in plan.ranks_of(role):
        env = dict(rank.env)
        node = plan.node(rank.node)
        for name, value in seed.env.items():
            assert name in env, f"{name} from the seed's {role} template is missing"
            want = derived[value](rank, node) if value in derived else value
            assert env[name] == want, (name, env[name], want)
        # What the A3 guide and the A2 FAQ require but the A2 template lacks: always derived.
        assert env["PYTHONHASHSEED"] == "0"
        assert env["DS_WORKER_ADDR"] == f"{node.address}:{plan.cfg.yuanrong.port}"
        assert set(env) - set(seed.env) <= {"PYTHONHASHSEED", "DS_WORKER_ADDR", "VLLM_ENGINE_READY_TIMEOUT_S"}
        # vLLM's own engine-ready deadline is the launch's (seed 000's FAQ sets 3600 by hand).
        assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == str(plan.cfg.vllm.ready_timeout_s)


@pytest.mark.parametrize("stack", STACKS)
def test_launch_script_unsets_proxies_and_quotes_every_rank(stack):
    plan = plan_of(stack)
    for inst in plan.instances:
        for node in inst.nodes:
            text = launch(plan, inst, node).create
            for var in UNSET_ENV:
                assert f"-u {var}" in text
            for r in inst.ranks_on(node):
                assert f"--data-parallel-rank {r.dp_rank} \\" in text
                assert f"ASCEND_RT_VISIBLE_DEVICES=\"{r.visible_devices}\"" in text


@pytest.mark.parametrize("stack", STACKS)
def test_worker_flags_equal_the_seed(stack):
    plan = plan_of(stack)
    seed = worker_flags(stack)  # A2: the huge-page appendix's complete run_yr_worker.sh
    for w in plan.workers:
        argv = list(w.argv)
        w_at = argv.index("-w")
        got = {argv[i]: argv[i + 1] for i in range(w_at + 1, len(argv), 2)}
        got.update({f"pre:{argv[i]}": argv[i + 1] for i in range(2, w_at, 2)})
        node = plan.node(w.node)
        for flag, value in seed.items():
            if flag == "pre:-t" and "pre:-t" not in seed:
                continue
            assert flag in got, f"{flag} from the seed is missing"
            if flag == "--worker_address":
                assert got[flag] == f"{node.address}:18481"
            elif flag == "--etcd_address":
                assert got[flag] == plan.etcd.endpoint
            else:
                assert got[flag] == value, (flag, got[flag], value)
        # -t bounds dscli's own wait even where the guide omits it (A3); nothing else is added.
        assert set(got) - set(seed) <= {"pre:-t"}


def test_render_prints_every_rank(capsys, tmp_path):
    assert main(["render", "--stack", "a2-8node", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"(prefill|decode)\s", line)]
    assert len(rows) == 40
    assert sum(r.startswith("prefill") for r in rows) == 8
    plan = plan_of("a2-8node")
    for node in plan.nodes:
        files = sorted(p.name for p in (tmp_path / node.name).iterdir())
        assert len(files) == 2 * len(node_scripts(plan, node.name))
    assert main(["render", "--stack", "a3-4node"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"(prefill|decode)\s", line)]
    assert len(rows) == 4


def test_render_unknown_stack_names_the_choices(capsys):
    assert main(["render", "--stack", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Pulumi.nope.yaml" in err and "a2-8node" in err


def test_tests_do_not_read_the_guides():
    """A plain clone has nothing beside the repository: no test may reach for the seed guides."""
    tests = Path(__file__).resolve().parent
    # Spelled in pieces so this file does not match itself.
    needles = ("../" + "shared", "shared" + "/seeds", "shared" + '" / "' + "seeds")
    offenders = [
        f"{path.relative_to(tests)}: {needle}"
        for path in sorted(tests.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
        for needle in needles
        if needle in path.read_bytes().decode("utf-8", "replace")
    ]
    assert offenders == []
