"""Every rank held to the vllm-ascend release its image runs (ascend_pd/releases.py), before anything
deploys: the guides' settings that break or do nothing on their own releases are refused or warned
about, each naming the file and line, the setting, the release and the fix; the committed stacks pass
clean; the documented upgrade to 0.23.0.post1 passes clean; the release is picked from the image tag
or `vllmAscend.release`, and an unknown one is refused with the known ones and how to add one.

Cases edit a committed stack's settings and read them as the CLI does (`open_stack`)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

import release_upgrade
from seed_reader import corrections

from ascend_pd import releases
from ascend_pd.__main__ import main
from ascend_pd.engine.capture import capture
from ascend_pd.errors import ConfigError, Problem
from ascend_pd.loader import PROJECT_DIR, cli_config_map, open_stack

STACKS = ("a2-8node", "a3-4node")


def settings(stack: str) -> dict:
    out = {}
    for k, v in cli_config_map(stack).items():
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def stack_file(tmp_path: Path, stack: str, values: dict) -> Path:
    """`values` written as a stack file the CLI reads (one top-level setting a key)."""
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump({"config": {f"ascend-pd:{k}": v for k, v in values.items()}}, sort_keys=False))
    (tmp_path / "Pulumi.yaml").write_text((PROJECT_DIR / "Pulumi.yaml").read_text())
    return path


def checked(tmp_path: Path, stack: str, values: dict) -> tuple[list[Problem], list[Problem]]:
    """(errors, warnings) of `values`, each located in the file written from them."""
    path = stack_file(tmp_path, stack, values)
    try:
        plan = open_stack(stack_file=path).build_plan()
    except ConfigError as exc:
        return exc.problems, []
    return [], list(plan.warnings)


def restore(values: dict, setting: str, guide, stack) -> dict:
    """`values` with the guide's value put back at `setting` (undoing one release correction)."""
    out = copy.deepcopy(values)
    owner, kind, *path = setting.split(".")
    block = out[owner]
    if kind == "connectorModulePath":
        block[kind] = guide
    elif kind == "env":
        block["env"][path[0]] = guide
    else:  # flags.<flag>.<key>
        value = block["flags"][path[0]]
        if isinstance(stack, dict):  # moved into a section: back at the top
            value[stack["moved"]].pop(path[1])
            if not value[stack["moved"]]:
                value.pop(stack["moved"])
        value[path[1]] = guide
    return out


@pytest.mark.parametrize("stack", STACKS)
def test_the_committed_stacks_pass_clean(stack):
    plan = open_stack(stack).build_plan()
    assert plan.warnings == ()


@pytest.mark.parametrize("stack,correction", [(s, c) for s in STACKS for c in corrections(s)],
                         ids=lambda v: v if isinstance(v, str) else v.setting)
def test_each_guide_setting_the_stack_corrects_draws_its_problem(tmp_path, stack, correction):
    values = restore(settings(stack), correction.setting, correction.guide, correction.stack)
    errors, warnings = checked(tmp_path, stack, values)
    found = errors if correction.check == "error" else warnings
    assert (errors, warnings) == ((found, []) if correction.check == "error" else ([], found))
    assert len(found) == 1, [str(p) for p in found]
    p = found[0]
    assert p.setting == f"ascend-pd:{correction.setting}"
    assert re.fullmatch(rf"Pulumi\.{stack}\.yaml:\d+", p.where), p.where
    assert correction.says in p.message and f"vllm-ascend {correction.release}" in p.message, p.message
    assert p.fix


