"""scripts/doc_samples.py reads a console sample as commands, shown output and an optional cut (no command run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import doc_samples  # noqa: E402


def test_commands_output_and_cut() -> None:
    block = "$ vllm-operator plan \\\n  --gpu L4\nFITS: x\n  a\n  ...\n$ vllm-operator check -- vllm serve m\nok\n"
    first, second = doc_samples.parse(block)
    assert (first.command, first.shown, first.cut) == ("vllm-operator plan --gpu L4", ["FITS: x", "  a"], "  ...")
    assert (second.command, second.shown, second.cut) == ("vllm-operator check -- vllm serve m", ["ok"], None)
    assert doc_samples.render(first, ["FITS: y", "  b", "  c", "  d"]) == [
        "$ vllm-operator plan --gpu L4", "FITS: y", "  b", "  ..."]
    assert doc_samples.render(second, ["ok", "more"]) == ["$ vllm-operator check -- vllm serve m", "ok", "more"]


def test_a_sample_without_a_command_is_refused() -> None:
    with pytest.raises(ValueError, match="command line"):
        doc_samples.parse("FITS: output without its command\n")


def test_the_documents_read() -> None:
    names = [p.name for p in doc_samples.documents()]
    assert names[0] == "README.md" and "install.md" not in names and "planner.md" in names
