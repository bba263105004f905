#!/usr/bin/env bash
# Installs PostgreSQL from Debian's package when it is missing. Nothing is started here: the tests
# and `msbridge bench` start throwaway clusters of their own on 127.0.0.1 (msbridge/bench/servers.py).
# Idempotent: an installed PostgreSQL (initdb and pg_ctl on PATH or in /usr/lib/postgresql/N/bin)
# is left alone. Needs root (or sudo) to install.
#
#   bash .ci/postgres.sh
set -euo pipefail

installed() {
    { command -v initdb && command -v pg_ctl; } >/dev/null 2>&1 ||
        compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
}

if installed; then
    echo "postgres: already installed ($(compgen -G '/usr/lib/postgresql/*/bin' | tr '\n' ' ')$(command -v pg_ctl || true))"
    exit 0
fi
command -v apt-get >/dev/null || { echo "postgres: not installed and no apt-get here; install PostgreSQL >= 13" >&2; exit 1; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq postgresql >/dev/null
installed || { echo "postgres: apt-get install postgresql did not install initdb/pg_ctl" >&2; exit 1; }
echo "postgres: installed $(compgen -G '/usr/lib/postgresql/*/bin' | tr '\n' ' ')"
