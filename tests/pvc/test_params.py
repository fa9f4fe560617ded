"""Parameters and names of the `pvc` check: bad values are refused when the check is
built (the config is validated at start), and the probe's object names and label
values stay valid for any node and storage class name Kubernetes allows."""

from __future__ import annotations

import re

import pytest

from checks.pvc import PvcCheck, PvcParams, probe_name
from healthd.kube.pvc_probe import label_value

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


@pytest.mark.parametrize(
    "params",
    [{"size": "lots"}, {"storage_classes": ["Bad_Name"]}, {"bind_timeout_s": 0}, {"nope": 1}],
)
def test_bad_params_are_rejected(params: dict) -> None:
    with pytest.raises(ValueError):
        PvcCheck(params)


def test_defaults_probe_nothing_until_a_class_is_configured() -> None:
    params = PvcCheck().params
    assert isinstance(params, PvcParams)
    assert params.storage_classes == []
    assert (params.size, params.bind_timeout_s, params.allow_pods) == ("1Mi", 60.0, True)


def test_long_node_names_give_valid_distinct_names_and_labels() -> None:
    base = "gpu-" + "a" * 70 + ".compute.internal"
    one, two = base + "-1", base + "-2"
    for node in (one, two):
        assert DNS_LABEL.fullmatch(probe_name(node, "fast." + "b" * 200))
        assert LABEL_VALUE.fullmatch(label_value(node))
    assert label_value(one) != label_value(two)
    assert label_value("gpu-node-1") == "gpu-node-1"
    assert probe_name("n1", "fast") != probe_name("n1", "fast")
