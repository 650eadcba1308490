"""Every invalid configuration is refused before anything exists, with a message naming the setting."""

from __future__ import annotations

import copy
import json

import pytest

from ascend_pd.errors import ConfigError
from ascend_pd.loader import cli_config_map, load_config
from ascend_pd.plan import DERIVED_ENV, DERIVED_FLAGS, build_plan


def raw(stack="a3-4node") -> dict:
    return {k: json.loads(v) if v[:1] in "[{" else v for k, v in cli_config_map(stack).items()}


def refuse(data: dict) -> str:
    flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}
    with pytest.raises(ConfigError) as err:
        build_plan(load_config(flat), "test")
    return str(err.value)


def test_committed_stacks_are_valid():
    for stack in ("a2-8node", "a3-4node"):
        flat = cli_config_map(stack)
        assert build_plan(load_config(flat), stack).ranks


def mutate(fn, stack="a3-4node"):
    data = copy.deepcopy(raw(stack))
    fn(data)
    return data


CASES = {
    "local dp x tp exceeds NPUs": (
        lambda d: d["prefill"].update(dp=4), "ascend-pd:prefill.tp", "32 NPUs"),
    "dp not divisible by nodes per instance": (
        lambda d: d["decode"].update(dp=3), "ascend-pd:decode.dp", "not divisible"),
    "node listed twice in a role": (
        lambda d: d["decode"].update(nodes=["d0", "d0"]), "ascend-pd:decode.nodes[1]", "already assigned"),
    "node in both roles": (
        lambda d: d["decode"].update(nodes=["p1", "d1"]), "ascend-pd:decode.nodes[0]", "already assigned to prefill"),
    "duplicate address": (
        lambda d: d["nodes"][3].update(address=d["nodes"][0]["address"]), "ascend-pd:nodes[3].address", "used twice"),
    "duplicate name": (
        lambda d: d["nodes"][3].update(name="p0"), "ascend-pd:nodes[3].name", "used twice"),
    "node named like render's Prometheus directory": (
        lambda d: d["nodes"][3].update(name="monitoring"), "ascend-pd:nodes[3].name", "Prometheus directory"),
    "unknown node in a role": (
        lambda d: d["prefill"].update(nodes=["p0", "p9"]), "ascend-pd:prefill.nodes[1]", "unknown node 'p9'"),
    "unknown etcd node": (
        lambda d: d["etcd"].update(node="x"), "ascend-pd:etcd.node", "unknown node 'x'"),
    "etcd version with an image": (
        lambda d: d["etcd"].update(image="quay.io/coreos/etcd:v3.5.12", version="v3.5.17"),
        "ascend-pd:etcd.version", "the image (quay.io/coreos/etcd:v3.5.12) fixes the version"),
    "etcd container named like the NPU container": (
        lambda d: d["etcd"].update(image="quay.io/coreos/etcd:v3.5.12", containerName=d["container"]["name"]),
        "ascend-pd:etcd.containerName", "also the NPU container's name"),
    "etcd container name without an image": (
        lambda d: d["etcd"].update(containerName="my-etcd"), "ascend-pd:etcd.containerName", "only used with etcd.image"),
    "unknown proxy node": (
        lambda d: d["proxy"].update(node="x"), "ascend-pd:proxy.node", "unknown node 'x'"),
    "prefill kv_port inside AscendDirect range": (
        lambda d: d["prefill"].update(kvPort=30000), "ascend-pd:prefill.kvPort", "kvPort >= 36001"),
    "prefill side channel runs into AscendDirect range from below": (
        lambda d: d["prefill"].update(kvPort=19990), "ascend-pd:prefill.kvPort", "AscendDirect"),
    "prefill and decode kv_port equal": (
        lambda d: d["decode"].update(kvPort=36100), "ascend-pd:decode.kvPort", "both use kv_port 36100"),
    "proxy on etcd's port": (
        lambda d: d["proxy"].update(port=2379), "ascend-pd:proxy.port", "port 2379 on node p0"),
    "worker on a rank port": (
        lambda d: d["yuanrong"].update(port=6700), "port 6700", "also used by"),
    "fixed port inside AscendDirect range": (
        lambda d: d["yuanrong"].update(port=25000), "port 25000", "AscendDirect"),
    "prefill tp below decode tp": (
        lambda d: (d["prefill"].update(tp=8), d["decode"].update(tp=16)), "ascend-pd:prefill.tp", "prefill tp >= decode tp"),
    "dead timeout not above node timeout": (
        lambda d: d["yuanrong"].update(nodeDeadTimeoutS=20), "ascend-pd:yuanrong.nodeDeadTimeoutS", "must exceed"),
    "huge TLB without enough huge pages": (
        lambda d: d["hugepages"].update(gib=100), "ascend-pd:yuanrong.hugeTlb", "ascend-pd:hugepages.gib"),
    "huge TLB without huge pages at all": (
        lambda d: d.pop("hugepages"), "ascend-pd:yuanrong.hugeTlb", "gives 0 MiB"),
    "container shm smaller than worker shared memory": (
        lambda d: d["container"].update(shmSize="100g"), "ascend-pd:container.shmSize", "at least 500g"),
    "unknown top-level key": (
        lambda d: d.update(prefil={"dp": 1}), "ascend-pd:prefil", "unknown setting"),
    "unknown nested key": (
        lambda d: d["prefill"].update(tpp=1), "ascend-pd:prefill.tpp", "unknown setting"),
    "wrong type": (
        lambda d: d["prefill"].update(tp="four"), "ascend-pd:prefill.tp", "'four'"),
    "missing required setting": (
        lambda d: d.pop("model"), "ascend-pd:model", "required setting is missing"),
    "dashes in a flag name": (
        lambda d: d["decode"]["flags"].update({"--max-num-seqs": 8}), "ascend-pd:decode.flags.--max-num-seqs", "without leading dashes"),
    "rh2d device that does not exist": (
        lambda d: d["yuanrong"].update(rh2dDeviceIds=[0, 16]), "ascend-pd:yuanrong.rh2dDeviceIds[1]", "0..15"),
    "derived proxy flag": (
        lambda d: d["proxy"].update(flags={"prefiller-hosts": 1}), "ascend-pd:proxy.flags.prefiller-hosts", "derived"),
    "not an address": (
        lambda d: d["nodes"][0].update(address="node-a"), "ascend-pd:nodes[0].address", "IPv4"),
    "bad shm size": (
        lambda d: d["container"].update(shmSize="lots"), "ascend-pd:container.shmSize", "docker size"),
    "two preparation steps with one identity": (
        lambda d: d["container"]["prepare"].append({"pip": ["transformers==5.3.0"]}),
        "ascend-pd:container.prepare[4]", "'pip-transformers'"),
    "state dir too long for the worker's sockets": (
        lambda d: d.update(stateDir="/workspace/" + "x" * 60), "ascend-pd:stateDir", "at most 60 characters"),
    "misspelt setting": (
        lambda d: d["prefill"].update(tpp=1), "ascend-pd:prefill.tpp", "did you mean 'prefill.tp'?"),
    "misspelt vLLM flag": (
        lambda d: d["decode"]["flags"].update({"max_num_seq": 8}), "ascend-pd:decode.flags.max_num_seq",
        "did you mean 'max-num-seqs'?"),
    "a number in quotes": (
        lambda d: d["proxy"].update(port="8088"), "ascend-pd:proxy.port", "write the number without quotes"),
    "maxUnavailable zero": (
        lambda d: d.update(rollout={"maxUnavailable": 0}), "ascend-pd:rollout.maxUnavailable", "between 1 and 1024"),
    "maxUnavailable percentage over 100": (
        lambda d: d.update(rollout={"maxUnavailable": "150%"}), "ascend-pd:rollout.maxUnavailable",
        "a percentage of the role's instances like '25%'"),
    "maxUnavailable a number in quotes": (
        lambda d: d.update(rollout={"maxUnavailable": "2"}), "ascend-pd:rollout.maxUnavailable",
        "neither a number of instances"),
    "command substitution in env": (
        lambda d: d["vllm"]["env"].update(X="$(id)"), "ascend-pd:vllm.env.X", "command substitution"),
}


