"""The agent's RBAC, proven by running it: the real agent talks to the API emulator as
its ServiceAccount with the manifests' Roles and bindings enforced, through a whole
life (first round, an XID fault, bad and good on-demand requests, a clear, a deep
diagnostic as a Job, the pvc probe). No request may be denied (a missing rule fails)
and every rule entry must decide at least one request (a superfluous rule fails). The
pvc probe's own Roles, whose rarer paths (leftovers, expired watches, provisioning
failures) a short life does not reach, are proven by running the probe as the
agent's account."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from checks.base import CheckContext, Severity, run_check
from checks.catalog import Catalog
from checks.probes import Probes
from checks.pvc import PvcCheck
from healthd.config import Config
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.kube.pvc_probe import KubeProbeApi
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.kubelet import FakeKubelet, HealthdRunner
from healthd.sim.machine import MachineSpec, load_machine_spec
from healthd.sim.rbac import RbacAuthorizer, RoleId
from tests.agent.harness import (
    KEYS,
    NODE,
    Harness,
    eventually,
    fast_config,
    node_object,
    running_agent,
)
from tests.deploy.manifests import AGENT, BASE, PROBES, documents, one, plain_resources
from tests.pvc import provisioner
from tests.pvc.conftest import storage_class

pytestmark = pytest.mark.anyio

XID_AT_S = 1.5  # XID 79 arrives once the agent is up
PVC_ROLES = [RoleId("Role", "healthd-agent-pvc-probe", PROBES),
             RoleId("ClusterRole", "healthd-agent-pvc-probe")]


def machine() -> MachineSpec:
    """8 healthy H100s; XID 79 on GPU 5 a moment after start; DCGM level 3 passes."""
    spec = load_machine_spec("healthy-8xh100")
    xid = {"gpu": 5, "xid": [{"code": 79, "at": XID_AT_S}]}
    return MachineSpec.model_validate({
        **spec.model_dump(), "node": NODE, "faults": [xid],
        "dcgm": {**spec.dcgm.model_dump(), "output": "v4-pass-r3"},
    })


def with_pvc(config: Config) -> Config:
    """The pvc probe on, on demand only (its interval is longer than any test)."""
    raw = config.model_dump()
    raw["checks"]["pvc"] = {"interval": 86400, "params": {"storage_classes": ["fast"]}}
    return Config.model_validate(raw)


def authorizer(api: ApiEmulator) -> RbacAuthorizer:
    authz = RbacAuthorizer.from_manifests(plain_resources(BASE))
    api.authorizer = authz
    return authz


@asynccontextmanager
async def cluster(api: ApiEmulator, spec: MachineSpec, tmp_path: Path) -> AsyncIterator[None]:
    """What the agent finds around it: the Job controller, scheduler and kubelet
    (running the Job's real command), and a storage class with its provisioner."""
    spec_file = tmp_path / "machine.yaml"
    spec_file.write_text(spec.model_dump_json())
    kubelet = FakeKubelet(api, runner=HealthdRunner(spec_file))
    api.seed(storage_class("fast"))
    async with provisioner.running(api, PROBES, {"fast": "bind"}), \
            anyio.create_task_group() as group:
        group.start_soon(kubelet.run)
        yield
        group.cancel_scope.cancel()


async def answered(h: Harness, text: str, run_id: str, timeout_s: float = 30) -> dict[str, Any]:
    h.request(text, run_id=run_id)
    return await eventually(lambda: (a := h.last_run()) and a["id"] == run_id and a,
                            timeout_s, f"answer to {text}")


async def live_a_life(h: Harness) -> None:
    """Every path through which the agent talks to the API."""
    await eventually(lambda: h.verdict() == "EVICT", 20, "EVICT after XID 79")
    await eventually(lambda: (h.condition() or {}).get("status") == "True",
                     what="GPUUnhealthy=True")
    bad = await answered(h, "foo", "rbac-bad")
    assert bad["accepted"] is False
    h.annotate(**{KEYS.clear: "true"})
    await eventually(lambda: h.verdict() == "PASS", 20, "PASS after clear")
    deep = await answered(h, "dcgm:3", "rbac-deep", 60)
    assert deep["checks"] == {"dcgm:3": "PASS"}, deep
    pvc = await answered(h, "pvc", "rbac-pvc")
    assert pvc["checks"] == {"pvc": "PASS"}, pvc


async def test_the_agent_needs_every_rule_and_no_more(
        api: ApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    authz = authorizer(api)
    # The harness writes the agent's kubeconfig: make it the ServiceAccount's.
    monkeypatch.setattr(api, "write_kubeconfig",
                        functools.partial(api.write_kubeconfig, user=AGENT))
    # The first write of the Node meets a conflict, so the publisher reads its Node by
    # name (it writes nothing before its watch has shown it the Node).
    api.fail("PATCH", rf"/api/v1/nodes/{NODE}", 409, times=1)
    spec = machine()
    config = with_pvc(fast_config(
        api_timeout_s=1, deep_diagnostics={"namespace": PROBES, "image": "healthd:test"}))
    async with cluster(api, spec, tmp_path), running_agent(
            api, tmp_path, spec=spec, config=config) as h:
        await live_a_life(h)
        final = h.node()
    assert [str(r) for r in authz.denied] == []
    agent_roles = [r for r in authz.bound_roles(AGENT) if r not in PVC_ROLES]
    assert authz.unused(AGENT, roles=agent_roles) == []
    # Everything the agent wrote, taken together, passes the node admission policy.
    admission = pytest.importorskip("tests.deploy.admission")
    policy = admission.Policy(one(documents((BASE / "node-policy.yaml").read_text()),
                                  "ValidatingAdmissionPolicy", "healthd-agent-node-writes"))
    verdict = policy.review(old=node_object(), new=final, user=AGENT,
                            extra={"authentication.kubernetes.io/node-name": [NODE]})
    assert verdict.judged and verdict.allowed, verdict.denials


async def test_the_pvc_probe_needs_its_rules_and_no_more(api: ApiEmulator) -> None:
    """Immediate and WaitForFirstConsumer classes that bind, one whose provisioner
    fails (its events are read), a leftover of a killed run (swept), and a watch whose
    history expired (the PVC is read again)."""
    authz = authorizer(api)
    api.fail("GET", rf"/api/v1/namespaces/{PROBES}/persistentvolumeclaims", 410,
             query={"watch": "true", "fieldSelector": "metadata.name=.+"})
    api.seed(storage_class("fast"), storage_class("broken"),
             storage_class("local", binding="WaitForFirstConsumer"))
    api.seed({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
              "metadata": {"name": "leftover", "namespace": PROBES,
                           "labels": {"healthd.io/probe": "pvc", "healthd.io/node": NODE}},
              "spec": {"storageClassName": "fast"}})
    modes: dict[str, provisioner.Mode] = {"fast": "bind", "local": "bind", "broken": "fail"}
    params = {"storage_classes": ["fast", "local", "broken"], "bind_timeout_s": 5}
    async with provisioner.running(api, PROBES, modes, wait_for_consumer=frozenset({"local"})), \
            Kube(api.async_client(user=AGENT)) as kube:
        check = PvcCheck(params, probes=Probes(pvc_api=KubeProbeApi.factory(kube, Keys())))
        ctx = CheckContext(catalog=Catalog(), node_name=NODE, namespace=PROBES)
        result = await run_check(check, ctx, timeout_s=20)
    assert [str(r) for r in authz.denied] == []
    assert result.status is not Severity.UNKNOWN, result.reason
    assert {(f.code, f.entity.name) for f in result.findings} == {("PVC_PROVISION_ERROR", "broken")}
    assert authz.unused(AGENT, roles=PVC_ROLES) == []
