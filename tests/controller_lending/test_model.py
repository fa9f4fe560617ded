"""The lending model, pure: limits per group, flavor and resource from node
contributions; the field removed when nothing is unavailable; clamping with a
shortfall; flavor membership by nodeLabels (and re-membership when a node's labels
or the flavors change); unknown flavors and unusable quotas left alone; and the
incremental sums staying exact over a 10,000-node fleet."""

from __future__ import annotations

import random
from decimal import Decimal

from healthd.capacity.health import Unavailability
from healthd.capacity.lending import LendingModel, LimitChange
from tests.controller_lending.helpers import GPU, group, queue, resources

H100 = {"gpu": "h100"}


def bad(name: str, gpus: int = 8, reason: str = "EVICT", **labels: str) -> Unavailability:
    return Unavailability(node=name, reasons=frozenset({reason}),
                          capacity={GPU: Decimal(gpus), "cpu": Decimal(64)}, labels=labels)


def model(**flavors: dict[str, str]) -> LendingModel:
    m = LendingModel()
    m.set_flavors(flavors or {"default-flavor": {}})
    return m


def by_key(changes: list[LimitChange]) -> dict[tuple[int, str, str], tuple[str | None, ...]]:
    return {(c.group, c.flavor, c.resource): (c.old, c.new) for c in changes}


def test_limits_removal_and_shortfall() -> None:
    m = model()
    q = queue(group(("default-flavor", resources(gpu=("12", "4"), cpu="32"))))
    assert by_key(m.changes(q)) == {(0, "default-flavor", GPU): ("4", None)}  # nothing bad
    m.set_node("n1", bad("n1"))
    assert by_key(m.changes(q)) == {(0, "default-flavor", "cpu"): (None, "0")}  # gpu 4 is right
    m.set_node("n2", bad("n2"))
    (gpu, cpu) = m.evaluate(q)
    assert (gpu.new, gpu.unavailable, gpu.shortfall) == ("0", Decimal(16), Decimal(4))
    assert (cpu.new, cpu.shortfall) == ("0", Decimal(96))
    assert gpu.path == "/spec/resourceGroups/0/flavors/0/resources/0/lendingLimit"
    m.set_node("n1", None)
    m.set_node("n2", None)
    assert [c.new for c in m.evaluate(q)] == [None, None]


def test_flavor_membership_follows_labels() -> None:
    m = model(**{"default-flavor": {}, "h100": H100, "a100": {"gpu": "a100"}})
    q = queue(group(("a100", resources(gpu="16")), ("h100", resources(gpu="16"))))
    m.set_node("n1", bad("n1", **H100))
    assert by_key(m.changes(q)) == {(0, "h100", GPU): (None, "8")}
    assert m.unavailable("default-flavor", GPU) == 8
    m.set_node("n1", bad("n1", gpu="a100"))  # relabelled: moves between flavors
    assert by_key(m.changes(q)) == {(0, "a100", GPU): (None, "8")}
    m.set_flavors({"default-flavor": {}, "h100": H100, "a100": {"gpu": "a100", "zone": "x"}})
    assert m.changes(q) == []  # no flavor matches now
    assert m.nodes_behind("default-flavor", GPU) == ["n1"]


def test_unknown_flavor_and_bad_quota_left_alone() -> None:
    m = model()
    m.set_node("n1", bad("n1"))
    q = queue(group(("ghost", resources(gpu=("16", "3"))),
                    ("default-flavor", [{"name": GPU, "nominalQuota": "lots"},
                                        {"name": "cpu"}, "junk"])))
    assert m.changes(q) == []
    assert m.changes({"spec": {"resourceGroups": "junk"}}) == []
    assert m.changes({}) == []


def test_unparseable_old_value_is_rewritten() -> None:
    m = model()
    m.set_node("n1", bad("n1"))
    q = queue(group(("default-flavor", resources(gpu=("12", "four")))))
    assert by_key(m.changes(q)) == {(0, "default-flavor", GPU): ("four", "4")}
    q = queue(group(("default-flavor", resources(gpu=("12", "4000m")))))
    assert m.changes(q) == []  # same quantity, other spelling: no write


def test_by_reason() -> None:
    m = model()
    m.set_node("n1", bad("n1", reason="EVICT"))
    m.set_node("n2", bad("n2", gpus=4, reason="Cordoned"))
    assert m.unavailable_by_reason("default-flavor") == {
        (GPU, "EVICT"): 8, ("cpu", "EVICT"): 64, (GPU, "Cordoned"): 4, ("cpu", "Cordoned"): 64}
    m.set_node("n2", None)
    assert (GPU, "Cordoned") not in m.unavailable_by_reason("default-flavor")


def test_ten_thousand_nodes_sum_exactly() -> None:
    """Random churn over 10,000 nodes in three flavors: the incremental sums equal a
    recount from scratch (the bench measures the time; here only correctness)."""
    rng = random.Random(7)
    flavors = {"default-flavor": {}, "h100": H100, "a100": {"gpu": "a100"}}
    m = model(**flavors)
    truth: dict[str, Unavailability | None] = {}
    for step in range(30_000):
        name = f"n{rng.randrange(10_000)}"
        if rng.random() < 0.4:
            unavail = None
        else:
            unavail = bad(name, gpus=rng.choice([4, 8]), gpu=rng.choice(["h100", "a100"]))
        m.set_node(name, unavail)
        truth[name] = unavail
        if step == 15_000:
            m.set_flavors({**flavors, "a100": {"gpu": "a100", "x": "y"}})
            m.set_flavors(flavors)  # a rebuild midway must not change the result
    for flavor, selector in flavors.items():
        expect = sum((u.capacity[GPU] for u in truth.values()
                      if u and all(u.labels.get(k) == v for k, v in selector.items())),
                     Decimal(0))
        assert m.unavailable(flavor, GPU) == expect
    assert len(m.bad_nodes) == sum(1 for u in truth.values() if u)
