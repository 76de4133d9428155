"""The chart's Grafana dashboard addresses the serving pods as render/pods.py defines them: a Deployment's pods, a
LeaderWorkerSet's leaders and a StatefulSet's pods, never a group's headless workers nor a neighbour whose name starts
alike. Fails when the
dashboard's pod matchers and `render.pods` disagree."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from vllm_operator.render.pods import SAFE_ALPHABET, dashboard_pod_regex, serving_pods

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "vllm-operator" / "dashboards" / "vllm-operator.json"
POD_MATCHER = re.compile(r'pod=~"((?:[^"\\]|\\.)*)"')
LABEL_REPLACE = re.compile(r'"service", "\$1", "pod", "((?:[^"\\]|\\.)*)"')


def _exprs() -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    return found


def test_every_vllm_series_is_read_through_the_serving_pods_matcher() -> None:
    vllm = [e for e in _exprs() if "vllm:" in e]
    assert vllm
    for expr in vllm:
        matchers = POD_MATCHER.findall(expr)
        assert len(matchers) == expr.count("vllm:"), expr  # every vLLM series selects pods
        assert set(matchers) == {dashboard_pod_regex("${service:regex}")}, expr
        assert set(LABEL_REPLACE.findall(expr)) <= {dashboard_pod_regex(".+?")}, expr


def _safe(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(SAFE_ALPHABET, k=n))


def test_the_matcher_selects_exactly_the_serving_pods_of_the_chosen_services() -> None:
    """`qwen` runs on a Deployment, `big` on a LeaderWorkerSet (2 groups of 3), `many` on a StatefulSet
    (`many-set-<n>`); `qwen-2`, `bigger` and `many-2` are neighbours a loose matcher catches. Grafana's
    `${service:regex}` for the choice {qwen, big, many} is `(qwen|big|many)`."""
    rng = random.Random(7)
    names = [f"{d}-{_safe(rng, rng.randint(1, 10))}-{_safe(rng, 5)}" for d in ("qwen", "qwen", "qwen-2", "bigger")]
    names += [f"{lws}-{g}" + (f"-{w}" if w else "") for lws in ("big", "bigger") for g in range(2) for w in range(3)]
    names += [f"{sts}-set-{n}" for sts in ("many", "many-2") for n in (0, 1, 12)]
    expected = {n for n in names if serving_pods("qwen", "team", kind="Deployment").selects_name("team", n)
                or serving_pods("big", "team", kind="LeaderWorkerSet").selects_name("team", n)
                or serving_pods("many", "team", kind="StatefulSet").selects_name("team", n)}
    assert len(expected) == 7  # two Deployment pods, two leaders, three StatefulSet pods
    matcher = dashboard_pod_regex("${service:regex}").replace("${service:regex}", "(qwen|big|many)")
    assert {n for n in names if re.fullmatch(matcher, n)} == expected
    # `label_replace` names each serving pod's service (the `service` label the panels sum by); the shortest name
    # that fits: `many-set-1` is `many`'s StatefulSet pod (only a LeaderWorkerSet of a service named `many-set` would
    # name a leader alike)
    capture = dashboard_pod_regex(".+?")
    services = {n: m.group(1) for n in expected if (m := re.fullmatch(capture, n))}
    assert services == {n: n.split("-")[0] for n in expected}


def test_the_pod_monitor_scrapes_exactly_the_serving_pods(chart: Any) -> None:
    """The chart's PodMonitor selects every managed vLLM pod by label and scrapes its `http` port: the pods of a
    Deployment and a LeaderWorkerSet's leaders declare it, the headless workers do not — so what Prometheus scrapes
    is render/pods.py's serving pods, for both shapes, as the templates render them."""
    from vllm_operator.render.lws import build_leaderworkerset
    from vllm_operator.render.manifests import OwnerRef, RenderInput, build_deployment

    monitor = chart.one(chart.objects("monitoring.yaml"), "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    ports = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    inp = RenderInput(name="big", namespace="team", owner=OwnerRef(name="big", uid="u"), model="org/model",
                      image="vllm/vllm-openai:v0.26.0", vllm_version="0.26.0", flags={}, gpu_count=8)
    group = build_leaderworkerset(inp, nodes=2)["spec"]["leaderWorkerTemplate"]
    lws = {"leaderworkerset.sigs.k8s.io/name": "big", "leaderworkerset.sigs.k8s.io/group-index": "0"}
    pods = {  # name: (labels, the container's named ports)
        "big-bcd-fghjk": build_deployment(inp)["spec"]["template"],
        "big-0": group["leaderTemplate"], "big-0-1": group["workerTemplate"]}
    scraped = set()
    for name, template in pods.items():
        labels = dict(template["metadata"]["labels"])
        if name.startswith("big-0"):
            labels.update(lws, **{"leaderworkerset.sigs.k8s.io/worker-index": "1" if name == "big-0-1" else "0"})
        named = {p.get("name") for c in template["spec"]["containers"] for p in c.get("ports") or []}
        if all(labels.get(k) == v for k, v in selector.items()) and ports & named:
            scraped.add(name)
        serving = serving_pods("big", "team", multinode=name.startswith("big-0"))
        assert (name in scraped) == serving.selects_labels(labels), name
    assert scraped == {"big-bcd-fghjk", "big-0"}
