"""Tests for the GPU catalog data (catalog/gpus.yaml) and its resolver (planner/gpus.py)."""

from __future__ import annotations

import math
from importlib import resources
from typing import Any

import pytest
import yaml

from vllm_operator.planner.gpus import (
    ESTIMATED_RESERVED_GIB,
    GPUCatalog,
    GPUSpec,
    NodeGPU,
    UnknownGPUError,
    estimate_reported_gib,
    generic_gpu,
    load_gpu_catalog,
    normalize_gpu_key,
    pick_gpu_pool,
    resolve_node_gpu,
)

RAW_ROWS: list[dict[str, Any]] = yaml.safe_load(
    resources.files("vllm_operator.catalog").joinpath("gpus.yaml").read_text(encoding="utf-8")
)
ROW_IDS = [row["name"] for row in RAW_ROWS]


@pytest.fixture(scope="module")
def catalog() -> GPUCatalog:
    return load_gpu_catalog()


def _cc(spec: GPUSpec) -> tuple[int, int]:
    assert spec.compute_capability is not None
    major, minor = spec.compute_capability.split(".")
    return int(major), int(minor)


# --- the data ---------------------------------------------------------------------------------------------


def test_catalog_has_the_required_skus(catalog: GPUCatalog) -> None:
    required = [
        "T4", "V100-16GB", "V100-32GB", "A10", "A10G", "L4", "L40", "L40S", "A100-PCIe-40GB",
        "A100-SXM4-40GB", "A100-PCIe-80GB", "A100-SXM4-80GB", "H100-PCIe-80GB", "H100-SXM-80GB",
        "H100-NVL-94GB", "H200-SXM-141GB", "GH200-96GB", "B200-180GB", "RTX-3090", "RTX-4090", "RTX-5090",
        "RTX-A5000", "RTX-A6000", "RTX-6000-Ada", "A30", "RTX-4080-16GB", "GB10",
        "RTX-PRO-6000-Blackwell", "RTX-5080", "RTX-5070-Ti", "RTX-5060-Ti-16GB", "RTX-4090-D", "RTX-3090-Ti",
        "B300-288GB", "GB300-288GB",
    ]  # fmt: skip
    assert set(required) <= set(catalog.names)


@pytest.mark.parametrize("row", RAW_ROWS, ids=ROW_IDS)
def test_row_resolves_by_name_aliases_and_products(catalog: GPUCatalog, row: dict[str, Any]) -> None:
    name = row["name"]
    for text in [name, name.lower(), *row["aliases"], *(a.upper() for a in row["aliases"])]:
        assert catalog.get(text).name == name, text
    # a WSL2 row is the same card as its Linux row, which owns the label GFD writes
    assert bool(row["gfd_products"]) == (row.get("host", "linux") == "linux"), f"{name}: GFD product labels"
    for product in row["gfd_products"]:
        assert catalog.get(product).name == name, product
        # nvidia-smi spells it with spaces; GFD with dashes
        assert catalog.get(product.replace("-", " ")).name == name, product


@pytest.mark.parametrize("row", RAW_ROWS, ids=ROW_IDS)
def test_row_values_are_consistent(catalog: GPUCatalog, row: dict[str, Any]) -> None:
    spec = catalog.get(row["name"])
    assert 0.9 * spec.memory_gib < spec.reported_gib < spec.memory_gib
    assert spec.memory_gib == spec.memory_mib / 1024
    cc = _cc(spec)
    assert spec.fp8 == (cc >= (8, 9))
    assert spec.bf16 == (cc >= (8, 0))
    assert 0.80 <= spec.default_utilization <= 0.95
    assert spec.uma == spec.name.startswith(("GH200", "GB10"))
    assert spec.mig_profile is None and spec.parent is None
    assert spec.source.startswith(("measured:", "estimated:")), spec.source
    if spec.source.startswith("estimated: rule"):
        assert spec.reported_gib == estimate_reported_gib(spec.memory_mib)
    assert round(spec.reported_gib, 2) == spec.reported_gib


def test_arch_matches_compute_capability(catalog: GPUCatalog) -> None:
    expected = {(7, 0): "volta", (7, 5): "turing", (8, 0): "ampere", (8, 6): "ampere", (8, 9): "ada",
                (9, 0): "hopper", (10, 0): "blackwell", (10, 3): "blackwell", (12, 0): "blackwell",
                (12, 1): "blackwell"}  # fmt: skip
    for spec in catalog:
        assert expected[_cc(spec)] == spec.arch, spec.name


