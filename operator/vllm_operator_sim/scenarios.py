"""Scenarios: the hidden facts and the expected outcome of each VLLMService the simulated cluster runs.

Scenarios are keyed by the VLLMService's ``metadata.name`` (see ``scenarios.yaml`` beside this module for the
format and the built-in set). The kubelet asks :meth:`ScenarioSet.hidden` for the facts of the service a pod
belongs to; the demo and the benchmark judge each service with :meth:`Expectation.check`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from vllm_operator.api.v1alpha1 import GROUP, KIND, VERSION

from .startup import HiddenFacts

__all__ = ["Expectation", "Outcome", "Scenario", "ScenarioSet", "Then", "Traffic", "load_scenarios"]

Outcome = Literal["Ready", "Infeasible", "Exhausted", "Degraded", "Timeout"]


class Expectation(BaseModel):
    """How a scenario should end."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: Outcome = "Ready"
    failed_starts: int | None = Field(None, ge=0, description="exactly this many failed container starts")
    min_failed_starts: int | None = Field(None, ge=0)
    max_failed_starts: int | None = Field(None, ge=0)
    flags: dict[str, Any] = Field(default_factory=dict, description="flags the final plan must have")

    def check(self, outcome: str, failed_starts: int, flags: Mapping[str, Any] | None = None) -> tuple[bool, str]:
        """(as expected?, why not)."""
        if outcome != self.outcome:
            return False, f"expected {self.outcome}, ended {outcome}"
        if self.failed_starts is not None and failed_starts != self.failed_starts:
            return False, f"expected {self.failed_starts} failed start(s), saw {failed_starts}"
        if self.min_failed_starts is not None and failed_starts < self.min_failed_starts:
            return False, f"expected at least {self.min_failed_starts} failed start(s), saw {failed_starts}"
        if self.max_failed_starts is not None and failed_starts > self.max_failed_starts:
            return False, f"expected at most {self.max_failed_starts} failed start(s), saw {failed_starts}"
        for name, value in self.flags.items():
            have = (flags or {}).get(name)
            if have != value:
                return False, f"expected flag {name}={value}, plan has {have}"
        return True, ""

    def describe(self) -> str:
        text: str = self.outcome
        if self.failed_starts is not None:
            text += f", {self.failed_starts} failed start(s)"
        elif self.min_failed_starts is not None or self.max_failed_starts is not None:
            low = self.min_failed_starts or 0
            high = "" if self.max_failed_starts is None else str(self.max_failed_starts)
            text += f", {low}..{high} failed start(s)"
        return text


class Traffic(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(ge=1)
    context: int = Field(ge=1)


class Then(BaseModel):
    """A change the user makes once the service is first Ready (e.g. a longer context): a merge patch of the spec;
    the service is judged once it is Ready again at the new generation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str = ""
    spec: dict[str, Any] = Field(description="merged into the VLLMService's spec")


class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    title: str = ""
    example: str | None = Field(None, description="the examples/ file this scenario's manifest copies")
    hidden: HiddenFacts = HiddenFacts()
    expect: Expectation = Expectation()
    needs: tuple[str, ...] = ()
    traffic: Traffic | None = None
    then: Then | None = None
    manifest: dict[str, Any] | None = Field(None, description="the VLLMService spec used without examples/")

    def vllmservice(self, namespace: str = "default") -> dict[str, Any]:
        """The built-in manifest as a VLLMService object."""
        if self.manifest is None:
            raise ValueError(f"scenario {self.name} has no built-in manifest")
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": self.name, "namespace": namespace}, "spec": dict(self.manifest)}


class ScenarioSet:
    """Scenarios by VLLMService name, and the default for services without one."""

    def __init__(self, scenarios: Mapping[str, Scenario] | None = None, default: Scenario | None = None) -> None:
        self._scenarios = dict(scenarios or {})
        self.default = default or Scenario(name="default")

    def __iter__(self) -> Iterator[Scenario]:
        return iter(self._scenarios.values())

    def __contains__(self, name: object) -> bool:
        return name in self._scenarios

    def __len__(self) -> int:
        return len(self._scenarios)

    def get(self, name: str) -> Scenario:
        """The scenario of a service (the default one, renamed, when it has none)."""
        found = self._scenarios.get(name)
        return found if found is not None else self.default.model_copy(update={"name": name})

    def hidden(self, namespace: str, name: str) -> HiddenFacts:
        return self.get(name).hidden

    def with_scenario(self, scenario: Scenario) -> ScenarioSet:
        return ScenarioSet({**self._scenarios, scenario.name: scenario}, self.default)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ScenarioSet:
        default_row = dict(data.get("default") or {})
        default = Scenario(name="default", **default_row)
        scenarios = {name: Scenario(name=name, **(row or {})) for name, row in (data.get("scenarios") or {}).items()}
        return cls(scenarios, default)


def load_scenarios(path: str | Path | None = None) -> ScenarioSet:
    """The scenarios of a YAML file (default: the built-in ``sim/scenarios.yaml``)."""
    if path is None:
        text = resources.files("vllm_operator_sim").joinpath("scenarios.yaml").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    return ScenarioSet.from_data(yaml.safe_load(text) or {})
