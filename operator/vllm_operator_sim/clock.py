"""The simulated cluster's clock.

Simulated time runs up to ``speed`` times faster than real time (``speed`` simulated seconds per real second), so a
vLLM startup that takes a minute on a real GPU takes a few real seconds here, while every duration the cluster
reports (back-off delays, timestamps, "time to Ready") stays in simulated seconds. Three ways to run it:

* free-running (``SimClock(speed)``): simulated time follows the wall clock, compressed;
* paced (``SimClock(speed, paced=True)``): the clock does not move by itself; a
  :class:`~vllm_operator_sim.pacer.Pacer` advances it at ``speed`` while the operator is idle, stops it while the
  operator works, and never past the kubelet's next transition — so what the operator decides does not depend on how
  fast the machine runs it;
* manual (:meth:`SimClock.manual`): tests advance it explicitly.

Kubernetes timestamps (``startedAt``, ``lastTransitionTime``, …) are ``epoch`` + simulated seconds, in RFC 3339.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

__all__ = ["DEFAULT_SPEED", "SimClock", "format_duration"]

#: Simulated seconds per real second when nothing else is asked for: a one-minute vLLM startup takes 3 s.
DEFAULT_SPEED = 20.0


class SimClock:
    """Simulated seconds since the clock started; thread-safe."""

    def __init__(self, speed: float = DEFAULT_SPEED, *, epoch: datetime | None = None, paced: bool = False) -> None:
        if speed < 0:
            raise ValueError(f"speed must not be negative, got {speed}")
        self._lock = threading.Lock()
        self._speed = float(speed)
        #: the clock moves only through advance(); ``speed`` is then the pace a Pacer keeps while nothing happens
        self.paced = paced
        self._real0 = time.monotonic()
        self._sim0 = 0.0
        self.epoch = epoch or datetime.now(UTC).replace(microsecond=0)

    @classmethod
    def manual(cls, *, epoch: datetime | None = None) -> SimClock:
        """A clock that only moves when :meth:`advance` is called (for tests)."""
        return cls(0.0, epoch=epoch or datetime(2026, 1, 1, tzinfo=UTC))

    @property
    def speed(self) -> float:
        return self._speed

    def set_speed(self, speed: float) -> None:
        """Change the speed from now on (simulated time stays continuous)."""
        with self._lock:
            self._sim0 = self._now_locked()
            self._real0 = time.monotonic()
            self._speed = float(speed)

    def now(self) -> float:
        """Simulated seconds since the start."""
        with self._lock:
            return self._now_locked()

    def _now_locked(self) -> float:
        if self.paced:
            return self._sim0
        return self._sim0 + (time.monotonic() - self._real0) * self._speed

    def advance(self, seconds: float) -> float:
        """Move simulated time forward by ``seconds`` (any clock; meant for manual ones). Returns the new time."""
        if seconds < 0:
            raise ValueError("time does not run backwards")
        with self._lock:
            self._sim0 += seconds
            return self._now_locked()

    def advance_to(self, sim_seconds: float) -> float:
        """Move simulated time forward to ``sim_seconds`` (no-op when it is already later). Returns the new time."""
        with self._lock:
            now = self._now_locked()
            if sim_seconds > now:
                self._sim0 += sim_seconds - now
            return self._now_locked()

    def real_seconds(self, sim_seconds: float) -> float:
        """How long ``sim_seconds`` of simulated time take in real time (inf for a manual clock)."""
        return sim_seconds / self._speed if self._speed > 0 else float("inf")

    def datetime_at(self, sim_seconds: float | None = None) -> datetime:
        return self.epoch + timedelta(seconds=self.now() if sim_seconds is None else sim_seconds)

    def timestamp(self, sim_seconds: float | None = None) -> str:
        """RFC 3339 (whole seconds, as the API writes them) for a simulated time (default: now)."""
        return self.datetime_at(sim_seconds).strftime("%Y-%m-%dT%H:%M:%SZ")

    def log_time(self, sim_seconds: float | None = None) -> str:
        """The time as vLLM's log records print it: ``MM-DD HH:MM:SS``."""
        return self.datetime_at(sim_seconds).strftime("%m-%d %H:%M:%S")


def format_duration(seconds: float | None) -> str:
    """``95`` → ``1m35s``; ``None`` → ``-``."""
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return "never"
    total = int(round(seconds))
    minutes, secs = divmod(total, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
