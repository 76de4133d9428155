"""Schemas of the served kinds, and the OpenAPI v2 and v3 documents ``kubectl`` reads.

The built-in kinds' schemas are Kubernetes' own, as packaged by ``kubernetes-validate`` (the definitions of
the newest release it ships, in JSON-schema form): this module only converts them back to OpenAPI and adds
the CRDs' ``openAPIV3Schema``. ``kubectl`` uses the documents for:

* ``kubectl explain`` (``/openapi/v3/<group-version>``, schemas tagged ``x-kubernetes-group-version-kind``);
* deciding that the server validates fields itself (the ``fieldValidation`` query parameter on the PATCH
  operation of the kind), so ``kubectl apply`` sends ``fieldValidation=Strict`` instead of downloading
  ``/openapi/v2`` to validate on the client side; ``/openapi/v2`` is served as well, for older clients;
* the patch strategy of built-in lists (``x-kubernetes-patch-merge-key``) in client-side ``kubectl apply``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import kubernetes_validate

from vllm_operator_sim.emulator_resources import ResourceDef

__all__ = ['OBJECT_META', 'builtin_definitions', 'crd_schema', 'kind_schema_name', 'openapi_v2', 'openapi_v3_doc',
           'openapi_v3_paths', 'resolve']

Schema = dict[str, Any]
OBJECT_META = 'io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta'
_DEFS_REF = '#/$defs/'


@functools.cache
def builtin_definitions() -> dict[str, Schema]:
    """Kubernetes' definitions (``io.k8s.api.apps.v1.Deployment``, …) from the newest release packaged."""
    root = importlib.resources.files(kubernetes_validate).joinpath('kubernetes-json-schema')
    releases = [p.name for p in root.iterdir() if re.fullmatch(r'v\d+\.\d+\.\d+-local', p.name)]
    newest = max(releases, key=lambda n: tuple(int(x) for x in n[1:].split('-')[0].split('.')))
    document = json.loads(root.joinpath(newest, '_definitions.json').read_text())
    defs: dict[str, Schema] = document['$defs']
    return defs


def resolve(schema: Mapping[str, Any] | None, defs: Mapping[str, Schema] | None = None) -> Mapping[str, Any]:
    """Follow a ``$ref`` into the built-in definitions (``{}`` for nothing)."""
    while schema and isinstance(schema.get('$ref'), str) and schema['$ref'].startswith(_DEFS_REF):
        schema = (defs if defs is not None else builtin_definitions()).get(schema['$ref'][len(_DEFS_REF):], {})
    return schema or {}


@functools.cache
def _gvk_index() -> dict[tuple[str, str, str], str]:
    index: dict[tuple[str, str, str], str] = {}
    for name, schema in builtin_definitions().items():
        for gvk in schema.get('x-kubernetes-group-version-kind') or []:
            index.setdefault((gvk.get('group', ''), gvk.get('version', ''), gvk.get('kind', '')), name)
    return index


def kind_schema_name(rdef: ResourceDef) -> str | None:
    """The definition name of a built-in kind (``None`` for CRDs and kinds Kubernetes does not define)."""
    return None if rdef.custom else _gvk_index().get((rdef.group, rdef.version, rdef.kind))


def crd_schema(crd: Mapping[str, Any], version: str) -> Schema | None:
    """A CRD version's ``openAPIV3Schema`` with ``metadata`` as Kubernetes' ObjectMeta (``None`` if it has none)."""
    spec = crd.get('spec') or {}
    for served in spec.get('versions') or []:
        if served.get('name') == version:
            schema = copy.deepcopy((served.get('schema') or {}).get('openAPIV3Schema'))
            if not isinstance(schema, dict):
                return None
            props = schema.setdefault('properties', {})
            props['metadata'] = {'$ref': _DEFS_REF + OBJECT_META}
            props.setdefault('apiVersion', {'type': 'string'})
            props.setdefault('kind', {'type': 'string'})
            schema['x-kubernetes-group-version-kind'] = [
                {'group': spec.get('group', ''), 'version': version, 'kind': (spec.get('names') or {}).get('kind')}]
            return schema
    return None


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, Mapping):
        ref = schema.get('$ref')
        if isinstance(ref, str) and ref.startswith(_DEFS_REF):
            yield ref[len(_DEFS_REF):]
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


def _closure(roots: Mapping[str, Schema]) -> dict[str, Schema]:
    """The named schemas plus every built-in definition they reach."""
    defs = builtin_definitions()
    result = dict(roots)
    todo = [ref for schema in roots.values() for ref in _refs(schema)]
    while todo:
        name = todo.pop()
        if name not in result and name in defs:
            result[name] = defs[name]
            todo.extend(_refs(defs[name]))
    return result


