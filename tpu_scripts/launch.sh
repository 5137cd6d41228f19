#!/usr/bin/env bash
# Starts jaxrl-train on every worker, detached (nohup), its output in logs/<name>.log.
set -euo pipefail
USAGE="Start a training run on the TPU VM: the same jaxrl-train command on every worker
(on a multi-host slice JAX finds its peers from the TPU metadata). It runs under nohup,
so it survives the ssh session; its output goes to <remote-dir>/logs/<log>.log on each
worker (appended). Follow it with tpu_scripts/logs.sh.

  tpu_scripts/launch.sh --config configs/X.py [--log NAME] [jaxrl-train arguments...]

  tpu_scripts/launch.sh --config configs/textworld_tiny.py --config.rl.learning_rate=3e-4
  tpu_scripts/launch.sh --config configs/textworld_tiny.py --resume

  --config PATH   experiment config, relative to the checkout (required)
  --log NAME      log file name without .log (default: the config's file name)
Every other argument (--config.a.b=value overrides, --resume) goes to jaxrl-train as is."
WORKER_DEFAULT=all
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_common_args "$@"

config=""
log_name=""
train_args=()
set -- "${ARGS[@]}"
while (($#)); do
  case "$1" in
    --config=*) config="${1#*=}"; shift ;;
    --log=*) log_name="${1#*=}"; shift ;;
    --config | --log)
      (($# >= 2)) || die "$1 needs a value"
      if [[ "$1" == --config ]]; then config="$2"; else log_name="$2"; fi
      shift 2 ;;
    *) train_args+=("$1"); shift ;;
  esac
done
[[ -n "${config}" ]] || die "--config PATH is required (e.g. --config configs/textworld_tiny.py)"
require TPU_NAME ZONE
[[ -n "${log_name}" ]] || log_name="$(basename "${config}" .py)"

tpu_launch "${log_name}" jaxrl-train --config "${config}" "${train_args[@]}"
