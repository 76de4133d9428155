"""The pacer: simulated time moves only while the cluster is quiet, and never past the kubelet's next transition.

The pacer runs its own thread on real time; these tests poll for what it has done (how many ticks it made), never
sleep a fixed time, and assert what it did, not how fast.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from vllm_operator_sim.clock import SimClock
from vllm_operator_sim.pacer import Pacer, process_cpu_seconds


class FakeAPI:
    """Activity as the emulator reports it; ``busy`` makes every look see a new request."""

    def __init__(self) -> None:
        self.rv = self.http = self.backlog = 0
        self.busy = False

    def activity(self) -> tuple[int, int, int]:
        if self.busy:
            self.http += 1
        return self.rv, self.http, self.backlog


class FakeKubelet:
    """Transitions due at given simulated times; each one writes (a new resourceVersion) when the tick makes it."""

    def __init__(self, api: FakeAPI, clock: SimClock, dues: list[float]) -> None:
        self.api, self.clock, self.dues = api, clock, sorted(dues)
        self.ticks = 0
        self.made: list[float] = []  # the clock's time at each transition made
        self.changed = threading.Condition()

    def next_due(self) -> float:
        return self.dues[0] if self.dues else float("inf")

    def tick(self) -> None:
        now = self.clock.now()
        while self.dues and self.dues[0] <= now:
            self.dues.pop(0)
            self.made.append(now)
            self.api.rv += 1
        with self.changed:
            self.ticks += 1
            self.changed.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), "the pacer did not get there"


def _pacer(dues: list[float], **kwargs: object) -> tuple[Pacer, FakeAPI, FakeKubelet, SimClock]:
    clock = SimClock(1000.0, paced=True)
    api = FakeAPI()
    kubelet = FakeKubelet(api, clock, dues)
    pacer = Pacer(clock, kubelet, api, tick_s=0.005, quiet_s=0.05, **kwargs)  # type: ignore[arg-type]
    return pacer, api, kubelet, clock


def test_a_paced_clock_does_not_move_by_itself() -> None:
    clock = SimClock(1000.0, paced=True)
    assert clock.now() == 0.0 and clock.now() == 0.0
    assert clock.advance_to(7.5) == 7.5 and clock.advance_to(3.0) == 7.5  # never backwards
    with pytest.raises(ValueError, match="paced clock"):
        Pacer(SimClock(10.0), FakeKubelet(FakeAPI(), clock, []), FakeAPI())


def test_time_stands_still_while_the_api_is_busy_and_moves_once_it_is_quiet() -> None:
    pacer, api, kubelet, clock = _pacer([30.0])
    api.busy = True
    pacer.start()
    try:
        kubelet.wait(lambda: kubelet.ticks >= 40)
        assert clock.now() == 0.0 and kubelet.made == []  # the kubelet ticked (controllers react), time did not move
        assert pacer.held_s > 0
        api.busy = False
        kubelet.wait(lambda: bool(kubelet.made))
    finally:
        pacer.stop()
    assert kubelet.made == [30.0]


def test_the_clock_stops_at_every_transition_so_none_is_skipped() -> None:
    """Transitions 1 s apart at 1000x: a free-running clock would make several in one tick; the pacer makes each at
    its own time, and each one's write holds the clock until the cluster is quiet again."""
    dues = [10.0, 11.0, 12.0, 22.0, 42.0]
    pacer, api, kubelet, clock = _pacer(list(dues))
    pacer.start()
    try:
        kubelet.wait(lambda: len(kubelet.made) == len(dues))
    finally:
        pacer.stop()
    assert kubelet.made == dues


def test_a_watched_process_using_cpu_holds_the_clock() -> None:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cpu = process_cpu_seconds(burner.pid)
        if cpu is None:
            pytest.skip("no /proc on this system: the pacer cannot see a process's CPU time")
        pacer, _api, kubelet, clock = _pacer([5.0], processes=lambda: (burner.pid,))
        pacer.start()
        try:
            kubelet.wait(lambda: (process_cpu_seconds(burner.pid) or 0.0) - cpu > 0.5 and kubelet.ticks >= 40)
            assert clock.now() == 0.0 and kubelet.made == []
            burner.kill()
            burner.wait(10)
            kubelet.wait(lambda: bool(kubelet.made))
        finally:
            pacer.stop()
        assert kubelet.made == [5.0]
    finally:
        if burner.poll() is None:
            burner.kill()
            burner.wait(10)


def test_cpu_seconds_of_a_process() -> None:
    if process_cpu_seconds(1) is None and sys.platform.startswith("linux"):
        pytest.skip("/proc is not readable here")
    assert process_cpu_seconds(2**22 + 12345) is None  # no such pid
