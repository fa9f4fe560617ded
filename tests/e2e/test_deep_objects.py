"""An AppWrapper nested 3,000 levels deep on the real API server (it stores up to
10,000; the CRD leaves a component's template free-form): healthd's controller names
it in one warning and skips it, and still resets the AppWrapper on an EVICT node.
(Such an object once stopped every reset in the cluster: each list and watch of
AppWrappers failed with a RecursionError.)"""

from __future__ import annotations

import uuid

from kubernetes import client as k8s

from tests.deep_json import deep_appwrapper
from tests.e2e.conftest import Operator
from tests.e2e.healthd import Healthd
from tests.e2e.mlbatch import tutorial
from tests.e2e.running_job import running_job

AW_PATH = "/apis/workload.codeflare.dev/v1beta2/namespaces/{ns}/appwrappers"


def post_raw(api: k8s.ApiClient, path: str, text: str) -> tuple[int, str]:
    """POST `text` as it is: the client's own encoder stops near 1,000 levels."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    token = api.configuration.auth_settings().get("BearerToken", {}).get("value")
    if token:
        headers["Authorization"] = token
    resp = api.rest_client.pool_manager.request(
        "POST", api.configuration.host + path, body=text.encode(), headers=headers)
    return resp.status, resp.data.decode(errors="replace")


def test_a_deep_appwrapper_is_stored_skipped_and_resets_go_on(
        healthd: Healthd, operator: Operator) -> None:
    healthd.applier.apply(tutorial())
    deep = f"deep-{uuid.uuid4().hex[:5]}"
    status, answer = post_raw(healthd.client, AW_PATH.format(ns="blue"),
                              deep_appwrapper(deep, "blue"))
    assert status == 201, answer[:500]  # the real server stores it
    try:
        running_job(healthd, "deep").evicted_and_reset()
    finally:
        healthd.custom.delete_namespaced_custom_object(
            "workload.codeflare.dev", "v1beta2", "blue", "appwrappers", deep)
    assert healthd.controller is not None
    told = [m for m in healthd.controller.messages() if "cannot decode" in m]
    assert len(told) == 1 and f"blue/{deep}" in told[0], told
    assert not [m for m in healthd.controller.messages() if "RecursionError" in m]

