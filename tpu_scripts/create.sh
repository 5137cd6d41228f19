#!/usr/bin/env bash
# Creates a Cloud TPU VM, or with --queued a queued resource whose node has the same name.
set -euo pipefail
USAGE="Create a Cloud TPU VM (one host or a multi-host slice).

  tpu_scripts/create.sh [--queued] [--spot] [settings]

  TPU_NAME=my-tpu ZONE=us-central2-b ACCELERATOR_TYPE=v4-8 tpu_scripts/create.sh
  tpu_scripts/create.sh --tpu-name my-tpu --zone us-west4-a --accelerator-type v5litepod-8 --queued --spot

With --queued the request waits in Cloud TPU's queue until capacity is free; watch it with
gcloud compute tpus queued-resources describe NAME --zone ZONE."
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_common_args "$@"
((${#ARGS[@]} == 0)) || die "unexpected argument: ${ARGS[0]} (see --help)"
require TPU_NAME ZONE ACCELERATOR_TYPE
version="$(runtime_version)"

spot=()
is_true "${SPOT}" && spot=(--spot)

if is_true "${QUEUED}"; then
  gcloud_run compute tpus queued-resources create "${TPU_NAME}" "--node-id=${TPU_NAME}" \
    "--zone=${ZONE}" "--accelerator-type=${ACCELERATOR_TYPE}" "--runtime-version=${version}" \
    "${spot[@]}"
else
  gcloud_run compute tpus tpu-vm create "${TPU_NAME}" "--zone=${ZONE}" \
    "--accelerator-type=${ACCELERATOR_TYPE}" "--version=${version}" "${spot[@]}"
fi
