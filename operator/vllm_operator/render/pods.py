"""The pods that serve a VLLMService, defined once (pure): everything that addresses them derives from here.

A single-node service serves from its Deployment's pods; a multi-node service from its LeaderWorkerSet's leaders
(worker index 0) only — workers run `vllm serve --headless`: no port, no HTTP, no request metrics. A Deployment's pods
carry `vllm-operator.dev/workload: deployment` (`WORKLOAD_LABEL`), a label no pod of a LeaderWorkerSet carries: the
service labels alone also select the groups' pods, leaders and headless workers, which a Deployment-shaped Service or
InferencePool then routed to while a Deployment → LeaderWorkerSet switch ran (equality selectors cannot exclude).

`serving_pods` gives, for one service and shape:

* `match_labels` — equality labels, for objects that take nothing else (Service `spec.selector`, InferencePool
  `spec.selector.matchLabels`): a Deployment's shape includes `WORKLOAD_LABEL`;
* `match_expressions` / `label_selector()` — the exact set-based selector (`status.selector`, which the HPA and
  `kubectl scale` read through the `/scale` subresource): a Deployment's shape also excludes pods of a
  LeaderWorkerSet (`!leaderworkerset.sigs.k8s.io/name`), which carry the same service labels;
* `promql()` — the PromQL matchers of their series (KEDA triggers, the operator's metrics watch). With the usual
  `kubernetes_sd_configs` relabelling every series carries `namespace` and `pod` (pod labels only where a
  `labelmap` or a PodMonitor's `podTargetLabels` copies them, which the operator cannot count on), so the pods are
  matched by their exact names:
  - Deployment: `<deployment>-<pod-template-hash>-<suffix>`, both drawn from Kubernetes' safe alphabet
    (`k8s.io/apimachinery/pkg/util/rand.SafeEncodeString`: the hash 1–10 characters, the suffix 5), the base cut to
    58 characters by the API server's name generator when longer — so `qwen` never matches `qwen-2`'s pods, nor a
    LeaderWorkerSet's `qwen-0-1`;
  - LeaderWorkerSet: `<lws>-<group index>` (the leaders' StatefulSet pods), never `<lws>-<group>-<worker>`;
  - StatefulSet (a claim per pod where the LeaderWorkerSet API is not served, render/statefulset.py):
    `<statefulset>-<ordinal>`, the StatefulSet named `<service>-set` — never the same service's Deployment pods (a
    pod-template-hash has no vowel) nor its LeaderWorkerSet's leaders (`<lws>-<g>`: no `-set-`), so both may run
    during a make-before-break switch. (Another service of the namespace named `<service>-set` whose pods are a
    LeaderWorkerSet's leaders would be named alike: a StatefulSet's pods and a LeaderWorkerSet's leaders are both
    `<name>-<ordinal>`, so no name scheme can keep them apart across services.)

`matches(pod)` is the same definition applied to a pod object (its labels, or its name and namespace), so tests
check every object against the pods a simulated cluster runs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..api import switch
from ..api.labels import LABEL_SERVICE
from .names import DNS1123_LABEL, dns1035_label, label_value

#: Labels the LeaderWorkerSet controller puts on its pods.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
INSTANCE_LABEL = "app.kubernetes.io/instance"
#: The label that says which workload a pod is of (on a Deployment's pod template, not in its immutable
#: `spec.selector`; in a StatefulSet's selector too), and its values. A LeaderWorkerSet's pods carry none.
WORKLOAD_LABEL = "vllm-operator.dev/workload"
DEPLOYMENT_WORKLOAD = "deployment"
STATEFULSET_WORKLOAD = "statefulset"
#: What a StatefulSet's name adds to the service's (a vowel: no pod-template-hash contains it).
STATEFULSET_SUFFIX = "-set"
#: The longest StatefulSet name: its pods carry `controller-revision-hash: <name>-<hash of up to 10 characters>`, a
#: label value of at most 63 characters (kubernetes/kubernetes#64023).
STATEFULSET_NAME_LIMIT = 52
#: The characters of generated name parts (pod-template-hash, generateName suffix): no vowels, no 0/1/3.
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SAFE = f"[{SAFE_ALPHABET}]"
#: The API server cuts a generateName base to 63 - 5 characters before appending the 5 random ones.
_GENERATED_BASE_LIMIT = 58
_TEMPLATE_HASH_LENGTHS = range(1, 11)  # a uint32 in decimal, one safe character per digit

Shape = Literal["Deployment", "LeaderWorkerSet", "StatefulSet"]


def instance_selector(name: str) -> dict[str, str]:
    """Every pod of one VLLMService, of any workload (the Deployment's immutable `spec.selector.matchLabels`)."""
    value = label_value(name)
    return {INSTANCE_LABEL: value, LABEL_SERVICE: value}


def deployment_pod_labels(name: str) -> dict[str, str]:
    """The labels that make a pod one of the Deployment's serving pods (its template carries them)."""
    return {**instance_selector(name), WORKLOAD_LABEL: DEPLOYMENT_WORKLOAD}


def deployment_name(name: str) -> str:
    """The Deployment's name: the service's own name when it is a DNS-1123 label, else a DNS-1035 form."""
    return name if len(name) <= 63 and DNS1123_LABEL.fullmatch(name) else dns1035_label(name)


def lws_name(name: str) -> str:
    """The LeaderWorkerSet's name: a DNS-1035 label (pods are `<name>-<g>` and `<name>-<g>-<w>`)."""
    return dns1035_label(name)


def statefulset_name(name: str) -> str:
    """The StatefulSet's name: `<service>-set`, a DNS-1035 label of at most 52 characters (a longer one keeps a
    stable hash of the service's name before the suffix, so two long names stay apart)."""
    base = dns1035_label(name)
    if len(base) + len(STATEFULSET_SUFFIX) <= STATEFULSET_NAME_LIMIT and base == name:
        return base + STATEFULSET_SUFFIX
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    keep = base[: STATEFULSET_NAME_LIMIT - len(STATEFULSET_SUFFIX) - len(digest) - 1].rstrip("-")
    return f"{keep}-{digest}{STATEFULSET_SUFFIX}"


def statefulset_pod_labels(name: str) -> dict[str, str]:
    """The labels of a StatefulSet's pods, and its `spec.selector.matchLabels` (no other workload's pod has them)."""
    return {**instance_selector(name), WORKLOAD_LABEL: STATEFULSET_WORKLOAD}


def _literal(text: str) -> str:
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


#: What follows `<deployment>-` in its pods' names (uncut), and `<lws>-` in its leaders' names.
_DEPLOYMENT_POD_SUFFIX = f"{_SAFE}{{1,10}}-{_SAFE}{{5}}"
_LEADER_SUFFIX = "(?:0|[1-9][0-9]*)"


def deployment_pod_regex(deployment: str) -> str:
    """An anchored (RE2/PromQL) regex of exactly the names a Deployment's pods get."""
    if len(deployment) + 12 <= _GENERATED_BASE_LIMIT:  # no hash length gets the base cut: one pattern says it
        return f"{_literal(deployment)}-{_DEPLOYMENT_POD_SUFFIX}"
    alternatives: list[str] = []
    for length in _TEMPLATE_HASH_LENGTHS:  # the base `<deployment>-<hash>-`, as the API server cuts it
        tokens = [_literal(c) for c in deployment] + ["-"] + [_SAFE] * length + ["-"]
        pattern = _compact(tokens[:_GENERATED_BASE_LIMIT]) + f"{_SAFE}{{5}}"
        if pattern not in alternatives:
            alternatives.append(pattern)
    return "|".join(f"(?:{a})" for a in alternatives)


def _compact(tokens: list[str]) -> str:
    """Tokens joined, runs of the safe class written as `[...]{n}`."""
    out: list[str] = []
    run = 0
    for token in [*tokens, ""]:
        if token == _SAFE:
            run += 1
            continue
        if run:
            out.append(_SAFE if run == 1 else f"{_SAFE}{{{run}}}")
            run = 0
        out.append(token)
    return "".join(out)


def leader_pod_regex(lws: str) -> str:
    """An anchored regex of exactly the names of a LeaderWorkerSet's leaders (`<lws>-<group index>`)."""
    return f"{_literal(lws)}-{_LEADER_SUFFIX}"


def statefulset_pod_regex(statefulset: str) -> str:
    """An anchored regex of exactly the names of a StatefulSet's pods (`<statefulset>-<ordinal>`)."""
    return f"{_literal(statefulset)}-{_LEADER_SUFFIX}"


def dashboard_pod_regex(services: str) -> str:
    """The serving pods of the services whose names match the regex `services` (a Grafana variable such as
    `${service:regex}`), for dashboards that address several services in one query: a Deployment's pods, a
    LeaderWorkerSet's leaders or a StatefulSet's pods, named as `serving_pods` names them — never a group's headless
    workers (`<lws>-<g>-<w>`). The first group captures the service's name (`label_replace`). Exact for names whose
    Deployment, LeaderWorkerSet and StatefulSet are named after the service and short enough (46 characters) that the
    API server does not cut their pods' names."""
    set_suffix = _literal(STATEFULSET_SUFFIX.lstrip("-"))
    return f"({services})-(?:{_DEPLOYMENT_POD_SUFFIX}|{_LEADER_SUFFIX}|{set_suffix}-{_LEADER_SUFFIX})"


def _promql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class ServingPods:
    """The serving pods of one VLLMService (see the module docstring)."""

    shape: Shape
    namespace: str
    match_labels: Mapping[str, str]
    match_expressions: tuple[tuple[str, str], ...]  # (key, "Exists" | "DoesNotExist")
    pod_name_regex: str

    def describe(self) -> str:
        if self.shape == "LeaderWorkerSet":
            return "the LeaderWorkerSet's leaders (worker-index 0; the headless workers serve nothing)"
        return f"the {self.shape}'s pods"

    def label_selector(self) -> str:
        """The selector as a string (`status.selector`, `kubectl get pods -l`)."""
        parts = [f"{k}={v}" for k, v in self.match_labels.items()]
        parts += [("!" if op == "DoesNotExist" else "") + key for key, op in self.match_expressions]
        return ",".join(parts)

    def promql(self) -> str:
        """PromQL label matchers (without braces) of the series of exactly these pods."""
        return f'namespace="{_promql_string(self.namespace)}",pod=~"{_promql_string(self.pod_name_regex)}"'

    def selects_labels(self, labels: Mapping[str, Any]) -> bool:
        """Whether a pod with these labels is selected by `label_selector()`."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all((key in labels) == (op == "Exists") for key, op in self.match_expressions)

    def selects_name(self, namespace: str, pod_name: str) -> bool:
        """Whether a pod of this name is matched by `promql()` (PromQL regexes are anchored)."""
        return namespace == self.namespace and re.fullmatch(self.pod_name_regex, pod_name) is not None

    def matches(self, pod: Mapping[str, Any]) -> bool:
        """Whether a pod object is one of the serving pods, by its labels and by its name (both must agree)."""
        meta = pod.get("metadata") or {}
        return self.selects_labels(meta.get("labels") or {}) and self.selects_name(
            str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def serving_pods(name: str, namespace: str, *, multinode: bool = False, kind: str | None = None) -> ServingPods:
    """The pods that serve VLLMService `name`: its Deployment's pods, its LeaderWorkerSet's leaders (`multinode`, or
    `kind` "LeaderWorkerSet"), or its StatefulSet's pods (`kind` "StatefulSet")."""
    shape = kind if kind in ("Deployment", "LeaderWorkerSet", "StatefulSet") else (
        "LeaderWorkerSet" if multinode else "Deployment")
    if shape == "LeaderWorkerSet":
        lws = lws_name(name)
        return ServingPods(shape="LeaderWorkerSet", namespace=namespace,
                           match_labels={LWS_NAME_LABEL: lws, LWS_WORKER_INDEX_LABEL: "0"},
                           match_expressions=(), pod_name_regex=leader_pod_regex(lws))
    if shape == "StatefulSet":
        return ServingPods(shape="StatefulSet", namespace=namespace, match_labels=statefulset_pod_labels(name),
                           match_expressions=(), pod_name_regex=statefulset_pod_regex(statefulset_name(name)))
    return ServingPods(shape="Deployment", namespace=namespace, match_labels=deployment_pod_labels(name),
                       match_expressions=((LWS_NAME_LABEL, "DoesNotExist"),),
                       pod_name_regex=deployment_pod_regex(deployment_name(name)))


def serving_now(name: str, namespace: str, status: Mapping[str, Any]) -> ServingPods:
    """The pods that serve VLLMService `name` as its status records it: the recorded plan's workload
    (`status.workload`), except while a switch between workload kinds waits for its new workload (`api.switch`:
    created, not yet Ready) — the previous workload's pods serve until the Service moves to the new one."""
    record = switch.recorded(status)
    if record is not None and record.step in (switch.CREATE_TARGET, switch.WAIT_READY):
        kind: str = record.previous
    else:
        kind = switch.target_kind(status)
    return serving_pods(name, namespace, kind=kind)