@pytest.mark.parametrize("case", CASES)
def test_refused_with_setting_named(case):
    fn, setting, words = CASES[case]
    message = refuse(mutate(fn))
    line = next((ln for ln in message.splitlines() if setting in ln), None)
    assert line is not None, message
    assert words in line, line
    assert "Fix:" in line
    assert "pydantic" not in message and "errors.pydantic.dev" not in message


@pytest.mark.parametrize("flag", sorted(DERIVED_FLAGS))
@pytest.mark.parametrize("where", ["prefill", "decode", "vllm"])
def test_derived_flags_refused_in_tuning_maps(flag, where):
    message = refuse(mutate(lambda d: d.setdefault(where, {}).setdefault("flags", {}).update({flag: "1"})))
    assert f"ascend-pd:{where}.flags.{flag}" in message
    assert f"--{flag} is derived" in message


@pytest.mark.parametrize("var", sorted(DERIVED_ENV))
def test_derived_env_refused(var):
    message = refuse(mutate(lambda d: d["decode"].setdefault("env", {}).update({var: "1"})))
    assert f"ascend-pd:decode.env.{var}" in message


def test_every_problem_is_reported_at_once():
    def many(d):
        d["yuanrong"].update(nodeDeadTimeoutS=1)
        d["decode"].update(kvPort=36000)
        d["prefill"]["flags"].update(port=1)

    message = refuse(mutate(many))
    assert "3 problem(s)" in message
    for setting in ("yuanrong.nodeDeadTimeoutS", "decode.kvPort", "prefill.flags.port"):
        assert f"ascend-pd:{setting}" in message


