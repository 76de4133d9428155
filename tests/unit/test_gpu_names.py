"""Unknown GPU names: suggestions match the series and memory (never a random neighbour); AMD/Intel are out of
scope and said to be."""

from __future__ import annotations

import re

import pytest

from vllm_operator.planner.gpus import UnknownGPUError, load_gpu_catalog


def _message(text: str) -> str:
    with pytest.raises(UnknownGPUError) as info:
        load_gpu_catalog().get(text)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("text", ["MI300X", "AMD-Instinct-MI300X", "Instinct MI250", "Radeon RX 7900 XTX", "Gaudi2",
                                  "Intel-Gaudi3", "Arc A770", "Intel Data Center GPU Max 1550"])
def test_amd_and_intel_are_out_of_scope(text: str) -> None:
    message = _message(text)
    assert "AMD and Intel GPUs are not in scope" in message
    assert "did you mean" not in message


@pytest.mark.parametrize(("text", "series"), [("RTX-3080", "RTX-"), ("rtx 4070", "RTX-"), ("h1000", "H")])
def test_suggestions_are_of_the_same_series(text: str, series: str) -> None:
    suggested = re.search(r"did you mean (.*)\?", _message(text))
    assert suggested is not None
    assert all(name.startswith(series) for name in suggested.group(1).split(", "))


def test_suggestions_match_the_memory_a_name_states() -> None:
    suggested = re.search(r"did you mean (.*)\?", _message("NVIDIA-A800-SXM4-80GB"))
    assert suggested is not None
    names = suggested.group(1).split(", ")
    assert names and all(load_gpu_catalog().get(name).memory_gib > 75 for name in names)


def test_no_suggestion_when_nothing_matches() -> None:
    assert "no matching GPU in the catalog" in _message("tesla p100")
