"""The operator's only door to the Kubernetes API: generic CRUD by path over the kubernetes client's ApiClient.

Errors are mapped to kopf's in one place (`api_errors`): 409 → retry soon, 5xx/connection → retry later,
404 → None from `get`. Every call is synchronous (kopf runs sync handlers in its thread pool).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..api.times import format_time
from . import decode

_lock = threading.Lock()
_client: kubernetes.client.ApiClient | None = None

#: The field manager of every write the operator makes (`metadata.managedFields`): server-side apply of the children
#: removes what the operator stops setting only from fields this manager owns.
FIELD_MANAGER = "vllm-operator"
#: Field managers the operator wrote children under before it applied them server-side (an `Update` entry): the
#: kubernetes client's default (the API server names a manager after the User-Agent), then this operator's own.
LEGACY_MANAGERS = frozenset({"OpenAPI-Generator", FIELD_MANAGER})
APPLY_PATCH = "application/apply-patch+yaml"


def configure(kubeconfig: str | None = None) -> None:
    """Load credentials once: in-cluster service account, else the kubeconfig (explicit path or $KUBECONFIG)."""
    global _client
    with _lock:
        configuration = kubernetes.client.Configuration()
        try:
            if kubeconfig:
                raise kubernetes.config.ConfigException("explicit kubeconfig")
            kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration)
        # every reconcile thread and kopf's sync workers keep a connection: no connect per request under load
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, 32)
        _client = kubernetes.client.ApiClient(configuration)


def client() -> kubernetes.client.ApiClient:
    if _client is None:
        configure()
    assert _client is not None
    return _client


_service_locks: dict[tuple[str, str], threading.RLock] = {}


def service_lock(namespace: str, name: str) -> threading.RLock:
    """One lock per VLLMService: kopf runs handlers for different objects (pods, the service) concurrently, and
    a reconcile or a ladder step must read the status it is about to change under the same lock."""
    with _lock:
        return _service_locks.setdefault((namespace, name), threading.RLock())


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


DEPLOYMENTS = Resource("apps", "v1", "deployments")
DAEMONSETS = Resource("apps", "v1", "daemonsets")  # spec.modelCache.prewarm (handlers/prewarm.py)
STATEFULSETS = Resource("apps", "v1", "statefulsets")  # a claim per pod without LeaderWorkerSet (render/statefulset.py)
SERVICES = Resource("", "v1", "services")
PVCS = Resource("", "v1", "persistentvolumeclaims")
PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes", namespaced=False)
STORAGECLASSES = Resource("storage.k8s.io", "v1", "storageclasses", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
VLLMSERVICES = Resource("vllm-operator.dev", "v1alpha1", "vllmservices")

HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers")
SCALEDOBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects")
INFERENCEPOOLS = Resource("inference.networking.k8s.io", "v1", "inferencepools")

LEADERWORKERSETS = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
RESOURCECLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims")  # share groups (issue 26)
DEVICECLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)

KIND_RESOURCES = {"Deployment": DEPLOYMENTS, "Service": SERVICES, "PersistentVolumeClaim": PVCS,
                  "HorizontalPodAutoscaler": HPAS, "ScaledObject": SCALEDOBJECTS, "InferencePool": INFERENCEPOOLS,
                  "LeaderWorkerSet": LEADERWORKERSETS, "ConfigMap": CONFIGMAPS, "ResourceClaim": RESOURCECLAIMS,
                  "DaemonSet": DAEMONSETS, "StatefulSet": STATEFULSETS}


def serves(resource: Resource) -> bool:
    """Whether the API server serves `resource` (discovery of its group version; 404 = not installed)."""
    path = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    try:
        doc = _call("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(entry.get("name") == resource.plural for entry in (doc or {}).get("resources") or [])


_served: dict[tuple[int, str], tuple[float, bool]] = {}


def served(resource: Resource, max_age: float) -> bool:
    """`serves(resource)`, from an answer at most `max_age` seconds old (per client): asked again after that, so an
    API installed after the operator started is noticed."""
    key = (id(client()), resource.path())
    now = time.monotonic()
    with _lock:
        hit = _served.get(key)
    if hit is not None and now - hit[0] < max_age:
        return hit[1]
    with api_errors(f"discover {resource.plural}"):
        answer = serves(resource)
    with _lock:
        _served[key] = (now, answer)
    return answer


def forget_served() -> None:
    """Drop the cached discovery answers (tests; a new cluster)."""
    with _lock:
        _served.clear()


class Rejected(kopf.PermanentError):
    """The API server refused what the operator sent (400, 422): retrying the same object cannot help."""

    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__(f"{what}: the API server refused it ({status}): {message}")
        self.what = what
        self.status = status
        self.server_message = message


def server_message(exc: ApiException) -> str:
    """The `message` of the API server's Status body, else the HTTP reason."""
    body = exc.body
    try:
        data = json.loads(body) if isinstance(body, (str, bytes)) and body else None
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])[:2000]
    return str(exc.reason or exc.status)


