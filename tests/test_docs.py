"""The reference page's sections (docs/reference.md) are generated from the code (ascend_pd/docs.py) and must match it."""

from __future__ import annotations

import inspect
import re
import textwrap
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from ascend_pd import docs, valuetypes
from ascend_pd.__main__ import main as cli
from ascend_pd.config import SECRET_KEYS, StackConfig, _Model
from ascend_pd.valuetypes import Kind, Port, Seconds, Text

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "docs" / "reference.md"  # the page with the generated sections


def all_fields(model: type[BaseModel] = StackConfig):
    seen: list[type[BaseModel]] = []

    def walk(m: type[BaseModel]):
        if m in seen:
            return
        seen.append(m)
        for name, f in m.model_fields.items():
            yield m, name, f
            for sub in docs._models(f.annotation):
                yield from walk(sub)

    yield from walk(model)


def prose_words(text: str) -> list[str]:
    """The words of a description outside code spans and flag names: what it says in English."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"--?[a-z0-9_-]+", " ", text)
    return re.findall(r"[A-Za-z][A-Za-z'-]*", text)


def test_readme_generated_sections_are_current():
    stale = docs.stale_sections(README.read_text(encoding="utf-8"))
    assert not stale, f"docs/reference.md is stale in {stale}: run `{docs.WRITE_COMMAND}`"


def test_every_setting_has_a_description_that_says_something():
    fields = list(all_fields())
    assert len(fields) >= 89  # every model field of the stack file, each model once (Role for both roles)
    thin = [f"{m.__name__}.{n}: {f.description!r}" for m, n, f in fields
            if not f.description or len(prose_words(f.description)) < 5 or not f.description.rstrip().endswith(".")]
    assert not thin, "descriptions missing or too thin (say what it does, units, when to change it):\n" + "\n".join(thin)
    assert set(SECRET_KEYS) <= set(docs.SECRET_DOCS)


def test_types_read_as_an_operator_would_say_them():
    by_key = {k: s for s in docs.settings() for k in s.keys}
    expect = {
        "hardware": "`atlas-800i-a2` or `atlas-800-a3`",
        "nodes": "list of objects",
        "nodes[].address": "IPv4 address",
        "nodes[].name": "node name",
        "prefill.nodes": "list of node names",
        "decode.portBase": "port",
        "ssh.port": "port (≥ 1)",
        "vllm.readyTimeoutS": "seconds (≥ 60)",
        "model.path": "absolute path",
        "stateDir": "owned path",
        "container.prepare": "list of `{pip}` or `{repo, patches}` objects",
        "container.prepare[].patches": "list of file paths",
        "ssh.hostKeys": "map: node name → SSH host key",
        "container.env": "map: env var name → string",
        "yuanrong.arenaPerTenant": "integer (1–1024)",
        "proxy.flags.retry-delay": "number (0–3600)",
        "converge": "integer (≥ 0)",
    }
    assert {k: by_key[k].type for k in expect} == expect
    assert by_key["prefill.dp"].keys == ("prefill.dp", "decode.dp")  # one row for the fields both roles share
    assert by_key["hugepages"].default == "unset" and by_key["ssh"].default == "optional"
    assert by_key["yuanrong.port"].default == "`18481`" and by_key["etcd.node"].default == "required"
    for s in docs.settings():  # no pydantic or typing reprs anywhere
        assert not re.search(r"typing\.|Annotated|<class|\bstr\b|\bint\b|Optional|Union|NoneType", s.type), s


def test_every_constrained_type_of_valuetypes_names_itself():
    annotated = {name: v for name, v in vars(valuetypes).items() if typing.get_origin(v) is typing.Annotated}
    assert len(annotated) >= 20
    unnamed = [name for name, v in annotated.items() if docs._kind(docs._unwrap(v)[1]) is None]
    assert not unnamed, f"give these a valuetypes.Kind: {unnamed}"
    assert docs.describe_type(Port()) == "port" and docs.describe_type(Seconds(10)) == "seconds (≥ 10)"


def test_a_new_setting_appears_without_touching_the_generator():
    """Other work adds settings (a `preflight` section, say): the table picks them up as they are."""

    class Preflight(_Model):
        checks: list[Text] = Field(default_factory=list, description="Names of the checks that must pass first.")
        timeout_s: Seconds(ge=1) = Field(30, description="Seconds one check may take before it fails.")

    class Extended(StackConfig):
        preflight: Preflight = Field(default_factory=Preflight, description="Checks run on every node first.")

    rows = {k: s for s in docs.settings(Extended) for k in s.keys}
    assert rows["preflight"].type == "object" and rows["preflight"].default == "optional"
    assert (rows["preflight.timeoutS"].type, rows["preflight.timeoutS"].default) == ("seconds (≥ 1)", "`30`")
    assert rows["preflight.checks"].type == "list of strings"

    class Undocumented(StackConfig):
        rollout: int = 0

    with pytest.raises(docs.DocsError, match="Undocumented.rollout has no description"):
        docs.settings(Undocumented)

    class Opaque(StackConfig):
        hang: typing.Annotated[Path, "no kind"] = Field(Path("/"), description="A type the docs have no words for.")

    with pytest.raises(docs.DocsError, match="give it a valuetypes.Kind"):
        docs.settings(Opaque)


def test_table_cells_survive_markdown():
    assert docs.cell("a | b `x|y` <role> 2*3") == "a \\| b `x\\|y` &lt;role&gt; 2\\*3"
    assert docs.cell("two\nlines") == "two lines"


def test_components_are_the_component_resources_of_the_package():
    """The parsed table agrees with the imported classes: every ComponentResource of `components`,
    its fixed type token, and what it waits for."""
    import pulumi

    from ascend_pd import components

    classes = {name: cls for name, cls in vars(components).items()
               if inspect.isclass(cls) and issubclass(cls, pulumi.ComponentResource)}
    documented = {c.name: c for c in docs.components()}
    assert set(documented) == set(classes) == {"HugepageHost", "NpuContainer", "EtcdSingle", "YuanrongWorker",
                                               "VllmDpGroup", "PdProxy", "NodePreflight", "PrometheusServer",
                                               "HostFirewall"}
    for name, c in documented.items():
        assert c.token == f"ascend-pd:index:{name}"
        hints = typing.get_type_hints(classes[name].__init__)
        takes = {other for other in classes if other != name
                 and re.search(rf"\b{other}\b", " ".join(map(str, hints.values())))}
        assert set(c.after) == takes, name
    order = [c.name for c in docs.components()]
    assert order.index("NpuContainer") < order.index("EtcdSingle") < order.index("YuanrongWorker") \
        < order.index("VllmDpGroup") < order.index("PdProxy") < order.index("PrometheusServer")


def test_a_component_without_its_docs_fields_is_refused(tmp_path):
    (tmp_path / "cluster.py").write_text('"""Order:\n\n    a -> b\n"""\n')
    (tmp_path / "thing.py").write_text(textwrap.dedent('''
        import pulumi

        class Thing(pulumi.ComponentResource):
            """Does things."""

            def __init__(self, name, *, opts=None):
                super().__init__("ascend-pd:index:Thing", name, None, opts)
    '''))
    with pytest.raises(docs.DocsError, match="Thing's docstring needs a `Per:` and a `Runs:`"):
        docs.deployed_section(tmp_path)
    (tmp_path / "thing.py").write_text((tmp_path / "thing.py").read_text().replace(
        '"""Does things."""', '"""Does things.\n\n            Per: node\n            Runs: the thing,\n'
        '              on two lines\n            """'))
    assert "| `Thing` | node | — | the thing, on two lines |" in docs.deployed_section(tmp_path)


