"""The emulated Kubernetes API, exercised over real HTTP on loopback by the kubernetes client, kubectl and kopf."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from vllm_operator_sim.emulator import AccessRecord, APIError, EmulatedAPIServer, KubeEmulator
from vllm_operator_sim.emulator_patches import json_patch, merge_patch, strategic_merge_patch
from vllm_operator_sim.emulator_selectors import parse_field_selector, parse_label_selector

GROUP, VERSION, PLURAL = 'example.com', 'v1', 'widgets'
SMP = 'application/strategic-merge-patch+json'
MERGE = 'application/merge-patch+json'
JSONPATCH = 'application/json-patch+json'


def _crd(plural: str = PLURAL, kind: str = 'Widget', scope: str = 'Namespaced', scale: bool = True) -> dict[str, Any]:
    subresources: dict[str, Any] = {'status': {}}
    if scale:
        subresources['scale'] = {'specReplicasPath': '.spec.replicas', 'statusReplicasPath': '.status.replicas'}
    return {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.{GROUP}'},
        'spec': {'group': GROUP, 'scope': scope,
                 'names': {'plural': plural, 'singular': kind.lower(), 'kind': kind, 'shortNames': [plural[:2]]},
                 'versions': [{'name': VERSION, 'served': True, 'storage': True, 'subresources': subresources,
                               'schema': {'openAPIV3Schema': {'type': 'object',
                                                              'x-kubernetes-preserve-unknown-fields': True}}}]}}


def _deployment(name: str = 'web', **labels: str) -> dict[str, Any]:
    return {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': name, 'labels': labels or {'app': name}},
            'spec': {'replicas': 1, 'selector': {'matchLabels': {'app': name}},
                     'template': {'metadata': {'labels': {'app': name}}, 'spec': {'containers': [
                         {'name': 'main', 'image': 'img:1', 'env': [{'name': 'A', 'value': '1'}]},
                         {'name': 'side', 'image': 'side:1'}]}}}}


@pytest.fixture
def api(emulator: EmulatedAPIServer) -> kubernetes.client.ApiClient:
    """A kubernetes client configured from the emulator's kubeconfig (no global configuration)."""
    client = kubernetes.config.new_client_from_config(config_file=str(emulator.kubeconfig_path))
    yield client
    client.close()


def _http(emulator: EmulatedAPIServer, path: str, method: str = 'GET', body: Any = None,
          content_type: str = 'application/json') -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(emulator.url + path, data=data, method=method,
                                     headers={'Content-Type': content_type})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            raw = response.read().decode()
            code = response.status
    except urllib.error.HTTPError as e:
        raw, code = e.read().decode(), e.code
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


# --- the kubernetes client: CRUD, patches, conflicts ----------------------------------------------

