"""The shell around share groups (issue 26): observe a member's group once per reconcile — every VLLMService of the
namespace naming the same `spec.gpu.share.group`, their models, how the cluster can share a GPU (DRA's API and
device class, time-sliced single-GPU nodes), and the group's record — for the pure `sharegroup.decide`."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from ..render.manifests import child_names
from ..render.sharing import DRA_DEVICE_CLASS, HOSTNAME_LABEL, sharing_support
from ..sharegroup import MAX_MEMBERS, ShareObserved, member_from, record_name
from . import kube
from .observe import list_gpu_nodes, load_model

#: How long one answer about DRA (API served, device classes) is trusted (seconds).
RECHECK_SECONDS = 30.0
_cache: dict[int, tuple[float, bool, tuple[str, ...]]] = {}
_lock = threading.Lock()


def _group_of(spec: Mapping[str, Any]) -> str | None:
    share = (spec.get("gpu") or {}).get("share") if isinstance(spec.get("gpu"), Mapping) else None
    group = share.get("group") if isinstance(share, Mapping) else None
    return group if isinstance(group, str) and 0 < len(group) <= 63 else None


def dra_support(max_age: float = RECHECK_SECONDS) -> tuple[bool, tuple[str, ...]]:
    """Whether resource.k8s.io/v1 resourceclaims is served, and the DeviceClasses (from an answer ≤ max_age old)."""
    key = id(kube.client())
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
    if hit is not None and now - hit[0] < max_age:
        return hit[1], hit[2]
    with kube.api_errors("discover the DRA API"):
        served = kube.serves(kube.RESOURCECLAIMS)
        classes: tuple[str, ...] = ()
        if served:
            classes = tuple(str((c.get("metadata") or {}).get("name")) for c in kube.list_objects(kube.DEVICECLASSES))
    with _lock:
        _cache[key] = (now, served, classes)
    return served, classes


def observe_share(name: str, namespace: str, spec: Mapping[str, Any]) -> ShareObserved | None:
    """The group `spec` names, as observed now; None without spec.gpu.share, or when this service is alone in it."""
    group = _group_of(spec)
    if group is None:
        return None
    with kube.api_errors("list the share group"):
        services = kube.list_objects(kube.VLLMSERVICES, namespace)
    same = sorted((s for s in services if _group_of(s.get("spec") or {}) == group
                   and not (s.get("metadata") or {}).get("deletionTimestamp")),
                  key=lambda s: str((s.get("metadata") or {}).get("name")))
    if len(same) < 2:
        return None
    members = []
    for index, service in enumerate(same):
        meta = service.get("metadata") or {}
        member_spec = dict(service.get("spec") or {})
        member = str(meta.get("name"))
        if index >= MAX_MEMBERS:  # not planned (bounded work): it is told so, its model is not read
            members.append(member_from(member, str(meta.get("uid") or ""), member_spec, None, None))
            continue
        files, _ = load_model(member_spec, namespace)
        with kube.api_errors(f"read Deployment {member}"):
            deployment = kube.get(kube.DEPLOYMENTS, namespace, child_names(member).deployment)
        members.append(member_from(member, str(meta.get("uid") or ""), member_spec, deployment, files,
                                   dict(service.get("status") or {})))
    served, classes = dra_support()
    selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    nodes = [(labels.get(HOSTNAME_LABEL, ""), labels) for labels in list_gpu_nodes(selector)
             if labels.get(HOSTNAME_LABEL)]
    # every time-sliced single-GPU node the service's nodeSelector admits (the reconcile resolves the product)
    support = sharing_support(dra_served=served, device_classes=classes if DRA_DEVICE_CLASS in classes else (),
                              nodes=nodes)
    with kube.api_errors("read the share group's record"):
        record = kube.get(kube.CONFIGMAPS, namespace, record_name(group))
    return ShareObserved(group=group, members=tuple(members), support=support,
                         recorded=(record or {}).get("data"))


def group_members(namespace: str, group: str) -> list[tuple[str, int]]:
    """(name, generation) of every VLLMService of `namespace` in share group `group`."""
    with kube.api_errors("list the share group"):
        services = kube.list_objects(kube.VLLMSERVICES, namespace)
    return sorted((str((s.get("metadata") or {}).get("name")), int((s.get("metadata") or {}).get("generation") or 1))
                  for s in services if _group_of(s.get("spec") or {}) == group
                  and not (s.get("metadata") or {}).get("deletionTimestamp"))[:MAX_MEMBERS]


def group_of(spec: Mapping[str, Any]) -> str | None:
    return _group_of(spec)
