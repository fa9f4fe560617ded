{{- /*
The chart renders the kustomize sources themselves: files/kustomize is a link to
deploy/daemonset, and these helpers do the little of kustomize those sources use
(resources, components, `labels`, strategic-merge and JSON 6902 patches). A change
to the base or an overlay therefore reaches the chart as it is; a kustomize feature
these helpers do not know fails the render with its name, and the chart's parity
tests compare both renders object by object.

Objects travel between helpers as JSON (`include` returns text).
*/ -}}

{{- /* A kustomize source file as text, with the release namespace for healthd-system
(healthd-system-probes becomes <namespace>-probes with it), in the config and the
admission policies (the keys the agent may write) the key prefixes of the values, and
in the policy on what the agent creates the images the config names:
(list $ "base/config.yaml"). The placeholders keep a prefix that contains the other
one from being replaced twice. */ -}}
{{- define "healthd.source" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $text := $root.Files.Get (printf "files/kustomize/%s" $path) -}}
{{- if not $text -}}
{{- fail (printf "healthd chart: files/kustomize/%s is missing (files/kustomize links to deploy/daemonset)" $path) -}}
{{- end -}}
{{- $text = regexReplaceAll "\\bhealthd-system\\b" $text $root.Release.Namespace -}}
{{- if eq $path "base/probe-policy.yaml" -}}
{{- $text = include "healthd.policyImages" (list $root $text) -}}
{{- end -}}
{{- if has $path (list "base/config.yaml" "base/node-policy.yaml" "base/controller-node-policy.yaml" "base/probe-policy.yaml") -}}
{{- $text = $text | replace "autopilot.ibm.com/" "@@LABEL_PREFIX@@" | replace "healthd.io/" "@@OWN_PREFIX@@" -}}
{{- $text = $text | replace "@@LABEL_PREFIX@@" $root.Values.labelPrefix | replace "@@OWN_PREFIX@@" $root.Values.ownPrefix -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{- /* The images of the shipped config (the diagnostic Jobs', the pvc probe pod's)
swapped, in a policy's text, for those of the config the values make:
(list $ TEXT). */ -}}
{{- define "healthd.policyImages" -}}
{{- $root := index . 0 -}}
{{- $text := index . 1 -}}
{{- $shipped := $root.Files.Get "files/kustomize/base/config.yaml" | fromYaml -}}
{{- $config := include "healthd.config" $root | fromYaml -}}
{{- $text = $text | replace (printf "'%s'" $shipped.agent.deep_diagnostics.image) "'@@DIAGNOSTIC_IMAGE@@'" | replace (printf "'%s'" $shipped.checks.pvc.params.pod_image) "'@@PROBE_IMAGE@@'" -}}
{{- $text | replace "@@DIAGNOSTIC_IMAGE@@" $config.agent.deep_diagnostics.image | replace "@@PROBE_IMAGE@@" $config.checks.pvc.params.pod_image -}}
{{- end -}}

{{- /* The objects of a YAML stream file, as a JSON list: (list $ "base/agent-rbac.yaml"). */ -}}
{{- define "healthd.sourceObjects" -}}
{{- $objects := list -}}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" (include "healthd.source" .) -1 -}}
{{- $obj := fromYaml $doc -}}
{{- if hasKey $obj "Error" -}}
{{- fail (printf "healthd chart: files/kustomize/%s: %s" (index $ 1) $obj.Error) -}}
{{- end -}}
{{- if $obj.kind -}}
{{- $objects = append $objects $obj -}}
{{- end -}}
{{- end -}}
{{- toJson $objects -}}
{{- end -}}

{{- /* "overlays/gpu-operator" + "../../base" -> "base" */ -}}
{{- define "healthd.joinPath" -}}
{{- $parts := list -}}
{{- range $part := splitList "/" (printf "%s/%s" (index . 0) (index . 1)) -}}
{{- if eq $part ".." -}}
{{- $parts = initial $parts -}}
{{- else if and $part (ne $part ".") -}}
{{- $parts = append $parts $part -}}
{{- end -}}
{{- end -}}
{{- join "/" $parts -}}
{{- end -}}

{{- /* A kustomization directory rendered, as a JSON list: (list $ "overlays/gpu-operator"),
or (list $ DIR COMPONENTS) to add components (directories) as a user's own
kustomization would. Generators are left out: the chart makes its own ConfigMap. */ -}}
{{- define "healthd.kustomize" -}}
{{- $root := index . 0 -}}
{{- $dir := index . 1 -}}
{{- $extra := list -}}
{{- if gt (len .) 2 -}}
{{- $extra = index . 2 -}}
{{- end -}}
{{- $k := fromYaml (include "healthd.source" (list $root (printf "%s/kustomization.yaml" $dir))) -}}
{{- range $key := keys $k | sortAlpha -}}
{{- if not (has $key (list "apiVersion" "kind" "resources" "components" "labels" "patches" "configMapGenerator")) -}}
{{- fail (printf "healthd chart: %s/kustomization.yaml uses `%s`, which the chart does not render" $dir $key) -}}
{{- end -}}
{{- end -}}
{{- $objects := list -}}
{{- range $res := $k.resources | default list -}}
{{- $path := include "healthd.joinPath" (list $dir $res) -}}
{{- if hasSuffix ".yaml" $path -}}
{{- $objects = concat $objects (include "healthd.sourceObjects" (list $root $path) | fromJsonArray) -}}
{{- else -}}
{{- $objects = concat $objects (include "healthd.kustomize" (list $root $path) | fromJsonArray) -}}
{{- end -}}
{{- end -}}
{{- $components := list -}}
{{- range $c := $k.components | default list -}}
{{- $components = append $components (include "healthd.joinPath" (list $dir $c)) -}}
{{- end -}}
{{- range $c := concat $components $extra -}}
{{- $objects = include "healthd.patch" (list $root $c (include "healthd.source" (list $root (printf "%s/kustomization.yaml" $c)) | fromYaml) $objects) | fromJsonArray -}}
{{- end -}}
{{- $objects = include "healthd.patch" (list $root $dir $k $objects) | fromJsonArray -}}
{{- range $set := $k.labels | default list -}}
{{- if $set.includeSelectors -}}
{{- fail (printf "healthd chart: %s/kustomization.yaml: labels with includeSelectors are not rendered" $dir) -}}
{{- end -}}
{{- range $obj := $objects -}}
{{- $_ := set $obj.metadata "labels" (mergeOverwrite ($obj.metadata.labels | default dict) $set.pairs) -}}
{{- if and $set.includeTemplates $obj.spec (kindIs "map" $obj.spec) $obj.spec.template -}}
{{- $tmeta := $obj.spec.template.metadata | default dict -}}
{{- $_ := set $tmeta "labels" (mergeOverwrite ($tmeta.labels | default dict) $set.pairs) -}}
{{- $_ := set $obj.spec.template "metadata" $tmeta -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $objects -}}
{{- end -}}

{{- /* The `patches` of a kustomization (or component) applied to objects: (list $ DIR K OBJECTS). */ -}}
{{- define "healthd.patch" -}}
{{- $root := index . 0 -}}
{{- $dir := index . 1 -}}
{{- $k := index . 2 -}}
{{- $objects := index . 3 -}}
{{- range $p := $k.patches | default list -}}
{{- if not $p.path -}}
{{- fail (printf "healthd chart: %s: only patches from files are rendered" $dir) -}}
{{- end -}}
{{- $file := include "healthd.joinPath" (list $dir $p.path) -}}
{{- $text := include "healthd.source" (list $root $file) -}}
{{- $smp := fromYaml $text -}}
{{- if $p.target -}}
{{- range $obj := $objects -}}
{{- if and (eq $obj.kind $p.target.kind) (eq $obj.metadata.name $p.target.name) -}}
{{- if and $smp (not (hasKey $smp "Error")) -}}{{- /* a strategic-merge patch with a target */ -}}
{{- include "healthd.merge" (list $obj (omit $smp "apiVersion" "kind" "metadata")) -}}
{{- else -}}
{{- range $op := fromYamlArray $text -}}
{{- include "healthd.jsonPatchOp" (list $obj $op $file) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- range $patch := include "healthd.sourceObjects" (list $root $file) | fromJsonArray -}}
{{- range $obj := $objects -}}
{{- if and (eq $obj.kind $patch.kind) (eq $obj.metadata.name $patch.metadata.name) -}}
{{- include "healthd.merge" (list $obj $patch) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $objects -}}
{{- end -}}

{{- /* Strategic merge, as far as these manifests need it: maps merge; lists of named
items (containers, env, volumes, ports) merge by name, the patch's items first in its
order, then the others (kustomize's order); any other list or value replaces.
(list TARGET PATCH), TARGET changed in place. */ -}}
{{- define "healthd.merge" -}}
{{- $dst := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- $cur := get $dst $key -}}
{{- if and (kindIs "map" $value) (kindIs "map" $cur) -}}
{{- include "healthd.merge" (list $cur $value) -}}
{{- else if and (kindIs "slice" $value) (kindIs "slice" $cur) $value (kindIs "map" (first $value)) (hasKey (first $value) "name") -}}
{{- $merged := list -}}
{{- $names := list -}}
{{- range $item := $value -}}
{{- $names = append $names $item.name -}}
{{- $found := false -}}
{{- range $old := $cur -}}
{{- if eq $old.name $item.name -}}
{{- include "healthd.merge" (list $old $item) -}}
{{- $merged = append $merged $old -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- $merged = append $merged $item -}}
{{- end -}}
{{- end -}}
{{- range $old := $cur -}}
{{- if not (has $old.name $names) -}}
{{- $merged = append $merged $old -}}
{{- end -}}
{{- end -}}
{{- $_ := set $dst $key $merged -}}
{{- else -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* One JSON 6902 operation (add, replace, remove) on map members: (list OBJ OP FILE). */ -}}
{{- define "healthd.jsonPatchOp" -}}
{{- $obj := index . 0 -}}
{{- $op := index . 1 -}}
{{- $file := index . 2 -}}
{{- if not (has $op.op (list "add" "replace" "remove")) -}}
{{- fail (printf "healthd chart: %s: JSON patch op %q is not rendered" $file $op.op) -}}
{{- end -}}
{{- $tokens := list -}}
{{- range $t := rest (splitList "/" $op.path) -}}
{{- $tokens = append $tokens ($t | replace "~1" "/" | replace "~0" "~") -}}
{{- end -}}
{{- $node := $obj -}}
{{- range $t := initial $tokens -}}
{{- if not (kindIs "map" (get $node $t)) -}}
{{- $_ := set $node $t dict -}}
{{- end -}}
{{- $node = get $node $t -}}
{{- end -}}
{{- if eq $op.op "remove" -}}
{{- $_ := unset $node (last $tokens) -}}
{{- else -}}
{{- $_ := set $node (last $tokens) $op.value -}}
{{- end -}}
{{- end -}}
