"""GPU catalog: load the built-in NVIDIA SKU table, resolve what users and nodes call a GPU, pick a pool.

Pure code: no Kubernetes client, no network. The data lives in ``vllm_operator/catalog/gpus.yaml``; its header
explains every field, the ``reported_gib`` estimation rule and the ``default_utilization`` policy that the
functions here apply to GPUs that are not in the table (MIG slices, unknown products, bare sizes like ``24GiB``).
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Arch = Literal["pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell", "unknown"]
Tier = Literal["datacenter", "workstation", "consumer"]

#: GiB the driver keeps out of cudaMemGetInfo's total on a whole GPU, for estimated rows: just above the
#: largest gap measured between nvidia-smi's total and vLLM's reported total (A100-40GB: 0.62 GiB).
ESTIMATED_RESERVED_GIB = 0.65
#: GiB kept back from a MIG slice's memory. The driver reserve is carved out of the whole GPU before it is
#: sliced, so a slice's CUDA total is close to the slice's nvidia-smi memory; this is a small safety margin.
MIG_RESERVED_GIB = 0.3
#: MiB assumed per "GB" of a MIG profile name when the node does not label the slice's memory. Real slices:
#: A100-40GB 1g.5gb 4864 MiB, 3g.20gb 19968-20096 MiB; A100-80GB 3g.40gb ~40192 MiB. 1000 MiB/GB is
#: within ~3 % of those and, with MIG_RESERVED_GIB, never above what CUDA reports for the slice.
MIG_MIB_PER_GB = 1000
#: Generic GPUs at least this large (GiB) are assumed to be datacenter parts.
DATACENTER_MIN_GIB = 40.0
#: A node whose labelled memory is this much below the catalog's (MiB) is treated as really having less
#: (ECC switched on a workstation card, a cut-down variant). Smaller differences are driver noise.
MEMORY_LABEL_TOLERANCE_MIB = 256

LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_FAMILY = "nvidia.com/gpu.family"
LABEL_CC_MAJOR = "nvidia.com/gpu.compute.major"
LABEL_CC_MINOR = "nvidia.com/gpu.compute.minor"
SHARED_SUFFIX = "-SHARED"

_CATALOG_PACKAGE = "vllm_operator.catalog"
_CATALOG_FILE = "gpus.yaml"
_NAME_PREFIXES = ("nvidia", "geforce", "tesla")
_MIG_RE = re.compile(
    r"^(?P<parent>.+?)[-_ ]MIG[-_ ](?P<profile>(?P<compute>\d+)g\.(?P<gb>\d+)gb(?:[+.-]me(?:[+.-]all)?)?)$",
    re.IGNORECASE,
)
#: AMD and Intel accelerators (out of scope: vLLM's ROCm/XPU builds account memory differently).
_OTHER_VENDOR_RE = re.compile(
    r"(?i)(\bamd\b|radeon|instinct|\bmi\s?[123]\d{2}[a-z]*\b|\bintel\b|gaudi|\barc[\s_-]?[ab]\d{3}|"
    r"data\s?center\s?gpu\s?max|\bmax[\s_-]?1[15]\d0\b|ponte\s?vecchio|\bflex[\s_-]?1[47]0\b|\brx[\s_-]?[5-9]\d{3})")
_MIXED_MIG_LABEL_RE = re.compile(r"^nvidia\.com/mig-(?P<profile>[^/]+)\.product$")
_SIZE_RE = re.compile(r"^(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>gib|gb|gi|g|mib|mb)$", re.IGNORECASE)
_FAMILY_ARCH: dict[str, Arch] = {
    "pascal": "pascal",
    "volta": "volta",
    "turing": "turing",
    "ampere": "ampere",
    "ada": "ada",
    "lovelace": "ada",
    "ada-lovelace": "ada",
    "hopper": "hopper",
    "blackwell": "blackwell",
}


class UnknownGPUError(ValueError):
    """A GPU name, alias, product label or size that the catalog cannot resolve (one-line message)."""


class GPUSpec(BaseModel):
    """One GPU model (or MIG slice) as the memory planner needs it; fields are documented in gpus.yaml."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    gfd_products: tuple[str, ...] = ()
    memory_mib: int = Field(gt=0)
    reported_gib: float = Field(gt=0)
    source: str = Field(min_length=1)
    arch: Arch
    compute_capability: str | None = Field(default=None, pattern=r"^\d+\.\d+$")
    fp8: bool
    bf16: bool
    tier: Tier
    uma: bool = False
    nvlink: bool = False
    host: Literal["linux", "wsl2"] = Field("linux", description="where CUDA runs: WSL2 (a Windows host) reports the "
                                           "whole framebuffer as total; such rows carry no GFD label (the card's "
                                           "label resolves to its Linux row)")
    default_utilization: float = Field(gt=0.0, le=1.0)
    utilization_set: bool = Field(False, description="default_utilization was set by an operator override "
                                                     "(--gpu-catalog): planned as given, not derived from the GPU")
    mig_profile: str | None = None
    parent: str | None = None

    @model_validator(mode="after")
    def _check_consistency(self) -> GPUSpec:
        """Reject a reported total above the physical memory and fp8/bf16 flags that contradict the cc."""
        if self.reported_gib >= self.memory_gib:
            raise ValueError(
                f"reported_gib {self.reported_gib} must be below memory_mib/1024 = {self.memory_gib:.2f}"
            )
        cc = self.compute_capability_tuple
        if cc is not None:
            if self.fp8 != (cc >= (8, 9)):
                raise ValueError(f"fp8={self.fp8} contradicts compute_capability {self.compute_capability}")
            if self.bf16 != (cc >= (8, 0)):
                raise ValueError(f"bf16={self.bf16} contradicts compute_capability {self.compute_capability}")
        return self

    @property
    def memory_gib(self) -> float:
        """Total memory as nvidia-smi shows it, in GiB."""
        return self.memory_mib / 1024

    @property
    def is_a100(self) -> bool:
        """True for A100s (and their MIG slices), which vLLM gives the smaller batch defaults."""
        return "a100" in self.name.lower()

    @property
    def is_mig(self) -> bool:
        """True for a MIG slice of a larger GPU."""
        return self.mig_profile is not None

    @property
    def compute_capability_tuple(self) -> tuple[int, int] | None:
        """Compute capability as ``(major, minor)``, or None when unknown."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


class NodeGPU(BaseModel):
    """The GPUs of one node: which model, how many, and how that was worked out."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: GPUSpec
    count: int = Field(default=1, ge=1)
    how: str

    @property
    def total_reported_gib(self) -> float:
        """GPU memory of the whole node as vLLM sees it (reported_gib x count)."""
        return self.spec.reported_gib * self.count