@contextlib.contextmanager
def api_errors(what: str) -> Iterator[None]:
    """Map API failures to kopf's retry semantics: 400/422 → `Rejected` (permanent, with the server's message),
    409 → retry soon, 429/5xx/connection → retry later, other 4xx (403, 404) → retry much later."""
    try:
        yield
    except ApiException as exc:
        if exc.status == 409:
            raise kopf.TemporaryError(f"{what}: conflict, retrying", delay=1) from exc
        if exc.status in (400, 422):
            raise Rejected(what, exc.status, server_message(exc)) from exc
        if exc.status in (429,) or (exc.status or 0) >= 500:
            raise kopf.TemporaryError(f"{what}: API server answered {exc.status}", delay=5) from exc
        raise kopf.TemporaryError(f"{what}: {exc.status} {server_message(exc)}", delay=30) from exc
    except (HTTPError, OSError) as exc:
        raise kopf.TemporaryError(f"{what}: API unreachable ({exc})", delay=5) from exc


def _call(method: str, path: str, body: Any = None, query: list[tuple[str, Any]] | None = None,
          content_type: str = "application/json", raw: bool = False, discard: bool = False) -> Any:
    """One request; its answer parsed (JSON), as text (`raw`), or not at all (`discard`: a write whose caller does
    not need the object back — parsing a Deployment the operator just sent costs more than sending it)."""
    if method != "GET":
        _forget_reads()  # a write (even one that fails) may change what was read
    if method in ("POST", "PUT", "PATCH") and not any(key == "fieldManager" for key, _ in query or []):
        query = [*(query or []), ("fieldManager", FIELD_MANAGER)]
    api = client()
    method_, url, headers, payload, post = api.param_serialize(
        method=method, resource_path=path, query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body, auth_settings=["BearerToken"])
    response = api.call_api(method_, url, header_params=headers, body=payload, post_params=post)
    data = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = data.decode(errors="replace") if isinstance(data, bytes) else data
        raise error
    if discard:
        return None
    if raw:
        return data.decode(errors="replace") if isinstance(data, bytes) else data
    return decode.loads(data) if data else None  # bounded in depth: a stored object may nest 10,000 levels


_reads = threading.local()


@contextlib.contextmanager
def shared_reads() -> Iterator[None]:
    """Within this block (on this thread) a second `get` of an object returns the first one's answer, until any
    write through this module: the watchdog's look at one service reads the service and its Deployment once for
    the ladder and the drift check together."""
    outer = getattr(_reads, "cache", None)
    _reads.cache = {} if outer is None else outer
    try:
        yield
    finally:
        _reads.cache = outer


def _forget_reads() -> None:
    cache = getattr(_reads, "cache", None)
    if cache:
        cache.clear()


