#!/usr/bin/env bash
# Starts jaxrl-sweep on every worker, detached (nohup), its output in logs/<name>.log.
set -euo pipefail
USAGE="Start a sweep on the TPU VM: the same jaxrl-sweep command on every worker, under
nohup; its output goes to <remote-dir>/logs/<log>.log on each worker (appended).

  tpu_scripts/sweep.sh --sweep configs/sweeps/X.py [--log NAME] [jaxrl-sweep arguments...]

  --sweep PATH    sweep file, relative to the checkout (required)
  --log NAME      log file name without .log (default: sweep-<the sweep's file name>)
Every other argument goes to jaxrl-sweep as is."
WORKER_DEFAULT=all
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_common_args "$@"

sweep=""
log_name=""
sweep_args=()
set -- "${ARGS[@]}"
while (($#)); do
  case "$1" in
    --sweep=*) sweep="${1#*=}"; shift ;;
    --log=*) log_name="${1#*=}"; shift ;;
    --sweep | --log)
      (($# >= 2)) || die "$1 needs a value"
      if [[ "$1" == --sweep ]]; then sweep="$2"; else log_name="$2"; fi
      shift 2 ;;
    *) sweep_args+=("$1"); shift ;;
  esac
done
[[ -n "${sweep}" ]] || die "--sweep PATH is required (e.g. --sweep configs/sweeps/X.py)"
require TPU_NAME ZONE
[[ -n "${log_name}" ]] || log_name="sweep-$(basename "${sweep}" .py)"

tpu_launch "${log_name}" jaxrl-sweep --sweep "${sweep}" "${sweep_args[@]}"