def estimate_reported_gib(memory_mib: int, reserved_gib: float = ESTIMATED_RESERVED_GIB) -> float:
    """vLLM's total for a GPU with ``memory_mib`` in nvidia-smi: minus the reserve, floored to 0.01 GiB."""
    return math.floor((memory_mib / 1024 - reserved_gib) * 100 + 1e-6) / 100


def default_utilization_for(tier: Tier, memory_gib: float, uma: bool = False) -> float:
    """The --gpu-memory-utilization policy from the gpus.yaml header, for GPUs not in the catalog."""
    if tier == "consumer":
        return 0.85
    if tier == "workstation":
        return 0.88
    if uma or memory_gib < DATACENTER_MIN_GIB:
        return 0.90
    return 0.92


#: GiB other processes hold on a GPU that also drives a desktop (compositor, browser) before vLLM starts. Evidence:
#: an RTX 4080 with a desktop had 1.30 GiB in use at vLLM's start (15.99 total, 14.69 free), of which ~0.5 GiB is
#: vLLM's own context: ~0.8 GiB (benchmarks/data/vllm-startup-logs.jsonl); the catalog header's 0.3-1.5 GiB for compositors.
DESKTOP_RESERVE_GIB: dict[str, float] = {"consumer": 0.8, "workstation": 0.75, "datacenter": 0.0}
#: What must stay free after vLLM's budget for what grows after its memory profile (allocator fragmentation,
#: cuBLAS/NCCL workspaces, sampler spikes): a fixed part plus a share of the GPU. Evidence: the RTX 4080 record
#: started with ~0.3 GiB left after its budget (v0.26) and a gpt-oss-20b start at 0.95 on an H100 ran out during
#: graph capture (v0.19); 1 GiB + 1 % keeps a margin over both, and 50+ H100 starts at 0.95 kept ~3.5 GiB.
SLACK_GIB = 1.0
SLACK_SHARE = 0.01
#: The highest utilization the evidence supports at scale (H100 starts at 0.95 in benchmarks/data/vllm-startup-logs.jsonl); never planned above.
MAX_SAFE_UTILIZATION = 0.95