def _to_openapi(schema: Any, ref_prefix: str) -> Any:
    """JSON-schema flavour → OpenAPI: single types, refs under ``ref_prefix``, int-or-string as Kubernetes writes it."""
    if isinstance(schema, list):
        return [_to_openapi(item, ref_prefix) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    one_of = schema.get('oneOf')
    if isinstance(one_of, list) and sorted(str(resolve(s).get('type')) for s in one_of) == [
            "['integer', 'null']", "['string', 'null']"]:
        return {'type': 'string', 'format': 'int-or-string', 'x-kubernetes-int-or-string': True,
                **{k: v for k, v in schema.items() if k == 'description'}}
    out: Schema = {}
    for key, value in schema.items():
        if key == '$ref' and isinstance(value, str) and value.startswith(_DEFS_REF):
            out[key] = ref_prefix + value[len(_DEFS_REF):]
        elif key == 'type' and isinstance(value, list):
            types = [t for t in value if t != 'null']
            if types:
                out[key] = types[0]
        else:
            out[key] = _to_openapi(value, ref_prefix)
    return out


def _kind_schemas(resources: Iterable[ResourceDef], crds: Mapping[tuple[str, str], Mapping[str, Any]]
                  ) -> dict[str, Schema]:
    """Root schema per served kind: built-ins by definition name, CRD kinds as ``<reversed group>.<version>.<Kind>``."""
    roots: dict[str, Schema] = {}
    defs = builtin_definitions()
    for rdef in resources:
        if rdef.custom:
            crd = crds.get(rdef.storage_key)
            schema = crd_schema(crd, rdef.version) if crd is not None else None
            if schema is not None:
                roots['.'.join(reversed(rdef.group.split('.'))) + f'.{rdef.version}.{rdef.kind}'] = schema
        elif (name := kind_schema_name(rdef)) is not None:
            roots[name] = defs[name]
    return roots


def _params(names: Iterable[str]) -> list[Schema]:
    return [{'name': name, 'in': 'query', 'schema': {'type': 'string'}, 'type': 'string', 'uniqueItems': True}
            for name in names]


_WRITE_PARAMS = ('dryRun', 'fieldManager', 'fieldValidation')


def _paths(rdef: ResourceDef, schema_name: str | None, ref_prefix: str) -> dict[str, Any]:
    """Paths of one resource, with the operations' GVK extension and the write parameters."""
    base = f'/apis/{rdef.group}/{rdef.version}' if rdef.group else f'/api/{rdef.version}'
    scope = f'{base}/namespaces/{{namespace}}/{rdef.plural}' if rdef.namespaced else f'{base}/{rdef.plural}'
    gvk = {'group': rdef.group, 'version': rdef.version, 'kind': rdef.kind}
    body = {'$ref': ref_prefix + schema_name} if schema_name else {'type': 'object'}

    def op(action: str, params: Iterable[str] = ()) -> Schema:
        return {'operationId': f'{action}{rdef.kind}', 'x-kubernetes-action': action,
                'x-kubernetes-group-version-kind': gvk, 'parameters': _params(params),
                'responses': {'200': {'description': 'OK', 'schema': body,
                                      'content': {'application/json': {'schema': body}}}}}

    return {
        scope: {'get': op('list', ('labelSelector', 'fieldSelector', 'watch')), 'post': op('post', _WRITE_PARAMS),
                'delete': op('deletecollection', ('dryRun',))},
        f'{scope}/{{name}}': {'get': op('get'), 'put': op('put', _WRITE_PARAMS),
                              'patch': op('patch', (*_WRITE_PARAMS, 'force')), 'delete': op('delete', ('dryRun',))},
    }


def openapi_v2(resources: Iterable[ResourceDef], crds: Mapping[tuple[str, str], Mapping[str, Any]]) -> Schema:
    """The Swagger 2.0 document served at ``/openapi/v2``."""
    resources = list(resources)
    roots = _kind_schemas(resources, crds)
    by_kind = {(g['group'], g['version'], g['kind']): name for name, s in roots.items()
               for g in s.get('x-kubernetes-group-version-kind') or []}
    paths: dict[str, Any] = {}
    for rdef in resources:
        paths.update(_paths(rdef, by_kind.get((rdef.group, rdef.version, rdef.kind)), '#/definitions/'))
    return {'swagger': '2.0', 'info': {'title': 'Kubernetes (emulated)', 'version': 'v1.32.0'}, 'paths': paths,
            'definitions': _to_openapi(_closure(roots), '#/definitions/')}


def _gv_path(rdef: ResourceDef) -> str:
    return f'apis/{rdef.group}/{rdef.version}' if rdef.group else f'api/{rdef.version}'


def openapi_v3_doc(resources: Iterable[ResourceDef], crds: Mapping[tuple[str, str], Mapping[str, Any]],
                   group_version: str) -> Schema | None:
    """The OpenAPI 3.0 document of one group version (``apis/apps/v1``), or ``None`` if it is not served."""
    served = [r for r in resources if _gv_path(r) == group_version]
    if not served:
        return None
    roots = _kind_schemas(served, crds)
    by_kind = {(g['group'], g['version'], g['kind']): name for name, s in roots.items()
               for g in s.get('x-kubernetes-group-version-kind') or []}
    paths: dict[str, Any] = {}
    for rdef in served:
        paths.update(_paths(rdef, by_kind.get((rdef.group, rdef.version, rdef.kind)), '#/components/schemas/'))
    return {'openapi': '3.0.0', 'info': {'title': 'Kubernetes (emulated)', 'version': 'v1.32.0'}, 'paths': paths,
            'components': {'schemas': _to_openapi(_closure(roots), '#/components/schemas/')}}


def openapi_v3_paths(resources: Iterable[ResourceDef], crds: Mapping[tuple[str, str], Mapping[str, Any]]
                     ) -> Schema:
    """The ``/openapi/v3`` discovery document: one entry per group version, with a content hash."""
    resources = list(resources)
    paths = {}
    for gv in sorted({_gv_path(r) for r in resources}):
        doc = openapi_v3_doc(resources, crds, gv)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        paths[gv] = {'serverRelativeURL': f'/openapi/v3/{gv}?hash={digest}'}
    return {'paths': paths}
