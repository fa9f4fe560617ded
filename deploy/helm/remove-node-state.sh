#!/usr/bin/env bash
# Remove what healthd wrote on the Nodes, once healthd is uninstalled (Helm
# and kubectl delete leave it: the Nodes are not theirs). Uses your kubectl context.
#   deploy/helm/remove-node-state.sh                       # the default prefixes
#   LABEL_PREFIX=shadow.healthd.io/ deploy/helm/remove-node-state.sh   # another prefix
# Removes the labels <LABEL_PREFIX>gpuhealth and <LABEL_PREFIX>dcgm.level.1-4, the
# annotations <OWN_PREFIX>health, last-run, nvml-released, clearing, run, run-id, clear, peers
# (the controller's ping peers), and the GPUUnhealthy condition. Other owners' keys are not touched.
# While healthd still runs, its agents and controller write their keys back:
# uninstall first. Before removing autopilot.ibm.com/gpuhealth,
# make sure nothing still needs it (AppWrapper keeps pods off EVICT/TESTING nodes by it).
set -euo pipefail
LABEL_PREFIX=${LABEL_PREFIX:-autopilot.ibm.com/}
OWN_PREFIX=${OWN_PREFIX:-healthd.io/}
KUBECTL=${KUBECTL:-kubectl}

labels=("${LABEL_PREFIX}gpuhealth-")
for level in 1 2 3 4; do labels+=("${LABEL_PREFIX}dcgm.level.${level}-"); done
annotations=()
for key in health last-run nvml-released clearing run run-id clear peers; do annotations+=("${OWN_PREFIX}${key}-"); done

# One patch per node for the labels, one for the annotations (a missing key is no error).
"$KUBECTL" label nodes --all "${labels[@]}" >/dev/null
"$KUBECTL" annotate nodes --all "${annotations[@]}" >/dev/null

# The condition, where a node has one: a JSON patch removes it by index, guarded by a
# `test` of its type so a condition list that moved meanwhile is refused, not damaged.
"$KUBECTL" get nodes -o \
  jsonpath='{range .items[*]}{.metadata.name}{" "}{range .status.conditions[*]}{.type}{","}{end}{"\n"}{end}' |
while read -r node types; do
  index=0
  IFS=, read -ra kinds <<< "$types"
  for kind in "${kinds[@]}"; do
    if [ "$kind" = GPUUnhealthy ]; then
      "$KUBECTL" patch node "$node" --subresource=status --type=json -p \
        "[{\"op\":\"test\",\"path\":\"/status/conditions/$index/type\",\"value\":\"GPUUnhealthy\"},{\"op\":\"remove\",\"path\":\"/status/conditions/$index\"}]" >/dev/null
      break
    fi
    index=$((index + 1))
  done
done
echo "healthd's labels, annotations and condition removed from every node"