def safe_utilization(gpu: GPUSpec, context_gib: float) -> tuple[float, str]:
    """The highest --gpu-memory-utilization that keeps this GPU's real needs outside vLLM's budget covered, and why.

    Outside the budget live vLLM's own CUDA context (and NCCL buffers at TP>1: ``context_gib``), what a desktop
    holds on consumer and workstation cards, and slack for what grows after the profile. UMA GPUs (GH200, GB10) keep
    the catalog's policy: vLLM compares against host-available memory there, which the OS also draws on.
    """
    if gpu.utilization_set:
        return gpu.default_utilization, "set for this GPU by the operator's GPU catalog override"
    if gpu.uma:
        return gpu.default_utilization, f"the catalog's {gpu.default_utilization:.2f} for unified-memory GPUs"
    total = gpu.reported_gib
    desktop = DESKTOP_RESERVE_GIB.get(gpu.tier, 0.0)
    slack = SLACK_GIB + SLACK_SHARE * total
    util = math.floor((total - context_gib - desktop - slack) / total * 100 + 1e-9) / 100
    needs = (f"the CUDA context/NCCL ({context_gib:.2f} GiB)"
             + (f", a desktop ({desktop:.2f} GiB on a {gpu.tier} card)" if desktop else "")
             + f" and {slack:.2f} GiB of slack for fragmentation and workspaces")
    why = f"the highest that leaves {needs} outside vLLM's budget on this {total:.2f} GiB GPU"
    if util > MAX_SAFE_UTILIZATION:
        util = MAX_SAFE_UTILIZATION
        why = (f"the highest the evidence supports (H100 starts at {MAX_SAFE_UTILIZATION:.2f}); {needs} would "
               "allow more")
    return max(util, 0.05), why


def normalize_gpu_key(text: str) -> str:
    """Lookup key: lowercase, separators dropped, leading 'nvidia'/'geforce'/'tesla' stripped."""
    key = re.sub(r"[\s_\-]+", "", text.strip().lower())
    stripped = True
    while stripped:
        stripped = False
        for prefix in _NAME_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


def parse_memory_size(text: str) -> float | None:
    """GiB for inputs like '24GB', '24GiB', '80G', '46068MiB'; None if ``text`` is not a size.

    GPU vendors' "GB" is binary in practice (a "24 GB" card has 24 GiB), so GB and GiB mean the same here.
    """
    match = _SIZE_RE.match(text.strip())
    if match is None:
        return None
    number = float(match["number"])
    return number / 1024 if match["unit"].lower() in ("mib", "mb") else number


def generic_gpu(memory_gib: float, name: str | None = None) -> GPUSpec:
    """A GPU known only by its size: reported = size - 0.65 GiB, datacenter if >= 40 GiB else consumer."""
    if not math.isfinite(memory_gib) or memory_gib < 1:
        raise ValueError(f"GPU memory must be at least 1 GiB, got {memory_gib!r}")
    memory_mib = round(memory_gib * 1024)
    tier: Tier = "datacenter" if memory_gib >= DATACENTER_MIN_GIB else "consumer"
    return GPUSpec(
        name=name or f"generic-{memory_gib:g}GiB",
        memory_mib=memory_mib,
        reported_gib=estimate_reported_gib(memory_mib),
        source=f"estimated: generic {memory_gib:g} GiB GPU, reported = size - {ESTIMATED_RESERVED_GIB} GiB",
        arch="unknown",
        compute_capability=None,
        fp8=False,
        bf16=True,
        tier=tier,
        default_utilization=default_utilization_for(tier, memory_gib),
    )


