{{- /* What the values change on top of the kustomize render. */ -}}

{{- define "healthd.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- /* Helm's recommended labels, on every object's metadata (never on a selector). */ -}}
{{- define "healthd.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- /* Autopilot's check names that healthd spells differently. */ -}}
{{- define "healthd.checkAliases" -}}
{{- toJson (dict "gpupower" "power") -}}
{{- end -}}

{{- /* healthd's checks (checks.REGISTRY; values.schema.json's checkName adds the
aliases; the chart's tests hold the three lists together). */ -}}
{{- define "healthd.checkNames" -}}
{{- toJson (list "gpus" "remapped" "recovery" "power" "pcie" "aer" "ecc" "nvlink" "fabric" "xid" "sxid" "pciebw" "ping" "nic" "rdma" "pvc" "dcgm") -}}
{{- end -}}

{{- /* A check name as healthd spells it: (list $ NAME). */ -}}
{{- define "healthd.checkName" -}}
{{- $aliases := include "healthd.checkAliases" (index . 0) | fromJson -}}
{{- get $aliases (index . 1) | default (index . 1) -}}
{{- end -}}

{{- /* checks.<name> of a config, made when missing: (list CHECKS NAME) -> set in place. */ -}}
{{- define "healthd.ensureCheck" -}}
{{- $checks := index . 0 -}}
{{- if not (kindIs "map" (get $checks (index . 1))) -}}
{{- $_ := set $checks (index . 1) dict -}}
{{- end -}}
{{- end -}}

{{- /* The healthd config: deploy/daemonset/base/config.yaml (namespace and prefixes
swapped), then the values, then .Values.config merged over all. */ -}}
{{- define "healthd.config" -}}
{{- $v := .Values -}}
{{- $cfg := include "healthd.source" (list . "base/config.yaml") | fromYaml -}}
{{- if not (kindIs "map" $cfg.checks) -}}
{{- $_ := set $cfg "checks" dict -}}
{{- end -}}
{{- $checks := $cfg.checks -}}
{{- $all := include "healthd.checkNames" . | fromJsonArray -}}
{{- $enabled := $v.checks.enabled -}}
{{- if kindIs "string" $enabled -}}
{{- $enabled = splitList "," ($enabled | nospace) -}}
{{- end -}}
{{- if not (has "all" $enabled) -}}
{{- $on := list -}}
{{- range $name := $enabled -}}
{{- $on = append $on (include "healthd.checkName" (list $ $name)) -}}
{{- end -}}
{{- range $name := $all -}}
{{- include "healthd.ensureCheck" (list $checks $name) -}}
{{- $_ := set (get $checks $name) "enabled" (has $name $on) -}}
{{- end -}}
{{- end -}}
{{- if $v.checks.interval -}}
{{- range $name := $all -}}
{{- include "healthd.ensureCheck" (list $checks $name) -}}
{{- $_ := set (get $checks $name) "interval" $v.checks.interval -}}
{{- end -}}
{{- end -}}
{{- range $alias, $interval := $v.checks.intervals -}}
{{- $name := include "healthd.checkName" (list $ $alias) -}}
{{- include "healthd.ensureCheck" (list $checks $name) -}}
{{- $_ := set (get $checks $name) "interval" $interval -}}
{{- end -}}
{{- range $name, $params := dict "pvc" (dict "storage_classes" $v.checks.pvc.storageClasses) "dcgm" (dict "level" $v.dcgm.level) -}}
{{- include "healthd.ensureCheck" (list $checks $name) -}}
{{- $section := get $checks $name -}}
{{- $_ := set $section "params" (mergeOverwrite ($section.params | default dict) $params) -}}
{{- end -}}
{{- $agent := $cfg.agent | default dict -}}
{{- $_ := set $cfg "agent" $agent -}}
{{- $_ := set $agent "diagnostics" $v.checks.diagnostics -}}
{{- $_ := set $agent "deep_diagnostics" (mergeOverwrite ($agent.deep_diagnostics | default dict) (dict "image" (include "healthd.image" .))) -}}
{{- $b := $v.controller.breaker -}}
{{- $controller := dict "dry_run" $v.controller.dryRun "slack_queues" $v.controller.slackQueues
      "breaker" (dict "max_unhealthy" $b.maxUnhealthy "min_allowed" $b.minAllowed "window" $b.window "hold" $b.hold)
      "election" (dict "namespace" .Release.Namespace) -}}
{{- $_ := set $cfg "controller" (mergeOverwrite ($cfg.controller | default dict) $controller) -}}
{{- toYaml (mergeOverwrite $cfg (deepCopy $v.config)) -}}
{{- end -}}

{{- /* The image and pull settings of every container of a pod spec: (list $ POD). */ -}}
{{- define "healthd.podImage" -}}
{{- $root := index . 0 -}}
{{- $pod := index . 1 -}}
{{- range $c := concat $pod.containers ($pod.initContainers | default list) -}}
{{- $_ := set $c "image" (include "healthd.image" $root) -}}
{{- if $root.Values.image.pullPolicy -}}
{{- $_ := set $c "imagePullPolicy" $root.Values.image.pullPolicy -}}
{{- end -}}
{{- end -}}
{{- if $root.Values.imagePullSecrets -}}
{{- $_ := set $pod "imagePullSecrets" $root.Values.imagePullSecrets -}}
{{- end -}}
{{- end -}}

{{- /* Pod template settings the agent and the controller share: (list $ OBJ SECTION).
A changed config rolls the pods (kustomize does it by the ConfigMap's hash name). */ -}}
{{- define "healthd.workload" -}}
{{- $root := index . 0 -}}
{{- $obj := index . 1 -}}
{{- $section := index . 2 -}}
{{- $tpl := $obj.spec.template -}}
{{- $pod := $tpl.spec -}}
{{- $annotations := mergeOverwrite ($tpl.metadata.annotations | default dict) ($section.podAnnotations | default dict)
      (dict "checksum/config" (include "healthd.config" $root | sha256sum)) -}}
{{- $_ := set $tpl.metadata "annotations" $annotations -}}
{{- include "healthd.podImage" (list $root $pod) -}}
{{- if $section.nodeSelector -}}
{{- $_ := set $pod "nodeSelector" $section.nodeSelector -}}
{{- end -}}
{{- if $section.tolerations -}}
{{- $_ := set $pod "tolerations" (concat ($pod.tolerations | default list) $section.tolerations) -}}
{{- end -}}
{{- if $section.resources -}}
{{- $_ := set (first $pod.containers) "resources" $section.resources -}}
{{- end -}}
{{- end -}}

{{- /* The agent DaemonSet: runtime class (and the diagnostic Jobs' with it), DCGM host engine. */ -}}
{{- define "healthd.agent" -}}
{{- $root := index . 0 -}}
{{- $ds := index . 1 -}}
{{- $v := $root.Values -}}
{{- include "healthd.workload" (list $root $ds $v.agent) -}}
{{- $pod := $ds.spec.template.spec -}}
{{- $agent := first $pod.containers -}}
{{- if not (kindIs "invalid" $v.agent.runtimeClassName) -}}
{{- $env := list -}}
{{- range $e := $agent.env -}}
{{- if ne $e.name "DIAGNOSTIC_RUNTIME_CLASS" -}}
{{- $env = append $env $e -}}
{{- end -}}
{{- end -}}
{{- $_ := unset $pod "runtimeClassName" -}}
{{- if $v.agent.runtimeClassName -}}
{{- $_ := set $pod "runtimeClassName" $v.agent.runtimeClassName -}}
{{- $env = append $env (dict "name" "DIAGNOSTIC_RUNTIME_CLASS" "value" $v.agent.runtimeClassName) -}}
{{- end -}}
{{- $_ := set $agent "env" $env -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.dcgm.hostEngine) -}}
{{- range $e := $agent.env -}}
{{- if eq $e.name "DCGM_HOST_ENGINE" -}}
{{- $_ := set $e "value" $v.dcgm.hostEngine -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The controller Deployment: replicas. */ -}}
{{- define "healthd.controller" -}}
{{- $root := index . 0 -}}
{{- $deploy := index . 1 -}}
{{- include "healthd.workload" (list $root $deploy $root.Values.controller) -}}
{{- $_ := set $deploy.spec "replicas" $root.Values.controller.replicas -}}
{{- end -}}
