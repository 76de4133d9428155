"""Resource definitions served by the emulator: built-ins, CRD-derived ones, and discovery documents."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ['BUILTIN_RESOURCES', 'ResourceDef', 'api_resource_list', 'api_group_list', 'from_crd']

ALL_VERBS = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')


@dataclasses.dataclass(frozen=True)
class ResourceDef:
    """One served resource in one group version (as in an ``APIResourceList`` entry)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ''
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    #: Served subresources among ``status``, ``scale``, ``log``.
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ALL_VERBS
    #: Served from a CustomResourceDefinition: no strategic-merge patches, as in the real API.
    custom: bool = False
    #: Paths of the scale subresource (dotted, as in a CRD's ``subresources.scale``).
    spec_replicas_path: str = '.spec.replicas'
    status_replicas_path: str = '.status.replicas'
    label_selector_path: str | None = None
    #: A CRD's ``additionalPrinterColumns`` (for ``kubectl get`` tables).
    printer_columns: tuple[Mapping[str, Any], ...] = ()

    @property
    def api_version(self) -> str:
        return f'{self.group}/{self.version}' if self.group else self.version

    @property
    def storage_key(self) -> tuple[str, str]:
        """Objects are stored per group and plural, shared by all versions of a resource."""
        return self.group, self.plural

    @property
    def qualified(self) -> str:
        """``deployments.apps`` or ``pods``, as in the real API's error messages."""
        return f'{self.plural}.{self.group}' if self.group else self.plural

    def names(self) -> set[str]:
        """All names that identify this resource in the direct Python API."""
        names = {self.plural, self.kind, self.kind.lower(), self.singular, self.qualified,
                 f'{self.api_version}/{self.plural}', *self.short_names}
        return {name for name in names if name}


def _builtin(api_version: str, plural: str, kind: str, *, namespaced: bool = True,
             short: Iterable[str] = (), sub: Iterable[str] = ()) -> ResourceDef:
    group, _, version = api_version.rpartition('/')
    return ResourceDef(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced,
                       singular=kind.lower(), short_names=tuple(short), subresources=frozenset(sub))


BUILTIN_RESOURCES: tuple[ResourceDef, ...] = (
    _builtin('v1', 'namespaces', 'Namespace', namespaced=False, short=['ns'], sub=['status']),
    _builtin('v1', 'pods', 'Pod', short=['po'], sub=['status', 'log']),
    _builtin('v1', 'services', 'Service', short=['svc'], sub=['status']),
    _builtin('v1', 'events', 'Event', short=['ev']),
    _builtin('v1', 'configmaps', 'ConfigMap', short=['cm']),
    _builtin('v1', 'secrets', 'Secret'),
    _builtin('v1', 'nodes', 'Node', namespaced=False, short=['no'], sub=['status']),
    _builtin('v1', 'serviceaccounts', 'ServiceAccount', short=['sa']),
    _builtin('v1', 'persistentvolumeclaims', 'PersistentVolumeClaim', short=['pvc'], sub=['status']),
    _builtin('apps/v1', 'deployments', 'Deployment', short=['deploy'], sub=['status', 'scale']),
    _builtin('apps/v1', 'replicasets', 'ReplicaSet', short=['rs'], sub=['status', 'scale']),
    _builtin('apps/v1', 'daemonsets', 'DaemonSet', short=['ds'], sub=['status']),
    _builtin('apps/v1', 'statefulsets', 'StatefulSet', short=['sts'], sub=['status', 'scale']),
    _builtin('apps/v1', 'controllerrevisions', 'ControllerRevision'),
    _builtin('storage.k8s.io/v1', 'storageclasses', 'StorageClass', namespaced=False, short=['sc']),
    _builtin('autoscaling/v2', 'horizontalpodautoscalers', 'HorizontalPodAutoscaler', short=['hpa'], sub=['status']),
    _builtin('events.k8s.io/v1', 'events', 'Event', short=['ev']),
    _builtin('coordination.k8s.io/v1', 'leases', 'Lease'),
    _builtin('apiextensions.k8s.io/v1', 'customresourcedefinitions', 'CustomResourceDefinition',
             namespaced=False, short=['crd', 'crds'], sub=['status']),
    _builtin('kopf.dev/v1', 'clusterkopfpeerings', 'ClusterKopfPeering', namespaced=False),
    _builtin('kopf.dev/v1', 'kopfpeerings', 'KopfPeering'),
)