def test_every_lookup_key_names_exactly_one_sku() -> None:
    owners: dict[str, set[str]] = {}
    for row in RAW_ROWS:
        for text in [row["name"], *row["aliases"], *row["gfd_products"]]:
            owners.setdefault(normalize_gpu_key(text), set()).add(row["name"])
    clashes = {key: names for key, names in owners.items() if len(names) > 1}
    assert not clashes
    assert len({row["name"] for row in RAW_ROWS}) == len(RAW_ROWS)


@pytest.mark.parametrize(
    ("reported", "name"),
    [(79.19, "H100-SXM-80GB"), (39.38, "A100-SXM4-40GB"), (44.42, "L40S"), (23.58, "RTX-3090"),
     (14.56, "T4"), (15.99, "RTX-4080-16GB"), (95.01, "RTX-PRO-6000-Blackwell"), (23.98, "RTX-4090-WSL2")],
)  # fmt: skip
def test_measured_reported_totals(catalog: GPUCatalog, name: str, reported: float) -> None:
    spec = catalog.get(name)
    assert spec.reported_gib == reported
    assert spec.source.startswith("measured:")


@pytest.mark.parametrize(
    ("product", "memory_mib"),
    [("NVIDIA-H100-80GB-HBM3", 81559), ("NVIDIA-A100-SXM4-40GB", 40960), ("NVIDIA-L40S", 46068),
     ("Tesla-T4", 15360), ("NVIDIA-H200", 143771)],
)  # fmt: skip
def test_nvidia_smi_totals(catalog: GPUCatalog, product: str, memory_mib: int) -> None:
    assert catalog.get(product).memory_mib == memory_mib


def test_estimation_rule_errs_low_on_every_measured_card(catalog: GPUCatalog) -> None:
    # the rule is about a dedicated framebuffer; on unified memory (GB10) CUDA's total is what the host OS leaves
    measured = [spec for spec in catalog if spec.source.startswith("measured:") and not spec.uma]
    assert len(measured) >= 5
    for spec in measured:
        assert estimate_reported_gib(spec.memory_mib) <= spec.reported_gib, spec.name


# --- lookups ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("h100", "H100-SXM-80GB"), ("H100-80GB", "H100-SXM-80GB"), ("h100 sxm", "H100-SXM-80GB"),
        ("a100", "A100-SXM4-80GB"), ("a100-40gb", "A100-SXM4-40GB"), ("A100_80GB", "A100-SXM4-80GB"),
        ("a100-pcie", "A100-PCIe-80GB"), ("4090", "RTX-4090"), ("rtx4090", "RTX-4090"),
        ("GeForce RTX 4090", "RTX-4090"), ("NVIDIA GeForce RTX 3090", "RTX-3090"), ("l4", "L4"),
        ("L40s", "L40S"), ("h200", "H200-SXM-141GB"), ("gh200", "GH200-96GB"), ("b200", "B200-180GB"),
        ("dgx spark", "GB10"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-Blackwell"),
        ("rtx pro 6000", "RTX-PRO-6000-Blackwell"), ("NVIDIA GeForce RTX 5070 Ti", "RTX-5070-Ti"),
        ("5060 ti", "RTX-5060-Ti-16GB"), ("RTX 4090 D", "RTX-4090-D"), ("3090 Ti", "RTX-3090-Ti"),
        ("v100", "V100-16GB"), ("tesla-v100-sxm2-32gb", "V100-32GB"), ("a6000", "RTX-A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"), ("nvidiah100nvl", "H100-NVL-94GB"),
        ("A100-SXM4-40GB", "A100-SXM4-40GB"),  # GFD's older label spelling, without the NVIDIA- prefix
    ],
)  # fmt: skip
def test_aliases_and_spellings(catalog: GPUCatalog, text: str, name: str) -> None:
    assert catalog.get(text).name == name


