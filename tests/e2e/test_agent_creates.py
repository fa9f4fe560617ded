"""What an agent's token may create, decided by the real API server: with the token the
kubelet would mount into the agent's Pod (bound to the Pod, so it names the node), a
server-side dry run of each case of tests/deploy/agent_creates_cases.py. The agent's
own diagnostic Job, probe PVC and probe pod, as the product builds them, are admitted;
a privileged pod with the host's `/`, a pod as healthd-controller, on another node, a
Job with another image, anything in healthd-system, ... are refused (403: RBAC, the
admission policy or Pod Security, whichever stops it first). Tokens of the accounts
the agent's pods may run as have no rights at all, and neither has a token bound to
no node. Dry runs store nothing: the cluster is left as it was."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from tests.deploy.agent_creates_cases import CASES, diagnostic_job, probe_pod, probe_pvc
from tests.deploy.manifests import PROBES
from tests.e2e.healthd import NAMESPACE, Healthd

Obj = dict[str, Any]
POLICY_WAIT_S = 30.0  # a new ValidatingAdmissionPolicy is in force a moment after it exists


def _create(client: k8s.ApiClient, obj: Obj, namespace: str) -> int:
    """Dry-run create `obj` in `namespace`: 201, or the HTTP status of the refusal."""
    creators: dict[str, Callable[..., Any]] = {
        "Job": k8s.BatchV1Api(client).create_namespaced_job,
        "Pod": k8s.CoreV1Api(client).create_namespaced_pod,
        "PersistentVolumeClaim": k8s.CoreV1Api(client).create_namespaced_persistent_volume_claim,
    }
    try:
        creators[obj["kind"]](namespace, obj, dry_run="All")
    except k8s.ApiException as exc:
        return int(exc.status)
    return 201


def _policy_in_force(client: k8s.ApiClient, node: str) -> None:
    """Until the API server refuses the agent's own Job pinned to another node (or the
    wait is over: the table then says what got through)."""
    other = next(c for c in CASES if c.description == "a Job on another node")
    deadline = time.monotonic() + POLICY_WAIT_S
    while _create(client, other.make(node), other.namespace) == 201 \
            and time.monotonic() < deadline:
        time.sleep(0.5)


def _outcome(code: int) -> str:
    return "allowed" if code == 201 else f"refused {code}"


def test_an_agent_creates_only_its_own_jobs_and_probes_on_its_own_node(
        healthd: Healthd) -> None:
    own = f"creates-{time.monotonic_ns() % 100000}"
    healthd.add_nodes(own)
    agent = healthd.client_for(healthd.token_for(healthd.agent_pod(own), "healthd-agent"))
    _policy_in_force(agent, own)
    outcomes = {case.description: _outcome(_create(agent, case.make(own), case.namespace))
                for case in CASES}
    expected = {case.description: "allowed" if case.allowed else "refused 403"
                for case in CASES}
    assert outcomes == expected


def _token(healthd: Healthd, account: str, namespace: str) -> str:
    """A token of `account` bound to nothing (what a stolen one could be at best)."""
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    answer = healthd.core.create_namespaced_service_account_token(account, namespace, request)
    return str(answer.status.token)


def test_a_token_bound_to_no_node_creates_nothing(healthd: Healthd) -> None:
    own = f"unbound-{time.monotonic_ns() % 100000}"
    healthd.add_nodes(own)
    agent = healthd.client_for(_token(healthd, "healthd-agent", NAMESPACE))
    _policy_in_force(healthd.client_for(healthd.token_for(healthd.agent_pod(own),
                                                          "healthd-agent")), own)
    for make in (diagnostic_job, probe_pvc, probe_pod):
        assert _create(agent, make(own), PROBES) == 403, make.__name__


def test_the_accounts_the_agents_pods_run_as_have_no_rights(healthd: Healthd) -> None:
    """The diagnostic Job's pod (healthd-diagnostic) and the probe pod (default) mount
    no token; were one minted, it could create, read and change nothing."""
    node = "nowhere"
    for account in ("healthd-diagnostic", "default"):
        client = healthd.client_for(_token(healthd, account, PROBES))
        core = k8s.CoreV1Api(client)
        refused: dict[str, Callable[[], Any]] = {
            "a pod": lambda c=client: _create(c, probe_pod(node), PROBES),
            "a Job": lambda c=client: _create(c, diagnostic_job(node), PROBES),
            "pods": lambda c=core: c.list_namespaced_pod(PROBES),
            "nodes": lambda c=core: c.list_node(),
            "secrets": lambda c=core: c.list_namespaced_secret(PROBES),
        }
        for what, call in refused.items():
            try:
                status = call()
            except k8s.ApiException as exc:
                status = exc.status
            assert status == 403, (account, what)
