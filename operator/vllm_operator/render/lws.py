"""One LeaderWorkerSet for a VLLMService whose plan spans nodes: vLLM's native multi-node mode, no Ray. (Also, with
`size: 1`, for single-node pods that each need a cache claim of their own: `_one_pod_groups`, render/cache.py.)

Each replica is one LWS group of `nodes` pods, one pod per node with all its GPUs (`leaderWorkerTemplate.size` =
nodes). Leader (worker-index 0) and workers run the same `vllm serve` with the same planned flags, plus
`--distributed-executor-backend mp --nnodes $(LWS_GROUP_SIZE) --node-rank <0 | $(LWS_WORKER_INDEX)>
--master-addr $(LWS_LEADER_ADDRESS) --master-port 29501`, and `--headless` on workers: the LWS pod webhook injects
`LWS_*` first in every container's env, so the kubelet expands them in args (lws PR #152). Workers serve no HTTP:
probes are on the leader only, and the Service selects the leader (`worker-index: "0"`). `restartPolicy:
RecreateGroupOnPodRestart`: a rank that dies takes its group with it (the engine cannot lose a rank).

First vLLM release with `--nnodes/--node-rank/--master-addr/--master-port` and the headless multiproc executor:
0.11.1 (read from the wheels: `vllm/engine/arg_utils.py` and `vllm/entrypoints/cli/serve.py` of 0.11.0 have
neither; 0.11.1 has both). The flag table (`catalog/vllm_flags.yaml`) carries the gate.

Pure: builds dicts; nothing here talks to the API.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..api.flags import vllm_cli_flag
from .flags import flag_table
from .manifests import (
    ANNOTATION_PLAN,
    ANNOTATION_SPEC_HASH,
    RenderInput,
    build_cache_pvc,
    build_deployment,
    build_service,
    host_memory_gib,
    spec_hash,
)
from .pods import (
    LWS_GROUP_INDEX_LABEL as LWS_GROUP_INDEX_LABEL,  # re-exported: handlers and tests import them here
)
from .pods import LWS_NAME_LABEL as LWS_NAME_LABEL
from .pods import LWS_WORKER_INDEX_LABEL as LWS_WORKER_INDEX_LABEL
from .pods import WORKLOAD_LABEL, serving_pods
from .pods import lws_name as lws_name  # the LWS name (a DNS-1035 label, as the LWS webhook requires)

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
#: vLLM's layer split override (vllm/distributed/utils.py get_pp_indices); a remediation step may set it.
PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
MASTER_PORT = 29501   # vLLM's ParallelConfig.master_port default
#: The most groups the LWS API takes (`spec.replicas` maximum in its CRD, tests/data/crds); a VLLMService may ask for
#: up to 2^31 - 1 pods, which no cluster runs: the LeaderWorkerSet gets the API's maximum instead of a 422.
MAX_REPLICAS = 1_000_000
MULTINODE_FLAGS = ("nnodes", "node_rank", "master_addr", "master_port", "headless")
#: How to install the engine when its CRD is missing (kubernetes-sigs/lws site/content/en/docs/installation).
LWS_CHART_VERSION = "0.10.0"
LWS_INSTALL_HINT = (f"install LeaderWorkerSet: helm install lws oci://registry.k8s.io/lws/charts/lws "
                    f"--version={LWS_CHART_VERSION} -n lws-system --create-namespace (or kubectl apply "
                    f"--server-side -f https://github.com/kubernetes-sigs/lws/releases/download/"
                    f"v{LWS_CHART_VERSION}/manifests.yaml)")


def multinode_supported(version: str) -> bool:
    """Whether this vLLM release has the native multi-node flags (every one of them)."""
    table = flag_table()
    return all(table.supports(name, version) for name in MULTINODE_FLAGS)


def multinode_unsupported_reason(version: str) -> str:
    table = flag_table()
    missing = [name for name in MULTINODE_FLAGS if not table.supports(name, version)]
    return (f"vLLM {version} has no native multi-node mode ({vllm_cli_flag(missing[0])} and the headless "
            f"multiproc executor arrived in 0.11.1); use an image of vLLM 0.11.1 or newer, or fewer nodes")


def rank_args(*, leader: bool) -> list[str]:
    """The arguments that make one pod a node of the engine (the LWS env expands them)."""
    args = ["--distributed-executor-backend", "mp", "--nnodes", "$(LWS_GROUP_SIZE)",
            "--node-rank", "0" if leader else "$(LWS_WORKER_INDEX)",
            "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", str(MASTER_PORT)]
    if not leader:
        args.append("--headless")
    return args


@dataclass(frozen=True)
class GroupOptions:
    """What every pod of a group gets beyond the single-node pod: the layer split a remediation step chose
    (VLLM_PP_LAYER_PARTITION) and the network passthrough of spec.network (RDMA resources, IPC_LOCK)."""

    layer_partition: str | None = None
    rdma_resources: tuple[tuple[str, int], ...] = ()
    ipc_lock: bool = False


def _with_partition(template: dict[str, Any], container: dict[str, Any], layer_partition: str | None) -> None:
    env = container.setdefault("env", [])
    if layer_partition is None or any(e.get("name") == PARTITION_ENV for e in env):
        return  # vLLM's own split, or a value the user set in spec.env (theirs: never replaced)
    env.append({"name": PARTITION_ENV, "value": layer_partition})  # every rank must split the layers alike
    annotations = template["metadata"]["annotations"]
    # a different layer split is a different pod template: the plan hash says so (the ladder compares it)
    annotations[ANNOTATION_PLAN] = spec_hash({"plan": annotations.get(ANNOTATION_PLAN), PARTITION_ENV: layer_partition})


def _with_network(container: dict[str, Any], group: GroupOptions) -> None:
    resources = container.setdefault("resources", {})
    for name, count in group.rdma_resources:
        for kind in ("requests", "limits"):
            resources.setdefault(kind, {})[name] = str(count)
    if group.ipc_lock:  # RDMA pins memory for its queues (GPUDirect RDMA needs it); everything else stays dropped
        capabilities = container.setdefault("securityContext", {}).setdefault("capabilities", {})
        capabilities["add"] = sorted({*capabilities.get("add", []), "IPC_LOCK"})


def _template(inp: RenderInput, *, leader: bool, group: GroupOptions, spans: bool = True) -> dict[str, Any]:
    template = copy.deepcopy(build_deployment(inp)["spec"]["template"])
    template["metadata"]["labels"].pop(WORKLOAD_LABEL)  # only a Deployment's pods carry it (render/pods.py)
    if not spans:  # a one-pod group: the single-node pod as the Deployment would run it
        return dict(template)
    container = template["spec"]["containers"][0]
    container["args"] = [*container["args"], *rank_args(leader=leader)]
    _with_partition(template, container, group.layer_partition)
    _with_network(container, group)
    if not leader:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            container.pop(probe, None)
        container.pop("ports", None)
        annotations = template["metadata"]["annotations"]
        for key in ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"):
            annotations.pop(key, None)
    return dict(template)


def build_leaderworkerset(inp: RenderInput, nodes: int, group: GroupOptions | None = None) -> dict[str, Any]:
    """The LeaderWorkerSet: `inp.replicas` groups of `nodes` pods, each pod `inp.gpu_count` GPUs (one node);
    `group.layer_partition` (e.g. "64,62") becomes VLLM_PP_LAYER_PARTITION on the leader and every worker."""
    group = group or GroupOptions()
    if nodes < 1 or (nodes == 1 and inp.cache_claim_template is None):
        raise ValueError("a LeaderWorkerSet is rendered for plans that span 2 or more nodes, or for one-pod groups "
                         "that each need a cache claim of their own (render/cache.py)")
    if nodes == 1:
        return _one_pod_groups(inp)
    if inp.memory is None:
        # each node's ranks load only their pipeline stage's layers: host RAM for its share of the weights
        inp = inp.model_copy(update={"memory": f"{host_memory_gib(inp.weights_gib_total / nodes, inp.gpu_count)}Gi"})
    return _group_set(inp, size=nodes, restart_policy="RecreateGroupOnPodRestart",
                      leader=_template(inp, leader=True, group=group), worker=_template(inp, leader=False, group=group))


def _group_set(inp: RenderInput, *, size: int, restart_policy: str, leader: dict[str, Any],
               worker: dict[str, Any]) -> dict[str, Any]:
    """The LeaderWorkerSet around a group's templates: the Deployment's identity (labels, owner) and replica count,
    one group at a time without a surge, and the cache claims per pod when the cache plan has them."""
    meta = build_deployment(inp)["metadata"]
    lws: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": lws_name(inp.name), "namespace": inp.namespace, "labels": dict(meta["labels"]),
                     "annotations": {}, "ownerReferences": list(meta["ownerReferences"])},
        "spec": {
            "replicas": min(max(inp.replicas, 0), MAX_REPLICAS),
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
            "leaderWorkerTemplate": {"size": size, "restartPolicy": restart_policy, "leaderTemplate": leader,
                                     "workerTemplate": worker},
        },
    }
    return _with_claims(inp, lws)


def _with_claims(inp: RenderInput, lws: dict[str, Any]) -> dict[str, Any]:
    if inp.cache_claim_template is not None:
        # a claim per pod (`model-cache-<pod>`): a recreated group's pods find their weights and compiled graphs;
        # kept when groups scale down (they come back warm), deleted with the LeaderWorkerSet (so with the service)
        template = lws["spec"]["leaderWorkerTemplate"]
        template["volumeClaimTemplates"] = [copy.deepcopy(inp.cache_claim_template)]
        template["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Delete", "whenScaled": "Retain"}
    lws["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(lws["spec"])
    return lws


def _one_pod_groups(inp: RenderInput) -> dict[str, Any]:
    """`inp.replicas` groups of one pod each (`size: 1`: the leader only; LWS keeps a 0-replica worker StatefulSet),
    so that each single-node pod gets a claim of its own from `volumeClaimTemplates` where storage is ReadWriteOnce
    only. The pod is the Deployment's pod template (no multi-node arguments: one node serves the whole model)
    without the Deployment-only label. `workerTemplate`, which the API requires, is the same template (no worker
    is ever made from it). `restartPolicy: None`: a failing container restarts in place, as in a Deployment, and its
    pod keeps its claim either way. Rolls one group at a time without a surge (a surge group's new claim would be
    empty, and a ReadWriteOnce claim cannot be shared with the pod it replaces)."""
    template = _template(inp, leader=True, group=GroupOptions(), spans=False)
    return _group_set(inp, size=1, restart_policy="None", leader=template, worker=copy.deepcopy(template))


def build_leader_service(inp: RenderInput) -> dict[str, Any]:
    """The Service of a multi-node VLLMService: it selects the leaders only (workers serve no HTTP)."""
    return build_service(inp, serving_pods(inp.name, inp.namespace, kind="LeaderWorkerSet"))


def build_multinode_children(inp: RenderInput, nodes: int,
                             group: GroupOptions | None = None) -> list[dict[str, Any]]:
    """Every object a multi-node VLLMService owns, in apply order (cache PVC, LeaderWorkerSet, Service)."""
    pvc = build_cache_pvc(inp)
    lws = build_leaderworkerset(inp, nodes, group)
    return ([pvc] if pvc else []) + [lws, build_leader_service(inp)]