def test_deployment_crud_versions_and_errors(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    apps = kubernetes.client.AppsV1Api(api)
    created = apps.create_namespaced_deployment('default', _deployment())
    assert len(created.metadata.uid) == 36 and created.metadata.generation == 1
    assert created.metadata.creation_timestamp is not None
    rv1 = int(created.metadata.resource_version)

    with pytest.raises(ApiException) as exc:
        apps.create_namespaced_deployment('default', _deployment())
    assert exc.value.status == 409 and json.loads(exc.value.body)['reason'] == 'AlreadyExists'

    merged = apps.patch_namespaced_deployment('web', 'default', {'spec': {'replicas': 3}}, _content_type=MERGE)
    assert merged.spec.replicas == 3 and merged.metadata.generation == 2
    assert int(merged.metadata.resource_version) > rv1
    labelled = apps.patch_namespaced_deployment('web', 'default', {'metadata': {'labels': {'x': 'y'}}},
                                                _content_type=MERGE)
    assert labelled.metadata.generation == 2 and labelled.metadata.labels == {'app': 'web', 'x': 'y'}
    same = apps.patch_namespaced_deployment('web', 'default', {'metadata': {'labels': {'x': 'y'}}},
                                            _content_type=MERGE)
    assert same.metadata.resource_version == labelled.metadata.resource_version  # no-op: no new version

    strategic = apps.patch_namespaced_deployment('web', 'default', {'spec': {'template': {'spec': {'containers': [
        {'name': 'main', 'image': 'img:2', 'env': [{'name': 'B', 'value': '2'}]}]}}}}, _content_type=SMP)
    containers = strategic.spec.template.spec.containers
    assert [(c.name, c.image) for c in containers] == [('main', 'img:2'), ('side', 'side:1')]
    assert [(e.name, e.value) for e in containers[0].env] == [('A', '1'), ('B', '2')]
    assert strategic.metadata.generation == 3

    patched = apps.patch_namespaced_deployment('web', 'default', [
        {'op': 'test', 'path': '/spec/replicas', 'value': 3},
        {'op': 'replace', 'path': '/spec/replicas', 'value': 5}], _content_type=JSONPATCH)
    assert patched.spec.replicas == 5
    with pytest.raises(ApiException) as exc:
        apps.patch_namespaced_deployment('web', 'default', [{'op': 'test', 'path': '/spec/replicas', 'value': 1}],
                                         _content_type=JSONPATCH)
    assert exc.value.status == 422

    body = apps.read_namespaced_deployment('web', 'default')
    body.spec.replicas = 2
    replaced = apps.replace_namespaced_deployment('web', 'default', body)
    assert replaced.spec.replicas == 2 and replaced.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as exc:
        apps.replace_namespaced_deployment('web', 'default', body)  # body's resourceVersion is stale now
    assert exc.value.status == 409 and json.loads(exc.value.body)['reason'] == 'Conflict'
    with pytest.raises(ApiException) as exc:
        apps.patch_namespaced_deployment('web', 'default', {'metadata': {'resourceVersion': '1'}},
                                         _content_type=MERGE)
    assert exc.value.status == 409

    listed = apps.list_namespaced_deployment('default')
    assert [d.metadata.name for d in listed.items] == ['web'] and listed.kind == 'DeploymentList'
    assert int(listed.metadata.resource_version) >= int(replaced.metadata.resource_version)

    apps.delete_namespaced_deployment('web', 'default')
    with pytest.raises(ApiException) as exc:
        apps.read_namespaced_deployment('web', 'default')
    status = json.loads(exc.value.body)
    assert exc.value.status == 404
    assert status | {'details': None} == {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                                          'reason': 'NotFound', 'code': 404, 'details': None,
                                          'message': 'deployments.apps "web" not found'}


def test_configmap_crud_and_generate_name(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    cm = core.create_namespaced_config_map('apps', {'metadata': {'generateName': 'cfg-'}, 'data': {'a': '1'}})
    name = cm.metadata.name
    assert name.startswith('cfg-') and len(name) == len('cfg-') + 5
    assert emulator.get_object('namespaces', 'apps') is not None  # auto-created namespace
    core.patch_namespaced_config_map(name, 'apps', {'data': {'b': '2', 'a': None}}, _content_type=MERGE)
    core.patch_namespaced_config_map(name, 'apps', {'data': {'c': '3'}}, _content_type=SMP)
    core.patch_namespaced_config_map(name, 'apps', [{'op': 'add', 'path': '/data/d', 'value': '4'}],
                                     _content_type=JSONPATCH)
    fresh = core.read_namespaced_config_map(name, 'apps')
    assert fresh.data == {'b': '2', 'c': '3', 'd': '4'}
    fresh.data = {'z': '26'}
    assert core.replace_namespaced_config_map(name, 'apps', fresh).data == {'z': '26'}
    core.delete_namespaced_config_map(name, 'apps')
    assert core.list_namespaced_config_map('apps').items == []
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map(name, 'apps')
    assert exc.value.status == 404


def test_status_and_scale_subresources_of_deployments(emulator: EmulatedAPIServer,
                                                       api: kubernetes.client.ApiClient) -> None:
    apps = kubernetes.client.AppsV1Api(api)
    body = _deployment() | {'status': {'replicas': 9}}
    assert apps.create_namespaced_deployment('default', body).status.replicas is None  # status dropped on create
    main = apps.patch_namespaced_deployment('web', 'default', {'status': {'readyReplicas': 1}}, _content_type=MERGE)
    assert main.status.ready_replicas is None  # the main resource ignores .status
    status = apps.patch_namespaced_deployment_status('web', 'default', {'status': {'readyReplicas': 1},
                                                                        'spec': {'replicas': 7}}, _content_type=MERGE)
    assert status.status.ready_replicas == 1 and status.spec.replicas == 1 and status.metadata.generation == 1

    scale = apps.read_namespaced_deployment_scale('web', 'default')
    assert scale.spec.replicas == 1 and scale.status.selector == 'app=web'
    scaled = apps.patch_namespaced_deployment_scale('web', 'default', {'spec': {'replicas': 4}}, _content_type=MERGE)
    assert scaled.spec.replicas == 4
    fresh = apps.read_namespaced_deployment('web', 'default')
    assert fresh.spec.replicas == 4 and fresh.metadata.generation == 2
    assert AccessRecord('patch', 'apps', 'deployments', 'scale', 'default') in emulator.accessed()
    assert AccessRecord('patch', 'apps', 'deployments', 'status', 'default') in emulator.accessed()


# --- CRDs registered at run time -------------------------------------------------------------------

def test_crd_registration_and_custom_objects(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    ext = kubernetes.client.ApiextensionsV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    crd = ext.create_custom_resource_definition(_crd())
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions['Established'] == 'True'

    code, resources = _http(emulator, f'/apis/{GROUP}/{VERSION}')
    assert code == 200
    names = {r['name']: r for r in resources['resources']}
    assert set(names) == {'widgets', 'widgets/status', 'widgets/scale'}
    assert names['widgets']['namespaced'] is True and 'watch' in names['widgets']['verbs']
    assert names['widgets']['shortNames'] == ['wi']
    assert GROUP in {g['name'] for g in _http(emulator, '/apis')[1]['groups']}

    obj = {'apiVersion': f'{GROUP}/{VERSION}', 'kind': 'Widget', 'metadata': {'name': 'w1'},
           'spec': {'replicas': 1}, 'status': {'phase': 'Ignored'}}
    created = custom.create_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, obj)
    assert 'status' not in created and created['metadata']['generation'] == 1
    patched = custom.patch_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, 'w1',
                                                    {'spec': {'replicas': 2}, 'status': {'phase': 'X'}})
    assert patched['spec']['replicas'] == 2 and 'status' not in patched and patched['metadata']['generation'] == 2
    status = custom.patch_namespaced_custom_object_status(GROUP, VERSION, 'default', PLURAL, 'w1',
                                                          {'status': {'phase': 'Ready', 'replicas': 2}})
    assert status['status'] == {'phase': 'Ready', 'replicas': 2} and status['metadata']['generation'] == 2
    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, 'default', PLURAL, 'w1')
    assert scale['spec']['replicas'] == 2 and scale['status']['replicas'] == 2
    custom.patch_namespaced_custom_object_scale(GROUP, VERSION, 'default', PLURAL, 'w1', {'spec': {'replicas': 6}})
    assert emulator.get_object(PLURAL, 'w1')['spec']['replicas'] == 6

    code, error = _http(emulator, f'/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/w1', 'PATCH',
                        {'spec': {'x': 1}}, SMP)
    assert code == 415 and error['reason'] == 'UnsupportedMediaType'  # as the real API does for CRs

    ext.create_custom_resource_definition(_crd('gadgets', 'Gadget', scope='Cluster', scale=False))
    gadget = custom.create_cluster_custom_object(GROUP, VERSION, 'gadgets', {'metadata': {'name': 'g1'}})
    assert 'namespace' not in gadget['metadata']
    assert [g['metadata']['name'] for g in custom.list_cluster_custom_object(GROUP, VERSION, 'gadgets')['items']] \
        == ['g1']
    assert _http(emulator, f'/apis/{GROUP}/{VERSION}/namespaces/default/gadgets')[0] == 404

    ext.delete_custom_resource_definition(f'{PLURAL}.{GROUP}')
    assert _http(emulator, f'/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}')[0] == 404
    assert 'widgets' not in {r['name'] for r in _http(emulator, f'/apis/{GROUP}/{VERSION}')[1]['resources']}
    with pytest.raises(KeyError):
        emulator.resolve(PLURAL)


