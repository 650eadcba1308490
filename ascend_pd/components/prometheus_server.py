"""PrometheusServer: Prometheus on `monitoring.node`, with the configuration generated from the plan."""

from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from ascend_pd.plan import NodePlan
from ascend_pd.scripts.prometheus import CONTAINER_CONFIG, CONTAINER_DATA, PROMETHEUS_UID, Server
from ascend_pd.shell import Script, on_host

from .npu_container import ADDRESS_LABEL, RESTART_POLICY, NpuContainer
from .pd_proxy import PdProxy
from .transport import _aliases


class PrometheusServer(pulumi.ComponentResource):
    """Prometheus for the stack on one of its nodes, in a container of its own, scraping every rank
    and etcd with the recording rules and alerts of `ascend_pd/monitoring.py`. It goes in after the
    proxy: nothing of the serving path waits for it, and a failed pull or a taken port cannot stop a
    deploy before the cluster serves.

    Per: stack, when `monitoring.node` is set
    Runs: on `monitoring.node`'s host: the generated prometheus.yml, rules and targets written to
      `<monitoring.dir>/config`, the TSDB in `<monitoring.dir>/data`; `monitoring.image` (kept on
      destroy) as the container `monitoring.containerName` (host network, the config read-only at
      /etc/prometheus, the data at /prometheus, restart `unless-stopped`); a changed configuration is
      written again and reloaded (`POST /-/reload`), the container stays. Destroy removes the container
      and the configuration; the data stays

    Resources (all `<node>-prometheus-*`, on that node):
    * `-config`: host Command writing the files (ascend_pd/scripts/prometheus.py). Its triggers hold
      the files' sha256: a changed rule or target set is a replacement (old delete first, which keeps
      the files while the container mounts the directory; the new create rewrites them in place).
    * `-image`, `-container`: pulumi-docker through the node's docker provider (the NPU container's).
      No input of the container derives from the configuration (it only waits for `-config`), so a
      new configuration never replaces it; a new image or other settings do (delete first: the name
      is fixed).
    * `-reload`: host Command; triggers the files' sha256 and the container's id. After a new
      configuration it makes the running Prometheus load it; after a new container it is its health
      gate (/-/ready). A POST to /-/reload rather than a SIGHUP (`docker kill -s HUP`): the POST
      answers once the configuration is loaded, with Prometheus' error when it is not, so a rule
      Prometheus refuses fails `pulumi up` on that step instead of only in the container's log.
    """

    config: remote.Command
    image: docker.RemoteImage
    container: docker.Container
    reload: remote.Command
    url: str

    def __init__(
        self,
        name: str,
        *,
        server: Server,
        node: NodePlan,
        npu: NpuContainer,
        proxy: PdProxy,
        conn: remote.ConnectionArgs,
        config: Script,
        reload: Script,
        digest: str,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("ascend-pd:index:PrometheusServer", name, None, opts)
        for script in (config, reload):
            if script.where != "host" or script.node != server.node:
                raise ValueError(f"{script.name} on {script.node} ({script.where}): not a host script of {server.node}")
        self.url = server.url
        # After the proxy, and after this node's NPU container (so after its preflight gate: nothing
        # is done on a node before its preflight passed, even where the proxy does not wait for it).
        after_proxy = [proxy.command, npu.container]
        n = node.name

        def host(cmd: str, script: Script, triggers: list, depends_on: list) -> remote.Command:
            return remote.Command(
                f"{n}-{cmd}",
                connection=conn,
                create=on_host(script.create),
                delete=on_host(script.delete),
                triggers=triggers,
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=depends_on,
                    # One fixed directory: a create-before-delete replacement would run the old
                    # delete after the new create.
                    delete_before_replace=True,
                    aliases=_aliases(node.names_of(cmd))),
            )

        self.config = host("prometheus-config", config, [node.address, *config.identity, digest], after_proxy)
        on_node = pulumi.ResourceOptions(parent=self, provider=npu.provider)
        self.image = docker.RemoteImage(
            f"{n}-prometheus-image", name=server.image,
            keep_locally=True,  # like the NPU image: destroy leaves it on the node
            opts=pulumi.ResourceOptions.merge(on_node, pulumi.ResourceOptions(
                depends_on=after_proxy, aliases=_aliases(node.names_of("prometheus-image")))))
        self.container = docker.Container(
            f"{n}-prometheus-container",
            name=server.container_name,
            image=self.image.image_id,
            network_mode="host",
            command=list(server.args),
            # The user the TSDB directory belongs to (the config script chowns it): nobody, as the
            # Prometheus images declare, but explicit so that a mirrored image cannot differ.
            user=f"{PROMETHEUS_UID}:{PROMETHEUS_UID}",
            volumes=[
                docker.ContainerVolumeArgs(host_path=server.config_dir, container_path=CONTAINER_CONFIG,
                                           read_only=True),
                docker.ContainerVolumeArgs(host_path=server.data_dir, container_path=CONTAINER_DATA,
                                           read_only=False),
            ],
            # A readdressed node is another machine: a new container there (as the NPU container's).
            labels=[docker.ContainerLabelArgs(label=ADDRESS_LABEL, value=node.address)],
            restart=RESTART_POLICY,
            must_run=True,
            opts=pulumi.ResourceOptions.merge(on_node, pulumi.ResourceOptions(
                # Order only: no input derives from the configuration, so a new one never replaces it.
                depends_on=[self.config],
                # The name is fixed: the old container must be gone before the new one is created.
                delete_before_replace=True,
                aliases=_aliases(node.names_of("prometheus-container")))),
        )
        self.reload = host("prometheus-reload", reload, [digest, self.container.id], [self.container, self.config])
        self.register_outputs({
            "node": server.node,
            "url": server.url,
            "image": server.image,
            "configSha256": digest,
            "containerId": self.container.id,
            "stdout": self.reload.stdout,
        })
