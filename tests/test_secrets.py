"""Secrets stay secret (ascend_pd/secrets.py): a value set with `pulumi config set --secret` reaches no
script, argv, state in clear or diff; the proxy answers clients only with its key and changes only for
the cluster's nodes. Under the SDK's mocks (the program as `pulumi up` runs it: the CLI hands the
program decrypted values, the stack file says which were secure) and against the release proxies
through the launcher."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from proxy_key import AUTH, TEST_PROXY_KEY
from proxy_release import RELEASES, script_path
from pulumi_harness import COMMAND, PROJECT, plain, run_program, stack_config, unwrap
from pulumi.runtime.rpc import is_rpc_secret

from ascend_pd.__main__ import main as cli
from ascend_pd.engine.model import REPLACE, UPDATE, plan_up
from ascend_pd.errors import ConfigError
from ascend_pd.loader import PROJECT_DIR, cli_config_map, load_config, open_stack
from ascend_pd.plan import build_plan
from ascend_pd.scripts import launch
from ascend_pd.secrets import placeholder

STACK = "a2-8node"
PLANTED = "hf_plantedSecretValue0123456789"  # what an operator sets with --secret
CIPHERTEXT = "v1:MDEyMzQ1Njc4OWFiY2RlZg==:planted"


def stack_dir(tmp_path: Path, edit) -> Path:
    """The committed stack, edited as its YAML document (secure leaves and all), in a project of its own."""
    doc = yaml.safe_load((PROJECT_DIR / f"Pulumi.{STACK}.yaml").read_text())
    edit(doc["config"])
    (tmp_path / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    return tmp_path


def plant(config: dict, section: str = "ascend-pd:vllm", ciphertext: str = CIPHERTEXT) -> None:
    """`pulumi config set --secret --path '<section>.env.HF_TOKEN' ...`: a secure leaf in the file."""
    config.setdefault(section, {}).setdefault("env", {})["HF_TOKEN"] = {"secure": ciphertext}


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as err:
        open_stack(STACK, path).build_plan()
    return [str(p) for p in err.value.problems]


def test_a_secret_rank_variable_reaches_no_command_line(tmp_path):
    plan = open_stack(STACK, stack_dir(tmp_path, plant)).build_plan()
    for r in plan.ranks:
        assert r.secret_env == ("HF_TOKEN",)
        assert "HF_TOKEN" not in dict(r.env)
        assert not any("secret:" in a for a in r.argv)
    text = launch(plan, plan.instance_on("d0"), "d0").create
    assert "HF_TOKEN=" not in text and placeholder(CIPHERTEXT) not in text
    assert f"secrets_file={plan.run_dir}/secrets/decode.env" in text and '. "$secrets_file"' in text


@pytest.mark.parametrize("where, says", [
    ("whole", "is encrypted as a whole"),
    ("flag", "a flag is on every rank's command line"),
    ("container", "`docker inspect`"),
])
def test_a_secret_where_it_would_leak_is_refused_with_where_to_put_it(tmp_path, where, says):
    def edit(config):
        if where == "whole":
            config["ascend-pd:vllm"] = {"secure": CIPHERTEXT}
        elif where == "flag":
            config["ascend-pd:prefill"]["flags"]["api-key"] = {"secure": CIPHERTEXT}
        else:
            config["ascend-pd:container"]["env"] = {"https_proxy": {"secure": CIPHERTEXT}}

    found = problems_of(stack_dir(tmp_path, edit))
    assert len(found) == 1 and says in found[0], found
    assert "Fix:" in found[0] and "secret" in found[0]


def _cli_config(path: Path) -> dict[str, str]:
    """What the Pulumi CLI hands the program for the stack at `path`: every value decrypted."""
    raw = {f"{PROJECT}:{k}": v for k, v in cli_config_map(STACK, path).items()}
    vllm = json.loads(raw[f"{PROJECT}:vllm"])
    vllm["env"]["HF_TOKEN"] = PLANTED
    raw[f"{PROJECT}:vllm"] = json.dumps(vllm)
    return raw | {f"{PROJECT}:proxyApiKey": TEST_PROXY_KEY}


def test_the_program_delivers_a_secret_beside_the_scripts_and_nowhere_else(tmp_path, monkeypatch):
    path = stack_dir(tmp_path, plant)
    monkeypatch.chdir(path)  # the program reads which values are secure from the stack file, as under the CLI
    run = run_program(_cli_config(path), stack=STACK, secret_keys=[f"{PROJECT}:vllm", f"{PROJECT}:proxyApiKey"],
                      model=False)
    assert run.error is None
    for reg in run.regs:  # nowhere in clear: not in a create, a delete, triggers, the container's env
        assert PLANTED not in json.dumps(_clear(reg.inputs), default=str), reg.name
        assert TEST_PROXY_KEY not in json.dumps(_clear(reg.inputs), default=str), reg.name
    nodes = ["d0", "d1", "d2", "d3", "p0", "p1", "p2", "p3"]
    for node in nodes:
        secrets = run.named(f"{node}-secrets")
        assert is_rpc_secret(secrets.inputs["stdin"]) and f"HF_TOKEN={PLANTED}\n" in plain(secrets.inputs["stdin"])
        launch_reg = run.named(f"{node}-launch")
        assert secrets.urn in launch_reg.dependencies and is_rpc_secret(launch_reg.inputs["triggers"])
    key = run.named("p0-proxy-key")
    assert plain(key.inputs["stdin"]) == TEST_PROXY_KEY and is_rpc_secret(key.inputs["stdin"])


def _clear(value):
    """`value` without its secret-wrapped parts (what the state and `preview --diff` show in clear)."""
    if is_rpc_secret(value):
        return "[secret]"
    if isinstance(value, dict):
        return {k: _clear(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clear(v) for v in value]
    return value


def test_a_new_secret_value_restarts_the_ranks_that_read_it(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    before = run_program(stack_config_of(stack_dir(tmp_path / "a", plant)), stack=STACK)
    after = run_program(stack_config_of(stack_dir(tmp_path / "b", lambda c: plant(c, ciphertext=CIPHERTEXT + "2"))),
                        stack=STACK)
    changed = {s.name: s.op for s in plan_up(before.regs, after) if s.op in (UPDATE, REPLACE) and s.reg.custom}
    launches = {f"{n}-launch" for n in ("p0", "p1", "p2", "p3", "d0", "d1", "d2", "d3")}
    assert {n for n, op in changed.items() if op == REPLACE} == launches  # drained and restarted, by role
    assert {n for n, op in changed.items() if op == UPDATE} == {f"{n[:2]}-secrets" for n in launches}


def stack_config_of(path: Path) -> dict[str, str]:
    return {f"{PROJECT}:{k}": v for k, v in cli_config_map(STACK, path).items()}


def test_the_program_refuses_to_deploy_without_the_proxys_key(tmp_path, monkeypatch):
    monkeypatch.chdir(stack_dir(tmp_path, lambda c: None))
    run = run_program(stack_config(STACK), stack=STACK, model=False, expect_error=True)
    assert "ascend-pd:proxyApiKey: is not set, and proxy.auth requires a key" in str(run.error)
    assert "pulumi config set --secret ascend-pd:proxyApiKey" in str(run.error)
    assert not run.of_type(COMMAND)


# -- the proxy's access rules, against each release's proxy through the launcher --------------------

LAUNCHER = PROJECT_DIR / "ascend_pd" / "shell" / "pd_proxy_launch.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _from(address: str) -> requests.Session:
    """A client whose requests leave from `address` (a stranger: not one of the cluster's nodes)."""
    session = requests.Session()
    session.trust_env = False
    session.headers["Connection"] = "close"  # a request the script fails closes its connection: none is reused
    adapter = requests.adapters.HTTPAdapter()
    adapter.init_poolmanager(1, 1, source_address=(address, 0))
    session.mount("http://", adapter)
    return session


@pytest.mark.parametrize("version", RELEASES)
def test_the_proxy_answers_clients_with_its_key_and_admins_only_from_the_cluster(tmp_path, version):
    key = tmp_path / "proxy-api-key"
    key.write_text(TEST_PROXY_KEY + "\n")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "--api-key-file", str(key), "--admin-from", "127.0.0.1",
                             str(script_path(version)), "--host", "127.0.0.1", "--port", str(port),
                             "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", "1",
                             "--decoder-hosts", "127.0.0.1", "--decoder-ports", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    admin, stranger = _from("127.0.0.1"), _from("127.0.0.2")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if admin.get(f"{url}/healthcheck", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
            time.sleep(0.2)
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}
        assert stranger.post(f"{url}/v1/completions", json=body, timeout=5).status_code == 401
        assert admin.post(f"{url}/v1/completions", json=body, timeout=5).status_code == 401  # the key, from anyone
        wrong = {"Authorization": "Bearer " + TEST_PROXY_KEY[:-1] + "x"}
        assert stranger.post(f"{url}/v1/completions", json=body, headers=wrong, timeout=5).status_code == 401
        # With the key the request reaches the script, whose backends do not answer: it fails there (an
        # error answer, or the connection closed by the script's own exception), not at the door.
        try:
            reached = stranger.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=10).status_code
        except requests.ConnectionError:
            reached = "closed by the script"
        assert reached not in (401, 403)
        assert stranger.get(f"{url}/healthcheck", timeout=5).status_code == 401
        assert stranger.get(f"{url}/healthcheck", headers=AUTH, timeout=5).json()["prefill_instances"] == 1
        take_over = {"type": "decode", "instances": ["127.0.0.2:9999"]}
        for path in ("/instances/add", "/instances/remove"):
            refused = stranger.post(f"{url}{path}", json=take_over, headers=AUTH, timeout=5)
            assert refused.status_code == 403 and "cluster's nodes only" in refused.text
        assert admin.post(f"{url}/instances/remove", json={"type": "decode", "instances": []}, timeout=5).ok
        assert admin.get(f"{url}/healthcheck", timeout=5).json()["decode_instances"] == 1  # nothing the stranger did
    finally:
        proc.terminate()
        proc.wait(timeout=10)