def test_the_seed_a2_decode_module_path_is_refused_by_render_with_the_fix(tmp_path, capsys):
    # Issue 37's headline: the guide's path makes every decode rank of a2 fail at start on its own image.
    values = settings("a2-8node")
    values["decode"]["connectorModulePath"] = "vllm_ascend.distributed.mooncake_connector"
    path = stack_file(tmp_path, "a2-8node", values)
    assert main(["render", "--stack-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "ascend-pd:decode.connectorModulePath: vllm_ascend.distributed.mooncake_connector: no such module in " \
           "vllm-ascend 0.20.2rc1 (vLLM 0.20.2)" in err
    assert "vLLM 0.20.2 imports a kv_connector_module_path before it looks at its registry" in err
    assert "Fix: remove decode.connectorModulePath: vllm-ascend 0.20.2rc1 (vLLM 0.20.2) registers " \
           "MooncakeHybridConnector itself (vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_hybrid_connector)" in err


def test_render_prints_warnings_and_strict_refuses_them(tmp_path, capsys):
    values = settings("a3-4node")
    values["vllm"]["flags"]["speculative-config"]["method"] = "deepseek_mtp"
    path = stack_file(tmp_path, "a3-4node", values)
    assert main(["render", "--stack-file", str(path)]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^warning: Pulumi\.a3-4node\.yaml:\d+: ascend-pd:vllm\.flags\.speculative-config\.method: "
                     r"'deepseek_mtp' is deprecated in vllm-ascend 0\.18\.0", err, re.M), err
    values["vllmAscend"] = {"strict": True}
    path = stack_file(tmp_path, "a3-4node", values)
    assert main(["render", "--stack-file", str(path)]) == 2
    assert "speculative-config.method: 'deepseek_mtp' is deprecated" in capsys.readouterr().err


# -- the upgrade to 0.23.0.post1, as docs/changes.md gives it ----------------------------------------


def test_the_documented_upgrade_to_0_23_passes_clean(tmp_path):
    values = release_upgrade.upgraded(settings("a2-8node"))
    errors, warnings = checked(tmp_path, "a2-8node", values)
    assert (errors, warnings) == ([], [])
    assert open_stack(stack_file=stack_file(tmp_path, "a2-8node", values)).build_plan().cfg.container.image.endswith(
        ":v0.23.0.post1")


def test_only_the_image_changed_to_0_23_says_what_else_to_change(tmp_path):
    values = settings("a2-8node")
    values["container"]["image"] = "quay.io/ascend/vllm-ascend:v0.23.0.post1"
    errors, _ = checked(tmp_path, "a2-8node", values)
    by_setting = {p.setting: p for p in errors}
    assert set(by_setting) == {"ascend-pd:vllm.env.VLLM_ASCEND_APPLY_DSV4_PATCH", "ascend-pd:yuanrong.package"}
    assert "no longer reads environment variable VLLM_ASCEND_APPLY_DSV4_PATCH (vllm-ascend 0.20.2rc1 did, " \
           "default '0'): your value '1' would be lost" in by_setting["ascend-pd:vllm.env.VLLM_ASCEND_APPLY_DSV4_PATCH"].message
    assert "is a wheel for Python 3.11 (cp311)" in by_setting["ascend-pd:yuanrong.package"].message
    assert "runs Python 3.12" in by_setting["ascend-pd:yuanrong.package"].message


def test_an_env_var_moved_into_additional_config_names_the_key(tmp_path):
    values = settings("a3-4node")  # FLASHCOMM1 on prefill, MLAPO on decode, FUSED_MC2 on both
    values["container"]["image"] = "quay.io/ascend/vllm-ascend:v0.23.0.post1-a3"
    values["yuanrong"]["package"] = "openyuanrong-datasystem==0.8.1"
    _, warnings = checked(tmp_path, "a3-4node", values)
    moved = {p.setting: p for p in warnings if "deprecated fallback" in p.message}
    assert set(moved) == {"ascend-pd:prefill.env.VLLM_ASCEND_ENABLE_FLASHCOMM1",
                          "ascend-pd:decode.env.VLLM_ASCEND_ENABLE_MLAPO",
                          "ascend-pd:vllm.env.VLLM_ASCEND_ENABLE_FUSED_MC2"}
    assert "additional-config key enable_flashcomm1" in moved["ascend-pd:prefill.env.VLLM_ASCEND_ENABLE_FLASHCOMM1"].message


# -- which release ---------------------------------------------------------------------------------


@pytest.mark.parametrize("image,release,suffix", [
    ("quay.io/ascend/vllm-ascend:v0.20.2rc1", "0.20.2rc1", ""),
    ("quay.io/ascend/vllm-ascend:v0.18.0-a3", "0.18.0", "-a3"),
    ("registry.local:5000/ascend/vllm-ascend:v0.23.0.post1-a3-openeuler", "0.23.0.post1", "-a3-openeuler"),
])
def test_the_release_is_read_from_the_image_tag(image, release, suffix):
    cfg = open_stack("a2-8node").config
    problems: list[Problem] = []
    got = releases.image_release(cfg, image, "ascend-pd:container.image", problems)
    assert problems == [] and (got.release.name, got.suffix) == (release, suffix)


def test_an_image_whose_tag_names_no_release_needs_vllm_ascend_release(tmp_path):
    values = settings("a2-8node")
    values["container"]["image"] = "quay.io/ascend/vllm-ascend@sha256:" + "a" * 64
    errors, _ = checked(tmp_path, "a2-8node", values)
    assert [p.setting for p in errors] == ["ascend-pd:container.image"]
    assert "names no vllm-ascend release" in errors[0].message
    assert "set `ascend-pd:vllmAscend.release`" in errors[0].fix and "0.23.0.post1" in errors[0].fix
    values["vllmAscend"] = {"release": "0.20.2rc1"}
    assert checked(tmp_path, "a2-8node", values) == ([], [])


def test_an_unknown_release_lists_the_known_ones_and_how_to_add_one(tmp_path):
    values = settings("a2-8node")
    values["container"]["image"] = "quay.io/ascend/vllm-ascend:v0.24.0"
    errors, _ = checked(tmp_path, "a2-8node", values)
    assert len(errors) == 1 and errors[0].setting == "ascend-pd:container.image"
    assert "vllm-ascend 0.24.0 is not a release ascend-pd knows (known: 0.18.0, 0.20.2rc1, 0.23.0.post1)" \
        in errors[0].message
    assert "python -m tools.release_facts --pins" in errors[0].fix


def test_a_release_that_disagrees_with_the_tag_is_refused(tmp_path):
    values = settings("a2-8node")
    values["vllmAscend"] = {"release": "0.23.0.post1"}
    errors, _ = checked(tmp_path, "a2-8node", values)
    assert [p.setting for p in errors] == ["ascend-pd:vllmAscend.release"]
    assert "names 0.20.2rc1" in errors[0].message


def test_each_role_is_held_to_its_own_image(tmp_path):
    # Prefill on 0.18.0 (no MooncakeHybridConnector, no yuanrong backend), decode on 0.20.2rc1.
    values = settings("a2-8node")
    values["prefill"]["image"] = "quay.io/ascend/vllm-ascend:v0.18.0"
    errors, _ = checked(tmp_path, "a2-8node", values)
    by_setting = {p.setting: p for p in errors}
    assert "registers no KV connector 'MooncakeHybridConnector'" in by_setting["ascend-pd:prefill.connector"].message
    assert "no 'yuanrong' backend for AscendStoreConnector" in by_setting["ascend-pd:prefill.image"].message
    assert not [p for p in errors if p.setting.startswith("ascend-pd:decode")]


def test_a_backend_patch_step_on_another_repository_names_that_step(tmp_path):
    """a3 on 0.18.0 needs the yuanrong patches on the image's vllm-ascend checkout: the patch step moved
    elsewhere is refused on that step's repo (what to fix), not on the image."""
    values = settings("a3-4node")
    i = next(i for i, s in enumerate(values["container"]["prepare"]) if s.get("repo", "").endswith("vllm-ascend"))
    values["container"]["prepare"][i]["repo"] = "/opt/other"
    errors, _ = checked(tmp_path, "a3-4node", values)
    assert [p.setting for p in errors] == [f"ascend-pd:container.prepare[{i}].repo"]
    assert "'/opt/other' is not the image's vllm-ascend repository" in errors[0].message
    assert "no 'yuanrong' backend for AscendStoreConnector" in errors[0].message
    del values["container"]["prepare"][i]  # no backend patch step at all: the image is what to change
    errors, _ = checked(tmp_path, "a3-4node", values)
    assert "ascend-pd:container.image" in [p.setting for p in errors]


# -- what else a release is particular about ----------------------------------------------------------


def test_a_flag_of_another_release_is_refused_for_this_one(tmp_path):
    only_018 = sorted(set(releases.load("0.18.0").facts["serve_flags"]) - set(releases.load("0.20.2rc1").facts["serve_flags"]))
    assert only_018
    values = settings("a2-8node")
    values["prefill"]["flags"][only_018[0]] = True
    errors, _ = checked(tmp_path, "a2-8node", values)
    assert [p.setting for p in errors] == [f"ascend-pd:prefill.flags.{only_018[0]}"]
    assert "it is in vllm-ascend 0.18.0" in errors[0].message
    values["vllm"]["allowUnknownFlags"] = [only_018[0]]
    assert checked(tmp_path, "a2-8node", values) == ([], [])


def test_an_additional_config_key_nobody_reads_warns_and_one_in_its_section_is_fine(tmp_path):
    values = settings("a2-8node")
    extra = values["decode"]["flags"]["additional-config"]
    extra["enable_frobnication"] = True
    extra["ascend_compilation_config"]["fuse_norm_quant"] = False  # read there: fine
    extra["ascend_compilation_config"]["recompute_scheduler_enable"] = True  # a top-level key, nested
    _, warnings = checked(tmp_path, "a2-8node", values)
    assert {p.setting: p.message.split(": ", 1)[0] for p in warnings} == {
        "ascend-pd:decode.flags.additional-config.enable_frobnication":
            "vllm-ascend 0.20.2rc1 (vLLM 0.20.2) does not read additional-config key enable_frobnication",
        "ascend-pd:decode.flags.additional-config.ascend_compilation_config.recompute_scheduler_enable":
            "vllm-ascend 0.20.2rc1 (vLLM 0.20.2) reads recompute_scheduler_enable at the top of additional-config, "
            "not inside ascend_compilation_config",
    }


def test_an_unknown_vllm_variable_warns_and_a_native_library_variable_is_not_judged(tmp_path):
    values = settings("a2-8node")
    values["vllm"]["env"]["VLLM_FROBNICATE"] = "1"
    values["vllm"]["env"]["HCCL_SOMETHING_NEW"] = "1"  # read by HCCL, which these facts cannot see
    _, warnings = checked(tmp_path, "a2-8node", values)
    assert [p.setting for p in warnings] == ["ascend-pd:vllm.env.VLLM_FROBNICATE"]


def test_a_registered_connector_without_a_module_path_and_a_wrong_class_name(tmp_path):
    values = settings("a2-8node")
    values["decode"]["connector"] = "MooncakeHybridConector"
    errors, _ = checked(tmp_path, "a2-8node", values)
    assert [p.setting for p in errors] == ["ascend-pd:decode.connector"]
    assert errors[0].fix.startswith("did you mean 'MooncakeHybridConnector'?")
    values["decode"]["connector"] = "MooncakeHybridConnector"
    values["decode"]["connectorModulePath"] = "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_hybrid_connector"
    errors, _ = checked(tmp_path, "a2-8node", values)  # the module exists, but defines MooncakeConnector
    assert [p.setting for p in errors] == ["ascend-pd:decode.connectorModulePath"]
    assert "defines no class MooncakeHybridConnector (it defines" in errors[0].message


def test_a_proxy_flag_the_release_proxy_lacks_and_an_unknown_proxy_interface(tmp_path, monkeypatch):
    values = settings("a2-8node")
    assert checked(tmp_path, "a2-8node", values) == ([], [])
    facts = copy.deepcopy(releases.load("0.20.2rc1").facts)
    del facts["proxy"]["options"]["waiting-retry-interval"]
    facts["proxy"]["defines"] = [d for d in facts["proxy"]["defines"] if d != "ProxyState"]
    monkeypatch.setattr(releases, "load", lambda name, real=releases.load: releases.Release(name, facts)
                        if name == "0.20.2rc1" else real(name))
    errors, _ = checked(tmp_path, "a2-8node", values)
    assert {p.setting for p in errors} == {"ascend-pd:proxy.flags.waiting-retry-interval",
                                           "ascend-pd:proxy.keepRemovedOut"}


def test_the_program_logs_the_warnings_and_diff_reports_them(tmp_path, capsys):
    # Under `pulumi preview`/`up` the program warns through the engine (pulumi.log.warn); `diff` lists them.
    values = settings("a3-4node")
    values["vllm"]["env"]["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] = "300000"
    graph = capture({f"ascend-pd:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in values.items()},
                    stack="a3-4node")
    assert graph.error is None and len(graph.warnings) == 1
    assert graph.warnings[0].startswith("ascend-pd:vllm.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT: in vllm-ascend 0.18.0")
    (tmp_path / "base").mkdir()
    base = stack_file(tmp_path / "base", "a3-4node", settings("a3-4node"))
    new = stack_file(tmp_path, "a3-4node", values)
    assert main(["diff", "--stack-file", str(new), "--base-file", str(base), "--format", "json"]) == 10
    doc = json.loads(capsys.readouterr().out)
    assert [w["setting"] for w in doc["warnings"]] == ["ascend-pd:vllm.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT"]
    assert re.fullmatch(r"Pulumi\.a3-4node\.yaml:\d+", doc["warnings"][0]["where"])