@pytest.mark.parametrize(
    ("product", "name"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM-80GB"), ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"), ("NVIDIA-A100-PCIE-40GB", "A100-PCIe-40GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-PCIe-80GB"), ("Tesla-T4", "T4"), ("NVIDIA-L4", "L4"),
        ("NVIDIA-L40S", "L40S"), ("NVIDIA-A10G", "A10G"), ("NVIDIA-A10", "A10"),
        ("NVIDIA-GeForce-RTX-4090", "RTX-4090"), ("NVIDIA-GeForce-RTX-3090", "RTX-3090"),
        ("NVIDIA-H100-PCIe", "H100-PCIe-80GB"), ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
        ("NVIDIA-H200", "H200-SXM-141GB"), ("NVIDIA-B200", "B200-180GB"),
        ("Tesla-V100-SXM2-16GB", "V100-16GB"), ("Tesla-V100-SXM2-32GB", "V100-32GB"),
        ("Tesla-V100-PCIE-16GB", "V100-16GB"), ("NVIDIA-RTX-A6000", "RTX-A6000"),
        ("NVIDIA-RTX-6000-Ada-Generation", "RTX-6000-Ada"), ("NVIDIA-RTX-A5000", "RTX-A5000"),
        ("NVIDIA-B300-SXM6-AC", "B300-288GB"), ("NVIDIA-GB300", "GB300-288GB"),
    ],
)  # fmt: skip
def test_gfd_product_labels(catalog: GPUCatalog, product: str, name: str) -> None:
    assert catalog.get(product).name == name
    assert product in catalog


def test_properties(catalog: GPUCatalog) -> None:
    assert catalog.get("a100").is_a100
    assert catalog.get("NVIDIA-A100-PCIE-40GB").is_a100
    assert not catalog.get("h100").is_a100
    assert not catalog.get("a10").is_a100
    assert catalog.get("h100").memory_gib == pytest.approx(79.647, abs=1e-3)
    assert catalog.get("gh200").uma


def test_unknown_name_lists_close_matches_on_one_line(catalog: GPUCatalog) -> None:
    with pytest.raises(UnknownGPUError) as info:
        catalog.get("h1000")
    message = str(info.value)
    assert "'h1000'" in message and "H100-SXM-80GB" in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("text", ["qwerty", "", "24", "A100-X"])
def test_unresolvable_inputs_raise(catalog: GPUCatalog, text: str) -> None:
    with pytest.raises(UnknownGPUError):
        catalog.get(text)


def test_specs_are_frozen(catalog: GPUCatalog) -> None:
    spec = catalog.get("h100")
    with pytest.raises(ValueError):
        spec.memory_mib = 1  # type: ignore[misc]


# --- generic sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "memory_mib"),
    [
        ("24GB", 24576),
        ("24GiB", 24576),
        ("24 gb", 24576),
        ("80G", 81920),
        ("48GB", 49152),
        ("46068MiB", 46068),
    ],
)
def test_size_strings_give_generic_specs(catalog: GPUCatalog, text: str, memory_mib: int) -> None:
    spec = catalog.get(text)
    assert spec.memory_mib == memory_mib
    assert spec.reported_gib == estimate_reported_gib(memory_mib)
    assert spec.arch == "unknown" and spec.compute_capability is None
    assert spec.fp8 is False and spec.bf16 is True


def test_generic_gpu() -> None:
    small = generic_gpu(24)
    assert small.name == "generic-24GiB"
    assert small.reported_gib == pytest.approx(24 - ESTIMATED_RESERVED_GIB)
    assert small.tier == "consumer" and small.default_utilization == 0.85
    big = generic_gpu(80, name="my-80g")
    assert big.name == "my-80g" and big.tier == "datacenter" and big.default_utilization == 0.92
    with pytest.raises(ValueError):
        generic_gpu(0.5)
    with pytest.raises(ValueError):
        generic_gpu(math.nan)


# --- MIG --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("product", "name", "parent"),
    [
        ("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "A100-SXM4-40GB-MIG-3g.20gb", "A100-SXM4-40GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "H100-SXM-80GB-MIG-1g.10gb", "H100-SXM-80GB"),
        ("A100-SXM4-40GB-MIG-1g.5gb", "A100-SXM4-40GB-MIG-1g.5gb", "A100-SXM4-40GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-7g.80gb", "A100-SXM4-80GB-MIG-7g.80gb", "A100-SXM4-80GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-me", "H100-SXM-80GB-MIG-1g.10gb-me", "H100-SXM-80GB"),
    ],
)
def test_mig_products(catalog: GPUCatalog, product: str, name: str, parent: str) -> None:
    spec = catalog.get(product)
    full = catalog.get(parent)
    assert spec.name == name and spec.parent == parent and spec.is_mig
    assert (spec.arch, spec.compute_capability, spec.tier) == (full.arch, full.compute_capability, full.tier)
    assert spec.nvlink is False
    assert 0 < spec.reported_gib < spec.memory_gib
    assert spec.memory_mib <= full.memory_mib
    assert spec.default_utilization <= full.default_utilization


