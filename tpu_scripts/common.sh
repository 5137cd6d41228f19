# Shared settings, argument parsing and command runner for the Cloud TPU VM scripts.
# Sourced by every script in tpu_scripts/; not meant to be run on its own.
#
# Each setting comes from a flag or, failing that, from the environment variable of the
# same meaning; the flag wins. `--dry-run` prints every command, one per line and
# shell-quoted, instead of running it, so it needs neither gcloud nor a cloud account.
# shellcheck shell=bash

TPU_NAME="${TPU_NAME:-}"
ZONE="${ZONE:-}"
PROJECT="${PROJECT:-}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-}"
RUNTIME_VERSION="${RUNTIME_VERSION:-}"
BUCKET="${BUCKET:-}"
REPO_URL="${REPO_URL:-}"
REPO_BRANCH="${REPO_BRANCH:-}"
REMOTE_DIR="${REMOTE_DIR:-jaxrl-agents}"
SPOT="${SPOT:-0}"
QUEUED="${QUEUED:-0}"
DRY_RUN="${DRY_RUN:-0}"
WORKER="${WORKER_DEFAULT-all}"
ARGS=()

# shellcheck disable=SC2034  # read by the scripts that source this file
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

COMMON_HELP="Settings (flag, else environment variable):
  --tpu-name NAME          TPU_NAME          TPU VM name (also the queued resource's name)
  --zone ZONE              ZONE              e.g. us-central2-b, us-west4-a
  --project ID             PROJECT           Google Cloud project (default: gcloud's own)
  --accelerator-type T     ACCELERATOR_TYPE  e.g. v4-8, v4-32, v5litepod-8, v5p-8, v6e-8
  --runtime-version V      RUNTIME_VERSION   TPU software version (default: from the type:
                                             v2-v4 tpu-ubuntu2204-base, v5litepod
                                             v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5,
                                             v6e v2-alpha-tpuv6e)
  --bucket gs://B[/DIR]    BUCKET            where sync.sh copies runs
  --repo-url URL           REPO_URL          git URL setup.sh clones (default: copy this checkout)
  --branch NAME            REPO_BRANCH       branch or tag to clone (default: the remote's HEAD)
  --remote-dir DIR         REMOTE_DIR        checkout on each worker, under \$HOME (jaxrl-agents)
  --spot                   SPOT=1            Spot capacity (create.sh)
  --queued                 QUEUED=1          use a queued resource (create.sh, delete.sh)
  --worker all|N                             which workers (default: ${WORKER:-0 to push, all to pull})
  --dry-run                DRY_RUN=1         print the commands, one per line, do not run them
  -h, --help                                 this help"

# Prints "$USAGE" (set by the calling script) and the shared settings.
usage() {
  printf '%s\n\n%s\n' "${USAGE}" "${COMMON_HELP}"
}

die() {
  printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2
  exit 2
}

# True for 1, true or yes (any case): how SPOT, QUEUED and DRY_RUN are read.
is_true() {
  [[ "${1,,}" =~ ^(1|true|yes)$ ]]
}

# Reads the shared flags; everything else is left, in order, in the ARGS array for the
# calling script. After `--` every argument goes to ARGS untouched.
parse_common_args() {
  local flag value
  while (($#)); do
    flag="$1"
    case "${flag}" in
      --) shift; ARGS+=("$@"); return 0 ;;
      -h | --help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1; shift; continue ;;
      --spot) SPOT=1; shift; continue ;;
      --queued) QUEUED=1; shift; continue ;;
      --tpu-name=* | --zone=* | --project=* | --accelerator-type=* | --runtime-version=* | \
        --bucket=* | --repo-url=* | --branch=* | --remote-dir=* | --worker=*)
        value="${flag#*=}"; flag="${flag%%=*}"; shift ;;
      --tpu-name | --zone | --project | --accelerator-type | --runtime-version | \
        --bucket | --repo-url | --branch | --remote-dir | --worker)
        (($# >= 2)) || die "${flag} needs a value"
        value="$2"; shift 2 ;;
      *) ARGS+=("${flag}"); shift; continue ;;
    esac
    case "${flag}" in
      --tpu-name) TPU_NAME="${value}" ;;
      --zone) ZONE="${value}" ;;
      --project) PROJECT="${value}" ;;
      --accelerator-type) ACCELERATOR_TYPE="${value}" ;;
      --runtime-version) RUNTIME_VERSION="${value}" ;;
      --bucket) BUCKET="${value}" ;;
      --repo-url) REPO_URL="${value}" ;;
      --branch) REPO_BRANCH="${value}" ;;
      --remote-dir) REMOTE_DIR="${value}" ;;
      --worker) WORKER="${value}" ;;
    esac
  done
}

