"""`ascend-pd bundle --stack S`: one .tar.gz with everything a support ticket needs, secrets redacted.

What is in it (the MANIFEST inside lists every file, and what could not be collected and why):
* `plan/summary.txt` (render's summary), `plan/stack.yaml` (the stack file; Pulumi `secure:` values
  blanked), `plan/config.json` (the settings as loaded, defaults filled in);
* `status.json` (status --json without the smoke completion), `doctor.json` (doctor's versions, NPU,
  hccn.conf and fabric checks), `etcd.json` (the stack's keys: worker registrations, rollout slots and
  failure marks, launch states of multi-node groups), `versions.txt`;
* per node `nodes/<node>/`: the last lines of every log under `<stateDir>/logs/` and the worker's own
  log (`logs/`), etcd's `docker logs` in image mode, the NPU container's `docker inspect`, the
  processes in it, `npu-smi info`, huge pages, memory, disk, a `dmesg` tail, the driver's and the
  container's vLLM / vllm-ascend versions.

Bounds: every node (as many at once as ssh's `--parallel` gate lets through), status, doctor and
etcd at once, one deadline for all (what is late, or still waiting for a session, is named in the
MANIFEST, never waited for); each tool on a node has its own `timeout`; a cap per file (its last
bytes are kept: the end of a log is what matters) and in all. A node that is down costs its own files,
nothing else.

Secrets never leave (`Redactor`): the values of every variable of the plan (container, vLLM, role,
rank) whose name says secret (TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL...), such variables' values
anywhere in `NAME=value` form (docker inspect's Env, a log line), private key blocks, bearer tokens,
Hugging Face tokens, a password inside a URL (`https://user:pass@...`), the value of a flag whose name
says secret (`--api-key`, `--hf-token`), the proxy's key as exported for status, and the operator's
--identity key file's contents, wherever they appear. Values the stack keeps secret never reach a script,
argv or log (ascend_pd/secrets.py) for the bundle to find.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from . import ssh
from .logsources import sources
from .plan import Plan
from .secrets import PROXY_KEY_ENV
from .shell import q

DEFAULT_LINES = 2000  # of every log
DEFAULT_TIMEOUT_S = 60.0
FILE_MAX_BYTES = 4 * 1024 * 1024
TOTAL_MAX_BYTES = 64 * 1024 * 1024
TOOL_TIMEOUT_S = 20  # one tool on a node (a wedged npu-smi)
LINE_MAX_CHARS = 4000
SECTION = "@@apd-section"
REDACTED = "[redacted]"
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE|CREDENTIAL|AUTH)", re.I)
_ASSIGN = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=([^\s\"',;]+)")
# The value of a flag whose name says secret (--api-key, --hf-token), = or space separated.
_SECRET_FLAG = re.compile(r"(?i)(--[a-z0-9-]*(?:key|token|secret|passw)[a-z0-9-]*)(=|\s+)([^\s\"']+)")
_PATTERNS = (
    re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S),
    re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),
    re.compile(r"(?m)(?<=secure: )\S+"),  # Pulumi's encrypted config values
    re.compile(r"(?<=://)[^/\s:@'\"]+:[^/\s@'\"]+(?=@)"),  # user:password in a URL (https_proxy, PIP_INDEX_URL)
    re.compile(r"(?<=secret:sha256:)[0-9a-f]+"),  # a secret's placeholder (ascend_pd/secrets.py): names a version
)


class Redactor:
    """Blanks every secret it knows of (values) or recognises (patterns) in a text."""

    def __init__(self, values: set[str]):
        # Longest first: a secret that contains another is blanked whole. Short values would blank noise.
        self.values = sorted((v for v in values if len(v) >= 6), key=len, reverse=True)
        self.count = 0

    @classmethod
    def of(cls, plan: Plan, identity_file: Optional[str] = None) -> "Redactor":
        values: set[str] = set()
        envs = [plan.cfg.container.env] + [dict(r.env) for r in plan.ranks]
        for env in envs:
            values |= {str(v) for k, v in env.items() if SECRET_NAME.search(str(k))}
        key = os.environ.get(PROXY_KEY_ENV, "").strip()
        if key:  # the proxy's key, as the operator exported it for status
            values.add(key)
        if identity_file:
            try:
                values |= {ln.strip() for ln in Path(identity_file).read_text().splitlines() if len(ln.strip()) > 20}
            except OSError:
                pass
        return cls(values)

    def __call__(self, text: str) -> str:
        before = text
        for v in self.values:
            text = text.replace(v, REDACTED)
        for p in _PATTERNS:
            text = p.sub(REDACTED, text)
        text = _ASSIGN.sub(lambda m: f"{m.group(1)}={REDACTED}" if SECRET_NAME.search(m.group(1)) and m.group(2) != REDACTED
                           else m.group(0), text)
        text = _SECRET_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
        if text != before:
            self.count += 1
        return text


# ---------------------------------------------------------------------------------------------
# One node


def node_script(plan: Plan, node: str, lines: int) -> str:
    """Sections `@@apd-section NAME` then its text; each tool bounded by its own timeout."""
    c = q(plan.cfg.container.name)
    t = f"timeout {TOOL_TIMEOUT_S}"
    worker = next((w for w in plan.workers if w.node == node), None)
    files = f"{q(plan.log_dir)}/*.log" + (f" {q(worker.log)}" if worker else "")
    in_container = (f"for f in {files}; do [ -e \"$f\" ] || continue; "
                    f"printf '\\n{SECTION} logs/%s\\n' \"$(basename \"$f\")\"; tail -n {lines} \"$f\" | cut -c1-{LINE_MAX_CHARS}; done; "
                    f"printf '\\n{SECTION} container-processes\\n'; ps -eo pid,ppid,etime,rss,args 2>&1 | cut -c1-{LINE_MAX_CHARS}; "
                    f"printf '\\n{SECTION} container-versions\\n'; "
                    "python3 -c 'import vllm; print(\"vllm\", vllm.__version__)' 2>&1 | tail -n 1; "
                    "pip show vllm-ascend 2>/dev/null | sed -n 1,2p; "
                    "cat /usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info 2>/dev/null")
    out = [f"trap '' PIPE\nsection() {{ printf '\\n{SECTION} %s\\n' \"$1\"; }}\n",
           f"section container-inspect; {t} docker inspect {c} 2>&1\n",
           f"state=$({t} docker inspect --type container --format '{{{{.State.Running}}}}' {c} 2>&1)\n",
           f"if [ \"$state\" = true ]; then {t} docker exec -i {c} bash -c {q(in_container)} </dev/null 2>&1; "
           f"else section container-not-running; echo \"container {plan.cfg.container.name}: $state\"; fi\n",
           f"section npu-smi; {t} npu-smi info 2>&1\n",
           "section hugepages; grep -i huge /proc/meminfo; for f in /sys/kernel/mm/hugepages/*/nr_hugepages; do "
           "[ -e \"$f\" ] && echo \"$f $(cat \"$f\")\"; done\n",
           "section memory; free -m 2>&1 || cat /proc/meminfo\n",
           f"section disk; {t} df -h 2>&1\n",
           f"section dmesg; {t} dmesg -T 2>&1 | tail -n 200\n",
           "section host-versions; cat /usr/local/Ascend/driver/version.info 2>&1; "
           f"{t} docker version --format 'docker {{{{.Server.Version}}}}' 2>&1; uname -a\n"]
    e = plan.etcd
    if e.image and e.node == node:
        out.append(f"section logs/etcd-container.log; {t} docker logs --tail {lines} {q(e.container_name)} 2>&1\n")
    return "".join(out)


def split_sections(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    name, buf = None, []
    for line in text.splitlines(keepends=True):
        if line.startswith(SECTION + " "):
            if name is not None:
                out.append((name, "".join(buf).strip("\n") + "\n"))
            name, buf = line[len(SECTION) + 1:].strip(), []
        elif name is not None:
            buf.append(line)
    if name is not None:
        out.append((name, "".join(buf).strip("\n") + "\n"))
    return out


DESCRIBE = {
    "container-inspect": "docker inspect of the NPU container (Env values of secret names redacted)",
    "container-processes": "processes in the NPU container (ps): the ranks, worker, etcd, proxy",
    "container-versions": "vLLM, vllm-ascend and CANN inside the NPU container",
    "container-not-running": "the NPU container is not running: its logs could not be read",
    "npu-smi": "npu-smi info", "hugepages": "huge pages (meminfo, nr_hugepages)", "memory": "free -m",
    "disk": "df -h", "dmesg": "the last 200 kernel messages", "host-versions": "driver, docker, kernel",
}


# ---------------------------------------------------------------------------------------------
# The whole bundle


@dataclass
class BundleResult:
    path: Path
    size: int
    files: int
    elapsed_s: float
    missing: list[str] = field(default_factory=list)


def _status(plan: Plan, timeout_s: float) -> str:
    from .status import Timeouts, collect_status
    from .status.report import _finite

    t = Timeouts(connect_s=min(2.0, timeout_s), request_s=min(5.0, timeout_s), smoke_s=min(10.0, timeout_s))
    return json.dumps(_finite(collect_status(plan, timeouts=t, smoke=False).to_dict()), indent=2)


def _doctor(plan: Plan, targets: dict[str, ssh.Target], timeout_s: float) -> str:
    from .doctor import run_doctor

    return json.dumps(run_doctor(plan, targets, only=("versions", "npu", "hccn-conf", "fabric"),
                                 timeout_s=timeout_s).as_json(), indent=2)


def _etcd(plan: Plan, timeout_s: float) -> str:
    import etcd3gw

    from .plan import ROLLOUT_KEY_PREFIX
    from .scripts.launch import GROUP_KEY_PREFIX

    c = etcd3gw.client(host=plan.etcd.address, port=plan.etcd.client_port, timeout=min(5.0, timeout_s))
    out = {}
    try:
        c.status()
    except Exception as exc:  # etcd3gw's errors often carry no message: say where and what
        raise RuntimeError(f"etcd at {plan.etcd.client_url} did not answer ({type(exc).__name__} {exc})".strip()) from None
    for what, prefix in (("worker registrations", "/datasystem/cluster/"),
                         ("rollout slots and failure marks", f"{ROLLOUT_KEY_PREFIX}/{plan.stack}/"),
                         ("launch states of multi-node groups", f"{GROUP_KEY_PREFIX}/{plan.stack}/")):
        out[what] = {m["key"].decode(errors="replace"): v.decode(errors="replace") for v, m in c.get_prefix(prefix)}
    return json.dumps(out, indent=2)


def _versions(plan: Plan) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("ascend-pd")
    except PackageNotFoundError:
        mine = "unknown (not installed as a package)"
    images = "\n".join(f"  {n.name}: {n.image}" for n in plan.nodes)
    return (f"ascend-pd {mine}\nimages (per node):\n{images}\n"
            "vLLM / vllm-ascend / CANN inside each container: nodes/<node>/container-versions.txt\n"
            "driver, docker, kernel: nodes/<node>/host-versions.txt; doctor.json (versions check)\n")


def default_out(stack: str) -> Path:
    return Path(f"ascend-pd-{stack}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.tar.gz")


def make_bundle(plan: Plan, targets: dict[str, ssh.Target], out: Path, *, lines: int = DEFAULT_LINES,
                timeout_s: float = DEFAULT_TIMEOUT_S, stack_file: Optional[Path] = None,
                identity_file: Optional[str] = None, file_max: int = FILE_MAX_BYTES, total_max: int = TOTAL_MAX_BYTES,
                log: Callable[[str], None] = lambda m: None) -> BundleResult:
    start = time.monotonic()
    identity_file = identity_file or next((t.identity_file for t in targets.values() if t.identity_file), None)
    redact = Redactor.of(plan, identity_file)
    files: list[tuple[str, str, str]] = []  # (path in the archive, text, what it is)
    missing: list[str] = []
    from . import term
    from .render import summary_blocks

    files.append(("plan/summary.txt", term.plain(summary_blocks(plan)) + "\n", "render's summary: ranks, endpoints"))
    files.append(("plan/config.json", json.dumps(plan.cfg.model_dump(mode="json"), indent=2, default=str),
                  "the stack's settings as loaded, defaults filled in"))
    if stack_file is not None:
        try:
            files.append(("plan/stack.yaml", stack_file.read_text(), f"the stack file {stack_file.name} (secure values blanked)"))
        except OSError as exc:
            missing.append(f"plan/stack.yaml: cannot read {stack_file}: {exc.strerror}")
    files.append(("versions.txt", _versions(plan), "this program, the images; where the others are"))

    log(f"bundle: collecting from {len(plan.nodes)} nodes, status, doctor and etcd (deadline {timeout_s:g} s)")
    pool = ThreadPoolExecutor(max_workers=4)
    scripts = {n.name: node_script(plan, n.name, lines) for n in plan.nodes}
    jobs = {
        "nodes": pool.submit(ssh.run_on_nodes, targets, scripts, timeout_s=timeout_s, deadline_s=timeout_s),
        "status.json": pool.submit(_status, plan, timeout_s),
        "doctor.json": pool.submit(_doctor, plan, targets, timeout_s),
        "etcd.json": pool.submit(_etcd, plan, timeout_s),
    }
    what = {"status.json": "status --json (no smoke completion)",
            "doctor.json": "doctor: versions, NPUs, hccn.conf, fabric (link, addresses) per node",
            "etcd.json": "the stack's keys in etcd: registrations, rollout slots and failure marks, group launch states"}
    wait(jobs.values(), timeout=timeout_s + 10)
    for name, fut in jobs.items():
        if not fut.done():
            missing.append(f"{name}: not done within the deadline ({timeout_s:g} s)")
            continue
        exc = fut.exception()
        if exc is not None:
            missing.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if name != "nodes":
            files.append((name, fut.result(), what[name]))
            continue
        for node, r in fut.result().items():
            sections = split_sections(r.stdout)
            for sec, text in sections:
                kind = "log" if sec.startswith("logs/") else "txt"
                path = f"nodes/{node}/{sec}" + ("" if sec.endswith(".log") else ".txt")
                files.append((path, text, f"last {lines} lines of {sec[5:]}" if kind == "log" else DESCRIBE.get(sec, sec)))
            if r.error:
                done = f"; collected before that: {len(sections)} sections" if sections else ""
                missing.append(f"nodes/{node}: {r.error}{done}")
    pool.shutdown(wait=False, cancel_futures=True)
    have_logs = {p.split("/")[1] + "/" + p.split("/", 3)[3] for p, _, _ in files if p.startswith("nodes/") and "/logs/" in p}
    for s in sources(plan):
        if s.docker:
            continue
        key = f"{s.node}/{Path(s.path).name}"
        if key not in have_logs and not any(m.startswith(f"nodes/{s.node}:") for m in missing):
            missing.append(f"nodes/{s.node}/logs/{Path(s.path).name}: no such log ({s.name}: not started yet, or "
                           "the container is not running)")
    res = _write(out, files, missing, redact, file_max, total_max, start, plan)
    return res


def _write(out: Path, files, missing, redact: Redactor, file_max: int, total_max: int, start: float, plan: Plan
           ) -> BundleResult:
    top = out.name[:-len(".tar.gz")] if out.name.endswith(".tar.gz") else out.stem
    total, entries = 0, []
    kept: list[tuple[str, bytes]] = []
    for path, text, what in files:
        data = redact(text).encode()
        note = ""
        if len(data) > file_max:
            data = b"[... cut: the first bytes]\n" + data[-file_max:]
            note = f" (cut to its last {file_max} bytes)"
        if total + len(data) > total_max:
            missing.append(f"{path}: left out, the bundle's cap of {total_max} bytes was reached")
            continue
        total += len(data)
        kept.append((path, data))
        entries.append(f"{path}  {what}{note}")
    manifest = (f"ascend-pd bundle of stack {plan.stack}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, "
                f"collected in {time.monotonic() - start:.1f} s\n\nFILES\n" + "\n".join(entries)
                + "\n\nNOT COLLECTED (and why)\n" + ("\n".join(missing) if missing else "nothing") + "\n"
                + f"\nREDACTED: secrets were blanked as {REDACTED} in {redact.count} file(s) (values of variables "
                "whose names say secret, private keys, bearer and Hugging Face tokens, Pulumi secure values)\n")
    kept.insert(0, ("MANIFEST", redact(manifest).encode()))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    now = time.time()
    with tarfile.open(tmp, "w:gz") as tar:
        for path, data in kept:
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size, info.mtime, info.mode = len(data), int(now), 0o600
            tar.addfile(info, io.BytesIO(data))
    os.chmod(tmp, 0o600)
    os.replace(tmp, out)
    return BundleResult(out, out.stat().st_size, len(kept), time.monotonic() - start, missing)


__all__ = ["make_bundle", "Redactor", "node_script", "split_sections", "BundleResult", "default_out",
           "DEFAULT_LINES", "DEFAULT_TIMEOUT_S"]
