"""Container preparation: the openYuanrong wheel, the etcd binary (etcd node), the stack's pip and
patch steps. One script per step, so a changed step re-runs alone.

An install step records itself done for this container incarnation (the start time of the
container's PID 1), so re-running its create (a changed SSH connection, `ascend-pd:converge`) does
not reinstall, while a new container (replaced or restarted) installs again. Package installs have
no undo: they last as long as the container.
"""

from __future__ import annotations

from ..config import PatchStep, PipStep, step_name
from ..plan import Plan
from ..shell import LOG_TAIL, Script, fingerprint, header, library, params, q, say, source_env_files

KEEP = 'echo "$what: installed packages stay until the container is replaced"\nrm -f "$marker"\n'


def prepare(plan: Plan, node: str) -> tuple[Script, ...]:
    cfg = plan.cfg
    steps = [_pip(plan, node, "install-yuanrong", "openYuanrong Datasystem", [cfg.yuanrong.package],
                  check="python3 -c 'import yr.datasystem' && command -v dscli >/dev/null")]
    if node == plan.etcd.node and plan.etcd.image is None:
        steps.append(_install_etcd(plan, node))
    for step in cfg.container.prepare:
        if isinstance(step, PipStep):
            steps.append(_pip(plan, node, step_name(step), "pip install " + " ".join(step.pip), step.pip))
        elif isinstance(step, PatchStep):
            steps.append(_patches(plan, node, step))
    return tuple(steps)


def _top(plan: Plan, node: str, name: str, what: str, *, cann: bool) -> str:
    return (header(plan.stack, node, what)
            + params(node=node, what=what, marker=f"{plan.prepared_dir}/{name}.done", log_tail=LOG_TAIL)
            + (source_env_files(plan.cfg.container.env_files) if cann else "")
            + library("lib"))


def _delete(plan: Plan, node: str, name: str, what: str) -> str:
    return header(plan.stack, node, what + " (forget)") + params(
        what=what, marker=f"{plan.prepared_dir}/{name}.done") + KEEP


def _pip(plan: Plan, node: str, name: str, what: str, args: list[str], check: str = "") -> Script:
    install = "pip install --no-input " + " ".join(q(a) for a in args)
    spec = fingerprint(install)
    # Under stateDir (on the host, beside the ranks' logs), not a fixed name in the container's /tmp:
    # it outlives the container for a post-mortem, and nothing else can own or plant that path.
    log = f"{plan.log_dir}/prepare-{name}.log"
    create = _top(plan, node, name, what, cann=True) + f"""
if step_done "$marker" {spec}; then
  echo "$what: already done on $node"
  exit 0
fi
mkdir -p {q(plan.log_dir)}
{install} > {q(log)} 2>&1 \\
  || fail_with_log {q(log)} "$what failed on $node"
{check + chr(10) if check else ''}mark_done "$marker" {spec}
echo "$what: done on $node"
"""
    return Script(name, node, "container", create, _delete(plan, node, name, what), identity=(plan.prepared_dir,))


def _install_etcd(plan: Plan, node: str) -> Script:
    e = plan.cfg.etcd
    what = f"etcd {e.version}"
    top = header(plan.stack, node, f"install {what} if missing") + params(
        node=node, what=what, binary=e.binary, version=e.version)
    create = top + """
if command -v "$binary" >/dev/null 2>&1; then
  echo "etcd present on $node: $("$binary" --version | head -n 1)"
  exit 0
fi
case "$(uname -m)" in aarch64) arch=linux-arm64 ;; x86_64) arch=linux-amd64 ;; *) echo "unsupported $(uname -m)" >&2; exit 1 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
release="etcd-$version-$arch"
url="https://github.com/etcd-io/etcd/releases/download/$version/$release.tar.gz"
if ! curl -fsSL --max-time 600 -o "$tmp/etcd.tar.gz" "$url" || ! tar -xzf "$tmp/etcd.tar.gz" -C "$tmp" 2>/dev/null; then
  echo "could not download $what from $url on $node: give the container internet access (ascend-pd:container.env" >&2
  echo "https_proxy), put etcd in the image as ascend-pd:etcd.binary, or run it from ascend-pd:etcd.image" >&2
  exit 1
fi
# A path in etcd.binary is where the etcd script will start it from: install it exactly there.
case "$binary" in
  */*) mkdir -p "$(dirname "$binary")"; cp "$tmp/$release/etcd" "$binary"; cp "$tmp/$release/etcdctl" "$(dirname "$binary")/" ;;
  *) cp "$tmp/$release/etcd" "$tmp/$release/etcdctl" /usr/local/bin/ ;;
esac
echo "$what installed on $node"
"""
    return Script("install-etcd", node, "container", create, _delete(plan, node, "install-etcd", what),
                  identity=(plan.prepared_dir,), chained=False)


def _patches(plan: Plan, node: str, step: PatchStep) -> Script:
    """`git am` a patch series as a whole. Applying patch by patch is not re-runnable (a later patch
    may change what an earlier one added), so the series is always applied onto the commit the
    repository had before ascend-pd first touched it, and recorded with a fingerprint of the patch
    files: the same series on the same HEAD is left alone, anything else is reset and re-applied,
    and delete resets to that commit. ascend-pd owns these repositories' state: local edits in
    them are discarded."""
    name = step_name(step)
    marks = f"{plan.state_dir}/patches"
    top = header(plan.stack, node, f"patches for {step.repo}") + params(
        repo=step.repo, marks=marks, base=f"{marks}/{name}.base", applied=f"{marks}/{name}.applied",
        count=len(step.patches))
    files = " ".join(q(p) for p in step.patches)
    missing = "".join(
        f"if [ ! -f {q(p)} ]; then {say(f'patch {p} is missing on {node}: copy it there first', err=True)}; exit 1; fi\n"
        for p in step.patches)
    create = top + missing + f"""mkdir -p "$marks"
want="$(sha256sum {files} | sha256sum | cut -c1-16) $(git -C "$repo" rev-parse HEAD)"
if [ -f "$applied" ] && [ "$(cat "$applied")" = "$want" ]; then
  echo "$repo: $count patch(es) already applied"
  exit 0
fi
if [ ! -f "$base" ]; then git -C "$repo" rev-parse HEAD > "$base"; fi
git -C "$repo" am --abort >/dev/null 2>&1 || true
git -C "$repo" reset -q --hard "$(cat "$base")"
if ! git -C "$repo" -c user.name=ascend-pd -c user.email=ascend-pd@localhost am --3way {files}; then
  git -C "$repo" am --abort >/dev/null 2>&1 || true
  git -C "$repo" reset -q --hard "$(cat "$base")"
  echo "git am failed in $repo; the repository is back at $(cat "$base")" >&2
  exit 1
fi
echo "$(sha256sum {files} | sha256sum | cut -c1-16) $(git -C "$repo" rev-parse HEAD)" > "$applied"
echo "$repo: applied $count patch(es) onto $(cut -c1-12 "$base")"
"""
    delete = header(plan.stack, node, f"revert patches in {step.repo}") + params(
        repo=step.repo, base=f"{marks}/{name}.base", applied=f"{marks}/{name}.applied") + """
if [ -f "$base" ]; then
  git -C "$repo" am --abort >/dev/null 2>&1 || true
  git -C "$repo" reset -q --hard "$(cat "$base")"
  echo "$repo: reset to $(cut -c1-12 "$base")"
fi
rm -f "$base" "$applied"
"""
    return Script(name, node, "container", create, delete, identity=(plan.state_dir,))
