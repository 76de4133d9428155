"""`vllm-operator run`: start kopf with the operator's registry."""

from __future__ import annotations

import datetime
import getpass
import os
import secrets
import socket
import zlib

import kopf

from ..render.cache import CacheSettings
from . import config, decode, kube
from .registry import registry


def peering_priority(explicit: int | None) -> int:
    """Replicas with equal priority all pause in kopf: derive a distinct one from the pod name unless given."""
    if explicit is not None:
        return explicit
    pod = os.environ.get("POD_ID") or os.environ.get("HOSTNAME") or ""
    return zlib.crc32(pod.encode()) % 2**31 if pod else 0


def peering_identity() -> str:
    """This replica's name in kopf's peering object, chosen here (as kopf would: the pod, else user@host, start time
    and a random suffix) so that the watchdog knows which entry is its own."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    started = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d%H%M%S")
    return f"{user}@{socket.gethostname()}/{started}/{secrets.token_hex(2)}"


#: Set to true (the chart's `hub.operatorTokenForAllNamespaces`) to look every namespace's models up with the
#: operator's own HF_TOKEN; otherwise a service's lookup uses its spec.hfTokenSecretRef or no token.
HUB_TOKEN_ENV = "VLLM_OPERATOR_HUB_TOKEN_FOR_ALL_NAMESPACES"


def hub_token_for_all_namespaces() -> bool:
    return os.environ.get(HUB_TOKEN_ENV, "").strip().lower() in ("1", "true", "yes")


def run_operator(*, namespaces: list[str], all_namespaces: bool, kubeconfig: str | None, liveness: str | None,
                 metrics_port: int, peering: str | None, verbose: bool, prometheus_url: str | None = None,
                 gpu_catalog: str | None = None, priority: int | None = None, default_image: str | None = None,
                 metrics_interval: int = 60, prometheus_selector: str | None = None,
                 model_cache: CacheSettings | None = None) -> int:
    """Run until stopped (SIGINT/SIGTERM). Two replicas with the same peering name never both act."""
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's login handler and the client read it
    kube.configure(kubeconfig)
    config.configure(prometheus_url=prometheus_url or None, gpu_catalog_file=gpu_catalog or None,
                     default_image=default_image or None, metrics_interval_seconds=metrics_interval,
                     prometheus_selector=prometheus_selector or None,
                     namespaces=() if all_namespaces else tuple(namespaces),
                     model_cache=model_cache or CacheSettings(), peering_identity=peering_identity(),
                     hub_token_all_namespaces=hub_token_for_all_namespaces())
    if metrics_port:
        from ..metrics import start_metrics_server

        start_metrics_server(metrics_port)
    kopf.configure(verbose=verbose)
    decode.install()  # one object nested past Python's recursion limit must not stop every watch
    kopf.run(
        registry=registry,
        clusterwide=all_namespaces,
        namespaces=() if all_namespaces else namespaces,
        liveness_endpoint=liveness or None,
        standalone=peering is None,
        priority=peering_priority(priority),
        identity=config.CONFIG.peering_identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
        peering_name=peering,  # kopf makes peering mandatory when a name is given: the chart installs its CRDs
    )
    return 0
