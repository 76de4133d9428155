"""The project's one test kit: ports, the emulated API, the operator in-process and as a real process, faults.

Importable from every test directory as ``kit`` (pytest's ``pythonpath = ["tests"]``).
"""
