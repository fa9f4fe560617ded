"""The `pvc` check against the API emulator, spoken to over HTTP by `kubernetes.aio`,
with a fake provisioner that binds, never binds, or reports a provisioning error.

Covered: PASS with the bind time; PVC_NOT_BOUND and PVC_PROVISION_ERROR on the right
storage class; WaitForFirstConsumer with a consumer pod pinned to the node, and
SKIPPED without pods; no class, a missing class and a Retain class; leftovers of a
crashed run swept by label (and only this node's); cleanup after a cancellation; API
failures (500, 403, unreachable) as UNKNOWN. After every case no probe object of this
node is left in the emulator.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from checks.base import CheckContext, Entity, Severity
from checks.probes import Probes
from checks.pvc import PvcCheck
from healthd.kube.conventions import Keys
from healthd.kube.pvc_probe import label_value
from healthd.sim.apiserver import ApiEmulator
from tests.pvc.conftest import NAMESPACE, NODE, PvcSetup, run_pvc
from tests.pvc.provisioner import FAILURE_MESSAGE, running

pytestmark = pytest.mark.anyio

PROBE_LABEL, NODE_LABEL = Keys().probe, Keys().node
PVC_PATH = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
POD_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"


def probe_objects(api: ApiEmulator, node: str = NODE) -> list[str]:
    """`Kind/name` of every probe PVC and pod of `node` still stored."""
    out = []
    for kind in ("PersistentVolumeClaim", "Pod"):
        for obj in api.list(kind, NAMESPACE):
            labels = obj["metadata"].get("labels", {})
            if labels.get(PROBE_LABEL) == "pvc" and labels.get(NODE_LABEL) == label_value(node):
                out.append(f"{kind}/{obj['metadata']['name']}")
    return out


@pytest.fixture(autouse=True)
def nothing_left_behind(api: ApiEmulator) -> Iterator[None]:
    yield
    assert probe_objects(api) == [], "the check left probe objects behind"


async def test_no_storage_class_configured_is_skipped(context: PvcSetup) -> None:
    result = await run_pvc(context)
    assert result.status is Severity.SKIPPED
    assert result.reason == "no storage class configured"


async def test_bound_pvc_passes_with_bind_time(api: ApiEmulator, context: PvcSetup) -> None:
    async with running(api, NAMESPACE, {"fast": "bind"}):
        result = await run_pvc(context, storage_classes=["fast"], bind_timeout_s=5)
    assert result.status is Severity.PASS, result.reason
    (row,) = result.entities
    assert row.entity == Entity("storage", "fast")
    assert 0 <= float(row.values["bind_s"]) < 5
    created = api.writes("POST", PVC_PATH)
    assert len(created) == 1
    labels = created[0].body["metadata"]["labels"]
    assert labels[PROBE_LABEL] == "pvc" and labels[NODE_LABEL] == NODE
    assert len(api.writes("DELETE", rf"{PVC_PATH}/healthd-pvc-{NODE}-fast-\w+")) == 1


async def test_waiting_watches_instead_of_polling(api: ApiEmulator, context: PvcSetup) -> None:
    async with running(api, NAMESPACE, {}):
        result = await run_pvc(context, storage_classes=["fast"], bind_timeout_s=1)
    assert result.findings[0].code == "PVC_NOT_BOUND"
    mine = [r for r in api.requests_to("GET", PVC_PATH) if "fieldSelector" in r.query]
    watches = [r for r in mine if r.query.get("watch") in ("true", "1")]
    reads = api.requests_to("GET", rf"{PVC_PATH}/.+")
    assert len(watches) == 1
    assert reads == []


async def test_a_watch_the_server_ends_is_resumed(api: ApiEmulator, context: PvcSetup) -> None:
    async with running(api, NAMESPACE, {"fast": "bind"}):
        # The check's own watch (by name) fails: history expired. It must re-read, re-watch.
        api.fail("GET", PVC_PATH, 410, query={"watch": "true", "fieldSelector": "metadata.name=.*"})
        result = await run_pvc(context, storage_classes=["fast"], bind_timeout_s=5)
    assert result.status is Severity.PASS, result.reason
    watches = [r.status for r in api.requests_to("GET", PVC_PATH) if "fieldSelector" in r.query]
    assert watches[0] == 410
    assert len(api.requests_to("GET", rf"{PVC_PATH}/.+")) >= 1


async def test_never_bound_reports_pvc_not_bound(api: ApiEmulator, context: PvcSetup) -> None:
    started = anyio.current_time()
    async with running(api, NAMESPACE, {"fast": "never"}):
        result = await run_pvc(context, storage_classes=["fast"], bind_timeout_s=0.5)
    assert anyio.current_time() - started < 5
    assert result.status is Severity.WARN
    (finding,) = result.findings
    assert finding.code == "PVC_NOT_BOUND"
    assert finding.entity == Entity("storage", "fast")
    assert "not bound after 0.5 s" in finding.message


async def test_provisioning_error_reports_the_provisioner_message(
    api: ApiEmulator, context: PvcSetup
) -> None:
    async with running(api, NAMESPACE, {"fast": "fail"}):
        result = await run_pvc(context, storage_classes=["fast"])
    assert result.status is Severity.WARN
    (finding,) = result.findings
    assert finding.code == "PVC_PROVISION_ERROR"
    assert finding.entity == Entity("storage", "fast")
    assert FAILURE_MESSAGE in finding.message


async def test_each_class_is_judged_on_its_own(api: ApiEmulator, context: PvcSetup) -> None:
    async with running(api, NAMESPACE, {"fast": "bind", "slow": "never"}):
        result = await run_pvc(context, storage_classes=["fast", "slow"], bind_timeout_s=1)
    statuses = {row.entity.name: row.status for row in result.entities}
    assert statuses == {"fast": Severity.PASS, "slow": Severity.WARN}
    assert [(f.code, f.entity.name) for f in result.findings] == [("PVC_NOT_BOUND", "slow")]


async def test_first_consumer_class_binds_through_a_pod_on_this_node(
    api: ApiEmulator, context: PvcSetup
) -> None:
    waiting = frozenset({"local"})
    async with running(api, NAMESPACE, {"local": "bind"}, wait_for_consumer=waiting) as fake:
        result = await run_pvc(context, storage_classes=["local"], bind_timeout_s=5)
    assert result.status is Severity.PASS, result.reason
    assert list(fake.scheduled.values()) == [NODE]
    (pod,) = fake.scheduled
    assert len(api.writes("DELETE", f"{POD_PATH}/{pod}")) == 1
    assert api.list("Pod", NAMESPACE) == []


async def test_first_consumer_class_without_pods_is_skipped(
    api: ApiEmulator, context: PvcSetup
) -> None:
    result = await run_pvc(context, storage_classes=["local"], allow_pods=False)
    assert result.status is Severity.SKIPPED
    assert result.reason == "storage class local binds on first consumer and pods are not allowed"
    assert api.writes("POST", PVC_PATH) == []


async def test_missing_storage_class_is_unknown(api: ApiEmulator, context: PvcSetup) -> None:
    result = await run_pvc(context, storage_classes=["nosuch"])
    assert result.status is Severity.UNKNOWN
    assert result.reason == "storage class nosuch not found"
    assert result.findings == ()


async def test_retain_class_is_skipped_so_no_volume_leaks(
    api: ApiEmulator, context: PvcSetup
) -> None:
    result = await run_pvc(context, storage_classes=["archive"])
    assert result.status is Severity.SKIPPED
    assert "retains volumes" in result.reason
    assert api.writes("POST", PVC_PATH) == []


def _leftover(kind: str, name: str, node: str) -> dict:
    labels = {PROBE_LABEL: "pvc", NODE_LABEL: node}
    meta = {"name": name, "namespace": NAMESPACE, "labels": labels}
    spec = {"containers": [{"name": "c", "image": "pause"}]} if kind == "Pod" else {}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "spec": spec}


async def test_leftovers_of_a_crashed_run_are_deleted(
    api: ApiEmulator, context: PvcSetup
) -> None:
    api.seed(
        _leftover("PersistentVolumeClaim", "healthd-pvc-old", NODE),
        _leftover("Pod", "healthd-pvc-old", NODE),
        _leftover("PersistentVolumeClaim", "healthd-pvc-other", "gpu-node-2"),
    )
    async with running(api, NAMESPACE, {"fast": "bind"}):
        result = await run_pvc(context, storage_classes=["fast"], bind_timeout_s=5)
    assert result.status is Severity.PASS, result.reason
    assert api.get("PersistentVolumeClaim", "healthd-pvc-old", NAMESPACE) is None
    assert api.get("Pod", "healthd-pvc-old", NAMESPACE) is None
    assert probe_objects(api, "gpu-node-2") == ["PersistentVolumeClaim/healthd-pvc-other"]


@pytest.mark.parametrize("binding", ["fast", "local"])
async def test_cancellation_mid_wait_still_cleans_up(
    api: ApiEmulator, context: PvcSetup, binding: str
) -> None:
    check = PvcCheck({"storage_classes": [binding], "bind_timeout_s": 30},
                     probes=context.probes)
    async with running(api, NAMESPACE, {}, wait_for_consumer=frozenset({"local"})):
        with anyio.move_on_after(0.5) as scope:
            await check.run(context.ctx)
    assert scope.cancelled_caught
    assert len(api.writes("POST", PVC_PATH)) == 1
    assert len(api.writes("DELETE", rf"{PVC_PATH}/.+")) == 1
    assert len(api.writes("POST", POD_PATH)) == (1 if binding == "local" else 0)


async def test_server_error_on_create_is_unknown(api: ApiEmulator, context: PvcSetup) -> None:
    api.fail("POST", PVC_PATH, 500, body={"kind": "Status", "message": "etcd is sad"})
    result = await run_pvc(context, storage_classes=["fast"])
    assert result.status is Severity.UNKNOWN
    assert result.findings == ()
    assert "cannot create the test PVC: HTTP 500" in result.reason
    assert "etcd is sad" in result.reason


async def test_forbidden_is_unknown_with_reason(api: ApiEmulator, context: PvcSetup) -> None:
    api.authorizer = lambda user, verb, group, resource, *rest: resource != "pods"
    result = await run_pvc(context, storage_classes=["fast"])
    assert result.status is Severity.UNKNOWN
    assert result.reason.startswith("cannot list leftover probe pods: HTTP 403")
    assert api.writes("POST", PVC_PATH) == []


async def test_unreachable_api_is_unknown(api: ApiEmulator, context: PvcSetup) -> None:
    await api.go_away()
    try:
        result = await run_pvc(context, storage_classes=["fast"])
    finally:
        await api.come_back()
    assert result.status is Severity.UNKNOWN
    assert "Kubernetes API unreachable" in result.reason
    assert "\n" not in result.reason


async def test_without_a_client_or_node_name_is_unknown(context: PvcSetup) -> None:
    no_client = PvcSetup(Probes(), context.ctx)
    no_node = PvcSetup(context.probes, CheckContext(catalog=context.ctx.catalog))
    assert (await run_pvc(no_client, storage_classes=["fast"])).status is Severity.UNKNOWN
    assert (await run_pvc(no_node, storage_classes=["fast"])).status is Severity.UNKNOWN