def mig_slice(parent: GPUSpec, profile: str, memory_mib: int | None = None) -> GPUSpec:
    """The MIG slice ``profile`` (e.g. '3g.20gb') of ``parent``; ``memory_mib`` from a node label if known.

    Without a label the slice gets ``GB x 1000`` MiB (capped at the parent's memory); either way the
    reported total is the slice memory minus MIG_RESERVED_GIB.
    """
    match = re.fullmatch(r"(?P<compute>\d+)g\.(?P<gb>\d+)gb(?:[+.-]me(?:[+.-]all)?)?", profile, re.IGNORECASE)
    if match is None:
        raise ValueError(f"not a MIG profile: {profile!r} (expected e.g. '3g.20gb')")
    profile = profile.lower()
    if memory_mib is None:
        memory_mib = min(int(match["gb"]) * MIG_MIB_PER_GB, parent.memory_mib)
        how = f"{match['gb']} GB x {MIG_MIB_PER_GB} MiB"
    else:
        how = "node label"
    memory_gib = memory_mib / 1024
    return GPUSpec(
        name=f"{parent.name}-MIG-{profile}",
        memory_mib=memory_mib,
        reported_gib=estimate_reported_gib(memory_mib, MIG_RESERVED_GIB),
        source=(
            f"estimated: MIG slice {profile} of {parent.name}; memory {memory_mib} MiB ({how}), "
            f"reported = memory - {MIG_RESERVED_GIB} GiB"
        ),
        arch=parent.arch,
        compute_capability=parent.compute_capability,
        fp8=parent.fp8,
        bf16=parent.bf16,
        tier=parent.tier,
        uma=parent.uma,
        nvlink=False,
        default_utilization=min(
            parent.default_utilization, default_utilization_for(parent.tier, memory_gib, parent.uma)
        ),
        mig_profile=profile,
        parent=parent.name,
    )


