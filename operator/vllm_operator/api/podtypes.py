"""The Pod API's types a VLLMService spec embeds (tolerations, affinity, environment variables), typed and bounded
so that an unknown key or an invalid rule is refused with its field, not by the API server when the Deployment is
written.

Typed here rather than taken from the Kubernetes OpenAPI schema (as `kubernetes-validate` packages it): that schema
bounds nothing (no maxLength, pattern, enum or maxItems, no rule tying `values` to `operator`), so a CRD embedding it
would admit unbounded strings and lists and specs the API server then refuses in the Deployment. Each model mirrors
the `io.k8s.api.core.v1` (or `meta.v1`) definition of the same name as a subset: tests/unit/test_api_podtypes.py
checks that every property declared here exists upstream with a compatible type and that everything upstream
requires is required here, in the oldest supported release (`OLDEST_KUBERNETES`) and the newest one packaged."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints, model_validator

from .schema import (
    _LABEL_KEY,
    API_VERSION_PATTERN,
    DATA_KEY_PATTERN,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    FIELD_PATH_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    RESOURCE_NAME_PATTERN,
    TOLERATION_KEY_PATTERN,
    CelRule,
    Quantity,
    RuleViolation,
    _Model,
    _raise_violations,
    _short,
)

#: The oldest Kubernetes release the operator supports (CEL validation rules are GA from 1.29): every field of these
#: types exists in its Pod API.
OLDEST_KUBERNETES = "1.29"


class Toleration(_Model):
    """A pod toleration, as in the Pod API."""

    key: str | None = Field(
        default=None, max_length=317, pattern=TOLERATION_KEY_PATTERN,
        description="Taint key; empty with operator Exists matches all taints.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="`Exists` or `Equal` (default)."
    )
    value: str | None = Field(
        default=None, max_length=63, pattern=LABEL_VALUE_PATTERN, description="Taint value to match with operator Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=-(2**63), le=2**63 - 1, description="How long a NoExecute taint is tolerated before eviction."
    )


class KeySelector(_Model):
    """A key of a Secret or ConfigMap in the service's namespace, as in the Pod API."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN, description="Object name.")
    key: str = Field(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN, description="The key.")
    optional: bool | None = Field(default=None, description="Start the pod even when the object or key is missing.")


class ObjectFieldSelector(_Model):
    """A field of the pod, as in the Pod API (`metadata.name`, `status.podIP`, ...)."""

    api_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=API_VERSION_PATTERN,
                                    description="Schema version of fieldPath (v1).")
    field_path: str = Field(min_length=1, max_length=256, pattern=FIELD_PATH_PATTERN,
                            description="Path of the field, e.g. metadata.name.")


class ResourceFieldSelector(_Model):
    """A resource of a container, as in the Pod API (`limits.memory`, ...)."""

    container_name: str | None = Field(default=None, min_length=1, max_length=63, pattern=DNS1123_LABEL_PATTERN,
                                       description="The container (default: this one).")
    resource: str = Field(min_length=1, max_length=253, pattern=RESOURCE_NAME_PATTERN,
                          description="The resource, e.g. limits.memory.")
    divisor: Quantity | None = Field(default=None, description="Output unit, e.g. 1Mi (default 1).")


class EnvVarSource(_Model):
    """Where an environment variable's value comes from, as in the Pod API: typed, so the CRD bounds every field."""

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret in the namespace.")
    config_map_key_ref: KeySelector | None = Field(default=None,
                                                   description="A key of a ConfigMap in the namespace.")
    field_ref: ObjectFieldSelector | None = Field(default=None,
                                                  description="A field of the pod, e.g. metadata.name.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None,
                                                             description="A resource of the container.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        # the Pod API refuses none and more than one (validateEnvVarValueFrom): the Deployment would be a 422
        sources = [name for name, value in self if value is not None]
        if len(sources) != 1:
            raise ValueError("set exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef")
        return self



#: The most items of one list inside `spec.affinity` (the Pod API sets no bound; real rules have a handful).
MAX_AFFINITY_ITEMS = 32

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]


def _operator_values_problem(operator: str, values: list[str] | None) -> str | None:
    """What the Pod API refuses in a requirement's `values` for its `operator` (validateNodeSelectorRequirement,
    ValidateLabelSelectorRequirement), or None."""
    count = len(values or [])
    if operator in ("In", "NotIn") and count == 0:
        return f"operator {operator} needs at least one value; add values or use Exists"
    if operator in ("Exists", "DoesNotExist") and count:
        return f"operator {operator} takes no values; remove values or use In"
    if operator in ("Gt", "Lt") and (count != 1 or not re.fullmatch(r"-?[0-9]{1,18}", (values or [""])[0])):
        return f"operator {operator} takes exactly one value, an integer such as \"4\""
    return None


