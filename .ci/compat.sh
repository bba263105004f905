#!/usr/bin/env bash
# The compatibility job: the tests marked `compat` (callback, TrainStep/ring, every sink's contract,
# MindInsight read back through its REST API, the mindformers config and training tests) against
# the ends of pyproject's ranges, each in its own venv at the repo root:
#
#   .venv-compat-oldest  mindspore 2.7.0 + mindformers 1.6.0 (.ci/pins/oldest.txt)
#   .venv-compat-2.10    mindspore 2.10.0, no mindformers: 2.0 needs hyper-parallel, not on PyPI
#
# Each venv gets its pinned MindSpore first and then `pip install -e .` without constraints, as a
# team whose MindSpore matches its CANN driver would install msbridge; the job fails if that
# install replaced the pinned versions. Needs .venv-mindinsight (bash .ci/mindinsight_venv.sh).
#
#   bash .ci/compat.sh            # both
#   bash .ci/compat.sh 2.10       # one
#   bash .ci/compat.sh --venvs    # only build the venvs (.ci/run builds them beside .ci/setup.sh's parts)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export GLOG_v=3 PIP_DISABLE_PIP_VERSION_CHECK=1
python="${COMPAT_PYTHON:-python3.11}"

# name | pins file | msbridge extras | must mindformers import (its tests run) ?
ENVS=(
    "oldest|.ci/pins/oldest.txt|test|yes"
    "2.10|.ci/pins/mindspore-2.10.txt|mlflow,tensorboard,plot|no"
)

venvs_only=no
if [ "${1:-}" = --venvs ]; then
    venvs_only=yes
    shift
fi

make_venv() {
    local name="$1" pins="$2" extras="$3" mindformers="$4" venv="$root/.venv-compat-$1" start=$SECONDS
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/pip" install -q -r "$pins"
    # one editable install at a time (.ci/setup.sh's too): setuptools writes msbridge.egg-info in the repository
    flock "$root" "$venv/bin/pip" install -q -e ".[$extras]" pytest pytest-xdist hypothesis
    # Every pin still in place after msbridge's own install: its ranges did not replace them.
    local versions
    versions="$("$venv/bin/python" - "$pins" <<'PY'
import sys
from importlib.metadata import version

pins = [line.split("#")[0].strip().split("==") for line in open(sys.argv[1])]
pins = [pin for pin in pins if pin != [""]]
for name, want in pins:
    if version(name) != want:
        sys.exit(f"pip install -e . replaced {name} {want} with {version(name)}")
print(", ".join(f"{name} {want}" for name, want in pins))
PY
)"
    if [ "$mindformers" = yes ]; then
        # else its tests would skip, not fail; from a scratch dir: importing it writes ./output/log
        local scratch
        scratch="$(mktemp -d)"
        (cd "$scratch" && "$venv/bin/python" -c "import mindformers" >/dev/null)
        rm -rf "$scratch"
    fi
    echo "[compat] $name ($versions): venv ready in $((SECONDS - start)) s"
}

run_tests() {
    local name="$1" start=$SECONDS
    "$root/.venv-compat-$name/bin/python" -m pytest -n 3 --dist loadfile -m compat -p no:cacheprovider -q
    echo "[compat] $name: tests took $((SECONDS - start)) s"
}

for spec in "${ENVS[@]}"; do
    IFS='|' read -r name pins extras mindformers <<<"$spec"
    if [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]; then
        make_venv "$name" "$pins" "$extras" "$mindformers"
        [ "$venvs_only" = yes ] || run_tests "$name"
    fi
done
