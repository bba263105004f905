#!/usr/bin/env bash
# Everything the whole suite needs, built side by side (with the compatibility job's venvs, as .ci/run builds them:
# 244 s against 327 s one after another on a 2-vCPU VM, docs/benchmarks.md). Idempotent: what is already in place is
# checked and left alone.
#   .venv               msbridge with its test extra, on .ci/pins/default.txt
#   .venv-mindinsight   MindInsight 2.3.1, the reader of the MindInsight sink's tests (.ci/mindinsight_venv.sh)
#   .venv-mlflow2, .venv-mlflow-next   the MLflows that make the store tests' stores (.ci/mlflow_venvs.sh)
#   PostgreSQL          for the team-server tests (.ci/postgres.sh; needs root or sudo)
# Each part's output goes to a log that is printed when the part fails. An editable install of msbridge holds a lock
# on the repository's folder (flock), as .ci/compat.sh's do: setuptools writes msbridge.egg-info there.
#
#   bash .ci/setup.sh && .venv/bin/python -m pytest -n 3 --dist loadfile
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PIP_DISABLE_PIP_VERSION_CHECK=1
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

declare -A parts=(
    [msbridge]='{ [ -x .venv/bin/python ] || python3.11 -m venv .venv; } && flock . .venv/bin/pip install -q -e ".[test]" -c .ci/pins/default.txt'
    [mindinsight]='bash .ci/mindinsight_venv.sh'
    [mlflow]='bash .ci/mlflow_venvs.sh'
    [postgres]='bash .ci/postgres.sh'
)
run_part() {  # run_part NAME: its command, its output in its log, its seconds beside it
    local start=$SECONDS rc=0
    bash -c "${parts[$1]}" >"$logs/$1" 2>&1 || rc=$?
    echo "$((SECONDS - start))" >"$logs/$1.seconds"
    return "$rc"
}

declare -A pids
start=$SECONDS
for name in "${!parts[@]}"; do
    run_part "$name" &
    pids[$name]=$!
done
failed=0
for name in "${!parts[@]}"; do
    if wait "${pids[$name]}"; then
        echo "[setup] $name: ready in $(cat "$logs/$name.seconds") s"
    else
        echo "[setup] $name failed:" >&2
        cat "$logs/$name" >&2
        failed=1
    fi
done
echo "[setup] all parts in $((SECONDS - start)) s"
exit "$failed"
