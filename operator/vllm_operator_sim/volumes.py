"""Claims, their binding and which node their volume is attached to, as Kubernetes does it (PersistentVolume-less).

The simulated kubelet (kubelet.py) asks this module three things: may a pod be scheduled (its claims exist and are
bound, or bind when it is scheduled), onto which nodes (a node-local volume only where it lives), and may its
volumes be attached to its node (a ReadWriteOnce network volume is attached to one node at a time). What the real
cluster shows, this shows:

* **Storage classes** are of three kinds, decided from the class as a cluster admin would read it:
  a *shared file system* (NFS, CephFS, EFS, …: the classes render/cache.py `read_write_many_class` recognises, by
  provisioner or the `vllm-operator.dev/access-mode: ReadWriteMany` annotation) gives ReadWriteMany claims and needs
  no attach; a *node-local* class (local-path, OpenEBS LocalPV, TopoLVM, `NODE_LOCAL_PROVISIONER`) gives a volume on
  one node (the PersistentVolume's node affinity); any other class is *network block storage* (EBS, PD, Ceph RBD,
  `NETWORK_PROVISIONER`, the simulated cluster's default): ReadWriteOnce volumes the attach/detach controller
  attaches to the node of the pod that uses them. No zones are modelled: a network volume reaches every node.
* **Binding** (the PersistentVolume controller and the external provisioner): a claim with no `storageClassName`
  gets the default class's name (retroactive default class assignment, Kubernetes 1.28+); a class with
  `volumeBindingMode: Immediate` binds the claim at once, `WaitForFirstConsumer` when the scheduler places its first
  pod (`volume.kubernetes.io/selected-node`, and the `WaitForFirstConsumer` Event until then). A bound claim shows
  what the API shows: `spec.volumeName` `pvc-<uid>`, the annotations `pv.kubernetes.io/bind-completed`,
  `pv.kubernetes.io/bound-by-controller`, `volume.kubernetes.io/storage-provisioner` (and the beta one),
  `status.phase: Bound`, `status.accessModes` and `status.capacity.storage` (the request); the provisioner's
  `ProvisioningSucceeded` Event. A claim no class can serve stays Pending with the real Event: `FailedBinding` (no
  class), `ProvisioningFailed` (the class does not exist, or ReadWriteMany/ReadOnlyMany asked of a class that gives
  only ReadWriteOnce).
* **Scheduling** (the scheduler's VolumeBinding and VolumeRestrictions plugins): a pod whose claim is missing, or
  unbound with Immediate binding, stays Pending (`persistentvolumeclaim "x" not found`, `pod has unbound immediate
  PersistentVolumeClaims`); a node-local volume's pod fits only its node (`node(s) had volume node affinity
  conflict`); a ReadWriteOncePod claim used by another pod refuses the pod. ReadWriteOnce is *not* a scheduling
  constraint (as on a cluster): a second pod on another node is scheduled, then cannot attach.
* **Attach** (the attach/detach controller): a network ReadWriteOnce volume is attached to one node; a pod on another
  node stays `ContainerCreating` with the `FailedAttachVolume` Warning ("Multi-Attach error for volume "pvc-…" Volume
  is already used by pod(s) a, b") and, after two minutes, the kubelet's `FailedMount` Warning, until no pod on the
  first node uses the volume; then it is detached there and attached to the waiting pod's node
  (`SuccessfulAttachVolume`, "AttachVolume.Attach succeeded for volume "pvc-…""). Pods on one node share a
  ReadWriteOnce volume. Attach and detach take no simulated time beyond the pod's own creation.

Not modelled: PersistentVolume objects, zones, the `kubernetes.io/pvc-protection` finalizer (a claim in use is
deleted at once), volume expansion, snapshots/data sources, the detach delay of an unhealthy node, and ReadWriteOnce
on a shared file system (not enforced there, as on most such drivers: pods anywhere mount it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllm_operator.render.cache import read_write_many_class

__all__ = ["NETWORK_PROVISIONER", "NODE_LOCAL_PROVISIONER", "ClaimInfo", "Volumes", "storage_kind"]

#: The simulated cluster's default class: network block storage, attached to one node at a time.
NETWORK_PROVISIONER = "sim.vllm-operator.dev/network-block"
#: A simulated node-local class (a volume on the disk of the node its first pod ran on).
NODE_LOCAL_PROVISIONER = "sim.vllm-operator.dev/node-local"
#: Provisioners of node-local volumes (PersistentVolumes with node affinity), by exact name.
NODE_LOCAL_PROVISIONERS = frozenset({NODE_LOCAL_PROVISIONER, "rancher.io/local-path", "openebs.io/local",
                                     "local.csi.openebs.io", "topolvm.io", "lvm.csi.metal-stack.io",
                                     "kubernetes.io/no-provisioner"})
NETWORK, SHARED, LOCAL = "network", "shared", "local"
RWO, RWOP, RWX, ROX = "ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
WAIT = "WaitForFirstConsumer"
PV_CONTROLLER = "persistentvolume-controller"
AD_CONTROLLER = "attachdetach-controller"


def storage_kind(storage_class: Mapping[str, Any]) -> str:
    """`shared` (a file system every node mounts: ReadWriteMany), `local` (a node's disk) or `network` (block
    storage attached to one node at a time)."""
    provisioner = str(storage_class.get("provisioner") or "")
    if read_write_many_class([storage_class]) is not None:
        return SHARED
    return LOCAL if provisioner in NODE_LOCAL_PROVISIONERS else NETWORK


class _API(Protocol):
    def list_objects(self, resource: str, namespace: str | None = None, *, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]: ...
    def patch_object(self, resource: str, name: str, patch: Any, namespace: str | None = None, *,
                     patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]: ...


#: (involved object, type, reason, message, component): posts a core/v1 Event.
EventSink = Callable[[Mapping[str, Any], str, str, str, str], None]


@dataclass
class ClaimInfo:
    """What the binder knows of one claim (refreshed from the API on every `sync`)."""

    namespace: str
    name: str
    uid: str
    bound: bool
    volume: str                     # `pvc-<uid>`, the volume's name in Events
    kind: str | None                # the class's kind once known (network, shared, local)
    modes: tuple[str, ...]
    wait_for_consumer: bool = False
    provisionable: bool = True      # a class that can give it exists
    node: str | None = None         # a node-local volume: the node it lives on

    @property
    def attachable(self) -> bool:
        """A network volume one node at a time: ReadWriteOnce (or ReadWriteOncePod) without ReadWriteMany."""
        return self.bound and self.kind == NETWORK and RWX not in self.modes


@dataclass
class Volumes:
    """The claims' binder, the scheduler's volume checks and the attach/detach controller (module docstring)."""

    api: _API
    event: EventSink
    claims: dict[tuple[str, str], ClaimInfo] = field(default_factory=dict)   # (namespace, name) → info
    attached: dict[str, str] = field(default_factory=dict)                    # volume → node
    _local_nodes: dict[str, str] = field(default_factory=dict)                # volume → node (node-local, bound)
    _said: set[tuple[str, str]] = field(default_factory=set)                  # (claim uid, Event reason) posted

    # --- binding -------------------------------------------------------------------------------------------

    def sync(self, nodes: Sequence[str]) -> None:
        """Read the claims and classes; bind what binds now (Immediate), name the default class where none is
        set, and say why a claim cannot bind (once per claim and reason)."""
        classes = {str((c.get("metadata") or {}).get("name") or ""): c for c in self.api.list_objects("storageclasses")}
        default = next((name for name, c in sorted(classes.items()) if str(
            ((c.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CLASS, "")).lower() == "true"), None)
        seen: dict[tuple[str, str], ClaimInfo] = {}
        for claim in self.api.list_objects("persistentvolumeclaims"):
            info = self._sync_claim(claim, classes, default, nodes)
            seen[info.namespace, info.name] = info
        self.claims = seen
        live = {info.volume for info in seen.values()}
        self.attached = {volume: node for volume, node in self.attached.items() if volume in live}
        self._local_nodes = {volume: node for volume, node in self._local_nodes.items() if volume in live}

    def _sync_claim(self, claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], default: str | None,
                    nodes: Sequence[str]) -> ClaimInfo:
        meta, spec = claim.get("metadata") or {}, claim.get("spec") or {}
        namespace, name, uid = str(meta.get("namespace") or "default"), str(meta.get("name")), str(meta.get("uid"))
        annotations = meta.get("annotations") or {}
        modes = tuple(str(m) for m in spec.get("accessModes") or [RWO])
        volume = str(spec.get("volumeName") or f"pvc-{uid}")
        class_name = spec.get("storageClassName")
        storage_class = classes.get(str(class_name)) if class_name else None
        kind = storage_kind(storage_class) if storage_class is not None else None
        info = ClaimInfo(namespace, name, uid, bound=(claim.get("status") or {}).get("phase") == "Bound",
                         volume=volume, kind=kind, modes=modes)
        if info.bound:
            info.node = (self._local_nodes.get(volume) or annotations.get(SELECTED_NODE)) if kind == LOCAL else None
            if kind is None:  # bound before this binder saw it (a test's object): network storage
                info.kind = NETWORK
            return info
        if meta.get("deletionTimestamp"):
            return info
        if class_name is None and default is not None:  # retroactive default StorageClass assignment
            self.api.patch_object("persistentvolumeclaims", name, {"spec": {"storageClassName": default}}, namespace)
            class_name, storage_class = default, classes.get(default)
            info.kind = kind = storage_kind(storage_class) if storage_class is not None else None
        if not class_name:
            info.provisionable = False
            self._say(claim, "Normal", "FailedBinding",
                      "no persistent volumes available for this claim and no storage class is set", PV_CONTROLLER)
            return info
        if storage_class is None:
            info.provisionable = False
            self._say(claim, "Warning", "ProvisioningFailed", f'storageclass.storage.k8s.io "{class_name}" not found',
                      PV_CONTROLLER)
            return info
        if kind != SHARED and (RWX in modes or ROX in modes):
            info.provisionable = False
            self._say(claim, "Warning", "ProvisioningFailed",
                      f'failed to provision volume with StorageClass "{class_name}": rpc error: code = InvalidArgument'
                      f' desc = Volume capabilities {", ".join(m for m in modes if m in (RWX, ROX))} not supported '
                      f"(the class gives ReadWriteOnce volumes only)",
                      str(storage_class.get("provisioner") or PV_CONTROLLER))
            return info
        info.wait_for_consumer = storage_class.get("volumeBindingMode") == WAIT
        if info.wait_for_consumer:
            selected = annotations.get(SELECTED_NODE)
            if selected:  # the scheduler chose a node and then lost the binding (a restart): bind it now
                self._bind(claim, info, storage_class, str(selected))
            else:
                self._say(claim, "Normal", "WaitForFirstConsumer",
                          "waiting for first consumer to be created before binding", PV_CONTROLLER)
            return info
        self._bind(claim, info, storage_class, sorted(nodes)[0] if kind == LOCAL and nodes else None)
        return info

    def _bind(self, claim: Mapping[str, Any], info: ClaimInfo, storage_class: Mapping[str, Any],
              node: str | None) -> None:
        """Provision and bind: the claim as the API shows a bound one."""
        spec = claim.get("spec") or {}
        provisioner = str(storage_class.get("provisioner") or "")
        annotations = {"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes",
                       "volume.beta.kubernetes.io/storage-provisioner": provisioner,
                       "volume.kubernetes.io/storage-provisioner": provisioner}
        if info.wait_for_consumer and node:
            annotations[SELECTED_NODE] = node
        self.api.patch_object("persistentvolumeclaims", info.name, {"metadata": {"annotations": annotations},
                                                                     "spec": {"volumeName": info.volume}},
                              info.namespace)
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
        status: dict[str, Any] = {"phase": "Bound", "accessModes": list(info.modes)}
        if storage is not None:
            status["capacity"] = {"storage": storage}
        self.api.patch_object("persistentvolumeclaims", info.name, {"status": status}, info.namespace,
                              subresource="status")
        info.bound = True
        if info.kind == LOCAL and node:
            info.node = self._local_nodes[info.volume] = node
        self._say(claim, "Normal", "ProvisioningSucceeded", f"Successfully provisioned volume {info.volume}",
                  f"{provisioner}_sim" if provisioner else PV_CONTROLLER)

    def _say(self, claim: Mapping[str, Any], kind: str, reason: str, message: str, component: str) -> None:
        meta = claim.get("metadata") or {}
        key = (str(meta.get("uid")), reason)
        if key in self._said:
            return
        self._said.add(key)
        self.event({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": meta.get("name", ""),
                    "namespace": meta.get("namespace", "default"), "uid": meta.get("uid", "")},
                   kind, reason, message, component)

    # --- scheduling ----------------------------------------------------------------------------------------

    def refusal(self, namespace: str, claims: Iterable[str], others: Callable[[str], Sequence[str]]) -> str | None:
        """Why no node can take a pod with these claims (the scheduler's PreFilter), or None. `others(claim)`: the
        other pods that use the claim."""
        for claim in claims:
            info = self.claims.get((namespace, claim))
            if info is None:
                return f'persistentvolumeclaim "{claim}" not found'
            if not info.bound and (not info.wait_for_consumer or not info.provisionable):
                return "pod has unbound immediate PersistentVolumeClaims"
            if RWOP in info.modes and others(claim):
                return "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
        return None

    def reachable(self, namespace: str, claims: Iterable[str], node: str) -> bool:
        """Whether every volume of the pod can be used on the node (a bound node-local one only on its own)."""
        for claim in claims:
            info = self.claims.get((namespace, claim))
            if info is not None and info.kind == LOCAL and info.bound and info.node and info.node != node:
                return False
        return True

    def bind_for(self, namespace: str, claims: Iterable[str], node: str) -> None:
        """The scheduler placed a pod on `node`: its WaitForFirstConsumer claims bind there."""
        waiting = [self.claims[namespace, c] for c in claims
                   if (namespace, c) in self.claims and not self.claims[namespace, c].bound]
        if not waiting:
            return
        classes = {str((c.get("metadata") or {}).get("name") or ""): c for c in self.api.list_objects("storageclasses")}
        for info in waiting:
            found = self.api.list_objects("persistentvolumeclaims", namespace, field_selector=f"metadata.name={info.name}")
            if not found:
                continue
            claim = found[0]
            storage_class = classes.get(str((claim.get("spec") or {}).get("storageClassName") or ""))
            if storage_class is not None and info.wait_for_consumer and info.provisionable:
                self._bind(claim, info, storage_class, node)

    # --- attach / detach -----------------------------------------------------------------------------------

    def attach(self, namespace: str, claim: str, node: str, users: Mapping[str, Sequence[str]],
               pod: Mapping[str, Any]) -> bool:
        """Attach the claim's volume to `node` for `pod` (its involvedObject); False while a pod on another node
        uses it (the Multi-Attach error, posted once per pod), or while the claim is missing or unbound (the kubelet
        waits for it). `users`: node → the names of the other pods that use the claim there."""
        info = self.claims.get((namespace, claim))
        if info is None or not info.bound:
            return False
        if not info.attachable:
            return True
        current = self.attached.get(info.volume)
        if current is not None and current != node and users.get(current):
            blocking = sorted(users[current])
            if (str(pod.get("uid")), f"multi-attach:{info.volume}") not in self._said:
                self._said.add((str(pod.get("uid")), f"multi-attach:{info.volume}"))
                self.event(pod, "Warning", "FailedAttachVolume",
                           f'Multi-Attach error for volume "{info.volume}" Volume is already used by pod(s) '
                           f"{', '.join(blocking)}", AD_CONTROLLER)
            return False
        if current != node:
            self.attached[info.volume] = node
            self.event(pod, "Normal", "SuccessfulAttachVolume",
                       f'AttachVolume.Attach succeeded for volume "{info.volume}"', AD_CONTROLLER)
        return True

    def detach_unused(self, in_use: set[tuple[str, str]]) -> None:
        """Detach every volume no pod on its node uses any more (`in_use`: (volume, node) pairs)."""
        self.attached = {volume: node for volume, node in self.attached.items() if (volume, node) in in_use}

    def volume_of(self, namespace: str, claim: str) -> str | None:
        info = self.claims.get((namespace, claim))
        return info.volume if info is not None else None
