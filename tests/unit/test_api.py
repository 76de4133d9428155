"""The VLLMService models: defaults, aliases, validation messages, cross-field rules, condition helpers."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kit.specs import FULL_AFFINITY
from vllm_operator.api import conditions as c
from vllm_operator.api.v1alpha1 import (
    API_VERSION,
    DEFAULT_IMAGE,
    QUANTIZATION_METHODS,
    GPURequest,
    ModelCacheSpec,
    PinnedFlags,
    PlanStatus,
    RemediationStatus,
    SpecError,
    SpecValidationError,
    VLLMService,
    VLLMServiceSpec,
    VLLMServiceStatus,
    parse_spec,
    validate_spec,
    vllm_cli_flag,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)

MODEL = {"name": "Qwen/Qwen2.5-7B-Instruct"}


def spec(**fields: Any) -> dict[str, Any]:
    return {"model": dict(MODEL), **fields}


def rule_ids(doc: dict[str, Any]) -> list[str]:
    """The ids of the cross-field rules a spec breaks, as reported by pydantic."""
    try:
        VLLMServiceSpec.model_validate(doc)
    except ValidationError as exc:
        return [v["rule"] for e in exc.errors() if e["type"] == "spec_rule" for v in e["ctx"]["violations"]]
    return []


def fields(errors: list[SpecError]) -> list[str]:
    return [e.field for e in errors]


# --------------------------------------------------------------------------------------------------
# defaults and aliases
# --------------------------------------------------------------------------------------------------


def test_defaults_live_in_the_models() -> None:
    s = parse_spec(spec())
    assert s.image == DEFAULT_IMAGE
    assert s.replicas == 1 and s.max_replicas is None
    assert s.gpu.product is None and s.gpu.count is None and s.gpu.max_count == 8 and s.gpu.memory_gib is None
    assert s.flags.to_vllm() == {}
    assert s.extra_args == []
    assert s.remediation.enabled is True
    assert s.remediation.max_steps == 5
    assert s.remediation.min_interval_seconds == 60
    assert s.remediation.allow_step_up is False
    assert s.remediation.stable_window_seconds == 3600
    assert s.service.type == "ClusterIP" and s.service.port == 8000
    assert s.prometheus.enabled is False
    assert s.model_cache is None and s.hf_token_secret_ref is None
    assert s.workload.context_length is None and s.workload.profile is None


def test_nested_defaults() -> None:
    s = parse_spec(
        spec(
            model={**MODEL, "configMapRef": {"name": "qwen-config"}},
            hfTokenSecretRef={"name": "hf"},
            modelCache={"size": "100Gi"},
        )
    )
    assert s.model.config_map_ref is not None
    assert s.model.config_map_ref.config_key == "config.json"
    assert s.model.config_map_ref.safetensors_index_key == "model.safetensors.index.json"
    assert s.hf_token_secret_ref is not None and s.hf_token_secret_ref.key == "HF_TOKEN"
    assert s.model_cache is not None and s.model_cache.mount_path == "/root/.cache/huggingface"


FULL_SPEC: dict[str, Any] = {
    "model": {
        "name": "meta-llama/Llama-3.1-8B-Instruct",
        "revision": "main",
        "config": {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32},
        "safetensorsIndex": {"metadata": {"total_size": 16060522496}},
        "configMapRef": {"name": "llama", "configKey": "c.json", "safetensorsIndexKey": "i.json"},
        "quantization": "fp8",
        "servedName": "llama",
    },
    "gpu": {"product": "NVIDIA-L4", "count": 2, "maxCount": 4, "maxNodes": 1, "memoryGiB": 22.5},
    "image": "vllm/vllm-openai:v0.10.2",
    "imagePullPolicy": "IfNotPresent",
    "flags": {
        "tensorParallelSize": 2,
        "pipelineParallelSize": 1,
        "dataParallelSize": 1,
        "enableExpertParallel": False,
        "gpuMemoryUtilization": 0.9,
        "maxModelLen": 16384,
        "maxNumSeqs": 64,
        "maxNumBatchedTokens": 8192,
        "kvCacheDtype": "fp8",
        "quantization": "fp8",
        "dtype": "bfloat16",
        "enforceEager": False,
        "blockSize": 16,
        "enablePrefixCaching": True,
        "enableChunkedPrefill": True,
        "cpuOffloadGb": 0,
        "swapSpace": 4,
        "enableLora": True,
        "maxLoraRank": 64,
        "trustRemoteCode": False,
        "kvCacheMemoryBytes": 8000000000,
        "speculativeConfig": {"method": "eagle3", "model": "org/eagle3-head", "numSpeculativeTokens": 3},
    },
    "extraArgs": ["--disable-log-requests", "--seed", "-1"],
    "workload": {"contextLength": 8192, "concurrency": 32, "prefixCaching": True, "profile": "chat"},
    "replicas": 2,
    "maxReplicas": 4,
    "resources": {"memory": "64Gi", "cpu": "8", "shmSize": "16Gi"},
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}
    },
    "env": [
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ],
    "hfTokenSecretRef": {"name": "hf", "key": "token"},
    "modelCache": {"size": "200Gi", "storageClassName": "fast", "mountPath": "/cache"},
    "remediation": {
        "enabled": True,
        "maxSteps": 3,
        "minIntervalSeconds": 30,
        "allowStepUp": True,
        "stableWindowSeconds": 600,
        "maxGroupRecreations": 5,
    },
    "network": {"rdmaResources": [], "ipcLock": False},
    "service": {"type": "LoadBalancer", "port": 8080},
    "prometheus": {"enabled": True},
    "security": {"profile": "restricted", "runAsUser": 1000},
}


def test_camel_case_round_trip() -> None:
    s = parse_spec(FULL_SPEC)
    assert s.to_dict() == FULL_SPEC
    assert VLLMServiceSpec.model_validate(s.to_dict()) == s
    assert s.gpu.memory_gib == 22.5
    assert s.flags.max_model_len == 16384
    assert s.model.safetensors_index == {"metadata": {"total_size": 16060522496}}


def test_snake_case_names_are_accepted_too() -> None:
    s = VLLMServiceSpec.model_validate(
        {"model": MODEL, "flags": {"max_model_len": 4096}, "gpu": {"memory_gib": 24}, "extra_args": []}
    )
    assert s.flags.max_model_len == 4096 and s.gpu.memory_gib == 24


def test_whole_object_parses() -> None:
    obj = {"apiVersion": API_VERSION, "kind": "VLLMService", "metadata": {"name": "x"}, "spec": spec()}
    service = VLLMService.model_validate(obj)
    assert service.spec.model.name == MODEL["name"] and service.status is None
    assert parse_spec(obj) == service.spec
    with pytest.raises(ValidationError):
        VLLMService.model_validate({**obj, "apiVersion": "vllm-operator.dev/v1"})


def test_quantities_accept_integers_and_refuse_bad_strings() -> None:
    s = parse_spec(spec(resources={"cpu": 4, "memory": "1.5Gi", "shmSize": "512Mi"}))
    assert s.resources.cpu == "4" and s.resources.memory == "1.5Gi"
    for bad in ["64 GB", "64GB", "-1Gi", True, 0.5]:
        errors = validate_spec(spec(resources={"memory": bad}))
        assert fields(errors) == ["spec.resources.memory"], bad


def test_json_types_are_strict_as_in_the_api_server() -> None:
    errors = validate_spec(spec(flags={"enforceEager": "yes", "maxModelLen": "4096"}, replicas=1.5))
    assert fields(errors) == ["spec.flags.maxModelLen", "spec.flags.enforceEager", "spec.replicas"]
    assert (
        parse_spec(
            spec(flags={"gpuMemoryUtilization": 1}, gpu={"memoryGiB": 24})
        ).flags.gpu_memory_utilization
        == 1
    )


def test_read_only_mappings_are_accepted() -> None:
    from types import MappingProxyType

    body = MappingProxyType(
        {"spec": MappingProxyType({"model": MappingProxyType(dict(MODEL)), "extraArgs": ("--seed",)})}
    )
    assert parse_spec(body).extra_args == ["--seed"]


def test_quantization_enum_has_the_common_methods() -> None:
    for method in [
        "awq",
        "awq_marlin",
        "gptq",
        "gptq_marlin",
        "fp8",
        "compressed-tensors",
        "bitsandbytes",
        "mxfp4",
    ]:
        assert method in QUANTIZATION_METHODS
    assert fields(validate_spec(spec(flags={"quantization": "int3"}))) == ["spec.flags.quantization"]


# --------------------------------------------------------------------------------------------------
# validate_spec: paths and messages
# --------------------------------------------------------------------------------------------------


_TERMS = ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
          ".matchExpressions[0]")
_POD_TERM = "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"


def _node_terms(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": list(expressions)}]}}}


def _pod_term(**term: Any) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def test_unknown_field_is_rejected_with_its_path_and_a_suggestion() -> None:
    errors = validate_spec(spec(flags={"maxModelLength": 4096}))
    assert errors == [
        SpecError("spec.flags.maxModelLength", "unknown field 'maxModelLength'; did you mean 'maxModelLen'?")
    ]


def test_unknown_field_in_a_list_item() -> None:
    errors = validate_spec(spec(tolerations=[{"key": "a"}, {"key": "b", "efect": "NoSchedule"}]))
    assert fields(errors) == ["spec.tolerations[1].efect"]
    assert "did you mean 'effect'" in errors[0].message


def test_unknown_top_level_field() -> None:
    errors = validate_spec(spec(replica=2))
    assert fields(errors) == ["spec.replica"]
    assert "did you mean 'replicas'" in errors[0].message


def test_out_of_range_value_says_the_bound() -> None:
    errors = validate_spec(spec(flags={"gpuMemoryUtilization": 1.5}))
    assert errors == [
        SpecError("spec.flags.gpuMemoryUtilization", "must be less than or equal to 1 (got 1.5)")
    ]
    errors = validate_spec(spec(flags={"gpuMemoryUtilization": 0}))
    assert errors[0].message == "must be greater than 0 (got 0)"
    errors = validate_spec(spec(flags={"maxModelLen": 8}))
    assert errors == [SpecError("spec.flags.maxModelLen", "must be greater than or equal to 16 (got 8)")]


def test_enum_value_lists_the_choices() -> None:
    errors = validate_spec(spec(flags={"dtype": "fp16"}))
    assert fields(errors) == ["spec.flags.dtype"]
    assert "'bfloat16'" in errors[0].message and "(got 'fp16')" in errors[0].message


def test_missing_model_name() -> None:
    assert validate_spec({"model": {}}) == [SpecError("spec.model.name", "is required; set it")]
    assert validate_spec({}) == [SpecError("spec.model", "is required; set it")]


def test_model_name_must_be_a_hub_id() -> None:
    errors = validate_spec(spec(model={"name": "not a model"}))
    assert fields(errors) == ["spec.model.name"]
    assert "Hugging Face model id" in errors[0].message


def test_several_errors_are_all_reported() -> None:
    errors = validate_spec(spec(flags={"maxNumSeqs": 0, "dtype": "x"}, service={"port": 0}))
    assert fields(errors) == ["spec.flags.maxNumSeqs", "spec.flags.dtype", "spec.service.port"]


def test_parse_spec_raises_with_the_errors() -> None:
    with pytest.raises(SpecValidationError) as info:
        parse_spec(spec(gpu={"count": 0}))
    assert fields(info.value.errors) == ["spec.gpu.count"]
    assert "spec.gpu.count" in str(info.value)


@pytest.mark.parametrize(("affinity", "field", "words"), [
    # the corpus's two failed checks while affinity was free-form: the Deployment's schema refused them
    ({"nodeAffinity": {"a": 1}}, "spec.affinity.nodeAffinity.a", "unknown field 'a'"),
    ({"nodeAffinity": {"hidden_size": 4096}}, "spec.affinity.nodeAffinity.hidden_size",
     "unknown field 'hidden_size'"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "at least 1"),
    (_node_terms({"key": "zone", "operator": "In"}), f"{_TERMS}.values", "needs at least one value"),
    (_node_terms({"key": "zone", "operator": "Exists", "values": ["a"]}), f"{_TERMS}.values", "takes no values"),
    (_node_terms({"key": "gpus", "operator": "Gt", "values": ["four"]}), f"{_TERMS}.values", "an integer"),
    (_node_terms({"key": "zone", "operator": "Near", "values": ["a"]}), f"{_TERMS}.operator", "'DoesNotExist'"),
    (_node_terms({"key": "bad key", "operator": "Exists"}), f"{_TERMS}.key", "label key"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["n"]}]}]}}},
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchFields[0].key", "'metadata.name'"),
    ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101, "preference": {}}]}},
     "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight", "100"),
    (_pod_term(), f"{_POD_TERM}.topologyKey", "is required"),
    (_pod_term(topologyKey="zone", matchLabelKeys=["app"]), f"{_POD_TERM}.labelSelector", "needs a labelSelector"),
    (_pod_term(topologyKey="zone", labelSelector={"matchLabels": {"app": "a"}}, matchLabelKeys=["app"]),
     f"{_POD_TERM}.matchLabelKeys", "keep it in one"),
    (_pod_term(topologyKey="zone", labelSelector={}, matchLabelKeys=["t"], mismatchLabelKeys=["t"]),
     f"{_POD_TERM}.mismatchLabelKeys", "in both"),
    (_pod_term(topologyKey="zone", labelSelector={"matchLabels": {"a b": "x"}}),
     f"{_POD_TERM}.labelSelector.matchLabels", "label keys"),
    (_pod_term(topologyKey="zone", labelSelector={"matchExpressions": [{"key": "app", "operator": "DoesNotExist",
                                                                        "values": ["a"]}]}),
     f"{_POD_TERM}.labelSelector.matchExpressions[0].values", "takes no values"),
    (_pod_term(topologyKey="zone", namespaces=["UPPER"]), f"{_POD_TERM}.namespaces[0]", "namespace name"),
])
def test_affinity_is_checked_as_the_pod_api_does(affinity: dict[str, Any], field: str, words: str) -> None:
    errors = validate_spec(spec(affinity=affinity))
    assert fields(errors) == [field], errors
    assert words in errors[0].message, errors[0].message


def test_affinity_as_the_pod_api_writes_it_is_kept_as_is() -> None:
    affinity = FULL_AFFINITY
    assert validate_spec(spec(affinity=affinity)) == []
    assert parse_spec(spec(affinity=affinity)).affinity.to_dict() == affinity  # type: ignore[union-attr]


def test_valid_spec_has_no_errors() -> None:
    assert validate_spec(FULL_SPEC) == []
    assert validate_spec({"spec": FULL_SPEC, "status": {"anything": 1}}) == []


# --------------------------------------------------------------------------------------------------
# Cross-field rules (mirrors of the CRD's CEL rules; test_crd.py checks they agree with CEL)
# --------------------------------------------------------------------------------------------------

#: (spec, the rule it breaks or None, the field named). Shared with test_crd.py.
RULE_CASES: list[tuple[dict[str, Any], str | None, str | None]] = [
    (spec(gpu={"count": 9}), "gpu-count-within-max-count", "spec.gpu.count"),
    (spec(gpu={"count": 9, "maxCount": 16}), None, None),
    (spec(gpu={"count": 8}), None, None),
    (spec(network={"ipcLock": True}, security={"profile": "restricted"}), "ipc-lock-needs-baseline",
     "spec.network.ipcLock"),
    (spec(network={"ipcLock": True}, security={"profile": "baseline"}), None, None),
    (spec(network={"rdmaResources": [{"name": "nvidia.com/gpu", "count": 1}]}), "rdma-resource-is-not-the-gpu",
     "spec.network.rdmaResources[0].name"),
    (spec(network={"rdmaResources": [{"name": "rdma/rdma_shared_device_a", "count": 1}]}), None, None),
    (spec(gpu={"count": 4, "maxCount": 2}), "gpu-count-within-max-count", "spec.gpu.count"),
    (spec(gpu={"count": 2, "share": {"group": "team"}}), "gpu-share-one-gpu", "spec.gpu.share"),
    (spec(gpu={"count": 1, "share": {"group": "team", "memoryGiB": 8}}), None, None),
    (
        spec(flags={"tensorParallelSize": 4}, gpu={"count": 2}),
        "parallelism-matches-gpu-count",
        "spec.flags.tensorParallelSize",
    ),
    (spec(flags={"tensorParallelSize": 2}, gpu={"count": 2}), None, None),
    (spec(flags={"tensorParallelSize": 2, "pipelineParallelSize": 2}, gpu={"count": 4}), None, None),
    (
        spec(flags={"tensorParallelSize": 2, "pipelineParallelSize": 2}, gpu={"count": 2}),
        "parallelism-matches-gpu-count",
        "spec.flags.tensorParallelSize",
    ),
    (
        spec(flags={"pipelineParallelSize": 2}, gpu={"count": 3}),
        "pipeline-divides-gpu-count",
        "spec.flags.pipelineParallelSize",
    ),
    (spec(flags={"pipelineParallelSize": 2}, gpu={"count": 4}), None, None),
    # spec.gpu.maxNodes (issue 13): gpu.count is GPUs per pod; TP x PP may be count x a node count within maxNodes
    (spec(flags={"tensorParallelSize": 8, "pipelineParallelSize": 2}, gpu={"count": 8, "maxNodes": 2}), None, None),
    (spec(flags={"tensorParallelSize": 8, "pipelineParallelSize": 3}, gpu={"count": 8, "maxNodes": 4}), None, None),
    (
        spec(flags={"tensorParallelSize": 8, "pipelineParallelSize": 2}, gpu={"count": 8}),
        "parallelism-matches-gpu-count",
        "spec.flags.tensorParallelSize",
    ),
    (
        spec(flags={"tensorParallelSize": 8, "pipelineParallelSize": 4}, gpu={"count": 8, "maxNodes": 2}),
        "parallelism-matches-gpu-count",
        "spec.flags.tensorParallelSize",
    ),
    (spec(flags={"tensorParallelSize": 8, "pipelineParallelSize": 2}, gpu={"maxNodes": 2}), None, None),
    (
        spec(flags={"tensorParallelSize": 8, "pipelineParallelSize": 4}, gpu={"maxNodes": 2}),
        "parallelism-within-max-count",
        "spec.flags.tensorParallelSize",
    ),
    (spec(flags={"tensorParallelSize": 16}), "parallelism-within-max-count", "spec.flags.tensorParallelSize"),
    (spec(flags={"tensorParallelSize": 16}, gpu={"maxCount": 16}), None, None),
    (
        spec(flags={"tensorParallelSize": 4, "pipelineParallelSize": 4}),
        "parallelism-within-max-count",
        "spec.flags.tensorParallelSize",
    ),
    (
        spec(flags={"pipelineParallelSize": 16}),
        "parallelism-within-max-count",
        "spec.flags.pipelineParallelSize",
    ),
    (spec(flags={"tensorParallelSize": 8}), None, None),
    (spec(replicas=3, maxReplicas=2), "max-replicas-at-least-replicas", "spec.maxReplicas"),
    (spec(maxReplicas=1), None, None),
    (spec(replicas=0, maxReplicas=1), None, None),
    (
        spec(workload={"contextLength": 9000}, flags={"maxModelLen": 8192}),
        "context-length-within-max-model-len",
        "spec.workload.contextLength",
    ),
    (spec(workload={"contextLength": 8192}, flags={"maxModelLen": 8192}), None, None),
    (spec(flags={"maxLoraRank": 16}), "max-lora-rank-needs-lora", "spec.flags.maxLoraRank"),
    (
        spec(flags={"maxLoraRank": 16, "enableLora": False}),
        "max-lora-rank-needs-lora",
        "spec.flags.maxLoraRank",
    ),
    (spec(flags={"maxLoraRank": 16, "enableLora": True}), None, None),
    (
        spec(flags={"maxNumSeqs": 256, "maxNumBatchedTokens": 128}),
        "batched-tokens-at-least-seqs",
        "spec.flags.maxNumBatchedTokens",
    ),
    (spec(flags={"maxNumSeqs": 256, "maxNumBatchedTokens": 256}), None, None),
    (
        spec(flags={"speculativeConfig": {"method": "eagle3", "numSpeculativeTokens": 3}}),
        "speculative-draft-needs-model",
        "spec.flags.speculativeConfig.model",
    ),
    (
        spec(flags={"speculativeConfig": {"method": "ngram"}}),
        "speculative-needs-tokens",
        "spec.flags.speculativeConfig.numSpeculativeTokens",
    ),
    (spec(flags={"speculativeConfig": {"method": "deepseek_mtp"}}), None, None),
    (spec(flags={"speculativeConfig": {"method": "eagle3", "model": "org/eagle3", "numSpeculativeTokens": 3}}),
     None, None),
    (spec(modelCache={}), None, None),  # the operator's default cache (with prewarm, say)
    (spec(modelCache={"prewarm": {"keep": True}}), None, None),
    (
        spec(modelCache={"claimName": "c", "size": "1Gi"}),
        "model-cache-claim-or-size",
        "spec.modelCache.claimName",
    ),
    (spec(modelCache={"claimName": "c"}), None, None),
    (
        spec(modelCache={"claimName": "c", "storageClassName": "s"}),
        "model-cache-storage-class-needs-size",
        "spec.modelCache.storageClassName",
    ),
    (spec(modelCache={"size": "1Gi", "storageClassName": "s"}), None, None),
    (
        spec(env=[{"name": "A", "value": "1"}, {"name": "B", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
        "env-value-or-value-from",
        "spec.env[1].valueFrom",
    ),
    (spec(env=[{"name": "A"}]), None, None),
    (spec(nodeSelector={"bad key": "x"}), "node-selector-keys-are-label-keys", "spec.nodeSelector"),
    (spec(nodeSelector={"-x": "x"}), "node-selector-keys-are-label-keys", "spec.nodeSelector"),
    (spec(nodeSelector={"example.com/pool": "a", "zone": "b"}), None, None),
    (
        spec(lora={"adapters": [{"name": "a", "source": "o/a"}, {"name": "a", "source": "o/b"}]}),
        "lora-adapter-names-unique",
        "spec.lora.adapters",
    ),
    (spec(lora={"adapters": [{"name": "a", "source": "o/a"}, {"name": "b", "source": "/x/b"}]}), None, None),
    (spec(lora={}, flags={"enableLora": False}), "lora-agrees-with-flags", "spec.lora"),
    (spec(lora={"maxRank": 8}, flags={"enableLora": True, "maxLoraRank": 16}), "lora-agrees-with-flags", "spec.lora"),
    (spec(lora={"maxRank": 16}, flags={"enableLora": True, "maxLoraRank": 16}), None, None),
    (spec(autoscaling={"maxReplicas": 2}, maxReplicas=2), "autoscaling-or-max-replicas", "spec.maxReplicas"),
    (spec(autoscaling={"maxReplicas": 2, "minReplicas": 3}), "autoscaling-min-at-most-max",
     "spec.autoscaling.minReplicas"),
    (spec(autoscaling={"maxReplicas": 2, "minReplicas": 0}), "scale-to-zero-needs-keda",
     "spec.autoscaling.minReplicas"),
    (spec(autoscaling={"maxReplicas": 2, "engine": "KEDA"}), "keda-needs-prometheus",
     "spec.autoscaling.prometheusAddress"),
    (spec(autoscaling={"maxReplicas": 2, "activationQuery": "up"}), "activation-query-is-keda",
     "spec.autoscaling.activationQuery"),
    (spec(autoscaling={"maxReplicas": 2, "metrics": [{"type": "KVCacheUsage", "target": 2}]}),
     "kv-cache-usage-is-a-fraction", "spec.autoscaling.metrics[0].target"),
    (spec(autoscaling={"engine": "KEDA", "maxReplicas": 2, "minReplicas": 0, "activationQuery": "up",
                       "prometheusAddress": "http://p:9090"}), None, None),
    (FULL_SPEC, None, None),
    # spec.affinity: the Pod API's own cross-field refusals
    (spec(affinity=_node_terms({"key": "zone", "operator": "In"})), "node-selector-values-fit-operator",
     f"{_TERMS}.values"),
    (spec(affinity=_node_terms({"key": "n", "operator": "Lt", "values": ["1", "2"]})),
     "node-selector-values-fit-operator", f"{_TERMS}.values"),
    (spec(affinity=_node_terms({"key": "n", "operator": "Gt", "values": ["3"]},
                               {"key": "z", "operator": "Exists", "values": []})), None, None),
    (spec(affinity=_pod_term(topologyKey="z", labelSelector={"matchExpressions": [
        {"key": "app", "operator": "Exists", "values": ["a"]}]})), "label-selector-values-fit-operator",
     f"{_POD_TERM}.labelSelector.matchExpressions[0].values"),
    (spec(affinity=_pod_term(topologyKey="z", namespaceSelector={"matchLabels": {"a b": "x"}})),
     "match-labels-are-label-keys", f"{_POD_TERM}.namespaceSelector.matchLabels"),
    (spec(affinity=_pod_term(topologyKey="z", mismatchLabelKeys=["t"])), "label-keys-need-selector",
     f"{_POD_TERM}.labelSelector"),
    (spec(affinity=_pod_term(topologyKey="z", labelSelector={}, matchLabelKeys=["t"], mismatchLabelKeys=["t"])),
     "label-keys-disjoint", f"{_POD_TERM}.mismatchLabelKeys"),
    (spec(affinity=_pod_term(topologyKey="z", labelSelector={"matchExpressions": [
        {"key": "t", "operator": "Exists"}]}, mismatchLabelKeys=["t"])), "label-keys-not-in-selector",
     f"{_POD_TERM}.matchLabelKeys"),
    (spec(affinity=_pod_term(topologyKey="z", labelSelector={"matchLabels": {"app": "a"}},
                             matchLabelKeys=["rev"], mismatchLabelKeys=["tenant"])), None, None),
]


@pytest.mark.parametrize(("doc", "rule", "field"), RULE_CASES)
def test_cross_field_rules(doc: dict[str, Any], rule: str | None, field: str | None) -> None:
    assert rule_ids(doc) == ([rule] if rule else [])
    errors = validate_spec(doc)
    assert fields(errors) == ([field] if field else [])


def test_every_cel_rule_has_a_python_mirror_case() -> None:
    from vllm_operator.api.crd import build_crd  # noqa: F401  (the CRD is built from these rules)

    cel_ids = {rule.id for model in _spec_models() for rule in model.CEL_RULES}
    covered = {rule for _, rule, _ in RULE_CASES if rule}
    assert cel_ids == covered


def _spec_models() -> list[type[Any]]:
    from vllm_operator.api import v1alpha1

    return [
        obj
        for obj in vars(v1alpha1).values()
        if isinstance(obj, type) and issubclass(obj, v1alpha1._Model)
        and obj.__module__.startswith("vllm_operator.api.")  # the spec and the Pod API's types (api/podtypes.py)
    ]


def test_rule_messages_name_values_and_the_fix() -> None:
    errors = validate_spec(spec(flags={"tensorParallelSize": 4}, gpu={"count": 2}))
    assert errors[0].message.startswith("flags.tensorParallelSize (4) x flags.pipelineParallelSize (1) = 4")
    assert "gpu.count (2)" in errors[0].message
    errors = validate_spec(spec(gpu={"count": 12}))
    assert errors == [
        SpecError(
            "spec.gpu.count", "gpu.count (12) exceeds gpu.maxCount (8); raise gpu.maxCount or lower gpu.count"
        )
    ]


def test_rules_in_different_objects_are_reported_together_when_fields_are_valid() -> None:
    errors = validate_spec(
        spec(replicas=3, maxReplicas=2, workload={"contextLength": 100}, flags={"maxModelLen": 64})
    )
    assert fields(errors) == ["spec.maxReplicas", "spec.workload.contextLength"]


def test_gpu_and_model_cache_models_check_their_rules_on_construction() -> None:
    with pytest.raises(ValidationError):
        GPURequest(count=9)
    with pytest.raises(ValidationError):
        ModelCacheSpec(claim_name="c", size="1Gi")
    assert ModelCacheSpec().claim_name is None  # the operator's default cache
    assert GPURequest(count=8).count == 8


# --------------------------------------------------------------------------------------------------
# extraArgs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "hint"),
    [
        ("--max-model-len", "spec.flags.maxModelLen"),
        ("--max-model-len=4096", "spec.flags.maxModelLen"),
        ("--max_model_len", "spec.flags.maxModelLen"),
        ("--gpu-memory-utilization=0.8", "spec.flags.gpuMemoryUtilization"),
        ("-tp", "spec.flags.tensorParallelSize"),
        ("-tp=2", "spec.flags.tensorParallelSize"),
        ("-pp", "spec.flags.pipelineParallelSize"),
        ("-q", "spec.flags.quantization"),
        ("--no-enable-prefix-caching", "spec.flags.enablePrefixCaching"),
        ("--enforce-eager", "spec.flags.enforceEager"),
        ("--kv-cache-memory-bytes", "spec.flags.kvCacheMemoryBytes"),
        ("--port", "spec.service.port"),
        ("--served-model-name", "spec.model.servedName"),
        ("--model", "spec.model.name"),
        ("--revision", "spec.model.revision"),
        ("--host", "the operator sets it"),
    ],
)
def test_extra_args_must_not_set_managed_flags(arg: str, hint: str) -> None:
    errors = validate_spec(spec(extraArgs=["--disable-log-requests", arg, "7"]))
    assert fields(errors) == ["spec.extraArgs[1]"]
    assert hint in errors[0].message
    assert "manages" in errors[0].message


def test_extra_args_message_says_use_flags() -> None:
    errors = validate_spec(spec(extraArgs=["--max-model-len=4096"]))
    assert errors == [
        SpecError(
            "spec.extraArgs[0]",
            "'--max-model-len' duplicates --max-model-len, which the operator manages: "
            "pin it as spec.flags.maxModelLen instead",
        )
    ]


def test_extra_args_that_are_not_managed_pass() -> None:
    args = [
        "--disable-log-requests",
        "--seed",
        "-1",
        "--compilation-config",
        '{"level": 3}',
        "-O3",
        "--api-server-count",
        "1",
        "--no-enable-log-requests",
        "--",
        "-",
        "-.5",
        "--tokenizer",
        "x",
    ]
    assert validate_spec(spec(extraArgs=args)) == []


def test_data_and_expert_parallelism_are_pinned_flags_not_extra_args() -> None:
    # they decide the GPUs per pod and the memory per GPU (issue 13): the planner must see them
    errors = validate_spec(spec(extraArgs=["--data-parallel-size", "2", "-dp", "2", "--enable-expert-parallel"]))
    assert fields(errors) == ["spec.extraArgs[0]", "spec.extraArgs[2]", "spec.extraArgs[4]"]
    assert "spec.flags.dataParallelSize" in errors[0].message
    assert "spec.flags.enableExpertParallel" in errors[2].message


def test_every_duplicate_extra_arg_is_reported() -> None:
    errors = validate_spec(spec(extraArgs=["--max-model-len", "1", "--seed", "1", "--max-num-seqs", "2"]))
    assert fields(errors) == ["spec.extraArgs[0]", "spec.extraArgs[4]"]


# --------------------------------------------------------------------------------------------------
# PinnedFlags
# --------------------------------------------------------------------------------------------------


def test_to_vllm_gives_snake_case_names_of_set_fields_only() -> None:
    flags = PinnedFlags.model_validate(
        {"maxModelLen": 4096, "gpuMemoryUtilization": 0.85, "enforceEager": False, "kvCacheDtype": "fp8"}
    )
    assert flags.to_vllm() == {
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.85,
        "enforce_eager": False,
        "kv_cache_dtype": "fp8",
    }
    assert PinnedFlags().to_vllm() == {}


def test_every_pinned_flag_is_a_vllm_option_name() -> None:
    flags = parse_spec(FULL_SPEC).flags.to_vllm()
    assert set(flags) == set(PinnedFlags.model_fields)
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", name) for name in flags)


def test_field_path() -> None:
    assert PinnedFlags.field_path("max_model_len") == "spec.flags.maxModelLen"
    assert PinnedFlags.field_path("maxModelLen") == "spec.flags.maxModelLen"
    assert PinnedFlags.field_path("cpu_offload_gb") == "spec.flags.cpuOffloadGb"
    with pytest.raises(KeyError):
        PinnedFlags.field_path("no_such_flag")


def test_vllm_cli_flag() -> None:
    assert vllm_cli_flag("max_model_len") == "--max-model-len"


# --------------------------------------------------------------------------------------------------
# model facts
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "size"),
    [
        ({"metadata": {"total_size": 1000}, "weight_map": {"a": "b.safetensors"}}, 1000),
        ({"totalSize": 2000}, 2000),
    ],
)
def test_weights_bytes_from_the_inline_index(index: dict[str, Any], size: int) -> None:
    assert parse_spec(spec(model={**MODEL, "safetensorsIndex": index})).model.weights_bytes() == size


def test_weights_bytes_absent() -> None:
    assert parse_spec(spec()).model.weights_bytes() is None


@pytest.mark.parametrize(
    "index", [{}, {"metadata": {}}, {"totalSize": 0}, {"metadata": {"total_size": -1}}]
)
def test_safetensors_index_needs_a_size(index: dict[str, Any]) -> None:
    errors = validate_spec(spec(model={**MODEL, "safetensorsIndex": index}))
    assert fields(errors) == ["spec.model.safetensorsIndex"]
    assert "total_size" in errors[0].message


@pytest.mark.parametrize("index", [{"totalSize": "big"}, {"totalSize": True}, {"totalSize": 1.5}])
def test_a_safetensors_size_of_another_type_is_refused_naming_it(index: dict[str, Any]) -> None:
    errors = validate_spec(spec(model={**MODEL, "safetensorsIndex": index}))
    assert fields(errors) == ["spec.model.safetensorsIndex.totalSize"]


# --------------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------------

STATUS: dict[str, Any] = {
    "observedGeneration": 3,
    "state": "Ready",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Available",
            "message": "2/2 ready",
            "observedGeneration": 3,
            "lastTransitionTime": "2025-01-02T03:04:05Z",
        },
    ],
    "plan": {
        "fits": True,
        "flags": {
            "maxModelLen": 32768,
            "gpuMemoryUtilization": 0.9,
            "enforceEager": False,
            "dtype": "auto",
        },
        "args": ["--max-model-len", "32768"],
        "memory": {
            "gpuTotalGiB": 80,
            "requestedGiB": 72,
            "weightsGiB": 15.2,
            "activationGiB": 2.1,
            "nonTorchGiB": 0.5,
            "cudagraphGiB": 0.4,
            "kvCacheGiB": 53.8,
        },
        "kvCacheTokens": 440000,
        "maxConcurrency": 13.4,
        "reasons": ["max_model_len: the model's max_position_embeddings"],
        "failure": None,
        "options": [{"summary": "use fp8 KV cache", "flags": {"kvCacheDtype": "fp8"}, "extra": {"k": 1}}],
        "vllmVersion": "0.11.0",
        "specHash": "abc",
    },
    "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 1, "source": "nodeLabels", "memoryGiB": 80},
    "replicas": 2,
    "readyReplicas": 2,
    "selector": "app=x",
    "endpoint": "http://x.default.svc:8000/v1",
    "remediation": {
        "step": 1,
        "profile": {"maxNumSeqs": 128},
        "history": [
            {
                "step": 1,
                "time": "2025-01-02T03:04:05Z",
                "failureClass": "CUDAOutOfMemory",
                "evidence": "torch.OutOfMemoryError",
                "podUID": "u-1",
                "restartCount": 2,
                "flagsBefore": {"maxNumSeqs": 256},
                "flagsAfter": {"maxNumSeqs": 128},
                "message": "halved max_num_seqs",
            }
        ],
        "exhausted": False,
        "lastFailureKey": "u-1/2",
    },
    "metrics": {
        "kvCacheUsage": 0.4,
        "preemptionRate": 0.0,
        "waiting": 0,
        "running": 3,
        "time": "2025-01-02T03:04:05Z",
    },
    "kopf": {"progress": {"handler": {"retries": 1}}},
    "create_fn": {"written": "by a kopf handler result"},
}


def test_status_parses_with_kopf_bookkeeping_and_unknown_fields() -> None:
    status = VLLMServiceStatus.model_validate(STATUS)
    assert status.kopf == {"progress": {"handler": {"retries": 1}}}
    assert status.plan is not None and status.plan.memory is not None
    assert status.plan.memory.kv_cache_gib == 53.8
    assert status.plan.flags["enforce_eager"] is False and status.plan.flags["max_model_len"] == 32768
    assert status.plan.options[0].flags == {"kv_cache_dtype": "fp8"}
    assert status.remediation is not None and status.remediation.history[0].pod_uid == "u-1"
    dumped = status.to_dict()
    assert "create_fn" not in dumped
    assert dumped["remediation"]["history"][0]["podUID"] == "u-1"
    assert dumped["plan"]["memory"]["gpuTotalGiB"] == 80
    assert dumped["gpu"]["memoryGiB"] == 80
    assert dumped["plan"]["options"][0]["extra"] == {"k": 1}


def test_plan_needs_fits() -> None:
    with pytest.raises(ValidationError):
        PlanStatus.model_validate({})


# --------------------------------------------------------------------------------------------------
# conditions
# --------------------------------------------------------------------------------------------------


def test_condition_types_and_reasons_are_camel_case_and_unique() -> None:
    assert c.CONDITION_TYPES == ("Ready", "Progressing", "Degraded", "PlanFeasible", "MetricsAvailable", "PlanBudget")
    assert len(set(c.ALL_REASONS)) == len(c.ALL_REASONS)
    for reason in c.ALL_REASONS + c.CONDITION_TYPES:
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", reason), reason
    for name in [
        "PLAN_FITS",
        "PLAN_INFEASIBLE",
        "INVALID_SPEC",
        "GPU_NOT_FOUND",
        "MODEL_NOT_FOUND",
        "DEPLOYING",
        "AVAILABLE",
        "REMEDIATING",
        "REMEDIATION_EXHAUSTED",
    ]:
        assert getattr(c, name) in c.ALL_REASONS


def test_every_reason_is_used_by_the_operator() -> None:
    """A reason no module sets is vocabulary nobody speaks: it is removed, not kept "for later"."""
    package = Path(c.__file__).resolve().parents[1]
    sources = "\n".join(p.read_text() for p in package.rglob("*.py") if p.resolve() != Path(c.__file__).resolve())
    reasons = [name for name in dir(c) if name.isupper() and not name.startswith("STATE_")
               and isinstance(getattr(c, name), str) and getattr(c, name) in c.ALL_REASONS]
    assert len(reasons) == len(c.ALL_REASONS)
    unused = [name for name in reasons if not re.search(rf"\b{name}\b", sources)]
    assert unused == []


def test_format_time() -> None:
    assert c.format_time(T0) == "2025-01-02T03:04:05Z"
    assert c.format_time(datetime(2025, 1, 2, 4, 4, 5, 999, tzinfo=UTC)) == "2025-01-02T04:04:05Z"
    with pytest.raises(ValueError):
        c.format_time(datetime(2025, 1, 2))


def test_set_condition_adds_a_new_condition() -> None:
    result = c.set_condition(
        [], c.ConditionUpdate(c.READY, "False", c.DEPLOYING, "starting"), observed_generation=1, now=T0
    )
    assert [x.to_dict() for x in result] == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Deploying",
            "message": "starting",
            "observedGeneration": 1,
            "lastTransitionTime": "2025-01-02T03:04:05Z",
        }
    ]


def test_transition_time_moves_only_when_status_changes() -> None:
    first = c.set_condition(
        [], c.ConditionUpdate(c.READY, "False", c.DEPLOYING), observed_generation=1, now=T0
    )
    same_status = c.set_condition(
        first,
        c.ConditionUpdate(c.READY, "False", c.PODS_NOT_READY, "1/2 ready"),
        observed_generation=2,
        now=T1,
    )
    assert same_status[0].last_transition_time == "2025-01-02T03:04:05Z"
    assert same_status[0].reason == "PodsNotReady" and same_status[0].message == "1/2 ready"
    assert same_status[0].observed_generation == 2
    flipped = c.set_condition(
        same_status, c.ConditionUpdate(c.READY, "True", c.AVAILABLE), observed_generation=2, now=T1
    )
    assert flipped[0].last_transition_time == "2025-01-02T03:09:05Z"
    assert first[0].reason == "Deploying"  # inputs are not modified


def test_set_condition_keeps_order_and_other_conditions() -> None:
    conds = c.fold_conditions(
        [],
        [
            c.ConditionUpdate(c.PLAN_FEASIBLE, "True", c.PLAN_FITS),
            c.ConditionUpdate(c.READY, "False", c.DEPLOYING),
            c.ConditionUpdate(c.PLAN_FEASIBLE, "False", c.PLAN_INFEASIBLE, "weights do not fit"),
        ],
        observed_generation=1,
        now=T0,
    )
    assert [(x.type, x.status) for x in conds] == [("PlanFeasible", "False"), ("Ready", "False")]
    assert c.find_condition(conds, c.PLAN_FEASIBLE) is not None
    assert c.find_condition(conds, c.DEGRADED) is None
    assert not c.is_true(conds, c.READY) and not c.is_true(conds, c.DEGRADED)


def test_long_messages_are_truncated() -> None:
    conds = c.set_condition(
        [],
        c.ConditionUpdate(c.DEGRADED, "True", c.CONTAINER_CRASH_LOOP_BACK_OFF, "x" * 40000),
        observed_generation=1,
        now=T0,
    )
    assert len(conds[0].message) == c.MAX_MESSAGE_LENGTH


def test_fold_status_from_the_raw_api_dict() -> None:
    new = c.fold_status(
        STATUS,
        conditions=[
            c.ConditionUpdate(c.READY, "True", c.AVAILABLE, "2/2 ready"),
            c.ConditionUpdate(c.DEGRADED, "False", c.AS_EXPECTED),
        ],
        observed_generation=4,
        now=T1,
        ready_replicas=1,
        endpoint=None,
    )
    assert new.observed_generation == 4 and new.ready_replicas == 1 and new.endpoint is None
    ready = c.find_condition(new.conditions, c.READY)
    assert ready is not None and ready.last_transition_time == "2025-01-02T03:04:05Z"
    assert ready.observed_generation == 4
    degraded = c.find_condition(new.conditions, c.DEGRADED)
    assert degraded is not None and degraded.last_transition_time == "2025-01-02T03:09:05Z"
    assert new.kopf == STATUS["kopf"]


def test_fold_status_rejects_unknown_fields_and_accepts_none() -> None:
    with pytest.raises(TypeError):
        c.fold_status(None, observed_generation=1, now=T0, readyReplicas=1)
    assert c.fold_status(None, observed_generation=1, now=T0).to_dict() == {
        "observedGeneration": 1,
        "state": "Pending",
        "conditions": [],
    }


def test_status_patch_is_empty_when_nothing_changed() -> None:
    same = c.fold_status(STATUS, observed_generation=3, now=T1)
    assert c.status_patch(STATUS, same) == {}
    assert c.status_patch(VLLMServiceStatus.model_validate(STATUS), same) == {}


def test_status_patch_carries_only_the_changes_and_leaves_kopf_alone() -> None:
    new = c.fold_status(
        STATUS,
        conditions=[c.ConditionUpdate(c.READY, "False", c.PODS_NOT_READY, "1/2 ready")],
        observed_generation=4,
        now=T1,
        ready_replicas=1,
        endpoint=None,
        kopf={"progress": {}},
    )
    patch = c.status_patch(STATUS, new)
    assert set(patch) == {"observedGeneration", "conditions", "readyReplicas", "endpoint", "state"}
    assert patch["endpoint"] is None and patch["readyReplicas"] == 1 and patch["state"] == "RollingOut"
    assert patch["conditions"][0]["lastTransitionTime"] == "2025-01-02T03:09:05Z"


def test_status_patch_merges_nested_objects() -> None:
    plan = VLLMServiceStatus.model_validate(STATUS).plan
    assert plan is not None
    new = c.fold_status(
        STATUS,
        observed_generation=3,
        now=T0,
        plan=plan.model_copy(update={"flags": {**plan.flags, "max_model_len": 16384}}),
    )
    assert c.status_patch(STATUS, new) == {"plan": {"flags": {"maxModelLen": 16384}}}
    assert c.status_patch(None, new)["plan"]["fits"] is True


def _conditions(*updates: tuple[str, str, str]) -> list[Any]:
    return c.fold_conditions([], [c.ConditionUpdate(t, s, r, "m") for t, s, r in updates],  # type: ignore[arg-type]
                             observed_generation=1, now=T0)


@pytest.mark.parametrize(("updates", "exhausted", "state"), [
    ((), False, "Pending"),
    (((c.READY, "True", c.AVAILABLE), (c.DEGRADED, "False", c.AS_EXPECTED)), False, "Ready"),
    (((c.READY, "True", c.SCALED_TO_ZERO),), False, "ScaledToZero"),
    (((c.READY, "False", c.SERVING_PREVIOUS_PROFILE), (c.PROGRESSING, "True", c.DEPLOYING)), False, "RollingOut"),
    (((c.PROGRESSING, "True", c.DEPLOYING),), False, "RollingOut"),
    (((c.DEGRADED, "True", c.INVALID_SPEC), (c.PROGRESSING, "False", c.INVALID_SPEC)), False, "InvalidSpec"),
    (((c.DEGRADED, "True", c.PLAN_INFEASIBLE), (c.READY, "False", c.PLAN_INFEASIBLE)), False, "Infeasible"),
    (((c.DEGRADED, "True", c.MODEL_NOT_FOUND),), False, "ModelNotFound"),
    (((c.DEGRADED, "True", c.UNSCHEDULABLE), (c.READY, "False", c.SERVING_PREVIOUS_PROFILE)), False, "Unschedulable"),
    (((c.DEGRADED, "True", c.REMEDIATING),), False, "Remediating"),
    (((c.DEGRADED, "True", c.CONTAINER_OOM_KILLED),), False, "ContainerOOMKilled"),
    # exhausted while an old pod still serves: never "Ready"
    (((c.READY, "True", c.AVAILABLE), (c.DEGRADED, "True", c.REMEDIATION_EXHAUSTED)), True, "RemediationExhausted"),
    (((c.READY, "True", c.AVAILABLE),), True, "RemediationExhausted"),
    (((c.DEGRADED, "True", c.RECONCILE_ERROR),), False, "ReconcileError"),
    (((c.DEGRADED, "True", c.CHILD_REJECTED),), False, "ChildRejected"),
])
def test_state_reads_like_kubectl_get_pods(updates: tuple[tuple[str, str, str], ...], exhausted: bool,
                                           state: str) -> None:
    assert c.state_of(_conditions(*updates), exhausted=exhausted) == state


def test_fold_status_keeps_the_state_in_step_with_the_conditions() -> None:
    new = c.fold_status(STATUS, conditions=[c.ConditionUpdate(c.DEGRADED, "True", c.UNSCHEDULABLE, "0/3 nodes")],
                        observed_generation=3, now=T1)
    assert new.state == "Unschedulable"
    assert c.status_patch(STATUS, new)["state"] == "Unschedulable"
    exhausted = c.fold_status(STATUS, observed_generation=3, now=T1,
                              remediation=RemediationStatus(step=3, exhausted=True))
    assert exhausted.state == "RemediationExhausted"