def test_mig_slice_memory_rule(catalog: GPUCatalog) -> None:
    spec = catalog.get("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb")
    assert spec.memory_mib == 20000
    # at or below what CUDA reports for a real 3g.20gb slice (19968-20096 MiB)
    assert spec.reported_gib <= 19968 / 1024
    assert spec.is_a100


def test_mig_of_unknown_parent_raises(catalog: GPUCatalog) -> None:
    with pytest.raises(UnknownGPUError):
        catalog.get("NVIDIA-X999-MIG-1g.5gb")


# --- node labels ------------------------------------------------------------------------------------------


def test_node_with_known_product(catalog: GPUCatalog) -> None:
    node = resolve_node_gpu(
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}, catalog
    )
    assert node is not None
    assert node.spec.name == "H100-SXM-80GB" and node.count == 8
    assert node.how == "from node label nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    assert node.total_reported_gib == pytest.approx(8 * 79.19)


def test_node_count_defaults_to_one(catalog: GPUCatalog) -> None:
    node = resolve_node_gpu({"nvidia.com/gpu.product": "NVIDIA-L4"}, catalog)
    assert node is not None and node.count == 1
    bad = resolve_node_gpu({"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "x"}, catalog)
    assert bad is not None and bad.count == 1


@pytest.mark.parametrize("labels", [{}, {"kubernetes.io/hostname": "cpu-1", "nvidia.com/gpu.count": "2"}])
def test_node_without_gpu_labels(catalog: GPUCatalog, labels: dict[str, str]) -> None:
    assert resolve_node_gpu(labels, catalog) is None


def test_unknown_product_with_memory_label(catalog: GPUCatalog) -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H20",
        "nvidia.com/gpu.memory": "97871",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.count": "8",
    }
    node = resolve_node_gpu(labels, catalog)
    assert node is not None
    spec = node.spec
    assert spec.name == "NVIDIA-H20" and node.count == 8
    assert spec.memory_mib == 97871 and spec.reported_gib == estimate_reported_gib(97871)
    assert (spec.arch, spec.compute_capability, spec.fp8, spec.bf16) == ("hopper", "9.0", True, True)
    assert spec.tier == "datacenter"
    assert "estimated" in node.how and "nvidia.com/gpu.memory=97871" in node.how


def test_unknown_product_family_and_cc_fallbacks(catalog: GPUCatalog) -> None:
    ada = resolve_node_gpu(
        {
            "nvidia.com/gpu.product": "NVIDIA-L20",
            "nvidia.com/gpu.memory": "46068",
            "nvidia.com/gpu.family": "ada-lovelace",
        },
        catalog,
    )
    assert ada is not None and ada.spec.arch == "ada" and ada.spec.compute_capability is None
    by_cc = resolve_node_gpu(
        {
            "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-3080",
            "nvidia.com/gpu.memory": "10240",
            "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "6",
        },
        catalog,
    )
    assert by_cc is not None
    assert (by_cc.spec.arch, by_cc.spec.fp8, by_cc.spec.bf16, by_cc.spec.tier) == (
        "ampere",
        False,
        True,
        "consumer",
    )
    bare = resolve_node_gpu(
        {"nvidia.com/gpu.product": "NVIDIA-Mystery", "nvidia.com/gpu.memory": "65536"}, catalog
    )
    assert bare is not None and bare.spec.arch == "unknown" and bare.spec.fp8 is False


def test_unknown_product_without_memory_label_raises(catalog: GPUCatalog) -> None:
    with pytest.raises(UnknownGPUError, match="NVIDIA-Mystery"):
        resolve_node_gpu({"nvidia.com/gpu.product": "NVIDIA-Mystery"}, catalog)


def test_memory_label_without_product(catalog: GPUCatalog) -> None:
    node = resolve_node_gpu({"nvidia.com/gpu.memory": "24576"}, catalog)
    assert node is not None and node.spec.memory_mib == 24576 and "estimated" in node.how


def test_single_strategy_mig_takes_slice_memory_from_label(catalog: GPUCatalog) -> None:
    labels = {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        "nvidia.com/gpu.memory": "20096",
        "nvidia.com/gpu.count": "2",
    }
    node = resolve_node_gpu(labels, catalog)
    assert node is not None
    assert node.spec.name == "A100-SXM4-40GB-MIG-3g.20gb" and node.count == 2
    assert node.spec.memory_mib == 20096 and node.spec.reported_gib < 20096 / 1024


def test_mixed_strategy_mig_plans_for_largest_slice(catalog: GPUCatalog) -> None:
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/mig-1g.5gb.product": "A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/mig-1g.5gb.count": "2",
        "nvidia.com/mig-1g.5gb.memory": "4864",
        "nvidia.com/mig-3g.20gb.product": "A100-SXM4-40GB-MIG-3g.20gb",
        "nvidia.com/mig-3g.20gb.count": "1",
        "nvidia.com/mig-3g.20gb.memory": "20096",
    }
    node = resolve_node_gpu(labels, catalog)
    assert node is not None
    assert node.spec.name == "A100-SXM4-40GB-MIG-3g.20gb" and node.count == 1
    assert node.spec.memory_mib == 20096
    assert "mixed MIG" in node.how and "2x A100-SXM4-40GB-MIG-1g.5gb" in node.how


