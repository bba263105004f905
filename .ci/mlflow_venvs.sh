#!/usr/bin/env bash
# Builds the two MLflow venvs that the store tests (tests/faults/test_mlflow_stores.py) make real stores with, each
# with its own MLflow beside this project's (mlflow 3.17 in .venv):
#   .venv-mlflow2      mlflow-skinny 2.22.5: a team's store made by MLflow 2, with runs in it (an older schema)
#   .venv-mlflow-next  mlflow-skinny 3.18.0: a store a newer MLflow made (a schema this MLflow does not know;
#                      .ci/pins/default.txt keeps .venv's mlflow below it)
# mlflow-skinny is MLflow's client without its UI and ML libraries (~160 MB a venv); its sqlite store needs SQLAlchemy
# and alembic, and MLflow 2.22 imports a pool that SQLAlchemy 2.1 removed. Idempotent: a venv that already imports its
# MLflow is left alone. .ci/setup.sh builds them before the suite; the tests build them through this script when
# they are missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${MLFLOW_VENV_PYTHON:-python3.11}"

build() {  # build VENV VERSION PACKAGES...
    local venv="$root/$1" version="$2"
    shift 2
    if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -c 'import mlflow; print(mlflow.__version__)' 2>/dev/null)" = "$version" ]; then
        echo "mlflow venvs: $venv already has mlflow $version"
        return
    fi
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "mlflow-skinny==$version" "$@" 2>&1 | grep -v "^WARNING: Location" || true
    "$venv/bin/python" -c 'import mlflow.store.tracking.sqlalchemy_store' || { echo "mlflow venvs: $venv cannot open a sqlite store" >&2; exit 1; }
    echo "mlflow venvs: built $venv (mlflow $version)"
}

build .venv-mlflow2 2.22.5 "sqlalchemy>=1.4,<2.1" "alembic<2"
build .venv-mlflow-next 3.18.0 "sqlalchemy>=2,<3" "alembic<2"
