"""Prometheus on `monitoring.node` (ascend_pd/components/prometheus_server.py): the generated
configuration written on that node's host, and its reload after a change.

What runs where, all on the host (not in the NPU container):

* `prometheus-config` writes every file `ascend_pd.monitoring.files` generates (prometheus.yml,
  rules/*.yml, targets/*.json) under `<monitoring.dir>/config`, byte for byte, each from a quoted
  heredoc (data, never code: nothing in it is expanded), and removes files an earlier configuration
  had; it makes `<monitoring.dir>/data` (the TSDB) the container user's. Its delete removes
  `<monitoring.dir>/config` and keeps `data/`: destroy does not lose the history.
* `prometheus-reload` waits until Prometheus answers `/-/ready` and POSTs `/-/reload`: the running
  container picks up a changed configuration without a restart.

The container itself is pulumi-docker's (image, name, mounts, the argv below): `server(plan)` holds
the values both sides use.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Mapping, Optional

from ..monitoring import PROMETHEUS_YML, files
from ..plan import Plan
from ..shell import CURL, RESERVED_PREFIX, Script, UnsafeText, header, heredoc, params, q

# The delimiter of every configuration file's heredoc. The config model refuses any value holding
# RESERVED_PREFIX, and heredoc() refuses a text holding its delimiter as a line.
FILE_DELIMITER = RESERVED_PREFIX + "PROMETHEUS"
# The user the Prometheus images run as (nobody); the container is started as this user explicitly,
# so the TSDB directory given to it is writable whatever USER a mirrored image declares.
PROMETHEUS_UID = 65534
CONFIG_SUBDIR = "config"
DATA_SUBDIR = "data"
CONTAINER_CONFIG = "/etc/prometheus"  # the config dir, mounted read-only
CONTAINER_DATA = "/prometheus"  # the data dir
# How long the reload waits for Prometheus to answer /-/ready: a fresh container replays its WAL
# first, which takes a while on a large TSDB.
READY_TIMEOUT_S = 300
RELOAD_TIMEOUT_S = 60  # one POST /-/reload: Prometheus loads every rule file before it answers
LOG_LINES = 30  # of `docker logs` shown when Prometheus does not come up


@dataclass(frozen=True)
class Server:
    """Prometheus of a stack, from `monitoring` and the node it runs on."""

    node: str
    address: str
    port: int
    image: str
    container_name: str
    dir: str
    retention_days: int

    @property
    def config_dir(self) -> str:
        return f"{self.dir.rstrip('/')}/{CONFIG_SUBDIR}"

    @property
    def data_dir(self) -> str:
        return f"{self.dir.rstrip('/')}/{DATA_SUBDIR}"

    @property
    def url(self) -> str:
        """Where operators reach its UI and API (the `prometheusUrl` stack output)."""
        return f"http://{self.address}:{self.port}"

    @property
    def local_url(self) -> str:
        """Where the reload reaches it from its own host (it listens on every address)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def args(self) -> tuple[str, ...]:
        """The container's command: arguments to the image's entrypoint (/bin/prometheus)."""
        return (
            f"--config.file={CONTAINER_CONFIG}/{PROMETHEUS_YML}",
            f"--storage.tsdb.path={CONTAINER_DATA}",
            f"--storage.tsdb.retention.time={self.retention_days}d",
            f"--web.listen-address=:{self.port}",
            "--web.enable-lifecycle",  # POST /-/reload
        )


def server(plan: Plan) -> Optional[Server]:
    """The stack's Prometheus, or None when `monitoring.node` is unset (nothing deployed)."""
    m = plan.cfg.monitoring
    if m.node is None:
        return None
    return Server(node=m.node, address=plan.node(m.node).address, port=m.port, image=m.image,
                  container_name=m.container_name, dir=m.dir, retention_days=m.retention_days)


def config_files(plan: Plan) -> dict[str, str]:
    """Relative path (under the config dir) -> text: exactly what `render --out` writes."""
    return files(plan, plan.cfg.monitoring)


def digest(texts: Mapping[str, str]) -> str:
    """sha256 of a set of files (paths and texts): the configuration's identity in triggers."""
    return hashlib.sha256(json.dumps(sorted(texts.items()), ensure_ascii=False).encode()).hexdigest()


