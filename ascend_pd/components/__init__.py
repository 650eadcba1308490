"""The resource layer: one thin ComponentResource per concept, wired by `cluster.deploy`.

Components take slices of the plan and the scripts rendered from it (ascend_pd.scripts) and add
only transport (SSH, docker exec), providers, dependencies and lifecycle options.
"""

from .cluster import deploy
from .etcd_single import EtcdSingle
from .host_firewall import HostFirewall
from .hugepage_host import HugepageHost
from .npu_container import NpuContainer
from .pd_proxy import PdProxy
from .preflight import NodePreflight
from .prometheus_server import PrometheusServer
from .vllm_dp_group import VllmDpGroup
from .yuanrong_worker import YuanrongWorker

__all__ = ["deploy", "EtcdSingle", "HostFirewall", "HugepageHost", "NodePreflight", "NpuContainer", "PdProxy", "PrometheusServer", "VllmDpGroup",
           "YuanrongWorker"]