#: The CEL mirrors of `_operator_values_problem`: a label selector's operators, then a node selector's (Gt, Lt).
_LABEL_VALUES_CEL = ("self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                     "!has(self.values) || size(self.values) == 0")
_NODE_VALUES_CEL = (
    "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
    "self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : "
    "has(self.values) && size(self.values) == 1 && self.values[0].matches('^-?[0-9]{1,18}$')"
)
_OPERATOR_VALUES_MESSAGE = "values must fit the operator: In and NotIn take one or more, Exists and DoesNotExist none"


def _check_operator_values(rule: str, operator: str, values: list[str] | None) -> None:
    problem = _operator_values_problem(operator, values)
    if problem:
        _raise_violations([RuleViolation(rule, "values", problem)])


class NodeSelectorRequirement(_Model):
    """A node label requirement, as in the Pod API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(id="node-selector-values-fit-operator", rule=_NODE_VALUES_CEL,
                message=_OPERATOR_VALUES_MESSAGE + ", Gt and Lt exactly one integer", field_path=".values"),
    )

    key: LabelKey = Field(description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="`In`/`NotIn` (one or more values), `Exists`/`DoesNotExist` (no values), `Gt`/`Lt` (one "
        "integer value).")
    values: list[LabelValue] | None = Field(default=None, max_length=MAX_AFFINITY_ITEMS, description="Label values.")

    @model_validator(mode="after")
    def _check_values(self) -> NodeSelectorRequirement:
        _check_operator_values("node-selector-values-fit-operator", self.operator, self.values)
        return self


class NodeSelectorFieldRequirement(_Model):
    """A node field requirement, as in the Pod API: the only field is `metadata.name`."""

    key: Literal["metadata.name"] = Field(description="The node field: `metadata.name`.")
    operator: Literal["In", "NotIn"] = Field(description="`In` or `NotIn`.")
    values: list[Annotated[str, StringConstraints(max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)]] = Field(
        min_length=1, max_length=1, description="One node name.")


class NodeSelectorTerm(_Model):
    """Node requirements that must all hold, as in the Pod API."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Requirements on node labels.")
    match_fields: list[NodeSelectorFieldRequirement] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Requirements on node fields.")


class NodeSelector(_Model):
    """Node selector terms, any of which may hold, as in the Pod API."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=MAX_AFFINITY_ITEMS, description="The terms; a node matching one of them fits.")


class PreferredSchedulingTerm(_Model):
    """A weighted node preference, as in the Pod API."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    preference: NodeSelectorTerm = Field(description="The node requirements preferred.")


class NodeAffinity(_Model):
    """Node affinity, as in the Pod API."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on.")
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Nodes the pods prefer, by weight.")


class LabelSelectorRequirement(_Model):
    """A label requirement of a label selector, as in the Kubernetes API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(id="label-selector-values-fit-operator", rule=_LABEL_VALUES_CEL, message=_OPERATOR_VALUES_MESSAGE,
                field_path=".values"),
    )

    key: LabelKey = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="`In`/`NotIn` (one or more values) or `Exists`/`DoesNotExist` (no values).")
    values: list[LabelValue] | None = Field(default=None, max_length=MAX_AFFINITY_ITEMS, description="Label values.")

    @model_validator(mode="after")
    def _check_values(self) -> LabelSelectorRequirement:
        _check_operator_values("label-selector-values-fit-operator", self.operator, self.values)
        return self


