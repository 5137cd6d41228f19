#!/usr/bin/env bash
# Deletes the TPU VM, or with --queued its queued resource and the node in it.
set -euo pipefail
USAGE="Delete a Cloud TPU VM (gcloud asks to confirm unless --yes). Pass --queued (or
QUEUED=1) when it was created with --queued: that deletes the queued resource and its node.

  tpu_scripts/delete.sh [--queued] [--yes] [settings]

Copy what you want to keep to a bucket first: tpu_scripts/sync.sh push."
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_common_args "$@"
quiet=()
for arg in "${ARGS[@]}"; do
  case "${arg}" in
    -y | --yes) quiet=(--quiet) ;;
    *) die "unexpected argument: ${arg} (see --help)" ;;
  esac
done
require TPU_NAME ZONE

if is_true "${QUEUED}"; then
  gcloud_run compute tpus queued-resources delete "${TPU_NAME}" "--zone=${ZONE}" --force \
    "${quiet[@]}"
else
  gcloud_run compute tpus tpu-vm delete "${TPU_NAME}" "--zone=${ZONE}" "${quiet[@]}"
fi
