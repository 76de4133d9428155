"""Which vLLM flags exist in which release (catalog/vllm_flags.yaml), so args stay valid for the image's release."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from ..planner.versions import Version, parse_version


class FlagSupport(BaseModel):
    model_config = ConfigDict(frozen=True)

    since: str
    removed: str | None = None
    note: str = ""

    def available_in(self, version: Version) -> bool:
        if version < parse_version(self.since):
            return False
        return self.removed is None or version < parse_version(self.removed)


class FlagTable(BaseModel):
    model_config = ConfigDict(frozen=True)

    flags: dict[str, FlagSupport]
    negatable: dict[str, str]
    serve_command_since: str

    def supports(self, flag: str, version: str) -> bool:
        """Whether `--flag` exists in that release; flags we do not track are assumed to exist."""
        support = self.flags.get(flag)
        return support is None or support.available_in(parse_version(version))

    def unsupported_reason(self, flag: str, version: str) -> str:
        support = self.flags[flag]
        if parse_version(version) < parse_version(support.since):
            return f"--{flag.replace('_', '-')} does not exist before vLLM {support.since} (image is {version})"
        return f"--{flag.replace('_', '-')} was removed in vLLM {support.removed} (image is {version})"

    def can_negate(self, flag: str, version: str) -> bool:
        since = self.negatable.get(flag)
        return since is not None and parse_version(version) >= parse_version(since)

    def uses_serve_command(self, version: str) -> bool:
        return parse_version(version) >= parse_version(self.serve_command_since)


@lru_cache(maxsize=1)
def flag_table() -> FlagTable:
    text = resources.files("vllm_operator.catalog").joinpath("vllm_flags.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return FlagTable(**data)
