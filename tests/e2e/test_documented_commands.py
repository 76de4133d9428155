"""Every command in README, docs/ and the chart's NOTES.txt is run by a test, or is on an allow-list with a reason.

The commands are extracted from the documents (`kit.docs_commands`), never copied here. Three kinds:

* the demo section's commands: run by tests/e2e/test_demo_readme.py against `vllm-operator demo --keep-running` (and
  the commands the demo prints, there too);
* `ALLOWED`: the few that cannot run here, each with the reason;
* everything else: run here, in document order, as written (real kubectl and helm from .tools/, the real
  `vllm-operator` CLI) against the simulated cluster with the real `vllm-operator run` process — with the
  adaptations `ADAPTED` names, each with its reason. After each documented `helm install`, the NOTES.txt that
  install would print (rendered by helm) is run too.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.api import REPO
from kit.docs_commands import (
    Command,
    doc_files,
    documented_commands,
    inline_commands,
    notes_commands,
    render_notes,
    shell_commands,
)
from kit.kubectl import kubectl_binary
from vllm_operator_sim.cluster import SimulatedCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: Commands that cannot run here, and why. Each must still be in the documents (a stale entry fails).
ALLOWED: dict[str, str] = {
    "make demo": "the Makefile target is `vllm-operator demo` (checked below); the demo itself is run by "
                 "tests/e2e/test_demo.py and test_demo_readme.py",
    "make test": "the whole suite (CI runs it); a test running it would run itself",
    "make test-real": "installs vLLM's CPU build (about 3.5 GB) and runs real vLLM processes: .ci/run runs it "
                      "after make test",
    "make test-real VLLM_REAL_VERSION=0.32.0": "the same tier with its release named (.ci/run runs the default, "
                                               "0.32.0)",
    "helm install lws oci://registry.k8s.io/lws/charts/lws --version=0.10.0 -n lws-system --create-namespace":
        "pulls a chart from registry.k8s.io: no network here (tests/data/crds holds the LWS CRD the tests use)",
    "docker build -t vllm-operator:dev .": "no container runtime here (the Dockerfile is built by the release "
                                           "workflow, .github/workflows/release.yml)",
    "kind load docker-image vllm-operator:dev": "needs a kind cluster and a container runtime",
    "docker save vllm-operator:dev | sudo k3s ctr images import -": "needs docker, sudo and a k3s node",
    "vllm-operator check --gpu G --vllm-version V -- vllm serve '…'":
        "a template in prose (G, V, …); its concrete form, `vllm-operator check --gpu L4 -- vllm serve …`, runs here",
    "helm install vllm-operator oci://ghcr.io/vllm-operator/charts/vllm-operator --version '<version>'":
        "pulls the published chart from ghcr.io: no network here; the same chart from ./charts is installed here",
    "kubectl rollout status": "prose comparing with kubectl's own command, not an instruction (it needs a resource)",
    "helm uninstall vllm-operator -n vllm-operator":
        "needs the release record a real `helm install` stores; helm cannot install into the emulated API (its "
        "client-side validation reads /openapi/v2 as protobuf, which the emulator does not speak), so the "
        "installs run with --dry-run=client (see ADAPTED)",
}

#: How a command is adapted to run here (by program and subcommand), and why.
ADAPTED: dict[str, str] = {
    "helm install": "run as written plus --dry-run=client (the chart rendered with the same release, namespace and "
                    "values, its values schema checked, NOTES printed); then the chart's crds/ and the rendered "
                    "objects of the kinds the emulator serves are created, so the commands that follow find them",
    "kubectl create": "kubectl sends typed `create <kind>` bodies as protobuf, which the emulator refuses (415): "
                      "run as written with --dry-run=client -o yaml, and the object it prints applied",
}

#: Commands whose documented answer is not exit 0: (exit code, a text the output must hold, why).
EXPECTED: dict[str, tuple[int, str, str]] = {
    "vllm-operator plan --model llama-3.1-8b --gpu L4 --as-is": (
        1, "vLLM would fail (KVCacheTooSmall)", "vLLM's own defaults (max-model-len 131072) do not fit an L4: README "
        "says exit 1 = does not fit, with what vLLM would print"),
    "vllm-operator check --gpu H100 --vllm-version 0.10.2 -- vllm serve openai/gpt-oss-20b --enable-lora": (
        1, "GptOssForCausalLM does not support LoRA yet.", "README shows vLLM 0.10.2 refusing LoRA for gpt-oss: "
        "exit 1 with vLLM's own text"),
}

#: Placeholders the documents use, and what stands for them here.
PLACEHOLDERS = {"<name>": "llama", "NAME": "llama",  # examples/minimal.yaml's service
                "<hf-id>": "meta-llama/Llama-3.1-8B-Instruct", "<gpu>": "L4",
                "--replicas=N": "--replicas=1"}  # the example's own count: scaling it changes nothing else here


def _demo_section_commands() -> list[str]:
    """The commands of README's demo section (what test_demo_readme.py runs)."""
    section = (REPO / "README.md").read_text().split("## The demo: a simulated GPU cluster", 1)[1].split("\n## ", 1)[0]
    return [c.shell for c in shell_commands(section, "README.md")]