def from_crd(crd: Mapping[str, Any]) -> list[ResourceDef]:
    """The resources that a ``CustomResourceDefinition`` (apiextensions.k8s.io/v1) serves."""
    spec = crd.get('spec') or {}
    names = spec.get('names') or {}
    result = []
    for version in spec.get('versions') or []:
        if not version.get('served', True):
            continue
        subs = version.get('subresources') or {}
        scale = subs.get('scale') or {}
        result.append(ResourceDef(
            group=spec.get('group', ''), version=version['name'], plural=names.get('plural', ''),
            kind=names.get('kind', ''), namespaced=spec.get('scope', 'Namespaced') == 'Namespaced',
            singular=names.get('singular') or names.get('kind', '').lower(),
            short_names=tuple(names.get('shortNames') or ()), categories=tuple(names.get('categories') or ()),
            subresources=frozenset(k for k in ('status', 'scale') if k in subs), custom=True,
            spec_replicas_path=scale.get('specReplicasPath', '.spec.replicas'),
            status_replicas_path=scale.get('statusReplicasPath', '.status.replicas'),
            label_selector_path=scale.get('labelSelectorPath'),
            printer_columns=tuple(version.get('additionalPrinterColumns') or ()),
        ))
    return result


def _subresource_entry(rdef: ResourceDef, sub: str) -> dict[str, Any]:
    entry: dict[str, Any] = {'name': f'{rdef.plural}/{sub}', 'singularName': '', 'namespaced': rdef.namespaced,
                             'kind': rdef.kind, 'verbs': ['get', 'patch', 'update']}
    if sub == 'scale':
        entry.update(group='autoscaling', version='v1', kind='Scale')
    elif sub == 'log':
        entry.update(kind='Pod', verbs=['get'])
    return entry


def api_resource_list(api_version: str, resources: Iterable[ResourceDef]) -> dict[str, Any]:
    """The ``APIResourceList`` served at ``/api/v1`` or ``/apis/{group}/{version}``."""
    entries: list[dict[str, Any]] = []
    for rdef in sorted(resources, key=lambda r: r.plural):
        entries.append({
            'name': rdef.plural, 'singularName': rdef.singular, 'namespaced': rdef.namespaced,
            'kind': rdef.kind, 'verbs': list(rdef.verbs), 'shortNames': list(rdef.short_names),
            'categories': list(rdef.categories),
        })
        entries.extend(_subresource_entry(rdef, sub) for sub in sorted(rdef.subresources))
    return {'kind': 'APIResourceList', 'apiVersion': 'v1', 'groupVersion': api_version, 'resources': entries}


def api_group(group: str, versions: list[str]) -> dict[str, Any]:
    """The ``APIGroup`` served at ``/apis/{group}`` (and listed in ``/apis``)."""
    listed = [{'groupVersion': f'{group}/{v}', 'version': v} for v in versions]
    return {'kind': 'APIGroup', 'apiVersion': 'v1', 'name': group, 'versions': listed,
            'preferredVersion': listed[0]}


def api_group_list(resources: Iterable[ResourceDef]) -> dict[str, Any]:
    """The ``APIGroupList`` served at ``/apis``: every non-core group with its versions."""
    groups: dict[str, list[str]] = {}
    for rdef in resources:
        if rdef.group and rdef.version not in groups.setdefault(rdef.group, []):
            groups[rdef.group].append(rdef.version)
    return {'kind': 'APIGroupList', 'apiVersion': 'v1',
            'groups': [api_group(group, versions) for group, versions in sorted(groups.items())]}
