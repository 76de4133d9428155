"""Every console sample in README.md and docs/ is what its command prints today (`scripts/doc_samples.py --check`,
which re-runs the real `vllm-operator` CLI), and the checker does catch a stale one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import doc_samples  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_every_sample_is_current() -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "doc_samples.py"), "--check"],
                            capture_output=True, text=True, timeout=580, check=False)
    assert result.returncode == 0, result.stderr
    samples = [s for path in doc_samples.documents() for block in doc_samples.BLOCK.findall(path.read_text())
               for s in doc_samples.parse(block)]
    assert len(samples) >= 8 and all(s.command.startswith("vllm-operator ") for s in samples)


def test_a_stale_or_cut_sample_is_rewritten_from_the_real_output() -> None:
    text = ("Prose.\n\n```console\n$ vllm-operator plan --model Qwen/Qwen2.5-0.5B-Instruct --gpu L4 | head -3\n"
            "FITS: an old answer\n  ...\n```\n")
    new, stale = doc_samples.refresh(text, "t.md")
    assert stale == ["t.md: `vllm-operator plan --model Qwen/Qwen2.5-0.5B-Instruct --gpu L4 | head -3`"]
    lines = new.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    assert lines[1].startswith("FITS: Qwen/Qwen2.5-0.5B-Instruct on 1× L4") and lines[2:] == ["  ..."]  # cut kept
    assert doc_samples.refresh(new, "t.md") == (new, [])  # rewritten: current