def _helm() -> Path:
    local = REPO / ".tools" / "helm"
    assert os.access(local, os.X_OK), "helm is missing: run `make tools` (it installs .tools/helm)"
    return local


def test_every_documented_command_is_run_or_allowed_with_a_reason() -> None:
    commands = [c.shell for c in documented_commands()]
    demo = _demo_section_commands()
    assert {"vllm-operator demo --keep-running", "kubectl get vllms -o wide"} <= set(demo)
    assert len(commands) >= 25, commands
    assert {"README.md", "docs/install.md"} <= set(doc_files())
    for allowed, reason in ALLOWED.items():
        assert allowed in commands, f"ALLOWED names a command the documents no longer have: {allowed}"
        assert len(reason) > 20
    runnable = [c for c in documented_commands() if c.shell not in ALLOWED and c.shell not in demo]
    # what runs here is a program this test can run
    assert {c.program for c in runnable} <= {"kubectl", "helm", "vllm-operator"}, runnable
    assert {" ".join(c.words[:2]) for c in runnable if c.program == "helm"} == {"helm install"}
    # `make demo` is the demo
    makefile = (REPO / "Makefile").read_text()
    assert "demo: $(STAMP)\n\t$(BIN)/vllm-operator demo\n" in makefile


def test_notes_are_rendered_for_every_documented_install() -> None:
    installs = [c for c in documented_commands() if c.words[:2] == ["helm", "install"] and c.shell not in ALLOWED]
    assert len(installs) == 3, installs
    for install in installs:
        notes = notes_commands(render_notes(_helm(), install), "NOTES.txt")
        assert {c.program for c in notes} == {"kubectl", "vllm-operator", "helm"}, notes
        assert any("describe vllms" in c.shell for c in notes) and any(" logs " in c.shell for c in notes)
        # the one NOTES command not run here is the uninstall, allowed for the reason README's is
        assert [c.shell for c in notes if c.program == "helm"] == ["helm uninstall vllm-operator -n vllm-operator"]


# --------------------------------------------------------------------------------------------------------------
# Running them


class Runner:
    """Runs documented commands against the simulated cluster with the real kubectl, helm and vllm-operator."""

    def __init__(self, cluster: SimulatedCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.tools = [str(Path(kubectl_binary()).parent), str(_helm().parent), str(Path(sys.executable).parent)]
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path), "HOME": str(workdir),
                    "KUBECACHEDIR": str(workdir / "kubecache"), "HF_HUB_OFFLINE": "1",
                    "HELM_CACHE_HOME": str(workdir / "helm-cache"), "HELM_CONFIG_HOME": str(workdir / "helm-config"),
                    "HELM_DATA_HOME": str(workdir / "helm-data"),
                    "PATH": os.pathsep.join([*self.tools, os.environ.get("PATH", "")])}
        self.ran: list[str] = []

    def shell(self, text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-o", "pipefail", "-c", text], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=120, check=False)

    def run(self, command: Command) -> str:
        words = [self._resolve(w) for w in command.words]
        text = " | ".join(shlex.join([self._resolve(w) for w in shlex.split(part)])
                          for part in command.shell.split(" | "))
        if words[:2] == ["helm", "install"]:
            return self._helm_install(command, words)
        if words[:2] == ["kubectl", "create"]:
            return self._kubectl_create(command, words)
        result = self.shell(text)
        self._check(command, result)
        self.ran.append(command.shell)
        return result.stdout

    def _resolve(self, word: str) -> str:
        """A placeholder's stand-in; `POD`: a pod of the minimal example's service (it exists by then)."""
        if word != "POD":
            return PLACEHOLDERS.get(word, word)
        pods = self.cluster.wait_for(lambda: self.cluster.api.list_objects(
            "pods", "default", label_selector=f"vllm-operator.dev/service={PLACEHOLDERS['<name>']}") or None,
            timeout=30, message="a pod of the minimal example")
        name: str = pods[0]["metadata"]["name"]
        return name

    def _check(self, command: Command, result: subprocess.CompletedProcess[str]) -> None:
        output = result.stdout + result.stderr
        code, text, _why = EXPECTED.get(command.shell, (0, "", ""))
        assert result.returncode == code, f"{command.shell} ({command.source}) exited {result.returncode}:\n{output}"
        assert text in output, output
        assert "<invalid>" not in output, output
        # the chart's operator pod stays Pending here (every simulated node is a tainted GPU node): an empty log
        quiet = command.program == "kubectl" and "logs" in command.words
        assert quiet or output.strip(), f"{command.shell} printed nothing"

    def _helm_install(self, command: Command, words: list[str]) -> str:
        result = self.shell(shlex.join([*words, "--dry-run=client"]))
        self._check(command, result)
        namespace = words[words.index("-n") + 1]
        # a real install creates the chart's crds/ first (the dry run does not list them)
        crds = sorted((REPO / words[3] / "crds").glob("*.yaml"))
        objects = [doc for path in crds for doc in yaml.safe_load_all(path.read_text()) if doc] + _manifest(
            result.stdout)
        self._ensure_namespace(namespace)
        for name in _watch_namespaces(objects):  # README: "The namespaces must exist first."
            self._ensure_namespace(name)
        for doc in objects:
            self._create(doc, namespace)
        self.ran.append(command.shell)
        return result.stdout

    def _kubectl_create(self, command: Command, words: list[str]) -> str:
        rendered = self.shell(shlex.join([*words, "--dry-run=client", "-o", "yaml"]))
        self._check(command, rendered)
        path = self.workdir / "created.yaml"
        path.write_text(rendered.stdout)
        applied = self.shell(shlex.join(["kubectl", "apply", "-f", str(path)]))
        self._check(command, applied)
        self.ran.append(command.shell)
        return applied.stdout

    def _ensure_namespace(self, name: str) -> None:
        if self.cluster.api.get_object("namespaces", name) is None:
            self.cluster.api.create_object("namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": name}})

    def _create(self, doc: dict[str, Any], namespace: str) -> None:
        try:
            self.cluster.apply(doc, namespace=(doc.get("metadata") or {}).get("namespace") or namespace)
        except ValueError:  # a kind the emulator does not serve (RBAC): nothing in these commands reads it
            assert doc["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"), doc["kind"]


