"""End to end (issue 20): a generated corpus of secret shapes in vLLM's failure text, through the operator's kopf
registry in-process against the emulated API. Pods die with the texts as termination messages and as log tails;
no secret reaches an Event (the operator's or kopf's), any field of the VLLMService (conditions, status, history),
or a line of the operator's log."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kit import secret_shapes
from kit.inprocess import Cluster
from kit.secret_shapes import MARK

#: The shapes issue 20 found in Events, as vLLM printed them (each secret carries the marker).
ISSUE_20 = [
    "INFO non-default args: {'model': 'org/m', 'api_key': ['k1Zq0001', 'k2Zq0002'], 'port': 8000}",
    "OSError: could not fetch https://alice:pwZq0003@hub.example.com/org/m",
    "RuntimeError: AWS_SECRET_ACCESS_KEY=awsZq0004/K7MDENG is not valid",
    "ValueError: Authorization: authZq0005 was refused",
    "ValueError: 401 Unauthorized: invalid token tokZq0006",
    "+ exec vllm serve org/m --api-key '[keyZq0007]' --port 8000\nValueError: bad",
]
QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
NAME = "qwen"


@settings(max_examples=1, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(corpus=st.lists(secret_shapes.secret_texts(), min_size=8, max_size=8))
def test_no_generated_secret_reaches_events_status_or_the_operator_log(
        tmp_path_factory: pytest.TempPathFactory, corpus: list[tuple[str, list[str]]]) -> None:
    tmp = tmp_path_factory.mktemp("secrets")
    cluster = Cluster(tmp)
    try:
        cluster.add_gpu_node()
        cluster.start_operator()
        cluster.create_service(NAME, {"model": {"name": QWEN_7B}, "remediation": {"minIntervalSeconds": 0}})
        deployment = cluster.wait_deployment(NAME)
        before = len(cluster.events(NAME, component=None))
        for index, text in enumerate([*ISSUE_20, *(text for text, _ in corpus)]):
            in_log = index % 2 == 1
            cluster.crashed_pod(deployment, f"{NAME}-s{index}", message="" if in_log else text,
                                log=text if in_log else None, restart_count=1)
            cluster.wait_quiet(0.3)
        cluster.wait_for(lambda: len(cluster.events(NAME, component=None)) > before or None,
                         message="the operator answered none of the failures")
        events = cluster.events(NAME, component=None)
        texts = [json.dumps(e) for e in events]
        service = json.dumps(cluster.service(NAME))
        log = cluster.operator_log(last=100000)
        assert any("Container failed" in t or "Remediated" in t for t in texts), texts[-3:]
        assert MARK not in service, "a secret reached the VLLMService"
        assert not [t for t in texts if MARK in t], "a secret reached an Event"
        assert MARK not in log, "a secret reached the operator's log: " + next(
            line for line in log.splitlines() if MARK in line)
    finally:
        cluster.close()
