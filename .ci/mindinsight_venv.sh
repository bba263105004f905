#!/usr/bin/env bash
# Builds .venv-mindinsight at the repo root: MindInsight 2.3.1, the reader the
# MindInsight sink's tests start. It has its own venv because mindinsight 2.3.1
# pins protobuf<=3.20.1, older than what mindspore, mlflow and tensorboard need. Idempotent: a venv
# that already starts MindInsight 2.3.1 is left alone.
#
#   bash .ci/mindinsight_venv.sh          # then:
#   PATH="$PWD/.venv-mindinsight/bin:$PATH" mindinsight start --summary-base-dir DIR --port 8080
#
# MINDINSIGHT_PYTHON picks the interpreter (default python3.11; tested on 3.11.7).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-mindinsight"
python="${MINDINSIGHT_PYTHON:-python3.11}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

works() {
    # `mindinsight start` runs `gunicorn` from PATH and imports the Flask app there;
    # importing it writes logs into MINDINSIGHT_WORKSPACE, so point that at a temp dir.
    [ -x "$venv/bin/gunicorn" ] && [ -x "$venv/bin/mindinsight" ] &&
        MINDINSIGHT_WORKSPACE="$scratch" "$venv/bin/python" -c '
import sys, mindinsight, mindinsight.backend.application
sys.exit(mindinsight.__version__ != "2.3.1")' >/dev/null 2>&1
}

if works; then
    echo "mindinsight venv: $venv already works (mindinsight 2.3.1)"
    exit 0
fi

command -v "$python" >/dev/null || { echo "mindinsight venv: $python not found (set MINDINSIGHT_PYTHON)" >&2; exit 1; }
rm -rf "$venv"
"$python" -m venv "$venv"
# Versions this venv was tested with (MindInsight stopped releasing after 2.3,
# so newer web/numeric releases are not guaranteed to keep working with it).
"$venv/bin/pip" install --quiet --disable-pip-version-check -r /dev/stdin <<'PINS'
mindinsight==2.3.1
protobuf==3.20.1
Flask==3.1.3
flask-cors==6.0.5
Werkzeug==3.1.9
Jinja2==3.1.6
MarkupSafe==3.0.4
itsdangerous==2.2.0
blinker==1.9.0
click==8.5.1
gunicorn==27.0.1
grpcio==1.85.3
marshmallow==4.4.0
numpy==2.4.6
pandas==3.1.1
scipy==1.17.1
scikit-learn==1.9.1
pillow==13.0.0
psutil==7.2.2
PyYAML==6.0.4
treelib==1.8.0
PINS

works || { echo "mindinsight venv: built $venv but MindInsight does not import" >&2; exit 1; }
echo "mindinsight venv: ready at $venv"
