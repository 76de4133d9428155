"""examples/*.yaml: each is one VLLMService that validates against the CRD's openAPIV3Schema and the API's own
validation, says what it shows, uses only catalog models (no network), and plans to the outcome it describes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kit.crds import openapi_to_jsonschema
from vllm_operator import reconcile
from vllm_operator.api import conditions as cond
from vllm_operator.api.v1alpha1 import validate_spec
from vllm_operator.modelfiles import find_in_catalog

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
CRD = REPO / "crds" / "vllmservices.vllm-operator.dev.yaml"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
L4_NODE = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "23034"}

#: What each example is meant to show, as the planner should decide it: fits (with TP) or not.
EXPECTED: dict[str, tuple[bool, int | None]] = {
    "minimal.yaml": (True, 1),
    "llama3-8b-24gb.yaml": (True, 1),
    "llama3-70b-awq-a100-40gb.yaml": (True, 4),
    "llama3-70b-24gb-infeasible.yaml": (False, None),
    "shared-gpu-stale-process.yaml": (True, 1),
    "full-context-small-gpu.yaml": (True, 1),
    "llama-405b-two-nodes.yaml": (True, 8),  # TP 8 x PP 2 over two nodes (issue 13)
    "llama-405b-auto-fit.yaml": (True, 8),
    "llama-405b-last-stage-oom.yaml": (True, 8),
    # share group members (issue 26): alone here (no neighbours observed), each plans as a service alone
    "packing-chat.yaml": (True, 1),
    "packing-router.yaml": (True, 1),
    "packing-docs.yaml": (True, 1),
}


def _load(path: Path) -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(documents) == 1, f"{path.name}: one VLLMService per file"
    document: dict[str, Any] = documents[0]
    return document




@pytest.fixture(scope="module")
def crd_validator() -> jsonschema.Draft202012Validator:
    crd = yaml.safe_load(CRD.read_text())
    schema = openapi_to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_situation_has_an_example() -> None:
    assert sorted(p.name for p in EXAMPLE_FILES) == sorted(EXPECTED)


def test_example_names_are_unique() -> None:
    names = [_load(p)["metadata"]["name"] for p in EXAMPLE_FILES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_validates_against_the_crd_schema(path: Path, crd_validator: jsonschema.Draft202012Validator) -> None:
    document = _load(path)
    assert document["apiVersion"] == "vllm-operator.dev/v1alpha1" and document["kind"] == "VLLMService"
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in crd_validator.iter_errors(document)]
    assert errors == []


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_passes_the_api_validation(path: Path) -> None:
    assert validate_spec(_load(path)) == []


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_says_what_it_shows(path: Path) -> None:
    lines = path.read_text().splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    assert header and header[0].startswith(f"# {path.name}"), f"{path.name}: start with a comment naming it"
    assert len(" ".join(header)) > 120, f"{path.name}: say what the example shows"


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_uses_a_catalog_model(path: Path) -> None:
    model = _load(path)["spec"]["model"]["name"]
    assert find_in_catalog(model) is not None, f"{model} is not in the built-in catalog (it would need the network)"


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_plans_to_the_outcome_it_describes(path: Path) -> None:
    document = _load(path)
    spec = document["spec"]
    files = find_in_catalog(spec["model"]["name"])
    observed = reconcile.Observed(name=document["metadata"]["name"], namespace="default", uid="uid-1", generation=1,
                                  spec=spec, status={}, now=datetime(2025, 1, 1, tzinfo=UTC), nodes=[L4_NODE],
                                  model_files=files)
    desired = reconcile.desired_state(observed)
    fits, tp = EXPECTED[path.name]
    assert desired.plan is not None, desired.status.conditions
    assert desired.plan.fits is fits, desired.plan.reasons
    feasible = cond.find_condition(desired.status.conditions, cond.PLAN_FEASIBLE)
    assert feasible is not None and feasible.status == (cond.TRUE if fits else cond.FALSE)
    if fits:
        assert desired.children is not None
        assert desired.plan.flags["tensor_parallel_size"] == tp
    else:
        assert desired.children is None and desired.plan.options


def test_full_context_example_leaves_max_model_len_to_the_planner() -> None:
    spec = _load(EXAMPLES / "full-context-small-gpu.yaml")["spec"]
    assert "maxModelLen" not in (spec.get("flags") or {})
    files = find_in_catalog(spec["model"]["name"])
    assert files is not None and files.config["max_position_embeddings"] >= 32768  # a long-context model
    observed = reconcile.Observed(name="full", namespace="default", uid="u", generation=1, spec=spec, status={},
                                  now=datetime(2025, 1, 1, tzinfo=UTC), model_files=files)
    desired = reconcile.desired_state(observed)
    assert desired.plan is not None and desired.plan.fits
    assert desired.plan.flags["max_model_len"] < files.config["max_position_embeddings"]  # shortened to fit


def test_agent_example_asks_for_prefix_caching_and_gets_it() -> None:
    spec = _load(EXAMPLES / "llama3-70b-awq-a100-40gb.yaml")["spec"]
    assert spec["workload"] == {"profile": "agent", "contextLength": 16384, "concurrency": 8, "prefixCaching": True}
    observed = reconcile.Observed(name="agent", namespace="default", uid="u", generation=1, spec=spec, status={},
                                  now=datetime(2025, 1, 1, tzinfo=UTC), model_files=find_in_catalog(
                                      spec["model"]["name"]))
    desired = reconcile.desired_state(observed)
    assert desired.plan is not None and desired.plan.flags.get("enable_prefix_caching") is True


#: Hugging Face organisations whose checkpoints are gated (the hub asks for an accepted licence and a token).
GATED_ORGS = ("meta-llama/",)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_examples_name_no_namespace_and_gated_models_name_their_token(path: Path) -> None:
    """`kubectl apply -f` puts an example in the current namespace (-n to choose); a gated model needs a token."""
    doc = _load(path)
    assert "namespace" not in doc["metadata"], f"{path.name} hard-codes a namespace"
    if doc["spec"]["model"]["name"].startswith(GATED_ORGS):
        assert doc["spec"].get("hfTokenSecretRef", {}).get("name"), f"{path.name}: a gated model without a token"


def test_readme_sample_output_is_what_minimal_yaml_plans() -> None:
    """README's `kubectl get vllms` line after `kubectl apply -f examples/minimal.yaml`, computed by the core."""
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("kubectl apply -f examples/minimal.yaml"):]
    block = block[block.index("```text") + len("```text"):]
    header, row = block[:block.index("```")].strip().splitlines()[:2]
    sample = dict(zip(header.split(), row.split(), strict=True))
    doc = _load(EXAMPLES / "minimal.yaml")
    desired = reconcile.desired_state(reconcile.Observed(
        name=doc["metadata"]["name"], namespace="default", uid="u", generation=1, spec=doc["spec"], status={},
        now=datetime(2025, 1, 1, tzinfo=UTC), nodes=(L4_NODE,),
        model_files=find_in_catalog(doc["spec"]["model"]["name"])))
    status = desired.status.to_dict()
    ready = cond.find_condition(desired.status.conditions, cond.READY)
    assert ready is not None
    assert sample == {"NAME": doc["metadata"]["name"], "MODEL": doc["spec"]["model"]["name"],
                      "GPU": status["gpu"]["product"], "TP": str(status["plan"]["flags"]["tensorParallelSize"]),
                      "NODES": str(status["gpu"].get("nodes", 1)),
                      "MAXLEN": str(status["plan"]["flags"]["maxModelLen"]), "STATUS": status["state"],
                      "READY": ready.status, "AGE": sample["AGE"]}
