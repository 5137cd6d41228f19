#!/usr/bin/env bash
# Puts the project on every worker (git clone, or a copy of this checkout) and installs it.
set -euo pipefail
USAGE="Install the project on every worker of a TPU VM: Python 3.11, \`make install\`
(torch as the CPU build), then jax[tpu] at the version setup.cfg pins; ends by printing
jax.device_count() on each worker.

  tpu_scripts/setup.sh [settings]

  REPO_URL=https://github.com/ORG/jaxrl-agents.git tpu_scripts/setup.sh   # clone (or pull)
  tpu_scripts/setup.sh                     # copy this checkout (git-tracked and untracked,
                                           # not ignored files) to every worker

Run it again after changing the code: it pulls or re-copies, and installs what changed."
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_common_args "$@"
((${#ARGS[@]} == 0)) || die "unexpected argument: ${ARGS[0]} (see --help)"
require TPU_NAME ZONE

dir="$(quote "${REMOTE_DIR}")"
tarball_name="${REMOTE_DIR##*/}-src.tar.gz"

if [[ -n "${REPO_URL}" ]]; then
  branch=()
  [[ -n "${REPO_BRANCH}" ]] && branch=(--branch "${REPO_BRANCH}")
  fetch="if [ -d ${dir}/.git ]; then git -C ${dir} pull --ff-only;"
  fetch+=" else git clone $(quote_all "${branch[@]}" "${REPO_URL}") ${dir}; fi"
else
  tarball="${TMPDIR:-/tmp}/${TPU_NAME}-${tarball_name}"
  run_shell "git -C $(quote "${REPO_ROOT}") ls-files -z -co --exclude-standard | tar -czf $(quote "${tarball}") --ignore-failed-read -C $(quote "${REPO_ROOT}") --null -T -"
  gcloud_run compute tpus tpu-vm scp "${tarball}" "${TPU_NAME}:${tarball_name}" "--zone=${ZONE}" \
    "--worker=${WORKER}"
  run rm -f "${tarball}"
  fetch="mkdir -p ${dir}; tar -xzf $(quote "${tarball_name}") -C ${dir}; rm -f $(quote "${tarball_name}")"
fi

# apt waits for the lock that unattended upgrades hold on a fresh VM; torch comes from
# the CPU index first so that `make install` does not pull a CUDA build.
steps=(
  "set -e"
  "${fetch}"
  "sudo apt-get -o DPkg::Lock::Timeout=600 update -q"
  "sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q python3.11 python3.11-venv make git"
  "cd ${dir}"
  "test -x .venv/bin/python || python3.11 -m venv .venv"
  ".venv/bin/pip install -q \"\$(grep -m1 -o 'torch==[0-9.]*' setup.cfg)\" --index-url https://download.pytorch.org/whl/cpu"
  "make install PYTHON=python3.11"
  ".venv/bin/pip install -q \"jax[tpu]==\$(.venv/bin/python -c 'import jax; print(jax.__version__)')\""
  ".venv/bin/python -c 'import jax; print(\"worker\", jax.process_index(), \"devices\", jax.device_count())'"
)
tpu_ssh "$(join_by '; ' "${steps[@]}")"
