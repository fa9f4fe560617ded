"""Paginated lists (`limit` and `continue`), as the real server serves them: pages
that add up to one consistent list of the first page's revision (a change between
pages does not show), `remainingItemCount` when nothing is selected, the 400 for a
continue token beside a resourceVersion, and 410 `Expired` for a token whose
revision was compacted away (the emulator's powers: the real server keeps minutes)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio

NAMES = [f"p{i}" for i in range(5)]


async def _pods(kube: Kube, names: list[str]) -> None:
    for name in names:
        await kube.call("CoreV1Api", "create_namespaced_pod", kube.namespace, {
            "metadata": {"name": name, "labels": {"odd": str(int(name[1:]) % 2)}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})


async def _page(kube: Kube, limit: int, token: str | None = None, **selectors: str) -> Any:
    return await kube.call("CoreV1Api", "list_namespaced_pod", kube.namespace, limit=limit,
                           _continue=token, **selectors)


async def test_pages_add_up_to_one_list_of_the_first_pages_version(kube: Kube) -> None:
    await _pods(kube, NAMES)
    first = await _page(kube, 2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue
    # Changes made between pages do not show: the list is of the first page's version.
    await kube.call("CoreV1Api", "delete_namespaced_pod", "p3", kube.namespace,
                    grace_period_seconds=0)
    await _pods(kube, ["p9"])
    names, token, versions = [], first.metadata._continue, {first.metadata.resource_version}
    while token:
        page = await _page(kube, 2, token)
        assert len(page.items) <= 2
        names += [p.metadata.name for p in page.items]
        token, versions = page.metadata._continue, versions | {page.metadata.resource_version}
    assert names == ["p2", "p3", "p4"] and len(versions) == 1
    assert page.metadata.remaining_item_count is None


async def test_a_selected_list_pages_what_it_selects(kube: Kube) -> None:
    await _pods(kube, NAMES)
    names, token = [], None
    while True:
        page = await _page(kube, 1, token, label_selector="odd=1")
        names += [p.metadata.name for p in page.items]
        assert page.metadata.remaining_item_count is None  # not counted when selected
        token = page.metadata._continue
        if not token:
            break
    assert names == ["p1", "p3"]


async def test_a_continue_token_with_a_resource_version_is_400(kube: Kube) -> None:
    await _pods(kube, NAMES[:3])
    first = await _page(kube, 1)
    err = await kube.error("CoreV1Api", "list_namespaced_pod", kube.namespace, limit=1,
                           _continue=first.metadata._continue,
                           resource_version=first.metadata.resource_version)
    assert err.status == 400


async def test_a_compacted_continue_token_is_410_expired(ekube: Kube) -> None:
    await _pods(ekube, NAMES[:3])
    first = await _page(ekube, 1)
    await _pods(ekube, ["p7"])
    assert ekube.emulator is not None
    ekube.emulator.compact()
    err = await ekube.error("CoreV1Api", "list_namespaced_pod", ekube.namespace, limit=1,
                            _continue=first.metadata._continue)
    assert err.status == 410 and "Expired" in err.body


async def test_a_built_in_lists_items_carry_no_kind(kube: Kube) -> None:
    """The List names the kind once; its items leave it out (a client sets it)."""
    await _pods(kube, NAMES[:1])
    listing = await kube.call("CoreV1Api", "list_namespaced_pod", kube.namespace)
    assert listing.kind == "PodList"
    assert [(p.kind, p.api_version) for p in listing.items] == [(None, None)]
    one = await kube.call("CoreV1Api", "read_namespaced_pod", "p0", kube.namespace)
    assert (one.kind, one.api_version) == ("Pod", "v1")