def test_time_sliced_product_suffix(catalog: GPUCatalog) -> None:
    node = resolve_node_gpu({"nvidia.com/gpu.product": "NVIDIA-A10G-SHARED"}, catalog)
    assert node is not None and node.spec.name == "A10G" and "-SHARED" in node.how


def test_smaller_memory_label_lowers_the_spec(catalog: GPUCatalog) -> None:
    # RTX A6000 with ECC switched on: 49140 -> 46068 MiB
    node = resolve_node_gpu(
        {"nvidia.com/gpu.product": "NVIDIA-RTX-A6000", "nvidia.com/gpu.memory": "46068"}, catalog
    )
    assert node is not None
    catalogued = catalog.get("a6000")
    assert node.spec.memory_mib == 46068
    assert node.spec.reported_gib == pytest.approx(
        catalogued.reported_gib - (49140 - 46068) / 1024, abs=0.011
    )
    assert "46068" in node.how
    # a label at or above the catalog value (drivers differ by a few MiB) leaves the spec alone
    same = resolve_node_gpu(
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81920"}, catalog
    )
    assert same is not None and same.spec == catalog.get("h100")


# --- pools ------------------------------------------------------------------------------------------------


def _node(catalog: GPUCatalog, name: str, count: int) -> NodeGPU:
    return NodeGPU(spec=catalog.get(name), count=count, how="test")


def test_pick_pool_prefers_most_memory_per_node(catalog: GPUCatalog) -> None:
    nodes = [_node(catalog, "l4", 4), _node(catalog, "l4", 4), _node(catalog, "h100", 8)]
    chosen, reason = pick_gpu_pool(nodes)
    assert chosen.spec.name == "H100-SXM-80GB" and chosen.count == 8
    assert "most GPU memory per node" in reason
    assert "2 node(s) with 4x L4" in reason and "1 node(s) with 8x H100-SXM-80GB" in reason


def test_pick_pool_tie_breaks_on_node_count(catalog: GPUCatalog) -> None:
    # same GPU memory per node (2 x A10 == 2 x A10G); more nodes have A10G
    nodes = [_node(catalog, "a10", 2), _node(catalog, "a10g", 2), _node(catalog, "a10g", 2)]
    chosen, reason = pick_gpu_pool(nodes)
    assert chosen.spec.name == "A10G"
    assert "more nodes" in reason


def test_pick_pool_single_and_empty(catalog: GPUCatalog) -> None:
    chosen, reason = pick_gpu_pool([_node(catalog, "t4", 1)])
    assert chosen.spec.name == "T4" and "T4" in reason
    with pytest.raises(ValueError):
        pick_gpu_pool([])


# --- overrides --------------------------------------------------------------------------------------------


