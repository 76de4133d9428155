#!/usr/bin/env python3
"""The framework floor for benchmarks/operator_scale.py: a bare kopf operator that creates one fixed Deployment per
VLLMService (no planning, no status, no events), run the way the benchmark runs `vllm-operator`:

    python benchmarks/bare_kopf_operator.py run -A --standalone --kubeconfig PATH --liveness "" --metrics-port 0

Only what kopf itself does per object (its own patches) plus one create call: what no operator on kopf can beat
on the same emulated API.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import kopf
import kubernetes

_apps: kubernetes.client.AppsV1Api | None = None


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False  # the benchmark compares Deployments, not kopf's log Events


@kopf.on.create("vllm-operator.dev", "v1alpha1", "vllmservices")
def create_deployment(name: str, namespace: str, uid: str, **_: Any) -> None:
    assert _apps is not None
    labels = {"app.kubernetes.io/instance": name}
    _apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [{
            "apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMService", "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]}}}})


def main(argv: list[str] | None = None) -> int:
    global _apps
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run"])
    parser.add_argument("-A", "--all-namespaces", action="store_true")
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--liveness", default="")
    parser.add_argument("--metrics-port", default="0")
    args = parser.parse_args(argv)
    os.environ["KUBECONFIG"] = args.kubeconfig
    _apps = kubernetes.client.AppsV1Api(kubernetes.config.new_client_from_config(config_file=args.kubeconfig))
    kopf.configure(verbose=False)
    kopf.run(clusterwide=True, standalone=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
