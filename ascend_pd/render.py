"""`python -m ascend_pd render`: the whole deployment of a stack, without a cluster or Pulumi."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from .plan import Plan
from .scripts import node_scripts
from .term import Block, Table, plain

RANK_HEAD = ("role", "instance", "node", "address", "dp rank", "devices", "port")


def rank_rows(plan: Plan) -> list[tuple[str, ...]]:
    return [(r.role, f"{r.role}-{r.instance}", r.node, r.address, f"{r.dp_rank}/{r.dp_size}", r.visible_devices,
             str(r.port)) for r in plan.ranks]


def rank_table(plan: Plan) -> str:
    return plain([Table(RANK_HEAD, rank_rows(plan))])


def summary_blocks(plan: Plan) -> list[Block]:
    pre, dec = plan.ranks_of("prefill"), plan.ranks_of("decode")
    p = plan.proxy
    return [
        f"stack {plan.stack}: {len(plan.nodes)} nodes ({plan.cfg.hardware}, {plan.cfg.npus} NPUs each), "
        f"{len(plan.ranks)} ranks ({len(pre)} prefill, {len(dec)} decode) in {len(plan.instances)} DP instances",
        "",
        Table(RANK_HEAD, rank_rows(plan)),
        "",
        f"proxy   {p.url}  on {p.node}",
        "  prefillers: " + " ".join(f"{h}:{port}" for h, port in p.prefillers),
        "  decoders:   " + " ".join(f"{h}:{port}" for h, port in p.decoders),
        f"etcd    {plan.etcd.client_url}  on {plan.etcd.node}"
        + (f" (container {plan.etcd.container_name}, image {plan.etcd.image})" if plan.etcd.image else ""),
        "workers " + " ".join(w.address for w in plan.workers),
        *([f"spares  {' '.join(plan.spares)}  (prepared, no ranks: `ascend-pd replan --stack {plan.stack} --without NODE` "
           "puts one in a lost node's place)"] if plan.spares else []),
        *_images(plan),
        *_monitoring(plan),
        "",
        f"deploy  pulumi up --stack {plan.stack} --parallel {plan.up_parallelism}"
        "   (every node's pull and launch at once; a DP group's nodes must launch together)",
    ]


def _images(plan: Plan) -> list[str]:
    """Which nodes run which image, when a role has its own (prefill.image, decode.image)."""
    by_image: dict[str, list[str]] = {}
    for n in plan.nodes:
        by_image.setdefault(n.image, []).append(n.name)
    if len(by_image) < 2 and plan.cfg.container.image in by_image:
        return []
    return [f"image   {image}  on {' '.join(nodes)}" for image, nodes in by_image.items()]


def _monitoring(plan: Plan) -> list[str]:
    """Where Prometheus runs when `pulumi up` deploys it (monitoring.node), and the exporter it scrapes."""
    from .scripts.prometheus import server

    m, srv = plan.cfg.monitoring, server(plan)
    lines = [f"prometheus {srv.url}  on {srv.node} (container {srv.container_name}, image {srv.image})"] if srv else []
    if m.exporter is not None:
        lines.append(f"exporter   http://{m.exporter}/metrics  (run `ascend-pd exporter --stack {plan.stack}` there)")
    return lines


def summary(plan: Plan) -> str:
    return plain(summary_blocks(plan))


def write_scripts(plan: Plan, out: Path, progress: Optional[Callable[[int, int], None]] = None) -> list[Path]:
    """Every node's scripts as <out>/<node>/<NN>-<name>.{create,delete}.sh, in start order."""
    written = []
    for done, node in enumerate(plan.nodes):
        if progress:
            progress(done, len(plan.nodes))
        d = out / node.name
        d.mkdir(parents=True, exist_ok=True)
        for stale in d.glob("*.sh"):
            stale.unlink()
        for n, script in enumerate(node_scripts(plan, node.name)):
            for kind, text in (("create", script.create), ("delete", script.delete)):
                path = d / f"{n:02d}-{script.name}.{kind}.sh"
                path.write_text(text)
                path.chmod(0o755)
                written.append(path)
    if progress:
        progress(len(plan.nodes), len(plan.nodes))
    return written
