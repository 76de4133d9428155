"""README's demo section, run as written: `vllm-operator demo --keep-running`, then its kubectl commands (and the
ones the demo prints for another terminal).

The commands are read from the fenced block of the section "The demo: a simulated GPU cluster"; the kubeconfig is
the one the demo prints (the README's `export KUBECONFIG=…` line stands for it). The demo is stopped with SIGTERM.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from kit.api import REPO
from kit.docs_commands import demo_printed_commands
from kit.kubectl import Kubectl
from kit.process import operator_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

README = REPO / "README.md"


def readme_demo_commands() -> tuple[str, list[str]]:
    """(the demo command line, the kubectl command lines) of README's demo section."""
    text = README.read_text()
    section = text.split("## The demo: a simulated GPU cluster", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README's demo section has no ```sh block"
    lines = [line.split("#", 1)[0].strip() for line in block[1].splitlines()]
    demo = next(line for line in lines if line.startswith("vllm-operator demo"))
    return demo, [line for line in lines if line.startswith("kubectl ")]


def readme_deploy_commands() -> list[str]:
    """The kubectl command lines of README's "Deploy a model" section."""
    section = README.read_text().split("### Deploy a model", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README's Deploy a model section has no ```sh block"
    lines = [line.split("#", 1)[0].strip() for line in block[1].splitlines()]
    return [line for line in lines if line.startswith("kubectl ")]


def test_the_readme_lists_kubectl_commands_for_the_demo() -> None:
    demo, commands = readme_demo_commands()
    assert demo == "vllm-operator demo --keep-running"
    assert len(commands) >= 5


def test_readmes_kubectl_commands_work_against_the_demo(tmp_path: Path) -> None:
    demo, commands = readme_demo_commands()
    process = subprocess.Popen([*operator_command(), *shlex.split(demo)[1:]], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    output: list[str] = []
    try:
        kubeconfig = None
        while kubeconfig is None:
            line = lines.get(timeout=150)
            if line is None:
                pytest.fail(f"the demo exited ({process.wait()}) before printing a kubeconfig:\n{''.join(output)}")
            output.append(line)
            if match := re.search(r"export KUBECONFIG=(\S+)", line):
                kubeconfig = Path(match[1])
        while not output[-1].startswith("Press Ctrl-C"):  # the rest of what the demo prints for another terminal
            line = lines.get(timeout=30)
            assert line is not None, "".join(output)
            output.append(line)
        kubectl = Kubectl(kubeconfig, tmp_path)
        # the commands the demo itself prints, run as printed (`<name>`: one of the demo's services)
        printed = demo_printed_commands("".join(output))
        assert {c.program for c in printed} == {"export", "kubectl"} and len(printed) >= 4, printed
        for command in printed[1:]:  # [0] is the export of the kubeconfig used here
            args = [("qwen-shared-gpu" if w == "<name>" else w) for w in command.words[1:]]
            result = kubectl.run(*args)
            assert result.returncode == 0 and result.stdout.strip(), f"{command.shell}:\n{result.stderr}"
        generations = "{range .items[*]}{.metadata.name}={.metadata.generation} {end}"
        before = kubectl("get", "vllms", "-o", f"jsonpath={generations}")
        for command in commands:
            args = shlex.split(command)[1:]
            result = kubectl.run(*args)
            # kubectl diff exits 1 when there are differences, 0 (and prints nothing) when there are none
            ok = result.returncode in (0, 1) if args[0] == "diff" else result.returncode == 0 and result.stdout.strip()
            assert ok, f"{command} ({result.returncode}):\n{result.stdout}{result.stderr}"
            assert "<invalid>" not in result.stdout, result.stdout
        assert kubectl("get", "vllms", "-o", f"jsonpath={generations}") == before   # diff changed nothing
        out = {c: kubectl.run(*shlex.split(c)[1:]).stdout for c in commands if c.startswith("kubectl get")}
        assert "READY" in out["kubectl get pods -o wide"] and "RESTARTS" in out["kubectl get pods -o wide"]
        assert "REASON" in out["kubectl get events"] and "OBJECT" in out["kubectl get events"]
        # README's "Deploy a model" commands, as written, in a namespace of their own (the examples name none)
        # (typed `kubectl create <kind>` sends protobuf, which the emulator refuses (415): the namespace comes from a
        # manifest, and `create secret` runs as written with --dry-run=client, its object then applied as JSON)
        namespace = tmp_path / "namespace.yaml"
        namespace.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: readme}\n")
        assert kubectl.run("create", "-f", str(namespace)).returncode == 0
        deploy = readme_deploy_commands()
        assert [c.split()[1] for c in deploy] == ["create", "apply", "get"], deploy
        for command in deploy:
            args = [*shlex.split(command)[1:], "--namespace", "readme"]
            if args[0] == "create":
                rendered = kubectl.run(*args, "--dry-run=client", "-o", "yaml")
                assert rendered.returncode == 0, rendered.stderr
                (tmp_path / "created.yaml").write_text(rendered.stdout)
                args = ["apply", "-f", str(tmp_path / "created.yaml"), "--namespace", "readme"]
            result = kubectl.run(*args)
            assert result.returncode == 0 and result.stdout.strip(), f"{command}:\n{result.stdout}{result.stderr}"
        header, *rows = kubectl("get", "vllms", "--namespace", "readme").strip().splitlines()
        assert header.split()[:6] == ["NAME", "MODEL", "GPU", "TP", "NODES", "MAXLEN"], header
        assert rows and rows[0].split()[:2] == ["llama", "meta-llama/Llama-3.1-8B-Instruct"], rows
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