# --- watches and selectors -------------------------------------------------------------------------

def _watch(func: Callable[..., Any], *args: Any, count: int, **kwargs: Any) -> list[tuple[str, str]]:
    """Collect ``count`` events (or fewer, if the server ends the stream first) as (type, name)."""
    events: list[tuple[str, str]] = []
    watch = kubernetes.watch.Watch()
    for event in watch.stream(func, *args, **kwargs):
        events.append((event['type'], event['object'].metadata.name))
        if len(events) >= count:
            watch.stop()
    return events


def test_watch_resume_from_resource_version(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_config_map('default', {'metadata': {'name': 'a'}})
    rv = core.list_namespaced_config_map('default').metadata.resource_version
    core.create_namespaced_config_map('default', {'metadata': {'name': 'b'}})
    core.patch_namespaced_config_map('a', 'default', {'data': {'k': 'v'}})
    core.delete_namespaced_config_map('b', 'default')

    resumed = _watch(core.list_namespaced_config_map, 'default', resource_version=rv, count=3, timeout_seconds=5)
    assert resumed == [('ADDED', 'b'), ('MODIFIED', 'a'), ('DELETED', 'b')]
    fresh = _watch(core.list_namespaced_config_map, 'default', count=1, timeout_seconds=5)
    assert fresh == [('ADDED', 'a')]  # no resourceVersion: the current state

    live: list[tuple[str, str]] = []
    watcher = threading.Thread(target=lambda: live.extend(_watch(core.list_namespaced_config_map, 'default',
                                                                 count=2, timeout_seconds=5)))
    watcher.start()
    emulator.wait_for(lambda: any(w.key == ('', 'configmaps') for w in emulator.emulator._watchers))
    emulator.create_object('configmaps', {'metadata': {'name': 'c'}})
    watcher.join(10)
    assert live == [('ADDED', 'a'), ('ADDED', 'c')]

    ended = _watch(core.list_namespaced_config_map, 'default', resource_version=str(emulator.resource_version),
                   count=99, timeout_seconds=1)
    assert ended == []  # timeoutSeconds ends the stream


def test_watch_expired_resource_version_is_410() -> None:
    with EmulatedAPIServer(KubeEmulator(history_size=2)) as server:
        for name in 'abcd':
            server.create_object('configmaps', {'metadata': {'name': name}})
        code, event = _http(server, '/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1')
        assert code == 200  # a single ERROR event, then the end of the stream
        assert event['type'] == 'ERROR' and event['object']['code'] == 410 and event['object']['reason'] == 'Expired'


async def test_stopping_the_server_ends_open_watches() -> None:
    async with EmulatedAPIServer() as server:
        watching = asyncio.create_task(asyncio.to_thread(_http, server, '/api/v1/configmaps?watch=true'))
        await server.await_for(lambda: server.emulator._watchers, timeout=5)
        server.create_object('configmaps', {'metadata': {'name': 'a'}})
    code, event = await asyncio.wait_for(watching, 5)
    assert code == 200 and event['type'] == 'ADDED' and event['object']['metadata']['name'] == 'a'


def test_label_and_field_selectors(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    pods = {'p1': ({'app': 'a', 'tier': 'web'}, 'n1'), 'p2': ({'app': 'b'}, 'n2'), 'p3': ({'app': 'c', 'tier': 'db'}, '')}
    for name, (labels, node) in pods.items():
        spec: dict[str, Any] = {'containers': [{'name': 'c', 'image': 'i'}]} | ({'nodeName': node} if node else {})
        core.create_namespaced_pod('default', {'metadata': {'name': name, 'labels': labels}, 'spec': spec})
    emulator.patch_status('pods', 'p1', {'phase': 'Running'})

    def names(**kwargs: Any) -> list[str]:
        return [p.metadata.name for p in core.list_pod_for_all_namespaces(**kwargs).items]

    assert names(label_selector='app=a') == ['p1']
    assert names(label_selector='app==b') == ['p2']
    assert names(label_selector='app!=a') == ['p2', 'p3']
    assert names(label_selector='app in (a, c)') == ['p1', 'p3']
    assert names(label_selector='app notin (a,c),!tier') == ['p2']
    assert names(label_selector='tier') == ['p1', 'p3']
    assert names(label_selector='tier,app in (a,b)') == ['p1']
    assert names(field_selector='metadata.name=p2') == ['p2']
    assert names(field_selector='status.phase=Running') == ['p1']
    assert names(field_selector='status.phase!=Running,metadata.namespace=default') == ['p2', 'p3']
    assert names(field_selector='spec.nodeName=') == ['p3']
    assert names(field_selector='spec.nodeName=n2') == ['p2']
    with pytest.raises(ApiException) as exc:
        names(label_selector='app in a')
    assert exc.value.status == 400

    rv = core.list_namespaced_pod('default').metadata.resource_version
    emulator.patch_object('pods', 'p2', {'metadata': {'labels': {'app': 'a'}}})  # enters the selection
    emulator.patch_object('pods', 'p1', {'metadata': {'labels': {'app': 'z'}}})  # leaves the selection
    emulator.patch_object('pods', 'p3', {'metadata': {'labels': {'x': 'y'}}})  # never in it
    events = _watch(core.list_namespaced_pod, 'default', label_selector='app=a', resource_version=rv, count=2,
                    timeout_seconds=5)
    assert events == [('ADDED', 'p2'), ('DELETED', 'p1')]
    events = _watch(core.list_namespaced_pod, 'default', field_selector='metadata.name=p3', count=1, timeout_seconds=5)
    assert events == [('ADDED', 'p3')]


# --- deletion: finalizers and garbage collection ---------------------------------------------------

def test_finalizers_deletion_timestamp_and_gc(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
    owner = apps.create_namespaced_deployment('default', _deployment() | {'metadata': {
        'name': 'web', 'finalizers': ['example.com/cleanup']}})
    ref = {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'name': 'web', 'uid': owner.metadata.uid}
    other = core.create_namespaced_config_map('default', {'metadata': {'name': 'other-owner'}})
    other_ref = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 'other-owner', 'uid': other.metadata.uid}
    core.create_namespaced_config_map('default', {'metadata': {'name': 'owned', 'ownerReferences': [ref]}})
    core.create_namespaced_config_map('default', {'metadata': {'name': 'shared', 'ownerReferences': [ref, other_ref]}})
    core.create_namespaced_config_map('default', {'metadata': {
        'name': 'guarded', 'ownerReferences': [ref], 'finalizers': ['example.com/keep']}})

    apps.delete_namespaced_deployment('web', 'default')
    deleting = apps.read_namespaced_deployment('web', 'default')
    assert deleting.metadata.deletion_timestamp is not None
    assert emulator.get_object('configmaps', 'owned') is not None  # not collected while the owner is there
    with pytest.raises(ApiException) as exc:
        apps.patch_namespaced_deployment('web', 'default', {'metadata': {'finalizers': ['a', 'example.com/cleanup']}},
                                         _content_type=MERGE)
    assert exc.value.status == 422  # no new finalizers on a deleted object

    rv = deleting.metadata.resource_version
    apps.patch_namespaced_deployment('web', 'default', [
        {'op': 'test', 'path': '/metadata/resourceVersion', 'value': rv},
        {'op': 'remove', 'path': '/metadata/finalizers/0'}], _content_type=JSONPATCH)
    assert emulator.get_object('deployments', 'web') is None
    assert emulator.get_object('configmaps', 'owned') is None
    assert emulator.get_object('configmaps', 'shared')['metadata']['ownerReferences'] == [other_ref]
    guarded = emulator.get_object('configmaps', 'guarded')
    assert guarded['metadata']['deletionTimestamp']
    events = _watch(apps.list_namespaced_deployment, 'default', resource_version=rv, count=2, timeout_seconds=5)
    assert events == [('MODIFIED', 'web'), ('DELETED', 'web')]

    emulator.patch_object('configmaps', 'guarded', {'metadata': {'finalizers': None}})
    assert emulator.get_object('configmaps', 'guarded') is None

    core.create_namespaced_config_map('default', {'metadata': {'name': 'orphan', 'ownerReferences': [other_ref]}})
    core.delete_namespaced_config_map('other-owner', 'default', propagation_policy='Orphan')
    assert emulator.get_object('configmaps', 'orphan') is not None

    for name in ('x1', 'x2'):
        emulator.create_object('configmaps', {'metadata': {'name': name, 'labels': {'batch': 'x'}}})
    core.delete_collection_namespaced_config_map('default', label_selector='batch=x')
    assert [c['metadata']['name'] for c in emulator.list_objects('configmaps')] == ['orphan', 'shared']


# --- namespaces, discovery, logs, events, access log, direct API ------------------------------------

def test_namespaces_and_discovery(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    names = [ns.metadata.name for ns in core.list_namespace().items]
    assert {'default', 'kube-system'} <= set(names)
    assert core.read_namespace('default').status.phase == 'Active'
    assert _http(emulator, '/api')[1]['versions'] == ['v1']
    groups = {g['name']: g['preferredVersion']['version'] for g in _http(emulator, '/apis')[1]['groups']}
    assert groups == {'apps': 'v1', 'events.k8s.io': 'v1', 'coordination.k8s.io': 'v1',
                      'apiextensions.k8s.io': 'v1', 'kopf.dev': 'v1', 'storage.k8s.io': 'v1', 'autoscaling': 'v2'}
    core_resources = {r['name']: r for r in _http(emulator, '/api/v1')[1]['resources']}
    assert {'namespaces', 'pods', 'pods/log', 'pods/status', 'services', 'events', 'configmaps', 'secrets', 'nodes',
            'serviceaccounts', 'persistentvolumeclaims'} <= set(core_resources)
    assert core_resources['namespaces']['namespaced'] is False
    apps_resources = {r['name'] for r in _http(emulator, '/apis/apps/v1')[1]['resources']}
    assert {'deployments', 'deployments/status', 'deployments/scale', 'replicasets'} <= apps_resources
    kopf_resources = {r['name']: r['namespaced'] for r in _http(emulator, '/apis/kopf.dev/v1')[1]['resources']}
    assert kopf_resources == {'clusterkopfpeerings': False, 'kopfpeerings': True}
    assert _http(emulator, '/apis/nonexistent.io/v1')[0] == 404

    core.create_namespace({'metadata': {'name': 'doomed'}})
    core.create_namespaced_config_map('doomed', {'metadata': {'name': 'c'}})
    core.delete_namespace('doomed')
    assert emulator.list_objects('configmaps', 'doomed') == []


def test_pod_logs_and_events(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_pod('default', {'metadata': {'name': 'p'}, 'spec': {'containers': [{'name': 'c',
                                                                                                'image': 'i'}]}})
    assert core.read_namespaced_pod('p', 'default').status.phase == 'Pending'
    assert core.read_namespaced_pod_log('p', 'default') == ''
    emulator.set_pod_log('default', 'p', 'one\ntwo\nthree\n')
    assert core.read_namespaced_pod_log('p', 'default') == 'one\ntwo\nthree\n'
    assert core.read_namespaced_pod_log('p', 'default', tail_lines=2) == 'two\nthree\n'
    assert core.read_namespaced_pod_log('p', 'default', limit_bytes=5) == 'one\nt'
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log('absent', 'default')
    assert exc.value.status == 404

    core.create_namespaced_event('default', {'metadata': {'generateName': 'p.'}, 'reason': 'Started',
                                             'involvedObject': {'kind': 'Pod', 'name': 'p'}, 'message': 'hi'})
    assert [e.reason for e in core.list_namespaced_event('default').items] == ['Started']
    events_api = kubernetes.client.EventsV1Api(api)
    events_api.create_namespaced_event('default', {'metadata': {'name': 'e1'}, 'reason': 'Scaled',
                                                   'eventTime': '2024-01-01T00:00:00.000000Z',
                                                   'reportingController': 'x', 'reportingInstance': 'y',
                                                   'action': 'Scale'})
    assert [e.reason for e in events_api.list_event_for_all_namespaces().items] == ['Scaled']


def test_access_log_records_rbac_verbs(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_config_map('default', {'metadata': {'name': 'a'}})
    core.read_namespaced_config_map('a', 'default')
    core.list_config_map_for_all_namespaces()
    _watch(core.list_namespaced_config_map, 'default', count=1, timeout_seconds=5)
    core.replace_namespaced_config_map('a', 'default', {'metadata': {'name': 'a'}})
    core.patch_namespaced_config_map('a', 'default', {'data': {}})
    core.delete_namespaced_config_map('a', 'default')
    core.delete_collection_namespaced_config_map('default')
    _http(emulator, '/apis/apps/v1')  # discovery is not a resource request
    assert [(r.verb, r.namespace) for r in emulator.access_log] == [
        ('create', 'default'), ('get', 'default'), ('list', None), ('watch', 'default'), ('update', 'default'),
        ('patch', 'default'), ('delete', 'default'), ('deletecollection', 'default')]
    assert {(r.group, r.resource, r.subresource) for r in emulator.access_log} == {('', 'configmaps', None)}


def test_direct_api_from_threads_and_wait_for(emulator: EmulatedAPIServer) -> None:
    def writer(prefix: str) -> None:
        for i in range(20):
            emulator.create_object('configmaps', {'metadata': {'name': f'{prefix}{i}'}})
    threads = [threading.Thread(target=writer, args=(prefix,)) for prefix in 'cd']
    for thread in threads:
        thread.start()
    items = emulator.wait_for(lambda: len(emulator.list_objects('configmaps')) == 40 and emulator.list_objects(
        'configmaps'), timeout=5)
    assert len({i['metadata']['uid'] for i in items}) == len({i['metadata']['resourceVersion'] for i in items}) == 40
    for thread in threads:
        thread.join()
    with pytest.raises(TimeoutError):
        emulator.wait_for(lambda: emulator.get_object('configmaps', 'never'), timeout=0.2)
    with pytest.raises(APIError) as exc:
        emulator.create_object('configmaps', {'metadata': {'name': 'c1'}})
    assert exc.value.code == 409
    stale = emulator.get_object('configmaps', 'c1')
    emulator.patch_object('configmaps', 'c1', {'data': {'k': 'v'}})
    with pytest.raises(APIError) as exc:
        emulator.replace_object('configmaps', stale)
    assert exc.value.code == 409
    assert emulator.delete_object('configmaps', 'absent') is None

    async def main() -> dict[str, Any]:
        return await emulator.await_for(lambda: emulator.get_object('cm', 'c1'), timeout=1)
    assert asyncio.run(main())['data'] == {'k': 'v'}


def test_kmock_reactions_override_responses(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient) -> None:
    emulator.emulator['get /api/v1/namespaces/default/configmaps/broken'] << 503
    core = kubernetes.client.CoreV1Api(api)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map('broken', 'default')
    assert exc.value.status == 503
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map('other', 'default')
    assert exc.value.status == 404  # everything else is still emulated


def test_patch_helpers() -> None:
    assert merge_patch({'a': {'b': 1, 'c': 2}, 'l': [1]}, {'a': {'b': None, 'd': 3}, 'l': [2]}) == \
        {'a': {'c': 2, 'd': 3}, 'l': [2]}
    assert json_patch({'a': [1, 2]}, [{'op': 'add', 'path': '/a/-', 'value': 3}, {'op': 'move', 'from': '/a/0',
                                                                                  'path': '/b'}]) == {'a': [2, 3], 'b': 1}
    base = {'metadata': {'finalizers': ['x'], 'ownerReferences': [{'uid': '1', 'name': 'a'}]},
            'status': {'conditions': [{'type': 'Ready', 'status': 'False'}, {'type': 'Other', 'status': 'True'}]},
            'spec': {'containers': [{'name': 'a', 'ports': [{'containerPort': 80}]}, {'name': 'b'}],
                     'tolerations': [{'key': 'a'}]}}
    patched = strategic_merge_patch(base, {
        'metadata': {'finalizers': ['y'], 'ownerReferences': [{'uid': '2', 'name': 'b'}],
                     '$deleteFromPrimitiveList/finalizers': ['x']},
        'status': {'conditions': [{'type': 'Ready', 'status': 'True'}]},
        'spec': {'$setElementOrder/containers': [{'name': 'a'}, {'name': 'b'}],
                 'containers': [{'name': 'b', '$patch': 'delete'}, {'name': 'a', 'ports': [{'containerPort': 81}]}],
                 'tolerations': [{'key': 'b'}]}})
    assert patched['metadata'] == {'finalizers': ['y'], 'ownerReferences': [{'uid': '1', 'name': 'a'},
                                                                            {'uid': '2', 'name': 'b'}]}
    assert patched['status']['conditions'] == [{'type': 'Ready', 'status': 'True'}, {'type': 'Other', 'status': 'True'}]
    assert patched['spec'] == {'containers': [{'name': 'a', 'ports': [{'containerPort': 80}, {'containerPort': 81}]}],
                               'tolerations': [{'key': 'b'}]}
    assert parse_label_selector('a in (x,y),!b')({'a': 'y'}) and not parse_label_selector('a notin (x)')({'a': 'x'})
    assert parse_field_selector('spec.nodeName=')({'spec': {}})


# --- kubectl ---------------------------------------------------------------------------------------

@pytest.fixture
def kubectl(emulator: EmulatedAPIServer, tmp_path: Path) -> Callable[..., str]:
    """Run the real kubectl against the emulator; skipped where there is no kubectl binary."""
    binary = shutil.which('kubectl')
    if binary is None:
        pytest.skip('no kubectl on PATH')
    env = dict(os.environ, KUBECACHEDIR=str(tmp_path / 'kubecache'), KUBECONFIG=str(emulator.kubeconfig_path))

    def run(*args: str, check: bool = True) -> str:
        result = subprocess.run([binary, '--kubeconfig', str(emulator.kubeconfig_path), *args], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise AssertionError(f'kubectl {" ".join(args)} failed: {result.stderr}')
        return result.stdout + result.stderr
    return run


def test_kubectl_crd_and_custom_objects(emulator: EmulatedAPIServer, kubectl: Callable[..., str],
                                        tmp_path: Path) -> None:
    crd = _crd()
    crd['spec']['versions'][0]['additionalPrinterColumns'] = [
        {'name': 'Phase', 'type': 'string', 'jsonPath': '.status.phase'}]
    (tmp_path / 'crd.yaml').write_text(json.dumps(crd))
    (tmp_path / 'w.yaml').write_text(json.dumps({'apiVersion': f'{GROUP}/{VERSION}', 'kind': 'Widget',
                                                 'metadata': {'name': 'w1', 'namespace': 'default'},
                                                 'spec': {'replicas': 1}}))
    assert 'created' in kubectl('apply', '-f', 'crd.yaml', '--validate=false')
    assert 'condition met' in kubectl('wait', '--for', 'condition=established', f'crd/{PLURAL}.{GROUP}',
                                      '--timeout=10s')
    assert 'created' in kubectl('apply', '-f', 'w.yaml', '--validate=false')
    assert 'unchanged' in kubectl('apply', '-f', 'w.yaml', '--validate=false')
    emulator.patch_status(PLURAL, 'w1', {'phase': 'Ready'})
    listed = json.loads(kubectl('get', PLURAL, '-o', 'json'))
    assert [i['metadata']['name'] for i in listed['items']] == ['w1']
    table = kubectl('get', 'wi', '-A')
    assert 'PHASE' in table and 'Ready' in table and 'w1' in table
    assert 'patched' in kubectl('patch', 'widget', 'w1', '--type=merge', '-p', '{"spec":{"replicas":3}}')
    assert emulator.get_object(PLURAL, 'w1')['spec']['replicas'] == 3
    assert 'scaled' in kubectl('scale', 'widget', 'w1', '--replicas=5')
    assert emulator.get_object(PLURAL, 'w1')['spec']['replicas'] == 5
    assert 'deleted' in kubectl('delete', 'widget', 'w1')
    assert emulator.get_object(PLURAL, 'w1') is None


def test_kubectl_builtin_workloads(emulator: EmulatedAPIServer, kubectl: Callable[..., str], tmp_path: Path) -> None:
    deployment = _deployment()
    deployment['metadata']['namespace'] = 'default'
    (tmp_path / 'd.yaml').write_text(json.dumps(deployment))
    assert 'created' in kubectl('apply', '-f', 'd.yaml', '--validate=false')
    assert 'scaled' in kubectl('scale', 'deploy', 'web', '--replicas=4')
    assert 'env updated' in kubectl('set', 'env', 'deploy/web', '-c', 'main', 'B=2')  # a strategic merge patch
    deployment = emulator.get_object('deployments', 'web')
    containers = deployment['spec']['template']['spec']['containers']
    assert [c['name'] for c in containers] == ['main', 'side'] and deployment['spec']['replicas'] == 4
    assert containers[0]['env'] == [{'name': 'A', 'value': '1'}, {'name': 'B', 'value': '2'}]
    assert 'web' in kubectl('get', 'deploy', '-l', 'app=web', '--field-selector', 'metadata.name=web')
    assert 'No resources found' in kubectl('get', 'deploy', '-l', 'app=other')
    assert 'deleted' in kubectl('delete', 'deploy', 'web')


# --- kopf, in-process ------------------------------------------------------------------------------

@contextlib.contextmanager
def _running_operator(registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings,
                      namespaces: list[str]) -> Iterator[None]:
    """Run kopf in a thread with its own event loop; stop it (and check it stopped) at exit."""
    stop, ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(kopf.operator(registry=registry, settings=settings, clusterwide=not namespaces,
                                      namespaces=namespaces, standalone=True, stop_flag=stop, ready_flag=ready))
        except BaseException as e:  # reported by the test
            errors.append(e)

    thread = threading.Thread(target=target, name='kopf-operator', daemon=True)
    thread.start()
    try:
        assert ready.wait(10), f'kopf did not start: {errors}'
        yield
    finally:
        stop.set()
        thread.join(15)
        assert not thread.is_alive(), 'kopf did not stop'
    assert not errors, errors


@pytest.mark.parametrize('namespaces', [[], ['def*']], ids=['all-namespaces', 'namespace-pattern'])
def test_kopf_operator_create_and_delete_handlers(emulator: EmulatedAPIServer, api: kubernetes.client.ApiClient,
                                                  monkeypatch: pytest.MonkeyPatch, namespaces: list[str]) -> None:
    monkeypatch.setenv('KUBECONFIG', str(emulator.kubeconfig_path))
    emulator.create_object('customresourcedefinitions', _crd())
    registry = kopf.OperatorRegistry()
    deleted: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def created(name: str, patch: kopf.Patch, **_: Any) -> None:
        patch.status['phase'] = 'Ready'

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    def removed(name: str, **_: Any) -> None:
        deleted.append(name)

    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 5
    custom = kubernetes.client.CustomObjectsApi(api)
    with _running_operator(registry, settings, namespaces):
        custom.create_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, {
            'apiVersion': f'{GROUP}/{VERSION}', 'kind': 'Widget', 'metadata': {'name': 'w1'}, 'spec': {}})
        obj = emulator.wait_for(lambda: (o := emulator.get_object(PLURAL, 'w1')) and
                                o.get('status', {}).get('phase') == 'Ready' and o, timeout=10)
        assert obj['metadata']['finalizers'] == ['kopf.zalando.org/KopfFinalizerMarker']
        custom.delete_namespaced_custom_object(GROUP, VERSION, 'default', PLURAL, 'w1')
        emulator.wait_for(lambda: emulator.get_object(PLURAL, 'w1') is None, timeout=10)
    assert deleted == ['w1']
    watched_in = 'default' if namespaces else None
    assert AccessRecord('watch', GROUP, PLURAL, None, watched_in) in emulator.accessed()
    if namespaces:
        assert AccessRecord('watch', '', 'namespaces', None, None) in emulator.accessed()
    assert AccessRecord('patch', GROUP, PLURAL, 'status', 'default') in emulator.accessed()
