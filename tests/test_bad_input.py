"""Bad stack files, as an operator (or a bad merge) could write them: every one is refused by the
CLI with exit code 2 and one line per problem that names the setting and the fix, never a
traceback, never accepted.

Each case edits the committed a3-4node stack file as TEXT (so YAML-level mistakes are real) and
runs `python -m ascend_pd render` on a copy of the project holding that file; `status` goes
through the same loader and is checked once.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ascend_pd.__main__ import main
from ascend_pd.loader import PROJECT_DIR

STACK = "a3-4node"
STACK_FILE = f"Pulumi.{STACK}.yaml"
ORIGINAL = (PROJECT_DIR / f"Pulumi.{STACK}.yaml").read_text()


def sub(old: str, new: str, count: int = 1):
    """A text edit of the stack file that must apply."""
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, count)
    return edit


def re_sub(pattern: str, new: str):
    """A regular-expression edit of the stack file that must apply once."""
    def edit(text: str) -> str:
        out, n = re.subn(pattern, new, text, count=1)
        assert n == 1, pattern
        return out
    return edit


def add(section: str, line: str):
    """Add `line` (indented 4) as the first line of `ascend-pd:<section>:`."""
    return sub(f"  ascend-pd:{section}:\n", f"  ascend-pd:{section}:\n    {line}\n")


# case -> (edit of the file's text or bytes, setting named in the message, words in that line)
CASES = {
    # -- the file itself
    "tab indentation": (sub("    name: yr_glm5", "\tname: yr_glm5"), "Pulumi.a3-4node.yaml", "not valid YAML at line"),
    "not a mapping": (lambda t: "- just\n- a list\n", "Pulumi.a3-4node.yaml", "not a mapping"),
    "config not a mapping": (lambda t: "config: [a, b]\n", "Pulumi.a3-4node.yaml config", "not a mapping"),
    "integer key in config": (sub("config:\n", "config:\n  12: x\n"), "Pulumi.a3-4node.yaml config", "not text"),
    "integer key in a map": (sub("    env:\n      VLLM_ASCEND_ENABLE_FUSED_MC2", "    env:\n      7: x\n      VLLM_ASCEND_ENABLE_FUSED_MC2"),
                             "ascend-pd:vllm.env.7", "not text"),
    "not UTF-8": (lambda t: t.replace("name: yr_glm5", "name: yr_glm\xe9").encode("latin-1"),
                  "Pulumi.a3-4node.yaml", "not UTF-8"),
    "binary scalar": (sub("servedName: glm-5.1", "servedName: !!binary aGVsbG8="), "ascend-pd:model.servedName",
                      "bytes value is not supported"),
    "a date where a version goes": (add("etcd", "version: 2026-01-01"), "ascend-pd:etcd.version", "v3.5.12"),
    "duplicate key": (sub("    servedName: glm-5.1", "    servedName: glm-5.1\n    servedName: glm-5"),
                      "Pulumi.a3-4node.yaml", "appears twice"),
    "the reserved delimiter prefix": (sub("servedName: glm-5.1", "servedName: ASCEND_PD_PROBE"),
                                      "ascend-pd:model.servedName", "ASCEND_PD_"),
    "a newline in a value": (sub("servedName: glm-5.1", 'servedName: "glm\\nid"'), "ascend-pd:model.servedName",
                             "control character"),
    # -- paths ascend-pd writes and deletes
    "etcd data dir on a host mount": (add("etcd", "dataDir: /home"), "ascend-pd:etcd.dataDir", "mounts from the host"),
    "etcd data dir /data": (add("etcd", "dataDir: /data"), "ascend-pd:etcd.dataDir", "mounts from the host"),
    "etcd data dir in the driver": (add("etcd", "dataDir: /usr/local/Ascend/driver"), "ascend-pd:etcd.dataDir",
                                    "system tree /usr"),
    "etcd data dir the root": (add("etcd", "dataDir: /"), "ascend-pd:etcd.dataDir", "root directory"),
    "liveness file on hccn.conf": (add("yuanrong", "livenessPath: /etc/hccn.conf"), "ascend-pd:yuanrong.livenessPath",
                                   "system tree /etc"),
    "liveness path a directory": (add("yuanrong", "livenessPath: /workspace/"), "ascend-pd:yuanrong.livenessPath",
                                  "names a directory"),
    "state dir empty": (sub("config:\n", "config:\n  ascend-pd:stateDir: ''\n"), "ascend-pd:stateDir", "must not be empty"),
    "state dir relative": (sub("config:\n", "config:\n  ascend-pd:stateDir: workspace/x\n"), "ascend-pd:stateDir",
                           "not an absolute path"),
    "state dir with ..": (sub("config:\n", "config:\n  ascend-pd:stateDir: /workspace/../etc\n"), "ascend-pd:stateDir",
                          "not a normalised path"),
    "state dir in the weights": (sub("config:\n", "config:\n  ascend-pd:stateDir: /data/GLM-5.1-w8a8/x\n"),
                                 "ascend-pd:stateDir", "overlaps the model weights"),
    # -- ports and numbers
    "rank ports past 65535": (sub("    dp: 2\n    tp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30100",
                                  "    dp: 4\n    tp: 8\n    portBase: 65535\n    rpcPort: 10521\n    # The seed's 30100"),
                              "ascend-pd:decode.portBase", "run past 65535"),
    "port above 65535": (sub("port: 8088", "port: 70000"), "ascend-pd:proxy.port", "must be at most 65535 (got 70000)"),
    "decode kv port in the AscendDirect range": (sub("kvPort: 36200", "kvPort: 35000"), "ascend-pd:decode.kvPort",
                                                 "AscendDirect"),
    "side channels past 65535": (sub("kvPort: 36200", "kvPort: 65530"), "ascend-pd:decode.kvPort", "past 65535"),
    "yes for a size": (sub("    tp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30100",
                           "    tp: yes\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30100"),
                       "ascend-pd:decode.tp", "must be a whole number (got 'yes')"),
    "a string for a size": (sub("dp: 2\n    tp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30000",
                                "dp: '2'\n    tp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30000"),
                            "ascend-pd:prefill.dp", "write the number without quotes"),
    "true for a size": (sub("arenaPerTenant: 1", "arenaPerTenant: true"), "ascend-pd:yuanrong.arenaPerTenant",
                        "must be a whole number (got true)"),
    "timeout bash cannot hold": (add("yuanrong", "startTimeoutS: 9223372036854775808"),
                                 "ascend-pd:yuanrong.startTimeoutS", "must be at most 604800"),
    "infinite timeout": (add("vllm", "readyTimeoutS: .inf"), "ascend-pd:vllm.readyTimeoutS", "finite number"),
    "negative retries": (add("proxy", "flags: {max-retries: -1}"), "ascend-pd:proxy.flags.max-retries",
                         "must be at least 0 (got -1)"),
    "dead timeout not above timeout": (sub("nodeDeadTimeoutS: 30", "nodeDeadTimeoutS: 20"),
                                       "ascend-pd:yuanrong.nodeDeadTimeoutS", "must exceed"),
    # -- names, keys, addresses
    "flag key with shell": (sub("      seed: 1024", "      'max-num-seqs;id>/tmp/x;': 8"), "ascend-pd:vllm.flags",
                            "not valid here"),
    "flag key with =": (sub("      seed: 1024", "      port=7777: 1"), "ascend-pd:vllm.flags", "not valid here"),
    "derived flag in underscores": (sub("      max-num-seqs: 64", "      tensor_parallel_size: 8"),
                                    "ascend-pd:prefill.flags.tensor-parallel-size", "--tensor-parallel-size is derived"),
    "derived served name in underscores": (sub("      max-num-seqs: 8", "      served_model_name: x"),
                                           "ascend-pd:decode.flags.served-model-name", "is derived"),
    "derived dp size in underscores": (sub("      seed: 1024", "      data_parallel_size: 4"),
                                       "ascend-pd:vllm.flags.data-parallel-size", "is derived"),
    "one flag in two spellings": (sub("      seed: 1024", "      seed: 1024\n      max_model_len: 10"),
                                  "ascend-pd:vllm.flags.max-model-len", "same flag as 'max_model_len'"),
    "worker flag overriding etcd": (add("yuanrong", "flags: {etcd_address: '1.2.3.4:2379'}"),
                                    "ascend-pd:yuanrong.flags.etcd_address", "is derived"),
    "worker flag overriding its address": (add("yuanrong", "flags: {worker-address: '1.2.3.4:1'}"),
                                           "ascend-pd:yuanrong.flags.worker_address", "is derived"),
    "worker flag overriding shared memory": (add("yuanrong", "flags: {shared_memory_size_mb: 1}"),
                                             "ascend-pd:yuanrong.flags.shared_memory_size_mb", "is derived"),
    "env name starting with a digit": (sub("      HCCL_BUFFSIZE:", "      1BAD:"), "ascend-pd:vllm.env", "not valid here"),
    "env name with a dash": (sub("      HCCL_BUFFSIZE:", "      A-B:"), "ascend-pd:vllm.env", "not valid here"),
    "empty node name": (sub("{name: d1,", "{name: '',"), "ascend-pd:nodes[3].name", "not valid here"),
    "empty image": (sub("image: quay.io/ascend/vllm-ascend:v0.18.0-a3", "image: ''"), "ascend-pd:container.image",
                    "must not be empty"),
    "empty served name": (sub("servedName: glm-5.1", "servedName: ''"), "ascend-pd:model.servedName", "must not be empty"),
    "empty pip argument": (sub("- pip: [transformers==5.2.0,", "- pip: ['',"), "ascend-pd:container.prepare[0].pip[0]",
                           "must not be empty"),
    "address with leading zeros": (sub("address: 192.0.2.30,", "address: 192.0.2.030,"), "ascend-pd:nodes[0].address",
                                   "no leading zeros"),
    "address with non-ASCII digits": (sub("address: 192.0.2.30,", "address: \u0661\u0669\u0662.0.2.30,"),
                                      "ascend-pd:nodes[0].address", "IPv4"),
    "RSA host key": (re_sub(r"      p0: ssh-ed25519 \S+\n", "      p0: ssh-rsa AAAAB3NzaC1yc2E\n"),
                     "ascend-pd:ssh.hostKeys.p0", "ed25519"),
    "a quoted port": (sub("port: 8088", 'port: "8088"'), "ascend-pd:proxy.port", "write the number without quotes"),
    "a misspelt namespace": (sub("config:\n", "config:\n  ascend_pd:preflight: {mode: warn}\n"), "ascend_pd:preflight",
                             "write `ascend-pd:preflight`"),
    "a misspelt config key": (sub("config:\n", "configs:\n"), "configs", "write `config:`"),
    "a private key in plain text": (sub("config:\n", "config:\n  ascend-pd:sshPrivateKey: |\n    -----BEGIN OPENSSH "
                                        "PRIVATE KEY-----\n    AAAA\n    -----END OPENSSH PRIVATE KEY-----\n"),
                                    "ascend-pd:sshPrivateKey", "pulumi config set --secret ascend-pd:sshPrivateKey"),
    "a misspelt setting": (sub("servedName: glm-5.1", "servedNme: glm-5.1"), "ascend-pd:model.servedNme",
                           "did you mean 'model.servedName'?"),
    "a misspelt vLLM flag": (sub("      max-num-seqs: 64", "      max-num-seq: 64"), "ascend-pd:prefill.flags.max-num-seq",
                             "did you mean 'max-num-seqs'?"),
    "container name with a quote": (sub("name: yr_glm5", "name: \"yr'glm\""), "ascend-pd:container.name",
                                    "not valid here"),
}


def project_with(tmp_path: Path, content) -> Path:
    d = tmp_path / "project"
    d.mkdir()
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", d / "Pulumi.yaml")
    path = d / f"Pulumi.{STACK}.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return d


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("case", CASES)
def test_refused_with_setting_and_fix(case, tmp_path, capsys):
    edit, setting, words = CASES[case]
    project = project_with(tmp_path, edit(ORIGINAL))
    code, out = run_cli(capsys, "render", "--stack", STACK, "--project-dir", str(project))
    assert code == 2, out
    assert "Traceback" not in out
    # A problem line may start with where it is written (`Pulumi.a3-4node.yaml:42: `).
    lines = [ln for ln in out.splitlines() if re.match(rf"\s*- ({re.escape(STACK_FILE)}(:\d+)?: )?{re.escape(setting)}", ln)]
    assert lines, out
    assert any(words in ln for ln in lines), out
    # Every problem line says what to do; no raw pydantic dump reaches the operator.
    assert all("Fix:" in ln for ln in out.splitlines() if ln.startswith("  - ")), out
    assert "pydantic" not in out and "Input should" not in out and "Value error" not in out


def test_the_committed_file_renders(tmp_path, capsys):
    """The cases above are edits of a file that is valid as committed."""
    code, out = run_cli(capsys, "render", "--stack", STACK, "--project-dir", str(project_with(tmp_path, ORIGINAL)))
    assert code == 0, out


def test_status_refuses_the_same_way(tmp_path, capsys):
    edit, setting, words = CASES["etcd data dir on a host mount"]
    project = project_with(tmp_path, edit(ORIGINAL))
    code, out = run_cli(capsys, "status", "--stack", STACK, "--project-dir", str(project))
    assert code == 2 and setting in out and words in out


def test_every_problem_of_a_file_at_once(tmp_path, capsys):
    """Every problem of the settings' own types at once. (Checks across settings, such as a path
    against the mounts or ports against each other, run once the settings themselves are valid.)"""
    text = ORIGINAL
    for case in ("liveness path a directory", "port above 65535", "env name with a dash", "empty image"):
        text = CASES[case][0](text)
    code, out = run_cli(capsys, "render", "--stack", STACK, "--project-dir", str(project_with(tmp_path, text)))
    assert code == 2
    assert re.search(r"\((\d+) problem\(s\)\)", out).group(1) == "4", out
