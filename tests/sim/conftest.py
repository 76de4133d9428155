"""Fixtures for the simulated-cluster tests (helpers live in simkit.py: `conftest` names collide across test dirs)."""

from simkit import sim  # noqa: F401  (fixture)
