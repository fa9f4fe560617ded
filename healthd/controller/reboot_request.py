"""The reboot request: what the controller creates to hand a node's reboot to the
cluster's remediation (medik8s Self Node Remediation, or any operator that works
from a template the way medik8s NodeHealthCheck does), and how it tells its own
request from someone else's.

As NodeHealthCheck does: the request's kind is the template's kind without the
`Template` suffix, in the same group/version and namespace; it is named after the
node (Self Node Remediation requires it), its spec is the template's
`spec.template.spec`. It is labelled as healthd's and annotated with the node, so a
request found under that name is known to be ours or another remediator's.

Resource names (plurals) are the lower-case kind plus `s`, the default that
operators built with kubebuilder (every medik8s one) register.
"""

from __future__ import annotations

from typing import Any

from healthd.config.controller import RemediationTemplate
from healthd.kube.objects import Resource, annotations_of, labels_of, spec_of

Obj = dict[str, Any]
MANAGED_BY = "app.kubernetes.io/managed-by"
HEALTHD = "healthd"
# The annotation medik8s remediators read the node's name from when the request's
# name is not the node's; set too so any of them finds the node.
MEDIK8S_NODE_NAME = "remediation.medik8s.io/node-name"


def _resource(api_version: str, kind: str) -> Resource:
    group, _, version = api_version.partition("/")
    return Resource(group, version, kind.lower() + "s", True, kind)


def template_resource(ref: RemediationTemplate) -> Resource:
    return _resource(ref.api_version, ref.kind)


def request_resource(ref: RemediationTemplate) -> Resource:
    return _resource(ref.api_version, ref.request_kind)


def request_name(ref: RemediationTemplate, node: str) -> str:
    """`Kind namespace/name`: how the repair annotation and Events name the request."""
    return f"{ref.request_kind} {ref.namespace}/{node}"


def someone_elses(ref: RemediationTemplate, node: str) -> str:
    """Why a node whose request someone else made is not ours to reboot."""
    return (f"someone else is remediating the node: {request_name(ref, node)} exists "
            "and was not created by healthd")


def template_spec(template: Obj) -> Obj | None:
    """The template's `spec.template.spec` (None when it has no such map: unusable)."""
    inner = spec_of(template).get("template")
    spec = inner.get("spec", {}) if isinstance(inner, dict) else None
    return spec if isinstance(spec, dict) else None


def request_body(ref: RemediationTemplate, template: Obj, node: str,
                 node_key: str) -> Obj:
    """The request for `node` from `template` (`template_spec` must not be None);
    `node_key` is healthd's own annotation naming a node."""
    return {"apiVersion": ref.api_version, "kind": ref.request_kind,
            "metadata": {"name": node, "namespace": ref.namespace,
                         "labels": {MANAGED_BY: HEALTHD},
                         "annotations": {node_key: node, MEDIK8S_NODE_NAME: node}},
            "spec": template_spec(template) or {}}


def ours(request: Obj, node: str, node_key: str) -> bool:
    """Whether `request` is one healthd created for `node`."""
    return (labels_of(request).get(MANAGED_BY) == HEALTHD
            and annotations_of(request).get(node_key) == node)
