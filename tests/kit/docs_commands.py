"""The commands the documentation tells people to run, extracted programmatically (never copied into a test).

Sources: README.md and docs/*.md (fenced ``sh``/``bash``/``console``/``shell`` blocks, and inline code spans in
prose that give a whole command), the chart's NOTES.txt as
`helm install --dry-run=client` renders it for a documented install command, and the lines the demo prints. A
command is a line (with its ``\\`` continuations) whose first word is one of `PROGRAMS`, without a ``$ `` prompt and
without its trailing ``# comment``; the text kept is what a shell would run (`Command.shell`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kit.api import REPO

__all__ = ["PROGRAMS", "Command", "demo_printed_commands", "doc_files", "documented_commands", "inline_commands", "notes_commands",
           "render_notes", "shell_commands"]

#: What a documented command starts with.
PROGRAMS = ("kubectl", "helm", "vllm-operator", "make", "docker", "kind", "export")
def doc_files() -> list[str]:
    """README.md and every Markdown file under docs/ (relative paths, README first)."""
    return ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```(sh|bash|console|shell)\n(.*?)^```", re.S | re.M)
_ANY_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


@dataclass(frozen=True)
class Command:
    """One documented command: the shell text (comment stripped) and where it was written."""

    shell: str
    source: str
    position: int = 0   # offset in the source
    inline: bool = False  # an inline code span in prose, not a fenced block

    @property
    def words(self) -> list[str]:
        return shlex.split(self.shell)

    @property
    def program(self) -> str:
        return self.words[0]


def _strip(line: str) -> str:
    """The line as a shell runs it: no prompt, no trailing comment (quoting kept, pipes kept)."""
    line = line.strip()
    if line.startswith("$ "):
        line = line[2:]
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "|":
            parts.append([])
        else:
            parts[-1].append(word)
    return " | ".join(shlex.join(part) for part in parts)


def _logical_lines(block: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in block.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def shell_commands(text: str, source: str) -> list[Command]:
    """The commands of the fenced shell blocks of a Markdown text, in order."""
    found: list[Command] = []
    for match in _FENCE.finditer(text):
        for line in _logical_lines(match[2]):
            stripped = line.strip()
            if stripped.startswith("$ "):
                stripped = stripped[2:]
            if stripped.split(" ", 1)[0] in PROGRAMS:
                found.append(Command(_strip(stripped), source, match.start()))
    return found


def inline_commands(text: str, source: str) -> list[Command]:
    """The commands written in prose as inline code: a span starting with a program and at least two more words.
    Shorter spans (`helm upgrade`, `kubectl apply`, `vllm-operator run`) name a command, they do not give one."""
    prose = _ANY_FENCE.sub(lambda m: " " * len(m[0]), text)  # keep offsets, drop every fenced block
    found: list[Command] = []
    for match in _INLINE.finditer(prose):
        words = match[1].split()
        if words[0] in PROGRAMS and len(words) >= 3:
            found.append(Command(_strip(match[1]), source, match.start(), inline=True))
    return found


def documented_commands(*, inline: bool = True) -> list[Command]:
    """Every command of README.md and docs/ (fenced, and inline unless `inline=False`), in document order, each
    once (docs/install.md is generated from README, so its commands are README's)."""
    seen: set[str] = set()
    found: list[Command] = []
    for name in doc_files():
        text = (REPO / name).read_text()
        commands = shell_commands(text, name) + (inline_commands(text, name) if inline else [])
        for command in sorted(commands, key=lambda c: c.position):
            if command.shell not in seen:
                seen.add(command.shell)
                found.append(command)
    return found


def render_notes(helm: Path, install: Command) -> str:
    """NOTES.txt as `install` (a documented `helm install`) would print it: the same release, chart, namespace and
    values, rendered by helm itself with `--dry-run=client` (no cluster needed)."""
    done = subprocess.run([str(helm), *install.words[1:], "--dry-run=client"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{install.shell} --dry-run=client: {done.stderr}"
    assert "NOTES:" in done.stdout, done.stdout[-2000:]
    return done.stdout.split("NOTES:", 1)[1]


def notes_commands(notes: str, source: str) -> list[Command]:
    """The commands NOTES.txt tells people to run: its indented lines starting with a program (NOTES.txt writes
    every command on a line of its own, indented; prose lines start at the margin)."""
    return [Command(_strip(line), source) for line in notes.splitlines()
            if line[:1].isspace() and line.strip().split(" ", 1)[0] in PROGRAMS]


def demo_printed_commands(output: str) -> list[Command]:
    """The commands `vllm-operator demo --keep-running` prints for "another terminal"."""
    after = output.split("in another terminal:", 1)[1] if "in another terminal:" in output else ""
    block = after.split("Press Ctrl-C", 1)[0]
    return [Command(_strip(line), "the demo's output") for line in block.splitlines()
            if line.strip().split(" ", 1)[0] in PROGRAMS]
