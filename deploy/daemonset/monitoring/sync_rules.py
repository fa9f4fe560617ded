"""Copy the alert groups of dashboards/alerts.yaml into operator/prometheusrule.yaml.

The Prometheus Operator reads alert rules from a PrometheusRule object; a plain
Prometheus reads dashboards/alerts.yaml. One source of truth, two shapes: edit the
rules file, then run `python deploy/daemonset/monitoring/sync_rules.py` (the deploy
tests fail while the two differ). Needs only PyYAML.
"""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parents[2] / "dashboards" / "alerts.yaml"
RULE = HERE / "operator" / "prometheusrule.yaml"
HEADER = """\
# healthd's alert rules for the Prometheus Operator: spec.groups is a copy of
# dashboards/alerts.yaml, made by ../sync_rules.py (edit the rules file,
# then run it; the deploy tests fail while the two differ).
"""


def rule_text(alerts: str) -> str:
    """The PrometheusRule manifest carrying the groups of a Prometheus rules file."""
    groups = yaml.safe_load(alerts)["groups"]
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "healthd", "namespace": "healthd-system"},
            "spec": {"groups": groups}}
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=100)


if __name__ == "__main__":
    RULE.write_text(rule_text(ALERTS.read_text()))
    print(f"wrote {RULE}")