def _require(plan: Plan) -> Server:
    s = server(plan)
    if s is None:
        raise ValueError("ascend-pd:monitoring.node is not set: no Prometheus is deployed")
    return s


def _array(name: str, values: list[str]) -> str:
    return f"{name}=(" + " ".join(q(v) for v in values) + ")\n"


def prometheus_config(plan: Plan) -> Script:
    """Write the generated configuration under `<dir>/config`; delete: remove it, keep `<dir>/data`."""
    s = _require(plan)
    texts = config_files(plan)
    sha = digest(texts)
    paths = list(texts)
    for rel in paths:
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts or not rel or rel != str(p):
            raise UnsafeText(f"monitoring file {rel!r} is not a plain relative path")
        if not texts[rel].endswith("\n"):
            # heredoc() would add the newline: the file would not be byte-identical.
            raise UnsafeText(f"monitoring file {rel} does not end with a newline")
    dirs = sorted({str(PurePosixPath(rel).parent) for rel in paths} - {"."})
    # With the stack's converge generation: a new one writes the files again (an update).
    top = header(plan.stack, s.node, f"Prometheus configuration ({len(paths)} files, sha256 {sha[:16]})",
                 converge=plan.cfg.converge) + params(
        node=s.node, config_dir=s.config_dir, data_dir=s.data_dir, uid=PROMETHEUS_UID, sha=sha)
    mkdirs = "".join(f'mkdir -p "$config_dir"/{q(d)}\n' for d in dirs)
    writes = "".join(f'cat > "$config_dir"/{q(rel + ".tmp")} {heredoc(FILE_DELIMITER, texts[rel])}' for rel in paths)
    create = top + _array("files", paths) + f"""umask 022
mkdir -p "$config_dir" "$data_dir"
# The TSDB belongs to the user Prometheus runs as (uid $uid, nobody), not to the SSH user.
if [ "$(stat -c %u:%g "$data_dir")" != "$uid:$uid" ]; then
  if ! chown -R "$uid:$uid" "$data_dir"; then
    echo "cannot give $data_dir to uid $uid (Prometheus runs as nobody): deploy as root (ascend-pd:ssh.user)" >&2
    exit 1
  fi
fi
{mkdirs}# Every file first, then each one renamed into place (atomic: Prometheus never reads half a file).
{writes}for f in "${{files[@]}}"; do
  chmod 644 "$config_dir/$f.tmp"
  mv -f "$config_dir/$f.tmp" "$config_dir/$f"
done
# Files an earlier configuration had and this one does not. The directory itself stays: the running
# container has it bind-mounted, and a directory made anew would be another one it never sees.
while IFS= read -r -d '' path; do
  rel=${{path#"$config_dir"/}}
  keep=0
  for f in "${{files[@]}}"; do if [ "$f" = "$rel" ]; then keep=1; fi; done
  if [ "$keep" = 0 ]; then
    rm -f -- "$path"
    echo "removed $rel (not in this configuration)"
  fi
done < <(find "$config_dir" -type f -print0)
find "$config_dir" -mindepth 1 -type d -empty -delete
echo "Prometheus configuration on $node: ${{#files[@]}} files in $config_dir (sha256 $sha)"
"""
    delete = header(plan.stack, s.node, "Prometheus configuration (remove; the data stays)") + params(
        node=s.node, config_dir=s.config_dir, data_dir=s.data_dir, container=s.container_name) + """
# A replacement of this Command (a new configuration, old delete first) runs while Prometheus runs on
# with $config_dir bind-mounted: a directory removed and made again is another directory, which the
# running container would never see. So the files stay while a container of that name mounts it (the
# create that follows replaces them in place); destroy removes the container first, then this runs.
if mounts=$(docker inspect --type container --format '{{range .Mounts}}{{println .Source}}{{end}}' "$container" 2>&1); then
  if printf '%s\\n' "$mounts" | grep -qxF -- "$config_dir"; then
    echo "container $container mounts $config_dir: its files stay for the configuration that replaces them"
    exit 0
  fi
else
  case "$mounts" in
    *'No such'*) ;;
    *) echo "docker inspect $container: $mounts" >&2; exit 1 ;;
  esac
fi
rm -rf -- "$config_dir"
echo "Prometheus configuration removed from $node ($config_dir); the data in $data_dir stays"
"""
    return Script("prometheus-config", s.node, "host", create, delete, identity=(s.dir, s.container_name))