class GPUCatalog:
    """An immutable set of GPUSpecs, looked up by name, alias, GFD product label, MIG label or size."""

    def __init__(self, specs: Iterable[GPUSpec]) -> None:
        """Index ``specs``; raises ValueError if two SKUs share a name, alias or product label."""
        self._specs = tuple(specs)
        self._index: dict[str, GPUSpec] = {}
        for spec in self._specs:
            for text in (spec.name, *spec.aliases, *spec.gfd_products):
                self._add_key(text, spec)

    def _add_key(self, text: str, spec: GPUSpec) -> None:
        """Register one lookup text for ``spec``, refusing empty keys and keys owned by another SKU."""
        key = normalize_gpu_key(text)
        if not key:
            raise ValueError(f"GPU {spec.name}: {text!r} is not a usable name")
        owner = self._index.get(key)
        if owner is not None and owner.name != spec.name:
            raise ValueError(f"GPU {spec.name}: {text!r} already names GPU {owner.name}")
        if owner is not None and owner is not spec:
            raise ValueError(f"GPU catalog lists {spec.name} twice")
        self._index[key] = spec

    def __iter__(self) -> Iterator[GPUSpec]:
        """The catalog's SKUs in file order."""
        return iter(self._specs)

    def __len__(self) -> int:
        """Number of SKUs."""
        return len(self._specs)

    def __contains__(self, name_or_label: object) -> bool:
        """True if ``name_or_label`` is a catalog name, alias or product label (not a MIG slice or size)."""
        return isinstance(name_or_label, str) and self.find(name_or_label) is not None

    @property
    def names(self) -> tuple[str, ...]:
        """Canonical names of all SKUs."""
        return tuple(spec.name for spec in self._specs)

    def find(self, name_or_label: str) -> GPUSpec | None:
        """The SKU whose name, alias or GFD product matches, or None."""
        return self._index.get(normalize_gpu_key(name_or_label))

    def get(self, name_or_label: str) -> GPUSpec:
        """Resolve a name, alias, GFD product (MIG slices included) or size ('24GiB'); else UnknownGPUError."""
        text = name_or_label.strip()
        spec = self.find(text) if text else None
        if spec is not None:
            return spec
        mig = _MIG_RE.match(text)
        if mig is not None:
            parent = self.find(mig["parent"])
            if parent is not None:
                return mig_slice(parent, mig["profile"])
        size = parse_memory_size(text)
        if size is not None:
            return generic_gpu(size)
        raise UnknownGPUError(self._unknown_message(text))

    def _unknown_message(self, text: str) -> str:
        """One-line error for an unresolvable input, naming up to three *matching* catalog GPUs: the same series
        (the letters before the model number: RTX, A, H, L…) and, when the text names a size, the same memory.
        AMD and Intel GPUs are said to be out of scope rather than matched to an NVIDIA neighbour."""
        if not text:
            return "empty GPU name: give a catalog name (e.g. H100-SXM-80GB), an alias, a label or a size (24GiB)"
        usage = "(use a catalog name, an alias, a nvidia.com/gpu.product value or a size such as 24GiB)"
        if _OTHER_VENDOR_RE.search(text):
            return (f"unknown GPU {text!r}: AMD and Intel GPUs are not in scope - vllm-operator plans with the "
                    "memory arithmetic of vLLM's CUDA build and knows NVIDIA GPUs only " + usage)
        mig = _MIG_RE.match(text)
        key = normalize_gpu_key(mig["parent"] if mig else text)
        suggestions = self._matching(key, text)
        hint = f"did you mean {', '.join(suggestions)}?" if suggestions else "no matching GPU in the catalog"
        return f"unknown GPU {text!r}: {hint} {usage}"

    def _matching(self, key: str, text: str) -> list[str]:
        """Catalog names of the same series (and memory, when given), closest spelling first; at most three."""
        series = re.match(r"[a-z]*", key)
        prefix = series.group(0) if series else ""
        size = re.search(r"(\d+)\s*(?:gb|gib|g)\b", text.lower())
        scored: dict[str, float] = {}
        for candidate, spec in self._index.items():
            other = re.match(r"[a-z]*", candidate)
            if not prefix or (other.group(0) if other else "") != prefix:
                continue
            if size and abs(spec.memory_gib - float(size.group(1))) > max(2.0, 0.06 * spec.memory_gib):
                continue
            ratio = difflib.SequenceMatcher(None, key, candidate).ratio()
            if ratio >= 0.5:
                scored[spec.name] = max(scored.get(spec.name, 0.0), ratio)
        return [name for name, _ in sorted(scored.items(), key=lambda item: (-item[1], item[0]))[:3]]


