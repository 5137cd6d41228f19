#!/usr/bin/env bash
# Copies runs (configs, metrics, checkpoints) between the TPU VM and a GCS bucket.
set -euo pipefail
USAGE="Copy run directories between the TPU VM and a Cloud Storage bucket
(gcloud storage cp -r, run on the workers, which have gcloud and bucket access).

  tpu_scripts/sync.sh push [RUN]   runs/RUN on worker 0 -> BUCKET/runs/RUN (all runs without RUN)
  tpu_scripts/sync.sh pull [RUN]   BUCKET/runs/RUN -> runs/RUN on every worker (e.g. to
                                   --resume on a new VM)
  --local                          copy from or to runs/ of this checkout instead (e.g. to
                                   look at results here); needs no TPU_NAME or ZONE

  BUCKET=gs://my-bucket/jaxrl tpu_scripts/sync.sh push textworld_tiny"
WORKER_DEFAULT=""
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_common_args "$@"

local_copy=0
positional=()
for arg in "${ARGS[@]}"; do
  case "${arg}" in
    --local) local_copy=1 ;;
    -*) die "unexpected argument: ${arg} (see --help)" ;;
    *) positional+=("${arg}") ;;
  esac
done
((${#positional[@]} >= 1 && ${#positional[@]} <= 2)) || die "say push or pull, then optionally a run name (see --help)"
direction="${positional[0]}"
run_name="${positional[1]:-}"
[[ "${direction}" == push || "${direction}" == pull ]] || die "the first argument is push or pull, not '${direction}'"
if ((local_copy)); then require BUCKET; else require TPU_NAME ZONE BUCKET; fi

bucket="${BUCKET%/}"
[[ "${bucket}" == gs://* ]] || bucket="gs://${bucket}"
runs_dir="runs"
((local_copy)) && runs_dir="${REPO_ROOT}/runs"

# `cp -r SRC DIR/` puts SRC's last path component under DIR, so both directions copy
# runs/NAME to .../runs/NAME (or the whole runs/ folder when no run is named).
if [[ "${direction}" == push ]]; then
  [[ -n "${WORKER}" ]] || WORKER=0
  copy=(cp -r "${runs_dir}${run_name:+/${run_name}}")
  if [[ -n "${run_name}" ]]; then copy+=("${bucket}/runs/"); else copy+=("${bucket}/"); fi
  prepare=()
else
  [[ -n "${WORKER}" ]] || WORKER=all
  copy=(cp -r "${bucket}/runs${run_name:+/${run_name}}")
  if [[ -n "${run_name}" ]]; then copy+=("${runs_dir}/"); else copy+=("$(dirname "${runs_dir}")/"); fi
  prepare=(mkdir -p "${runs_dir}")
fi

if ((local_copy)); then
  ((${#prepare[@]} == 0)) || run "${prepare[@]}"
  gcloud_run storage "${copy[@]}"
else
  remote="cd $(quote "${REMOTE_DIR}")"
  ((${#prepare[@]} == 0)) || remote+=" && $(quote_all "${prepare[@]}")"
  tpu_ssh "${remote} && gcloud storage $(quote_all "${copy[@]}")"
fi
