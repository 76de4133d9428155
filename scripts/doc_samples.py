"""Sample outputs in README.md and docs/ are what the commands print today.

Every ```console block whose commands are `$ vllm-operator …` (pipes to grep/head allowed) is run again and its
output written under the command, so a sample cannot drift from the code:

    python scripts/doc_samples.py           # rewrite the samples from what the commands print now (make docs)
    python scripts/doc_samples.py --check   # exit 1, naming each stale sample, when one is out of date

A sample may show only the first lines of the output: a last line `...` (any indentation) says the rest is cut, and
the rewrite keeps the cut after as many lines. Commands run with bash from the repository root, offline
(HF_HUB_OFFLINE=1: the built-in model catalog), with this Python's `vllm-operator` first on PATH. docs/install.md is
generated from README.md (scripts/install_doc.py) and docs/research/ holds notes, so neither is read here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```console\n(.*?)^```\n", re.S | re.M)
CUT = ("...", "…")


def documents() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "install.md")
    return [ROOT / "README.md", *docs]


@dataclass
class Sample:
    command: str          # as written after the prompt (continuation lines joined)
    shown: list[str]      # the output lines the document shows
    cut: str | None       # the `...` line that ends a cut sample, if any


def parse(block: str) -> list[Sample]:
    samples: list[Sample] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            raise ValueError(f"a console sample must start with a `$ ` command line: {line!r}")
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        cut = shown.pop() if shown and shown[-1].strip() in CUT else None
        samples.append(Sample(command, shown, cut))
    return samples


def run(command: str) -> list[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    if result.returncode not in (0, 1):  # 1: a plan that does not fit, which a sample may well show
        raise RuntimeError(f"`{command}` exited {result.returncode}: {result.stderr.strip()[-500:]}")
    return [line.rstrip() for line in result.stdout.rstrip("\n").splitlines()]


def render(sample: Sample, output: list[str]) -> list[str]:
    lines = [f"$ {sample.command}"]
    if sample.cut is not None:
        lines += output[:len(sample.shown)] + [sample.cut]
    else:
        lines += output
    return lines


def refresh(text: str, where: str) -> tuple[str, list[str]]:
    """The document with every console sample rewritten, and the stale ones (for --check)."""
    stale: list[str] = []

    def replace(match: re.Match[str]) -> str:
        samples = parse(match.group(1))
        new: list[str] = []
        for sample in samples:
            fresh = render(sample, run(sample.command))
            old = [f"$ {sample.command}", *sample.shown, *([sample.cut] if sample.cut else [])]
            if fresh != old:
                stale.append(f"{where}: `{sample.command}`")
            new += fresh
        return "```console\n" + "\n".join(new) + "\n```\n"

    return BLOCK.sub(replace, text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a sample is stale; write nothing")
    args = parser.parse_args(argv)
    stale_all: list[str] = []
    for path in documents():
        text = path.read_text(encoding="utf-8")
        new, stale = refresh(text, str(path.relative_to(ROOT)))
        stale_all += stale
        if not args.check and new != text:
            path.write_text(new, encoding="utf-8")
    if args.check and stale_all:
        print("stale samples (run `make docs`):\n  " + "\n  ".join(stale_all), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