# Stops, with one line for each listed setting that is empty, naming its flag and variable.
require() {
  local name missing=()
  for name in "$@"; do
    [[ -n "${!name}" ]] || missing+=("${name}")
  done
  ((${#missing[@]} == 0)) && return 0
  for name in "${missing[@]}"; do
    printf '%s: error: %s is not set: pass --%s or export %s\n' \
      "$(basename "$0")" "${name}" "$(flag_of "${name}")" "${name}" >&2
  done
  exit 2
}

flag_of() {
  case "$1" in
    REPO_BRANCH) echo "branch" ;;
    *) local lower="${1,,}"; echo "${lower//_/-}" ;;
  esac
}

# The TPU software version for an accelerator type, unless RUNTIME_VERSION is set.
runtime_version() {
  if [[ -n "${RUNTIME_VERSION}" ]]; then
    echo "${RUNTIME_VERSION}"
    return 0
  fi
  case "${ACCELERATOR_TYPE}" in
    v2-* | v3-* | v4-*) echo "tpu-ubuntu2204-base" ;;
    v5litepod-* | v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    *) die "no default runtime version for accelerator type '${ACCELERATOR_TYPE}':" \
      "pass --runtime-version or export RUNTIME_VERSION" ;;
  esac
}

# One word, quoted for a POSIX shell only when it needs it.
quote() {
  local word="$1" q="'"
  if [[ "${word}" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "${word}"
  else
    printf "'%s'" "${word//${q}/${q}\\${q}${q}}"
  fi
}

# All arguments quoted and joined by spaces: a command line a shell reads back as "$@".
quote_all() {
  local word sep=""
  for word in "$@"; do
    printf '%s' "${sep}"
    quote "${word}"
    sep=" "
  done
}

# The arguments joined by the separator $1: join_by '; ' a b -> "a; b".
join_by() {
  local sep="$1" out="$2" word
  shift 2
  for word in "$@"; do
    out+="${sep}${word}"
  done
  printf '%s' "${out}"
}

# Runs a command, or with --dry-run prints it (one line, shell-quoted) instead.
run() {
  if is_true "${DRY_RUN}"; then
    quote_all "$@"
    printf '\n'
    return 0
  fi
  command -v "$1" >/dev/null 2>&1 ||
    die "$1 not found: install the Google Cloud CLI (https://cloud.google.com/sdk) or use --dry-run"
  "$@"
}

# Runs a shell command line (a pipeline), or with --dry-run prints it as it is.
run_shell() {
  if is_true "${DRY_RUN}"; then
    printf '%s\n' "$1"
    return 0
  fi
  bash -c "set -euo pipefail; $1"
}

# `gcloud <args...>`, plus --project when PROJECT is set.
gcloud_run() {
  run gcloud "$@" ${PROJECT:+"--project=${PROJECT}"}
}

# Runs a shell command line on the workers named by WORKER, from each one's $HOME.
tpu_ssh() {
  gcloud_run compute tpus tpu-vm ssh "${TPU_NAME}" "--zone=${ZONE}" "--worker=${WORKER}" \
    "--command=$1"
}

# Starts `.venv/bin/<program> <args...>` in the checkout on the workers, detached from
# the ssh session (nohup), appending its output to logs/<log_name>.log there.
tpu_launch() {
  local log_name="$1"
  shift
  local dir log
  dir="$(quote "${REMOTE_DIR}")"
  log="$(quote "logs/${log_name}.log")"
  tpu_ssh "set -e; cd ${dir}; mkdir -p logs; nohup .venv/bin/$(quote_all "$@") >> ${log} 2>&1 < /dev/null & echo started on \"\$(hostname)\": ${dir}/${log}"
}