def test_builtin_catalog_is_cached() -> None:
    assert load_gpu_catalog() is load_gpu_catalog()
    assert load_gpu_catalog([]) is load_gpu_catalog()


def test_field_override_by_alias() -> None:
    merged = load_gpu_catalog([{"name": "h100", "default_utilization": 0.95}])
    assert merged.get("NVIDIA-H100-80GB-HBM3").default_utilization == 0.95
    assert merged.get("h100").name == "H100-SXM-80GB"
    assert merged.get("a100").default_utilization == 0.92
    assert load_gpu_catalog().get("h100").default_utilization == 0.92  # built-in untouched


def test_new_sku_override_gets_defaults() -> None:
    merged = load_gpu_catalog(
        [
            {
                "name": "H20-96GB",
                "aliases": ["h20"],
                "gfd_products": ["NVIDIA-H20"],
                "memory_mib": 97871,
                "arch": "hopper",
                "compute_capability": "9.0",
                "tier": "datacenter",
                "nvlink": True,
            }
        ]
    )
    spec = merged.get("NVIDIA-H20")
    assert spec.name == "H20-96GB" and merged.get("h20") == spec
    assert spec.reported_gib == estimate_reported_gib(97871)
    assert spec.fp8 and spec.bf16 and spec.default_utilization == 0.92
    assert len(merged) == len(load_gpu_catalog()) + 1


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ([{"name": "h100", "default_utilization": 1.5}], "default_utilization"),
        ([{"name": "l4", "tier": "gaming"}], "tier"),
        ([{"name": "l4", "colour": "green"}], "colour"),
        ([{"name": "t4", "reported_gib": 20.0}], "reported_gib"),
        ([{"name": "t4", "fp8": True}], "fp8"),
        ([{"name": "NewGPU", "arch": "hopper"}], "memory_mib"),
        ([{"default_utilization": 0.9}], "name"),
        (["h100"], "mapping"),
        ([{"name": "l4", "aliases": ["h100"]}], "H100-SXM-80GB"),
        ([{"name": "l4", "default_utilization": 0.9}, {"name": "a10", "memory_mib": -1}], "#2"),
    ],
)
def test_bad_overrides_raise_naming_row_and_field(overrides: list[Any], fragment: str) -> None:
    with pytest.raises(ValueError, match="GPU override #") as info:
        load_gpu_catalog(overrides)
    assert fragment in str(info.value)


def test_duplicate_catalog_rows_are_rejected(catalog: GPUCatalog) -> None:
    spec = catalog.get("t4")
    with pytest.raises(ValueError, match="twice"):
        GPUCatalog([spec, spec.model_copy()])
    clash = spec.model_copy(update={"name": "T4-copy"})
    with pytest.raises(ValueError, match="already names"):
        GPUCatalog([spec, clash])


#: Every field a catalog row must state (GPUSpec's fields less those only overrides and MIG slices set).
_ROW_FIELDS = set(GPUSpec.model_fields) - {"utilization_set", "mig_profile", "parent"}


@pytest.mark.parametrize("row", RAW_ROWS, ids=ROW_IDS)
def test_every_row_states_every_field(row: dict[str, Any]) -> None:
    assert set(row) == _ROW_FIELDS, sorted(_ROW_FIELDS ^ set(row))


@pytest.mark.parametrize(("name", "raw_gib"), [("B300-288GB", 288), ("GB300-288GB", 288)])
def test_blackwell_ultra_rows_are_estimates_derived_from_their_siblings(
    catalog: GPUCatalog, name: str, raw_gib: int,
) -> None:
    """B300/GB300: no log or node of them was seen; memory is the raw HBM times the nvidia-smi share of the sibling
    of the same board type (B200 183359, GB200 189471 MiB of 192 GiB), the total by the estimation rule."""
    spec = catalog.get(name)
    sibling_mib = 183359 if name.startswith("B300") else 189471
    assert spec.memory_mib == int(raw_gib * 1024 * sibling_mib / (192 * 1024))
    assert spec.reported_gib == estimate_reported_gib(spec.memory_mib)
    assert spec.source.startswith("estimated:") and "ESTIMATE" in spec.source
    assert spec.compute_capability == "10.3" and spec.arch == "blackwell" and spec.tier == "datacenter"
    assert spec.reported_gib >= 160  # vLLM 0.28+ batch defaults 1024 / 16384