def test_a2_limits_are_per_profile():
    # DP2/TP4 fills an A2 node exactly; one more local rank does not fit 8 NPUs.
    message = refuse(mutate(lambda d: d["prefill"].update(dp=3), "a2-8node"))
    assert "ascend-pd:prefill.tp" in message and "atlas-800i-a2 has 8 per node" in message
    # On A2 the AscendDirect range ends at 28000 inclusive (device 7 draws from 27000-28000): 28001
    # is the first legal kvPort.
    message = refuse(mutate(lambda d: d["prefill"].update(kvPort=27990), "a2-8node"))
    assert "use a kvPort >= 28001" in message
    message = refuse(mutate(lambda d: d["prefill"].update(kvPort=28000), "a2-8node"))
    assert "20000-28000 (both ends inclusive)" in message
    flat = {k: v if isinstance(v, str) else json.dumps(v)
            for k, v in mutate(lambda d: d["prefill"].update(kvPort=28001), "a2-8node").items()}
    assert build_plan(load_config(flat), "x").ranks


def test_an_unknown_flag_allowed_on_purpose_is_passed():
    data = mutate(lambda d: d["vllm"].update(allowUnknownFlags=["my-plugin-flag"]) or
                  d["vllm"]["flags"].update({"my-plugin-flag": 1}))
    plan = build_plan(load_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}), "x")
    assert all("--my-plugin-flag" in r.argv for r in plan.ranks)


def test_problems_of_the_clis_flat_map_name_no_file():
    message = refuse(mutate(lambda d: d["proxy"].update(port="8088")))
    assert "  - ascend-pd:proxy.port: is the text '8088', not a number. Fix: write the number without quotes." in message
    assert "Pulumi." not in message


def test_secret_key_is_not_a_setting_error():
    flat = cli_config_map("a3-4node")
    flat["sshPrivateKey"] = "-----BEGIN OPENSSH PRIVATE KEY-----"
    assert build_plan(load_config(flat), "x").ranks
