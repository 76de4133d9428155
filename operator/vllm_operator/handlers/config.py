"""Operator-wide settings from `vllm-operator run` flags (or the Helm chart's values)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from ..planner.gpus import GPUCatalog, load_gpu_catalog
from ..render.cache import CacheSettings


@dataclass
class OperatorConfig:
    prometheus_url: str | None = None
    gpu_catalog_file: str | None = None
    metrics_interval_seconds: int = 60
    default_image: str | None = None
    prometheus_selector: str | None = None
    #: the namespaces the operator watches; empty: all of them (what it may list pods in, for the surge decision)
    namespaces: tuple[str, ...] = ()
    #: how long one reconcile (read, plan, render, apply) may take before the service gets a ReconcileError
    reconcile_timeout_seconds: float = 60.0
    #: the model cache of services without spec.modelCache (render/cache.py)
    model_cache: CacheSettings = field(default_factory=CacheSettings)
    #: this replica's identity in kopf's peering object (the watchdog reads the object with it)
    peering_identity: str = ""
    #: look models up with the operator's own HF_TOKEN for services without spec.hfTokenSecretRef, in every
    #: namespace (chart `hub.operatorTokenForAllNamespaces`); off: such lookups are anonymous
    hub_token_all_namespaces: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def catalog(self) -> GPUCatalog:
        """The GPU catalog with the user's overrides (extra SKUs, per-GPU utilization) applied."""
        if not self.gpu_catalog_file:
            return load_gpu_catalog()
        data = yaml.safe_load(Path(self.gpu_catalog_file).read_text()) or []
        rows = data.get("gpus", data) if isinstance(data, dict) else data
        return load_gpu_catalog(rows)


CONFIG = OperatorConfig()


def configure(**values: Any) -> OperatorConfig:
    global CONFIG
    CONFIG = OperatorConfig(**values)
    _ = CONFIG.catalog  # fail at startup, not at the first reconcile, when the overrides are bad
    return CONFIG
