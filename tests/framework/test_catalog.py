"""The one catalog of finding codes and its overrides."""

from __future__ import annotations

import pytest

import checks
from checks.base import Severity
from checks.catalog import DEFAULT_CODES, Catalog, Override, is_known_code

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


# A family's example member, to ask the catalog about `XID_*`-style declarations.
_FAMILY_EXAMPLE = {"XID_*": "XID_79", "SXID_*": "SXID_12028", "DCGM_*": "DCGM_PCIE"}


def test_every_check_declares_catalogued_codes_and_every_code_has_a_check() -> None:
    declared = {code for cls in checks.REGISTRY.values() for code in cls.CODES}
    for code in sorted(declared):
        assert is_known_code(_FAMILY_EXAMPLE.get(code, code)), f"{code} is not catalogued"
    orphans = sorted(set(DEFAULT_CODES) - declared)
    assert orphans == [], f"no check declares {orphans} in its CODES"