def _validation_summary(exc: ValidationError) -> str:
    """Pydantic errors as 'field: message; field: message' on one line."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "row"
        parts.append(f"field {field!r}: {error['msg']}")
    return "; ".join(parts)


@functools.lru_cache(maxsize=1)
def _builtin_specs() -> tuple[GPUSpec, ...]:
    """Parse and validate the packaged gpus.yaml once per process."""
    text = resources.files(_CATALOG_PACKAGE).joinpath(_CATALOG_FILE).read_text(encoding="utf-8")
    rows = yaml.safe_load(text)
    if not isinstance(rows, list):
        raise ValueError(f"{_CATALOG_FILE}: expected a list of GPU rows")
    specs = []
    for number, row in enumerate(rows, start=1):
        try:
            specs.append(GPUSpec.model_validate(row))
        except ValidationError as exc:
            name = row.get("name") if isinstance(row, dict) else None
            raise ValueError(f"{_CATALOG_FILE} row {number} ({name!r}): {_validation_summary(exc)}") from exc
    return tuple(specs)


@functools.lru_cache(maxsize=1)
def _builtin_catalog() -> GPUCatalog:
    """The built-in catalog, indexed once per process."""
    return GPUCatalog(_builtin_specs())


def _new_sku_defaults(row: Mapping[str, Any]) -> dict[str, Any]:
    """A new SKU row with source, reported_gib, fp8/bf16 and default_utilization filled in when omitted."""
    data = dict(row)
    data.setdefault("source", "catalog override (user-supplied)")
    memory_mib = data.get("memory_mib")
    if isinstance(memory_mib, int) and not isinstance(memory_mib, bool) and memory_mib > 0:
        data.setdefault("reported_gib", estimate_reported_gib(memory_mib))
        tier = data.get("tier")
        if tier in ("datacenter", "workstation", "consumer"):
            data.setdefault("default_utilization", default_utilization_for(tier, memory_mib / 1024))
    cc = data.get("compute_capability")
    if isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc):
        major, minor = (int(part) for part in cc.split("."))
        data.setdefault("fp8", (major, minor) >= (8, 9))
        data.setdefault("bf16", major >= 8)
    return data


def _apply_override(specs: list[GPUSpec], number: int, row: object) -> list[GPUSpec]:
    """``specs`` with override row ``number`` applied: fields of an existing SKU replaced, or a new SKU added."""
    if not isinstance(row, Mapping):
        raise ValueError(
            f"GPU override #{number}: expected a mapping with a 'name', got {type(row).__name__}"
        )
    name = row.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"GPU override #{number}: field 'name' must be a non-empty string")
    existing = GPUCatalog(specs).find(name)
    try:
        chosen = {"utilization_set": True} if "default_utilization" in row else {}
        if existing is None:
            return [*specs, GPUSpec.model_validate({**_new_sku_defaults(row), **chosen})]
        merged = GPUSpec.model_validate({**existing.model_dump(), **row, "name": existing.name, **chosen})
    except ValidationError as exc:
        raise ValueError(f"GPU override #{number} ({name!r}): {_validation_summary(exc)}") from exc
    return [merged if spec.name == existing.name else spec for spec in specs]


def load_gpu_catalog(overrides: Sequence[Mapping[str, Any]] | None = None) -> GPUCatalog:
    """The built-in catalog merged with ``overrides``; a bad override raises ValueError naming row and field.

    An override whose ``name`` resolves to a catalog SKU (name, alias or product label) replaces the fields
    it gives (lists are replaced, not extended); any other ``name`` adds a SKU, for which ``source``,
    ``reported_gib`` (estimation rule), ``fp8``/``bf16`` (from the compute capability) and
    ``default_utilization`` (policy) may be omitted.
    """
    if not overrides:
        return _builtin_catalog()
    specs = list(_builtin_specs())
    for number, row in enumerate(overrides, start=1):
        specs = _apply_override(specs, number, row)
        try:
            GPUCatalog(specs)
        except ValueError as exc:
            raise ValueError(f"GPU override #{number} ({row.get('name')!r}): {exc}") from exc
    return GPUCatalog(specs)


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    """Integer value of node label ``key``, or None if absent or not an integer."""
    value = labels.get(key)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def _arch_from_labels(labels: Mapping[str, str], cc: tuple[int, int] | None) -> Arch:
    """Architecture from GFD's nvidia.com/gpu.family label, else from the compute capability."""
    family = labels.get(LABEL_FAMILY, "").strip().lower()
    if family in _FAMILY_ARCH:
        return _FAMILY_ARCH[family]
    if cc is None:
        return "unknown"
    major, minor = cc
    by_major: dict[int, Arch] = {6: "pascal", 9: "hopper", 10: "blackwell", 11: "blackwell", 12: "blackwell"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada"
    return by_major.get(major, "unknown")


def _tier_from_product(product: str) -> Tier:
    """Tier guessed from a product label: GeForce -> consumer, RTX/Quadro -> workstation, else datacenter."""
    lowered = product.lower()
    if "geforce" in lowered:
        return "consumer"
    if "rtx" in lowered or "quadro" in lowered:
        return "workstation"
    return "datacenter"


def _spec_from_labels(product: str, memory_mib: int, labels: Mapping[str, str]) -> GPUSpec:
    """A GPUSpec for a product the catalog lacks, built from GFD's memory, family and compute labels."""
    major = _int_label(labels, LABEL_CC_MAJOR)
    minor = _int_label(labels, LABEL_CC_MINOR)
    cc = (major, minor) if major is not None and minor is not None else None
    tier = _tier_from_product(product)
    return GPUSpec(
        name=product,
        gfd_products=(product,),
        memory_mib=memory_mib,
        reported_gib=estimate_reported_gib(memory_mib),
        source=(
            f"estimated: product not in the catalog; memory from {LABEL_MEMORY}, "
            f"reported = memory - {ESTIMATED_RESERVED_GIB} GiB"
        ),
        arch=_arch_from_labels(labels, cc),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        fp8=cc >= (8, 9) if cc else False,
        bf16=cc >= (8, 0) if cc else True,
        tier=tier,
        default_utilization=default_utilization_for(tier, memory_mib / 1024),
    )


def _fit_to_memory_label(spec: GPUSpec, memory_mib: int | None, catalog: GPUCatalog) -> tuple[GPUSpec, str]:
    """``spec`` adjusted to the node's labelled memory where that is trustworthy, and a note saying so.

    MIG slices take the label as is. Whole GPUs only follow a label clearly below the catalog value
    (e.g. ECC on): newer drivers may count reserved memory in the label, so larger values are ignored.
    """
    if memory_mib is None or memory_mib == spec.memory_mib or memory_mib <= 0:
        return spec, ""
    if spec.is_mig and spec.parent is not None and spec.mig_profile is not None:
        parent = catalog.get(spec.parent)
        sliced = mig_slice(parent, spec.mig_profile, memory_mib)
        return sliced, f"; slice memory {memory_mib} MiB from the node label"
    if memory_mib > spec.memory_mib - MEMORY_LABEL_TOLERANCE_MIB:
        return spec, ""
    reported = estimate_reported_gib(memory_mib, reserved_gib=spec.memory_gib - spec.reported_gib)
    adjusted = GPUSpec.model_validate(
        {
            **spec.model_dump(),
            "memory_mib": memory_mib,
            "reported_gib": reported,
            "source": f"{spec.source}; lowered to the node's {LABEL_MEMORY}={memory_mib}",
        }
    )
    note = (
        f"; the node labels {memory_mib} MiB, below the catalog's {spec.memory_mib} MiB (ECC on?): used that"
    )
    return adjusted, note


def _resolve_product(
    product: str, memory_mib: int | None, labels: Mapping[str, str], catalog: GPUCatalog, label_key: str
) -> tuple[GPUSpec, str]:
    """The spec for one product label value and the sentence saying how it was found."""
    base = product.removesuffix(SHARED_SUFFIX)
    shared = "; time-sliced GPU ('-SHARED'): replicas share this memory" if base != product else ""
    try:
        spec = catalog.get(base)
    except UnknownGPUError:
        if memory_mib is None:
            raise UnknownGPUError(
                f"node GPU {product!r} is not in the GPU catalog and the node has no {LABEL_MEMORY} label: "
                f"add it with a catalog override or name the GPU explicitly"
            ) from None
        how = (
            f"estimated from node labels {label_key}={product} (not in the GPU catalog) and "
            f"{LABEL_MEMORY}={memory_mib} MiB"
        )
        return _spec_from_labels(base, memory_mib, labels), how + shared
    spec, note = _fit_to_memory_label(spec, memory_mib, catalog)
    return spec, f"from node label {label_key}={product}{note}{shared}"


def _resolve_mixed_mig(labels: Mapping[str, str], catalog: GPUCatalog) -> NodeGPU | None:
    """For GFD's mixed MIG strategy (nvidia.com/mig-<profile>.product labels): the largest slice type."""
    found: list[NodeGPU] = []
    for key, product in sorted(labels.items()):
        match = _MIXED_MIG_LABEL_RE.match(key)
        if match is None:
            continue
        prefix = f"nvidia.com/mig-{match['profile']}"
        count = _int_label(labels, f"{prefix}.count")
        if count is not None and count < 1:
            continue
        memory_mib = _int_label(labels, f"{prefix}.memory")
        spec, how = _resolve_product(product, memory_mib, labels, catalog, key)
        found.append(NodeGPU(spec=spec, count=count or 1, how=how))
    if not found:
        return None
    best = max(found, key=lambda node: (node.spec.memory_mib, node.count))
    others = [f"{node.count}x {node.spec.name}" for node in found if node is not best]
    seen = f"; also on the node: {', '.join(others)}" if others else ""
    how = f"{best.how} (mixed MIG strategy: planning for the largest slice type{seen})"
    return NodeGPU(spec=best.spec, count=best.count, how=how)


def resolve_node_gpu(labels: Mapping[str, str], catalog: GPUCatalog) -> NodeGPU | None:
    """The GPU model and count of a node from its GPU Feature Discovery labels; None if it has none.

    Order: mixed-strategy MIG labels, then nvidia.com/gpu.product (catalog SKU, MIG slice, or - when not in
    the catalog - an estimate from nvidia.com/gpu.memory/family/compute labels), then a bare
    nvidia.com/gpu.memory. Raises UnknownGPUError for an uncatalogued product without a memory label.
    """
    mixed = _resolve_mixed_mig(labels, catalog)
    if mixed is not None:
        return mixed
    product = labels.get(LABEL_PRODUCT, "").strip()
    memory_mib = _int_label(labels, LABEL_MEMORY)
    count = max(_int_label(labels, LABEL_COUNT) or 1, 1)
    if product:
        spec, how = _resolve_product(product, memory_mib, labels, catalog, LABEL_PRODUCT)
        return NodeGPU(spec=spec, count=count, how=how)
    if memory_mib is not None and memory_mib >= 1024:
        spec = generic_gpu(memory_mib / 1024, name=f"nvidia-gpu-{memory_mib}MiB")
        how = f"estimated from node label {LABEL_MEMORY}={memory_mib} MiB (no {LABEL_PRODUCT} label)"
        return NodeGPU(spec=spec, count=count, how=how)
    return None


def pick_gpu_pool(nodes: Sequence[NodeGPU]) -> tuple[NodeGPU, str]:
    """The node type to plan for in a mixed cluster, and a sentence naming the pools seen.

    Rule: the most GPU memory per node (reported_gib x count); ties go to the type more nodes have, then
    to the name, so the choice is deterministic.
    """
    if not nodes:
        raise ValueError("no GPU nodes to choose a pool from")
    pools: dict[tuple[str, int, int], list[NodeGPU]] = {}
    for node in nodes:
        pools.setdefault((node.spec.name, node.count, node.spec.memory_mib), []).append(node)
    ranked = sorted(
        pools.values(), key=lambda pool: (-pool[0].total_reported_gib, -len(pool), pool[0].spec.name)
    )
    chosen = ranked[0][0]
    described = [
        f"{len(pool)} node(s) with {pool[0].count}x {pool[0].spec.name} ({pool[0].total_reported_gib:.2f} GiB)"
        for pool in ranked
    ]
    if len(ranked) == 1:
        return chosen, f"all {len(nodes)} GPU node(s) have {chosen.count}x {chosen.spec.name}"
    runner_up = ranked[1]
    if not math.isclose(runner_up[0].total_reported_gib, chosen.total_reported_gib):
        why = "the most GPU memory per node"
    elif len(ranked[0]) > len(runner_up):
        why = "tied on memory per node, and more nodes have it"
    else:
        why = "tied on memory per node and on node count, first by name"
    reason = f"planning for {chosen.count}x {chosen.spec.name} ({why}); pools seen: {'; '.join(described)}"
    return chosen, reason
