"""What an operator reads when a stack file is wrong: where (file and line), which setting, what is
wrong and the fix, in ascend-pd's words (never pydantic's); and which file a stack name reads.

Each case edits the committed a3-4node stack file as text, writes it to a temporary project and
reads it the way the CLI does (`open_stack`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from test_bad_input import CASES as BAD_INPUT_CASES

from ascend_pd.change import compare
from ascend_pd.change.sources import working_tree
from ascend_pd.config import PROJECT
from ascend_pd.errors import ConfigError, Problem, Source
from ascend_pd.loader import PROJECT_DIR, cli_config_map, find_stack, load_config, load_stack, open_stack
from ascend_pd.vllm_flags import known_flags

STACK = "a3-4node"
STACK_FILE = f"Pulumi.{STACK}.yaml"
ORIGINAL = (PROJECT_DIR / STACK_FILE).read_text()


def sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def project(tmp_path: Path, text: str, name: str = STACK, pulumi_yaml: str | None = None) -> Path:
    d = tmp_path / "project"
    d.mkdir(exist_ok=True)
    if pulumi_yaml is None:
        shutil.copy(PROJECT_DIR / "Pulumi.yaml", d / "Pulumi.yaml")
    else:
        (d / "Pulumi.yaml").write_text(pulumi_yaml)
    (d / f"Pulumi.{name}.yaml").write_text(text)
    return d


def problems(tmp_path: Path, text: str, **kw) -> list[str]:
    """Each problem line of the error `text` gets, as printed."""
    with pytest.raises(ConfigError) as err:
        open_stack(STACK, project(tmp_path, text, **kw)).build_plan()
    return [str(p) for p in err.value.problems]


def one(tmp_path: Path, text: str, setting: str, **kw) -> str:
    found = [p for p in problems(tmp_path, text, **kw) if f" {setting}: " in f" {p}"]
    assert len(found) == 1, (setting, problems(tmp_path, text, **kw))
    return found[0]


# -- a. every problem of a file names the file, and the line where it can be found

def test_a_problem_names_the_file_and_the_line_of_the_setting(tmp_path):
    text = sub(ORIGINAL, "port: 8088", "port: 70000")
    assert one(tmp_path, text, "ascend-pd:proxy.port").startswith(
        f"{STACK_FILE}:{line_of(text, 'port: 70000')}: ascend-pd:proxy.port: must be at most 65535")


def test_a_missing_setting_points_at_its_section_and_a_missing_section_at_the_file(tmp_path):
    text = sub(ORIGINAL, "    dp: 2\n    tp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30000",
               "    dp: 2\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30000")
    assert one(tmp_path, text, "ascend-pd:prefill.tp") == (
        f"{STACK_FILE}:{line_of(text, 'ascend-pd:prefill:')}: ascend-pd:prefill.tp: required setting is missing. "
        "Fix: add it to the stack file.")
    text = sub(ORIGINAL, "  ascend-pd:hardware: atlas-800-a3\n", "")
    assert one(tmp_path, text, "ascend-pd:hardware") == (
        f"{STACK_FILE}: ascend-pd:hardware: required setting is missing. Fix: add it to the stack file.")


def test_a_list_item_and_a_flag_in_the_other_spelling_are_found(tmp_path):
    text = sub(ORIGINAL, "address: 192.0.2.41,", "address: 192.0.2.30,")
    assert one(tmp_path, text, "ascend-pd:nodes[3].address").startswith(
        f"{STACK_FILE}:{line_of(text, 'name: d1')}: ascend-pd:nodes[3].address: address 192.0.2.30 is used twice")
    # The plan names the flag `tensor-parallel-size`; the file spells it with underscores.
    text = sub(ORIGINAL, "      max-num-seqs: 64", "      tensor_parallel_size: 8")
    assert one(tmp_path, text, "ascend-pd:prefill.flags.tensor-parallel-size").startswith(
        f"{STACK_FILE}:{line_of(text, 'tensor_parallel_size')}: ")


def test_a_default_from_pulumi_yaml_names_pulumi_yaml(tmp_path):
    pulumi_yaml = (PROJECT_DIR / "Pulumi.yaml").read_text() + "config:\n  ascend-pd:converge:\n    default: -1\n"
    line = line_of(pulumi_yaml, "default: -1")
    assert one(tmp_path, ORIGINAL, "ascend-pd:converge", pulumi_yaml=pulumi_yaml).startswith(
        f"Pulumi.yaml:{line}: ascend-pd:converge: must be at least 0 (got -1)")


def bad_project(case: str, tmp_path: Path) -> Path:
    """A project directory holding the committed a3 stack file broken as bad-input `case` breaks it."""
    content = BAD_INPUT_CASES[case][0](ORIGINAL)
    d = tmp_path / "project"
    d.mkdir()
    shutil.copy(PROJECT_DIR / "Pulumi.yaml", d / "Pulumi.yaml")
    path = d / STACK_FILE
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return d


@pytest.mark.parametrize("case", BAD_INPUT_CASES)
def test_every_bad_input_case_names_the_file(case, tmp_path):
    """The catalogue of bad stack files (test_bad_input): read through `open_stack`, every problem
    line starts with the file (and its line, where the setting is written)."""
    d = bad_project(case, tmp_path)
    with pytest.raises(ConfigError) as err:
        open_stack(STACK, d).build_plan()
    assert all(str(p).startswith(STACK_FILE) for p in err.value.problems), str(err.value)


@pytest.mark.parametrize("case", BAD_INPUT_CASES)
def test_diff_names_the_file_and_line_as_render_does(case, tmp_path):
    """`diff` of each bad stack file against the committed one: the same problems, each with the same
    file and line, as `render` (open_stack) prints."""
    d = bad_project(case, tmp_path)
    with pytest.raises(ConfigError) as err:
        open_stack(STACK, d).build_plan()
    change = compare(STACK, working_tree(STACK, PROJECT_DIR), working_tree(STACK, d))
    assert change.problems is not None
    assert [str(p) for p in change.problems.problems] == [str(p) for p in err.value.problems]


def test_the_clis_flat_map_names_no_file():
    flat = cli_config_map(STACK)
    flat["proxy"] = flat["proxy"].replace("8088", "70000")
    with pytest.raises(ConfigError) as err:
        load_config(flat)
    assert str(err.value.problems[0]).startswith("ascend-pd:proxy.port: must be at most 65535")


def test_source_falls_back_to_the_parent_then_the_file():
    source = Source("Pulumi.x.yaml", {"ascend-pd:prefill": ("Pulumi.x.yaml", 7)})
    assert source.where("ascend-pd:prefill.flags.seed") == "Pulumi.x.yaml:7"
    assert source.where("ascend-pd:nodes[2].name") == "Pulumi.x.yaml"
    located = source.locate(ConfigError([Problem("ascend-pd:prefill.tp", "m", "f"), Problem("Pulumi.x.yaml", "m", "f")]))
    assert [p.where for p in located.problems] == ["Pulumi.x.yaml:7", ""]


# -- b, c. ascend-pd's words, not pydantic's

@pytest.mark.parametrize("edit, setting, words", [
    (lambda t: sub(t, "shmSize: 500g", "shmSize: 500x"), "ascend-pd:container.shmSize",
     "'500x' is not a docker size like 800g or 512000m"),
    (lambda t: sub(t, "    tp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30100",
                   "    tp: sixteen\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30100"),
     "ascend-pd:decode.tp", "must be a whole number (got 'sixteen'). Fix: write a whole number."),
    (lambda t: sub(t, "config:\n", "config:\n  ascend-pd:preflight: {mode: warning}\n"), "ascend-pd:preflight.mode",
     "must be 'enforce', 'warn' or 'off' (got 'warning'). Fix: write one of those values."),
    (lambda t: sub(t, "config:\n", "config:\n  ascend-pd:preflight: {minCann: 8}\n"), "ascend-pd:preflight.minCann",
     "must be text (got 8)"),
    (lambda t: sub(t, "      HCCL_BUFFSIZE: \"256\"", "      HCCL_BUFFSIZE: {a: 1}"), "ascend-pd:vllm.env.HCCL_BUFFSIZE",
     "must be text, a number or true/false. Fix: write text, a number or true/false."),
    (lambda t: sub(t, "hugeTlb: true", "hugeTlb: 'true'"), "ascend-pd:yuanrong.hugeTlb",
     "is the text 'true', not true or false. Fix: write true or false without quotes."),
    (lambda t: sub(t, "    gib: 500", "    gib: 0.5"), "ascend-pd:hugepages.gib", "must be a whole number (got 0.5)"),
    (lambda t: sub(t, "nodes: [p0, p1]", "nodes: []"), "ascend-pd:prefill.nodes", "must have at least 1 item."),
])
def test_plain_words(tmp_path, edit, setting, words):
    line = one(tmp_path, edit(ORIGINAL), setting)
    assert words in line, line
    assert not re.search(r"Input should|Value error|valid integer|valid string|Field required|Extra inputs", line)


def test_a_quoted_port_says_to_drop_the_quotes(tmp_path):
    text = sub(ORIGINAL, "port: 8088", 'port: "8088"')
    assert one(tmp_path, text, "ascend-pd:proxy.port") == (
        f"{STACK_FILE}:{line_of(text, '8088')}: ascend-pd:proxy.port: is the text '8088', not a number. "
        "Fix: write the number without quotes.")


# -- d. a private key in plain text

KEY_TEXT = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"


@pytest.mark.parametrize("where", ["stack", "project"])
def test_a_plain_text_private_key_is_sent_to_pulumi_config_set_secret(tmp_path, where):
    pem = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_TEXT}\n-----END OPENSSH PRIVATE KEY-----\n"
    if where == "stack":
        key = "  ascend-pd:sshPrivateKey: |\n" + "".join(f"    {ln}\n" for ln in pem.splitlines())
        text, pulumi_yaml, file = sub(ORIGINAL, "config:\n", "config:\n" + key), None, STACK_FILE
    else:  # a project default (a declaration's `default:`)
        key = "  ascend-pd:sshPrivateKey:\n    default: |\n" + "".join(f"      {ln}\n" for ln in pem.splitlines())
        base = (PROJECT_DIR / "Pulumi.yaml").read_text()
        text, pulumi_yaml, file = ORIGINAL, base + "config:\n" + key, "Pulumi.yaml"
    with pytest.raises(ConfigError) as err:
        open_stack(STACK, project(tmp_path, text, pulumi_yaml=pulumi_yaml))
    message = str(err.value)
    assert KEY_TEXT not in message and "BEGIN" not in message
    (line,) = [str(p) for p in err.value.problems]
    at = line_of(text, "sshPrivateKey") if where == "stack" else line_of(pulumi_yaml, "default: |")
    assert line == (f"{file}:{at}: ascend-pd:sshPrivateKey: is a secret, but {file} "
                    "holds it in plain text. Fix: set it with `pulumi config set --secret ascend-pd:sshPrivateKey "
                    f"< KEYFILE` and remove it from {file}.")
    assert "on one line" not in message


def test_an_encrypted_private_key_is_fine(tmp_path):
    text = sub(ORIGINAL, "config:\n", "config:\n  ascend-pd:sshPrivateKey:\n    secure: AAABAKEY\n")
    assert open_stack(STACK, project(tmp_path, text)).config.hardware == "atlas-800-a3"


# -- e. did you mean

@pytest.mark.parametrize("old, new, setting, meant", [
    ("    dp: 2\n    tp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30000",
     "    dp: 2\n    tpp: 16\n    portBase: 6700\n    rpcPort: 10521\n    # The seed's 30000", "prefill.tpp", "prefill.tp"),
    ("  ascend-pd:hugepages:", "  ascend-pd:hugepage:", "hugepage", "hugepages"),
    ("{name: d1,", "{nme: d1,", "nodes[3].nme", "nodes[3].name"),
    ("    servedName: glm-5.1", "    ServedName: glm-5.1", "model.ServedName", "model.servedName"),
    ("- pip: [transformers==5.2.0,", "- pips: [transformers==5.2.0,", "container.prepare[0].pips",
     "container.prepare[0].pip"),
    ("config:\n", "config:\n  ascend-pd:sshPrivatekey:\n    secure: AAAB\n", "sshPrivatekey", "sshPrivateKey"),
])
def test_an_unknown_setting_near_a_known_one_gets_did_you_mean(tmp_path, old, new, setting, meant):
    line = one(tmp_path, sub(ORIGINAL, old, new), f"{PROJECT}:{setting}")
    assert f"{PROJECT}:{setting}: unknown setting. Fix: did you mean '{meant}'? Otherwise remove it" in line, line


def test_an_unknown_setting_near_nothing_gets_no_guess(tmp_path):
    line = one(tmp_path, sub(ORIGINAL, "    servedName: glm-5.1", "    servedName: glm-5.1\n    zzz: 1"),
               "ascend-pd:model.zzz")
    assert "did you mean" not in line and "remove it or correct its spelling" in line


# -- f. a misspelt namespace or `config:`

@pytest.mark.parametrize("ns", ["ascend_pd", "ascendpd", "Ascend-PD", "ascend-pd ", "acsend-pd", "ascend.pd"])
def test_a_namespace_near_ascend_pd_is_refused(tmp_path, ns):
    text = sub(ORIGINAL, "config:\n", f"config:\n  '{ns}:preflight': {{mode: warn}}\n")
    (line,) = problems(tmp_path, text)
    assert line == (f"{STACK_FILE}:{line_of(text, 'preflight')}: {ns}:preflight: the namespace {ns!r} is not "
                    "'ascend-pd', so ascend-pd would ignore this setting. Fix: write `ascend-pd:preflight`.")


def test_other_namespaces_are_left_to_their_providers(tmp_path):
    text = sub(ORIGINAL, "config:\n", "config:\n  aws:region: us-east-1\n  docker:host: ssh://x\n  pulumi:tags: {a: b}\n")
    assert open_stack(STACK, project(tmp_path, text)).config.hardware == "atlas-800-a3"


@pytest.mark.parametrize("key", ["configs", "Config", "confg", "CONFIG"])
def test_a_misspelt_config_key_is_one_problem(tmp_path, key):
    text = sub(ORIGINAL, "config:\n", f"{key}:\n")
    assert problems(tmp_path, text) == [
        f"{STACK_FILE}:{line_of(text, key + ':')}: {key}: is not a key of a stack file: the settings go under "
        "`config:`. Fix: write `config:`."]


def test_the_other_keys_of_a_pulumi_stack_file_are_accepted(tmp_path):
    text = ("secretsprovider: passphrase\nencryptionsalt: v1:abc\nencryptedkey: xyz\nenvironment: [my-env]\n"
            + ORIGINAL)
    assert open_stack(STACK, project(tmp_path, text)).config.hardware == "atlas-800-a3"


def test_an_unknown_top_level_key_is_refused(tmp_path):
    (line,) = problems(tmp_path, "settings: {}\n" + ORIGINAL)
    assert line.startswith(f"{STACK_FILE}:1: settings: is not a key of a stack file (Pulumi reads only config,")


# -- g. vLLM flag names

def test_the_committed_stacks_use_known_flags_only():
    for stack in ("a2-8node", "a3-4node"):
        cfg = load_stack(stack)
        for flags in (cfg.vllm.flags, cfg.prefill.flags, cfg.decode.flags):
            assert set(flags) <= known_flags(), set(flags) - known_flags()
    assert {"no-enable-prefix-caching", "no-disable-hybrid-kv-cache-manager", "max-num-seqs",
            "kv-transfer-config", "enable-auto-tool-choice"} <= known_flags()


@pytest.mark.parametrize("section, old, new, key, meant", [
    ("prefill", "      max-num-seqs: 64", "      max-num-seq: 64", "max-num-seq", "max-num-seqs"),
    ("decode", "      async-scheduling: true", "      async_schedulng: true", "async_schedulng", "async-scheduling"),
    ("vllm", "      seed: 1024", "      seed: 1024\n      gpu-memory-utilisation: 0.9", "gpu-memory-utilisation",
     "gpu-memory-utilization"),
])
def test_a_misspelt_vllm_flag_is_refused_with_a_guess(tmp_path, section, old, new, key, meant):
    text = sub(ORIGINAL, old, new)
    line = one(tmp_path, text, f"{PROJECT}:{section}.flags.{key}")
    name = key.replace("_", "-")
    assert line == (f"{STACK_FILE}:{line_of(text, key)}: {PROJECT}:{section}.flags.{key}: is not a flag of `vllm serve` "
                    f"(vLLM 0.18.0, 0.20.2 and 0.23.0). Fix: did you mean '{meant}'? If the flag is right (a newer vLLM, a "
                    f"plugin), allow it with `{PROJECT}:vllm.allowUnknownFlags: [{name}]`.")


def test_an_unknown_flag_can_be_allowed_on_purpose(tmp_path):
    text = sub(ORIGINAL, "      max-num-seqs: 64", "      max-num-seqs: 64\n      my-plugin-flag: 3")
    (line,) = problems(tmp_path, text)
    assert "check the spelling (`vllm serve --help` lists the flags)" in line
    allowed = sub(text, "  ascend-pd:vllm:\n", "  ascend-pd:vllm:\n    allowUnknownFlags: [my_plugin_flag]\n")
    plan = open_stack(STACK, project(tmp_path, allowed)).build_plan()
    assert any("--my-plugin-flag" in r.argv for r in plan.ranks if r.role == "prefill")


def test_the_allow_list_is_validated_like_other_settings(tmp_path):
    text = sub(ORIGINAL, "  ascend-pd:vllm:\n", "  ascend-pd:vllm:\n    allowUnknownFlags: [--my-flag]\n")
    line = one(tmp_path, text, "ascend-pd:vllm.allowUnknownFlags[0]")
    assert "flag names are written without leading dashes: write `my-flag`" in line


# -- h. which file a stack name reads

def test_a_stack_name_is_looked_up_in_the_current_directory_first(tmp_path, monkeypatch):
    here = tmp_path / "ops"
    here.mkdir()
    (here / STACK_FILE).write_text(sub(ORIGINAL, "port: 8088", "port: 9099"))
    monkeypatch.chdir(here)
    files = find_stack(STACK)
    assert files.stack_file == here / STACK_FILE and files.name == STACK
    assert files.project_file == PROJECT_DIR / "Pulumi.yaml"  # none beside it: the project's
    assert load_stack(STACK).proxy.port == 9099
    assert load_stack("a2-8node").hardware == "atlas-800i-a2"  # not here: the project's


def test_a_stack_found_nowhere_names_every_directory_looked_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        find_stack("nope")
    (line,) = [str(p) for p in err.value.problems]
    assert f"no stack file Pulumi.nope.yaml in {tmp_path} (the current directory) nor in {PROJECT_DIR} (the project)" in line
    assert "a2-8node" in line and "--stack-file" in line


def test_a_given_project_dir_is_the_only_place_looked_in(tmp_path, monkeypatch):
    monkeypatch.chdir(PROJECT_DIR)
    d = project(tmp_path, sub(ORIGINAL, "port: 8088", "port: 9099"))
    assert load_stack(STACK, d).proxy.port == 9099
    with pytest.raises(ConfigError, match=f"no stack file Pulumi.a2-8node.yaml in {d}. Fix"):
        find_stack("a2-8node", d)
    # The project's own dir, as the CLI passes it by default, still looks in the current directory first.
    monkeypatch.chdir(d)
    assert find_stack(STACK, PROJECT_DIR).stack_file == d / STACK_FILE


def test_a_stack_file_path_names_the_stack_and_brings_its_pulumi_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = elsewhere / "Pulumi.prod.yaml"
    path.write_text(sub(ORIGINAL, "  ascend-pd:hardware: atlas-800-a3\n", ""))
    with pytest.raises(ConfigError, match="Pulumi.prod.yaml: ascend-pd:hardware: required setting is missing"):
        open_stack(stack_file=path)
    (elsewhere / "Pulumi.yaml").write_text("name: ascend-pd\nruntime: python\nconfig:\n"
                                           "  ascend-pd:hardware:\n    default: atlas-800-a3\n")
    stack = open_stack(stack_file=path)
    assert stack.name == "prod" and stack.files.project_file == elsewhere / "Pulumi.yaml"
    assert stack.config.hardware == "atlas-800-a3" and stack.build_plan().ranks


def test_a_stack_file_path_and_a_stack_name_must_agree(tmp_path):
    odd = tmp_path / "old.yaml"
    odd.write_text(ORIGINAL)
    with pytest.raises(ConfigError, match="is not named Pulumi.<stack>.yaml"):
        find_stack(stack_file=odd)
    assert find_stack("a3-4node", stack_file=odd).name == "a3-4node"
    with pytest.raises(ConfigError, match=r"--stack prod: differs from the stack Pulumi.a3-4node.yaml is named for"):
        find_stack("prod", stack_file=PROJECT_DIR / STACK_FILE)
    with pytest.raises(ConfigError, match="--stack-file .*: no such file"):
        find_stack(stack_file=tmp_path / "Pulumi.gone.yaml")


def test_the_flat_map_of_a_stack_file_is_what_the_cli_passes(tmp_path):
    """cli_config_map takes the same arguments; a file's map loads like the CLI's."""
    flat = cli_config_map(stack_file=PROJECT_DIR / STACK_FILE)
    assert flat == cli_config_map(STACK) and json.loads(flat["nodes"])[0]["name"] == "p0"
