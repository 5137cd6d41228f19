#!/usr/bin/env bash
# Streams a run's log from a worker (tail -F over ssh).
set -euo pipefail
USAGE="Stream the log of a run started by launch.sh or sweep.sh (Ctrl-C stops watching,
not the run).

  tpu_scripts/logs.sh [--log NAME] [--lines N] [--no-follow] [--worker N|all]

  --log NAME      logs/NAME.log (default: the newest log on the worker)
  --lines N       lines of history to print first (default 100)
  --no-follow     print them and stop
Worker 0 by default; --worker all interleaves every worker's lines."
WORKER_DEFAULT=0
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_common_args "$@"

log_name=""
lines=100
follow=(-F)
set -- "${ARGS[@]}"
while (($#)); do
  case "$1" in
    --log=*) log_name="${1#*=}"; shift ;;
    --lines=*) lines="${1#*=}"; shift ;;
    --log | --lines)
      (($# >= 2)) || die "$1 needs a value"
      if [[ "$1" == --log ]]; then log_name="$2"; else lines="$2"; fi
      shift 2 ;;
    --no-follow) follow=(); shift ;;
    *) die "unexpected argument: $1 (see --help)" ;;
  esac
done
[[ "${lines}" =~ ^[0-9]+$ ]] || die "--lines needs a number, got '${lines}'"
require TPU_NAME ZONE

tail_cmd="tail -n ${lines}${follow[*]:+ ${follow[*]}}"
if [[ -n "${log_name}" ]]; then
  tpu_ssh "cd $(quote "${REMOTE_DIR}") && ${tail_cmd} $(quote "logs/${log_name}.log")"
else
  tpu_ssh "cd $(quote "${REMOTE_DIR}") && log=\"\$(ls -t logs/*.log | head -n 1)\" && echo \"== \$log\" && ${tail_cmd} \"\$log\""
fi