def get(resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
    path = resource.path(namespace, name)
    cache: dict[str, Any] | None = getattr(_reads, "cache", None)
    if cache is not None and path in cache:
        cached: dict[str, Any] | None = copy.deepcopy(cache[path])
        return cached
    try:
        result: dict[str, Any] | None = _call("GET", path)
    except ApiException as exc:
        if exc.status != 404:
            raise
        result = None
    if cache is not None:
        cache[path] = copy.deepcopy(result)
    return result


def get_service(namespace: str, name: str) -> tuple[dict[str, Any], Any] | None:
    """A VLLMService and its parsed spec; None when it is gone or its spec is invalid (the reconcile says so)."""
    from ..api.v1alpha1 import SpecValidationError, parse_spec

    with api_errors(f"read VLLMService {name}"):
        service = get(VLLMSERVICES, namespace, name)
    if service is None:
        return None
    try:
        return service, parse_spec(service.get("spec") or {})
    except SpecValidationError:
        return None


def list_objects(resource: Resource, namespace: str | None = None, label_selector: str | None = None,
                 field_selector: str | None = None) -> list[dict[str, Any]]:
    query = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    result = _call("GET", resource.path(namespace), query=query)
    items: list[dict[str, Any]] = (result or {}).get("items", [])
    return items


def list_pages(resource: Resource, namespace: str | None = None, limit: int = 250) -> Iterator[dict[str, Any]]:
    """The objects, `limit` per request (the API server's `continue` token): one page in memory at a time."""
    token: str | None = None
    while True:
        query: list[tuple[str, Any]] = [("limit", limit)] + ([("continue", token)] if token else [])
        result = _call("GET", resource.path(namespace), query=query) or {}
        yield from result.get("items") or []
        token = (result.get("metadata") or {}).get("continue")
        if not token:
            return


def served_resources(group: str, version: str) -> set[str]:
    """The resources (plurals) the API serves in group/version: empty when the group is not installed (404)."""
    try:
        result = _call("GET", f"/apis/{group}/{version}")
    except ApiException as exc:
        if exc.status == 404:
            return set()
        raise
    return {str(r.get("name")) for r in (result or {}).get("resources") or []}


def create(resource: Resource, namespace: str | None, body: dict[str, Any], discard: bool = False) -> dict[str, Any]:
    """Create `body`; the object as stored, or {} with `discard` (the answer is not read)."""
    result: dict[str, Any] | None = _call("POST", resource.path(namespace), body=body, discard=discard)
    return result or {}


def patch(resource: Resource, namespace: str | None, name: str, body: dict[str, Any],
          subresource: str | None = None, discard: bool = False) -> dict[str, Any]:
    """Merge-patch; the object as stored, or {} with `discard` (the answer is not read)."""
    result: dict[str, Any] | None = _call("PATCH", resource.path(namespace, name, subresource), body=body,
                                          content_type="application/merge-patch+json", discard=discard)
    return result or {}


def apply(resource: Resource, namespace: str | None, name: str, body: dict[str, Any], *, force: bool = True,
          discard: bool = False) -> dict[str, Any]:
    """Server-side apply of `body` (the whole intended object) as `FIELD_MANAGER`: creates it when missing; sets what
    it holds, removes what this manager applied before and `body` no longer holds, leaves other managers' fields.
    `force`: take over fields another manager set to a different value (the operator's render is the authority)."""
    query: list[tuple[str, Any]] = [("fieldManager", FIELD_MANAGER)] + ([("force", "true")] if force else [])
    result: dict[str, Any] | None = _call("PATCH", resource.path(namespace, name), body=body, query=query,
                                          content_type=APPLY_PATCH, discard=discard)
    return result or {}


def delete(resource: Resource, namespace: str | None, name: str) -> None:
    try:
        _call("DELETE", resource.path(namespace, name))
    except ApiException as exc:
        if exc.status != 404:
            raise


def read_log(namespace: str, pod: str, *, container: str, tail_lines: int, previous: bool) -> str | None:
    """A bounded tail of a container's log (`previous`: the run that just ended)."""
    query: list[tuple[str, Any]] = [("container", container), ("tailLines", tail_lines), ("limitBytes", 65536)]
    if previous:
        query.append(("previous", "true"))
    try:
        text: str = _call("GET", PODS.path(namespace, pod, "log"), query=query, raw=True)
        return text
    except ApiException as exc:
        if exc.status in (400, 404):
            return None
        raise


def post_event(namespace: str, involved: dict[str, Any], type_: str, reason: str, message: str,
               component: str = "vllm-operator", event_name: str | None = None) -> None:
    """A core/v1 Event on the VLLMService (kubectl describe shows it). `event_name`: a fixed name (a second post of
    the same Event then answers 409 AlreadyExists) instead of a generated one."""
    now = format_time(datetime.now(UTC))
    name = involved.get("name", "object")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name, "namespace": namespace} if event_name else {
            "generateName": f"{name}.", "namespace": namespace},
        "involvedObject": involved,
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    create(EVENTS, namespace, body, discard=True)