def prometheus_reload(plan: Plan) -> Script:
    """After a new configuration (and after a new container): wait for /-/ready, POST /-/reload.

    A reload, not a restart: Prometheus re-reads prometheus.yml and every rule file in place (targets
    files it re-reads by itself). The POST answers only once the configuration is loaded, and with
    Prometheus' own error when it is not, so a broken rule fails `pulumi up` here; a SIGHUP would
    succeed whatever Prometheus then made of the files (only its log and
    `prometheus_config_last_reload_successful` would say)."""
    s = _require(plan)
    sha = digest(config_files(plan))
    # With the stack's converge generation: a new one starts a stopped container and checks it answers.
    top = header(plan.stack, s.node, f"Prometheus reload (configuration sha256 {sha[:16]})",
                 converge=plan.cfg.converge) + params(
        node=s.node, url=s.local_url, container=s.container_name, sha=sha, ready_timeout_s=READY_TIMEOUT_S,
        reload_timeout_s=RELOAD_TIMEOUT_S, log_lines=LOG_LINES)
    create = top + f"""state=$(docker inspect --type container --format '{{{{.State.Running}}}}' "$container" 2>&1) || case "$state" in
  *'No such'*) echo "container $container does not exist on $node: run pulumi refresh, then pulumi up" >&2; exit 1 ;;
  *) echo "docker inspect $container: $state" >&2; exit 1 ;;
esac
if [ "$state" != true ]; then
  echo "container $container is stopped: starting it"
  docker start "$container" >/dev/null
fi
deadline=$((SECONDS + ready_timeout_s))
until {CURL} -fsS -m 3 "$url/-/ready" >/dev/null 2>&1; do
  # A Prometheus that exits at start (its port taken, its data dir not writable) is restarted by
  # docker over and over: say so at once rather than at the deadline.
  status=$(docker inspect --type container --format '{{{{.State.Status}}}}' "$container" 2>&1) || true
  case "$status" in
    restarting|exited|dead) why="exits at start (its container is $status)" ;;
    *) why="" ;;
  esac
  if [ -n "$why" ] || [ "$SECONDS" -ge "$deadline" ]; then
    echo "Prometheus ($container) ${{why:-not ready at $url/-/ready within ${{ready_timeout_s}}s}}; its log:" >&2
    docker logs --tail "$log_lines" "$container" 2>&1 | sed 's/^/  /' >&2 || true
    exit 1
  fi
  sleep 1
done
if ! answer=$({CURL} -sS -m "$reload_timeout_s" -X POST -w '\\n%{{http_code}}' "$url/-/reload" 2>&1); then
  echo "POST $url/-/reload failed: $answer" >&2
  exit 1
fi
code=${{answer##*$'\\n'}}
if [ "$code" != 200 ]; then
  echo "Prometheus refused the configuration (HTTP $code): ${{answer%$'\\n'*}}" >&2
  echo "it runs on with the previous one; which file and why, from its log (docker logs $container):" >&2
  docker logs --tail "$log_lines" "$container" 2>&1 | sed 's/^/  /' >&2 || true
  exit 1
fi
echo "Prometheus on $node reloaded its configuration (sha256 $sha)"
"""
    delete = header(plan.stack, s.node, "Prometheus reload") + params(container=s.container_name) + """
# Nothing to undo: the container goes with its own resource.
echo "Prometheus reload: nothing to undo ($container)"
"""
    return Script("prometheus-reload", s.node, "host", create, delete, identity=(s.container_name,))


def prometheus(plan: Plan) -> tuple[Script, ...]:
    """Both scripts, in start order; none when `monitoring.node` is unset."""
    if server(plan) is None:
        return ()
    return (prometheus_config(plan), prometheus_reload(plan))


__all__ = ["Server", "server", "config_files", "digest", "prometheus", "prometheus_config", "prometheus_reload",
           "FILE_DELIMITER", "PROMETHEUS_UID", "CONTAINER_CONFIG", "CONTAINER_DATA", "CONFIG_SUBDIR", "DATA_SUBDIR"]