def _manifest(rendered: str) -> list[dict[str, Any]]:
    """The objects of `helm install --dry-run=client` output (between MANIFEST: and NOTES:)."""
    text = rendered.split("MANIFEST:", 1)[-1].split("NOTES:", 1)[0]
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict) and doc.get("kind")]


def _watch_namespaces(objects: list[dict[str, Any]]) -> list[str]:
    """The namespaces the rendered operator watches (`--namespace=` arguments)."""
    return [str(arg).split("=", 1)[1] for doc in objects if doc["kind"] == "Deployment"
            for container in doc["spec"]["template"]["spec"]["containers"]
            for arg in container.get("args") or [] if str(arg).startswith("--namespace=")]


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    with SimulatedCluster(workdir=tmp_path / "sim") as cluster:
        cluster.start_operator()
        yield Runner(cluster, tmp_path)


def _removes(command: Command) -> bool:
    return "delete" in command.words or "uninstall" in command.words


def test_documented_commands_run_as_written(runner: Runner) -> None:
    """In document order, the commands that remove things last (README's uninstall section, then prose such as
    the finalizer patch for a service stuck in Terminating, would otherwise find nothing left)."""
    demo = set(_demo_section_commands())
    commands = [c for c in documented_commands() if c.shell not in ALLOWED and c.shell not in demo]
    commands = [c for c in commands if not _removes(c)] + [c for c in commands if _removes(c)]
    for command in commands:
        output = runner.run(command)
        if command.words[:2] == ["helm", "install"]:
            for note in notes_commands(render_notes(_helm(), command), f"NOTES.txt of `{command.shell}`"):
                if note.shell not in ALLOWED:
                    runner.run(note)
        if command.shell.startswith("vllm-operator plan --model meta-llama/Llama-3.1-8B-Instruct --gpu ") and \
                "L4" in command.words[command.words.index("--gpu") + 1]:
            assert "NVIDIA-L4" in output or "L4" in output
    assert not [c.shell for c in commands if c.shell not in runner.ran], "every runnable command ran"
    # what the commands did: the minimal example planned; the uninstall removed the CRDs
    assert runner.cluster.api.get_object("customresourcedefinitions", "vllmservices.vllm-operator.dev") is None


def test_extraction_reads_commands_as_a_shell_would() -> None:
    text = ("```sh\n$ kubectl get pods   # a comment\nhelm install x ./c \\\n  --set 'a={b,c}'\n"
            "vllm-operator plan -o manifest | kubectl apply -f -\necho not a documented program\n```\n"
            "Prose: `kubectl get vllms` gives one, `helm upgrade` names one.\n```yaml\nkind: `kubectl x y`\n```\n")
    assert [c.shell for c in shell_commands(text, "t")] == [
        "kubectl get pods", "helm install x ./c --set 'a={b,c}'", "vllm-operator plan -o manifest | kubectl apply -f -"]
    assert [c.shell for c in inline_commands(text, "t")] == ["kubectl get vllms"]  # not the YAML block's
    notes = "Intro: vllm-operator 1.0 is installed.\n\n     kubectl get vllms -A\n     helm uninstall r -n ns\n"
    assert [c.shell for c in notes_commands(notes, "NOTES")] == ["kubectl get vllms -A", "helm uninstall r -n ns"]
