"""CLI basics: `vllm-operator --version`, and shell completion generated from the parser (bash, zsh)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_operator.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    found = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert found
    return found.group(1)


def test_version_prints_the_packages_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"vllm-operator {_pyproject_version()}"


def _complete(script: Path, words: list[str]) -> list[str]:
    """What bash offers for the last word of `words` with the generated completion sourced."""
    line = " ".join(words)
    program = (f"source {script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
               f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}\n"
               f"_shtab_vllm_operator vllm-operator {words[-1]!r} {words[-2]!r}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True)
    return result.stdout.split()


def test_bash_completion_offers_subcommands_options_and_choices(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("bash") is None:
        pytest.fail("bash is needed to check the bash completion script")
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "vllm-operator.bash"
    script.write_text(capsys.readouterr().out)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    assert _complete(script, ["vllm-operator", "pl"]) == ["plan"]
    assert set(_complete(script, ["vllm-operator", ""])) >= {"plan", "check", "run", "demo", "completion"}
    assert _complete(script, ["vllm-operator", "completion", ""]) == ["bash", "zsh"]
    assert "--kv-cache-dtype" in _complete(script, ["vllm-operator", "plan", "--kv-cache"])
    assert "--version" in _complete(script, ["vllm-operator", "--ver"])


def test_zsh_completion_names_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#compdef vllm-operator")
    subcommands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert subcommands
    for name in subcommands:
        assert f'"{name}:' in script or f"'{name}:" in script or f"{name}:" in script, name