class LabelSelector(_Model):
    """A label selector, as in the Kubernetes API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="match-labels-are-label-keys",
            rule=(
                "!has(self.matchLabels) || self.matchLabels.all(k, size(k) <= 317 && k.matches('"
                + LABEL_KEY_PATTERN.replace("\\", "\\\\") + "'))"
            ),
            message="matchLabels keys must be label keys such as app.kubernetes.io/name",
            field_path=".matchLabels",
        ),
    )

    match_labels: dict[str, LabelValue] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Labels that must be equal; keys are label keys.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Label requirements.")

    @model_validator(mode="after")
    def _check_keys(self) -> LabelSelector:
        bad = [k for k in self.match_labels or {} if len(k) > 317 or not _LABEL_KEY.fullmatch(k)]
        if bad:
            _raise_violations([RuleViolation("match-labels-are-label-keys", "matchLabels",
                                             f"keys must be label keys such as app.kubernetes.io/name "
                                             f"(got {_short(bad[0])})")])
        return self

    def label_keys(self) -> set[str]:
        """The label keys this selector names."""
        return set(self.match_labels or {}) | {r.key for r in self.match_expressions or []}


class PodAffinityTerm(_Model):
    """Pods to run near (or away from), as in the Pod API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="label-keys-need-selector",
            rule="has(self.labelSelector) || ((!has(self.matchLabelKeys) || size(self.matchLabelKeys) == 0) "
            "&& (!has(self.mismatchLabelKeys) || size(self.mismatchLabelKeys) == 0))",
            message="matchLabelKeys and mismatchLabelKeys need a labelSelector; add one or remove them",
            field_path=".labelSelector",
        ),
        CelRule(
            id="label-keys-disjoint",
            rule="!has(self.matchLabelKeys) || !has(self.mismatchLabelKeys) "
            "|| !self.matchLabelKeys.exists(k, k in self.mismatchLabelKeys)",
            message="a key cannot be in both matchLabelKeys and mismatchLabelKeys; keep it in one",
            field_path=".mismatchLabelKeys",
        ),
        CelRule(
            id="label-keys-not-in-selector",
            rule="!has(self.labelSelector) || ((has(self.matchLabelKeys) ? self.matchLabelKeys : []) "
            "+ (has(self.mismatchLabelKeys) ? self.mismatchLabelKeys : [])).all(k, "
            "!(has(self.labelSelector.matchLabels) && k in self.labelSelector.matchLabels) "
            "&& !(has(self.labelSelector.matchExpressions) && self.labelSelector.matchExpressions.exists(r, "
            "r.key == k)))",
            message="a key of matchLabelKeys or mismatchLabelKeys cannot also be in labelSelector; keep it in one",
            field_path=".matchLabelKeys",
        ),
    )

    label_selector: LabelSelector | None = Field(default=None, description="The pods, by label.")
    namespace_selector: LabelSelector | None = Field(default=None, description="Their namespaces, by label.")
    namespaces: list[Annotated[str, StringConstraints(max_length=63, pattern=DNS1123_LABEL_PATTERN)]] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Their namespaces, by name.")
    topology_key: LabelKey = Field(description="Node label that defines 'near', e.g. kubernetes.io/hostname.")
    match_label_keys: list[LabelKey] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Pod label keys whose values must match the pod's.")
    mismatch_label_keys: list[LabelKey] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Pod label keys whose values must differ.")

    @model_validator(mode="after")
    def _check_label_keys(self) -> PodAffinityTerm:
        _raise_violations(self._violations())
        return self

    def _violations(self) -> list[RuleViolation]:
        match, mismatch = set(self.match_label_keys or []), set(self.mismatch_label_keys or [])
        out: list[RuleViolation] = []
        if (match or mismatch) and self.label_selector is None:
            field = "matchLabelKeys" if match else "mismatchLabelKeys"
            out.append(RuleViolation("label-keys-need-selector", "labelSelector",
                                     f"{field} needs a labelSelector; add one or remove {field}"))
        if match & mismatch:
            out.append(RuleViolation("label-keys-disjoint", "mismatchLabelKeys",
                                     f"key {_short(sorted(match & mismatch)[0])} is in both matchLabelKeys and "
                                     "mismatchLabelKeys; keep it in one"))
        both = (match | mismatch) & (self.label_selector.label_keys() if self.label_selector else set())
        if both:
            out.append(RuleViolation("label-keys-not-in-selector", "matchLabelKeys",
                                     f"key {_short(sorted(both)[0])} is in labelSelector and in "
                                     "matchLabelKeys/mismatchLabelKeys; keep it in one"))
        return out


class WeightedPodAffinityTerm(_Model):
    """A weighted pod preference, as in the Pod API."""

    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The pods preferred.")


class PodAffinity(_Model):
    """Pod affinity or anti-affinity, as in the Pod API."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Terms that must hold.")
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        default=None, max_length=MAX_AFFINITY_ITEMS, description="Terms preferred, by weight.")


class Affinity(_Model):
    """Pod affinity, as in the Pod API, typed: an unknown key or an invalid rule is refused here, with its field,
    rather than by the API server when the Deployment is written."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity rules.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity rules.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity rules.")


class EnvVar(_Model):
    """An environment variable for the vLLM container, as in the Pod API."""

    CEL_RULES: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            id="env-value-or-value-from",
            rule="!(has(self.value) && has(self.valueFrom))",
            message="set either value or valueFrom, not both",
            field_path=".valueFrom",
        ),
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(
        default=None,
        max_length=32768,
        description="Literal value. Never a secret: use `valueFrom.secretKeyRef` (a literal token gets a warning).",
    )
    value_from: EnvVarSource | None = Field(
        default=None,
        description="A source for the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef).",
    )

    @model_validator(mode="after")
    def _check_rules(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            _raise_violations(
                [
                    RuleViolation(
                        "env-value-or-value-from",
                        "valueFrom",
                        f"env {self.name!r} sets both value and valueFrom; keep one",
                    )
                ]
            )
        return self
