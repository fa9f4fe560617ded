"""The one catalog of finding codes and its overrides."""

from __future__ import annotations

import pytest

from checks.base import Severity
from checks.catalog import Catalog, Override

S = Severity


@pytest.mark.parametrize(
    ("code", "severity", "sticky"),
    [
        ("REMAP_PENDING", S.ERR, False),
        ("REMAP_FAILURE", S.EVICT, True),
        ("GPU_MISSING", S.EVICT, True),
        ("HW_SLOWDOWN", S.WARN, False),
        ("XID_79", S.EVICT, True),
        ("XID_48", S.ERR, False),
        ("XID_13", S.PASS, False),  # application-caused: informational
        ("XID_43", S.PASS, False),
        ("DCGM_MEMORY", S.EVICT, True),
        ("DCGM_TARGETED_STRESS", S.ERR, False),
    ],
)
def test_defaults(code: str, severity: Severity, sticky: bool) -> None:
    spec = Catalog().lookup(code)
    assert (spec.severity, spec.sticky) == (severity, sticky)


def test_override_changes_severity_and_stickiness() -> None:
    catalog = Catalog({"REMAP_PENDING": Override(severity=S.EVICT, sticky=True)})
    spec = catalog.lookup("REMAP_PENDING")
    assert (spec.severity, spec.sticky) == (S.EVICT, True)
    assert catalog.lookup("REMAP_FAILURE").severity is S.EVICT  # others untouched


def test_override_of_unknown_code_is_refused() -> None:
    with pytest.raises(ValueError, match="NOT_A_CODE"):
        Catalog({"NOT_A_CODE": Override(severity=S.WARN)})
