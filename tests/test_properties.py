"""Property tests over random valid topologies: the plan is consistent by construction."""

from __future__ import annotations

import json
import re
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_pd.config import HARDWARE_NPUS, StackConfig
from ascend_pd.plan import MOONCAKE_DIRECT_BASE, MOONCAKE_DIRECT_PER_DEVICE, build_plan
from ascend_pd.scripts import node_scripts


@st.composite
def role(draw, npus: int, max_tp: int):
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8, 16) if t <= min(npus, max_tp)]))
    local = draw(st.integers(1, npus // tp))
    per_instance = draw(st.integers(1, 3))
    instances = draw(st.integers(1, 3))
    return {"tp": tp, "dp": local * per_instance, "nodesPerInstance": per_instance, "instances": instances,
            "portBase": draw(st.integers(7000, 7900)), "rpcPort": draw(st.integers(12000, 12999))}


@st.composite
def topology(draw):
    hardware = draw(st.sampled_from(sorted(HARDWARE_NPUS)))
    npus = HARDWARE_NPUS[hardware]
    pre = draw(role(npus, 16))
    dec = draw(role(npus, pre["tp"]))  # Mooncake: prefill tp >= decode tp
    n_pre = pre["instances"] * pre["nodesPerInstance"]
    n_dec = dec["instances"] * dec["nodesPerInstance"]
    spare = draw(st.integers(0, 2))  # nodes with no ranks (worker only)
    names = [f"n{i}" for i in range(n_pre + n_dec + spare)]
    draw(st.randoms()).shuffle(names)
    nodes = [{"name": n, "address": f"192.0.2.{10 + i}", "nic": "eth0"} for i, n in enumerate(names)]
    # AscendDirect's range is inclusive at both ends: the first legal side channel is one above it.
    direct_top = MOONCAKE_DIRECT_BASE + MOONCAKE_DIRECT_PER_DEVICE * npus
    pre_kv = draw(st.integers(direct_top + 1, 50000))
    cfg = {
        "hardware": hardware,
        "nodes": nodes,
        "container": {"name": "c", "image": "img:v0.20.2rc1", "shmSize": "64g"},
        "ssh": {"insecureIgnoreHostKeys": True},
        "model": {"path": "/m", "servedName": "m"},
        "prefill": {k: v for k, v in pre.items() if k != "instances"} | {"nodes": names[:n_pre], "kvPort": pre_kv},
        "decode": {k: v for k, v in dec.items() if k != "instances"} | {"nodes": names[n_pre : n_pre + n_dec],
                                                                         "kvPort": draw(st.integers(51000, 55000))},
        "yuanrong": {"sharedMemoryMb": 1024},
        "etcd": {"node": draw(st.sampled_from(names))},
        "proxy": {"node": draw(st.sampled_from(names)), "port": 18020},
    }
    return StackConfig.model_validate(cfg), pre["instances"], dec["instances"]


@settings(max_examples=150, deadline=None)
@given(topology())
def test_plan_invariants(case):
    cfg, n_pre_instances, n_dec_instances = case
    plan = build_plan(cfg, "prop")
    npus = cfg.npus

    assert len(plan.instances_of("prefill")) == n_pre_instances
    assert len(plan.instances_of("decode")) == n_dec_instances

    devices_on: dict[str, list[int]] = defaultdict(list)
    ports_on: dict[str, list[int]] = defaultdict(list)
    for r in plan.ranks:
        devices_on[r.node] += r.devices
        ports_on[r.node].append(r.port)
        kv_port = getattr(cfg, r.role).kv_port
        ports_on[r.node] += [kv_port + r.dp_rank * r.tp + t for t in range(r.tp)]
        env = dict(r.env)
        assert env["ASCEND_RT_VISIBLE_DEVICES"] == r.visible_devices
        assert len(r.devices) == r.tp
        assert env["HCCL_IF_IP"] == r.address == plan.node(r.node).address
    for node, devs in devices_on.items():
        assert len(devs) == len(set(devs)), f"devices shared on {node}"
        assert all(0 <= d < npus for d in devs)
    for w in plan.workers:
        ports_on[w.node].append(cfg.yuanrong.port)
    ports_on[plan.etcd.node] += [plan.etcd.client_port, plan.etcd.peer_port]
    ports_on[plan.proxy.node].append(plan.proxy.port)
    for inst in plan.instances:
        ports_on[inst.nodes[0]].append(inst.ranks[0].rpc_port)
    direct = range(MOONCAKE_DIRECT_BASE, MOONCAKE_DIRECT_BASE + MOONCAKE_DIRECT_PER_DEVICE * npus + 1)
    for node, ports in ports_on.items():
        assert len(ports) == len(set(ports)), f"port collision on {node}: {sorted(ports)}"
        assert not any(p in direct for p in ports)

    # The proxy lists every rank, prefill then decode, in rank order.
    assert plan.proxy.prefillers == tuple((r.address, r.port) for r in plan.ranks_of("prefill"))
    assert plan.proxy.decoders == tuple((r.address, r.port) for r in plan.ranks_of("decode"))

    # Both sides' Mooncake blocks agree and describe one instance of each role.
    want = ({"dp_size": cfg.prefill.dp, "tp_size": cfg.prefill.tp}, {"dp_size": cfg.decode.dp, "tp_size": cfg.decode.tp})
    engine_ids = set()
    for r in plan.ranks:
        kvt = json.loads(r.kv_transfer_config)
        mooncake, store = kvt["kv_connector_extra_config"]["connectors"]
        extra = mooncake["kv_connector_extra_config"]
        assert (extra["prefill"], extra["decode"]) == want
        role_name = "kv_producer" if r.role == "prefill" else "kv_consumer"
        assert kvt["kv_role"] == mooncake["kv_role"] == store["kv_role"] == role_name
        assert "engine_id" not in mooncake and "engine_id" not in store
        if r.role == "prefill":
            engine_ids.add((kvt["engine_id"], r.instance))
        assert store["kv_connector_extra_config"]["backend"] == "yuanrong"
    assert len({e for e, _ in engine_ids}) == n_pre_instances

    # Every rank of an instance points at the same DP master; DP ranks 0..dp-1 exactly once.
    for inst in plan.instances:
        assert {r.dp_address for r in inst.ranks} == {plan.node(inst.nodes[0]).address}
        assert sorted(r.dp_rank for r in inst.ranks) == list(range(inst.dp))
        assert {r.dp_size for r in inst.ranks} == {inst.dp}

    # Every node gets a worker script; a node with ranks gets one launch, for exactly its ranks.
    for node in plan.nodes:
        node_s = node_scripts(plan, node.name)
        names = [s.name for s in node_s]
        assert "worker" in names
        instances = [i for i in plan.instances if node.name in i.nodes]
        assert len(instances) <= 1
        assert names.count("launch") == len(instances)
        if instances:
            launch = next(s for s in node_s if s.name == "launch")
            started = set(re.findall(r"started [^ ]*/([a-z]+-[0-9]+-r[0-9]+)\.pid", launch.create))
            assert started == {r.name for r in instances[0].ranks_on(node.name)}