def test_check_and_write_commands(tmp_path, capsys):
    readme = tmp_path / "reference.md"
    fresh = README.read_text(encoding="utf-8")
    readme.write_text(fresh.replace("| `yuanrong.port` | port |", "| `yuanrong.port` | number |"), encoding="utf-8")
    assert docs.main(check=True, readme_path=readme) == 1
    assert "stale in settings" in capsys.readouterr().err
    assert docs.main(write=True, readme_path=readme) == 0
    assert readme.read_text(encoding="utf-8") == fresh
    assert docs.main(check=True, readme_path=readme) == 0
    readme.write_text("no markers here\n", encoding="utf-8")
    assert docs.main(check=True, readme_path=readme) == 2
    assert "needs exactly one pair of markers" in capsys.readouterr().err
    assert cli(["docs", "--check"]) == 0  # the committed page, through the command line


def test_kind_metadata_does_not_change_validation():
    class M(_Model):
        port: Port() = Field(2379, description="A port for this test only.")

    assert M(port=1024).port == 1024
    with pytest.raises(ValueError):
        M(port=80)
    assert isinstance(docs._kind(M.model_fields["port"].metadata), Kind)


def test_runbook_table_lists_every_generated_alert():
    """docs/operations.md's runbook table has one row per alert the rules can hold (exporter and
    node_exporter alerts included), and no row for an alert that does not exist."""
    from ascend_pd.loader import load_stack
    from ascend_pd.monitoring import Monitoring, alerts
    from ascend_pd.plan import build_plan

    plan = build_plan(load_stack("a2-8node"), "a2-8node")
    names = {a.name for a in alerts(plan, Monitoring(exporter="10.9.0.1:9478"))}
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(AscendPd\w+)` \|", text, flags=re.M))
    assert rows == names, (sorted(names - rows), sorted(rows - names))
