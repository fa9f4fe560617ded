"""`Backoff` delays (growth, cap, reset, jitter bounds) and `retrying` over a real
client: transient failures are retried until success, the attempt limit is kept,
and errors that will not heal are raised at once."""

from __future__ import annotations

import random

import pytest

from healthd.kube import errors
from healthd.kube.backoff import Backoff, retrying
from healthd.kube.client import Kube
from healthd.kube.objects import NODES
from healthd.sim.apiserver import ApiEmulator
from tests.kube.conftest import node

NODE_PATH = "/api/v1/nodes/n1"


def test_delays_grow_to_the_cap_and_reset() -> None:
    backoff = Backoff(initial=0.5, maximum=4, factor=2, jitter=0)
    assert [backoff.next() for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    backoff.reset()
    assert backoff.next() == 0.5


def test_proportional_jitter_stays_within_its_band_and_the_cap() -> None:
    backoff = Backoff(initial=1, maximum=3, jitter=0.2, rng=random.Random(7))
    firsts = []
    for _ in range(200):
        backoff.reset()
        firsts.append(backoff.next())
    assert all(0.8 <= d <= 1.2 for d in firsts)
    assert len(set(firsts)) > 100  # agents that failed together do not retry together
    later = [backoff.next() for _ in range(50)]
    assert all(d <= 3 for d in later)


def test_full_jitter_draws_from_zero_to_the_delay() -> None:
    backoff = Backoff(initial=2, maximum=2, full=True, rng=random.Random(1))
    delays = [backoff.next() for _ in range(200)]
    assert all(0 <= d <= 2 for d in delays)
    assert min(delays) < 0.5


@pytest.mark.parametrize("kwargs", [{"initial": 0}, {"initial": 5, "maximum": 1},
                                    {"factor": 0.5}, {"jitter": 1.5}])
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


@pytest.mark.anyio
async def test_retrying_gets_through_transient_failures(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"))
    api.fail("GET", NODE_PATH, 503, times=2)
    got = await retrying(lambda: kube.get(NODES, "n1"), backoff=Backoff(initial=0.01))
    assert got["metadata"]["name"] == "n1"
    assert len(api.requests_to("GET", NODE_PATH)) == 3


@pytest.mark.anyio
async def test_retrying_gives_up_after_its_attempts(api: ApiEmulator, kube: Kube) -> None:
    api.fail("GET", NODE_PATH, 500, times=5)
    with pytest.raises(errors.Unavailable):
        await retrying(lambda: kube.get(NODES, "n1"), backoff=Backoff(initial=0.01),
                       attempts=2)
    assert len(api.requests_to("GET", NODE_PATH)) == 2


@pytest.mark.anyio
async def test_retrying_does_not_retry_what_will_not_heal(api: ApiEmulator,
                                                          kube: Kube) -> None:
    with pytest.raises(errors.NotFound):
        await retrying(lambda: kube.get(NODES, "n1"), backoff=Backoff(initial=0.01))
    assert len(api.requests_to("GET", NODE_PATH)) == 1
