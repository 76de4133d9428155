"""The simulated cluster's pacer: simulated time moves only while the operator is idle.

A compressed wall clock lets a slow operator fall behind: on a busy machine a pod can die, back off and die again
before the operator has read the first death, and a test that bounds the failed starts fails for the machine's load,
not for the operator's decisions. The pacer drives a paced :class:`~vllm_operator_sim.clock.SimClock` and the
:class:`~vllm_operator_sim.kubelet.Kubelet` instead, as kopf's own tests drive a fake loop time:

* the kubelet ticks every ``tick_s`` real seconds, so controllers react to the operator's writes at once (at the
  current simulated time, which does not move while they do);
* simulated time moves only once the cluster has been **quiet** for ``quiet_s`` real seconds: no object changed
  (the API's resourceVersion stood still), no HTTP request began or ended, every watch event was written to its
  stream and — when processes are watched, e.g. the operator — no thread of theirs was seen running or waiting for a
  CPU (Linux's state R, which a busy process keeps on a loaded machine even while it gets no CPU) and they used no
  more than ``cpu_tolerance_s`` of CPU in that window (a process working through an event it has read is busy even
  before its next request). ``quiet_s`` is
  longer than kopf's batching window (0.1 s), in which an operator that has read an event sleeps on purpose;
* while quiet, time moves at the clock's ``speed`` (simulated seconds per real second of quiet), but never past the
  kubelet's next transition (:meth:`Kubelet.next_due`): the clock stops there, the kubelet makes that one
  transition, its write ends the quiet, and the operator sees the pod in that state before time moves on.

So the operator always gets the time it needs, however busy the machine: a back-off of 10 simulated seconds is 10
simulated seconds of an idle operator. Time the operator spends waiting on purpose (a retry delay in real seconds)
still passes at ``speed``, as it would on a compressed clock.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from .clock import SimClock

__all__ = ["DEFAULT_QUIET_S", "Pacer", "process_cpu_seconds", "process_running"]

log = logging.getLogger(__name__)

#: Real seconds of silence after which the cluster counts as quiet: kopf batches an object's events for 0.1 s before
#: it acts, sleeping (not state R) meanwhile; the rest is two looks of margin.
DEFAULT_QUIET_S = 0.15
#: CPU seconds a watched process may use in a quiet window (an idle kopf process uses next to none).
DEFAULT_CPU_TOLERANCE_S = 0.02


class _Activity(Protocol):
    def activity(self) -> tuple[int, int, int]: ...


class _Ticking(Protocol):
    def tick(self) -> None: ...
    def next_due(self) -> float: ...


def process_running(pid: int) -> bool:
    """Whether a thread of process ``pid`` is running or waiting for a CPU (state R), as Linux's /proc tells: a busy
    process on a loaded machine is R even while it gets no CPU, so this does not depend on the machine's load.
    False when unknown (not Linux, gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split(maxsplit=1)[0]
        except (OSError, IndexError):
            continue
        if state == b"R":
            return True
    return False


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) process ``pid`` has used; None when unknown (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None


class Pacer:
    """Advances a paced clock while the cluster is quiet and ticks the kubelet (see the module docstring)."""

    def __init__(self, clock: SimClock, kubelet: _Ticking, api: _Activity, *, tick_s: float = 0.02,
                 quiet_s: float = DEFAULT_QUIET_S, cpu_tolerance_s: float = DEFAULT_CPU_TOLERANCE_S,
                 processes: Callable[[], Iterable[int]] = tuple) -> None:
        if not clock.paced:
            raise ValueError("a Pacer drives a paced clock: SimClock(speed, paced=True)")
        self.clock = clock
        self.kubelet = kubelet
        self.api = api
        self.tick_s = tick_s
        self.quiet_s = quiet_s
        self.cpu_tolerance_s = cpu_tolerance_s
        #: the pids whose CPU use counts as activity (read at every look: the operator may start or stop later)
        self.processes = processes
        self.errors: list[str] = []
        #: real seconds the clock stood still because the cluster was busy (for benchmarks and curious tests)
        self.held_s = 0.0
        #: how often each kind of activity held the clock (write, request, watch, running, cpu)
        self.holds: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Pacer:
        if self._thread is not None:
            raise RuntimeError("the pacer is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="sim-pacer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _cpu(self) -> tuple[float, bool]:
        """The watched processes' CPU seconds, and whether one of their threads is running or runnable now."""
        total, running = 0.0, False
        for pid in self.processes():
            total += process_cpu_seconds(pid) or 0.0
            running = running or process_running(pid)
        return total, running

    def _loop(self) -> None:
        mark = self.api.activity()[:2]
        cpu = self._cpu()[0]
        last_look = quiet_since = credited_until = time.monotonic()
        # credit: real seconds of quiet not yet turned into simulated time (from the later of the two marks)
        while not self._stop.wait(self.tick_s):
            try:
                now_real = time.monotonic()
                activity = self.api.activity()
                used, running = self._cpu()
                reasons = [why for why, busy in (("write", activity[0] != mark[0]), ("request", activity[1] != mark[1]),
                                                  ("watch", activity[2] > 0), ("running", running),
                                                  ("cpu", used - cpu > self.cpu_tolerance_s)) if busy]
                if reasons:
                    self.holds.update(reasons)
                    if now_real - quiet_since < self.quiet_s:
                        self.held_s += now_real - last_look
                    mark, cpu, quiet_since = activity[:2], used, now_real
                elif now_real - quiet_since >= self.quiet_s:
                    self._advance(now_real - max(quiet_since, credited_until))
                    credited_until = now_real
                else:
                    self.held_s += now_real - last_look
                last_look = now_real
                self.kubelet.tick()
            except Exception as exc:  # keep simulating; the error is kept for tests and logs
                log.exception("simulated cluster pacer failed")
                self.errors.append(repr(exc))

    def _advance(self, quiet_real_s: float) -> None:
        """Move the clock by the quiet time at the clock's speed, stopping at the kubelet's next transition."""
        now = self.clock.now()
        target = now + max(quiet_real_s, 0.0) * self.clock.speed
        self.clock.advance_to(min(target, self.kubelet.next_due()))
