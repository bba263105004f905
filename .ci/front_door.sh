#!/usr/bin/env bash
# The README's front door as a new user meets it: a fresh clone of this checkout's HEAD, then the README's first
# command (install and `msbridge demo`) and its fast-tier command, each read from the README and run exactly as
# printed, in that order. Outside CI (CI unset), as a user's shell has it: MindInsight's tests skip there.
#
#   bash .ci/front_door.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The one-line command of the README's ```bash block that holds $1.
readme_command() {
    python3 - "$root/README.md" "$1" <<'PY'
import re, sys
blocks = re.findall(r"```bash\n(.*?)```", open(sys.argv[1], encoding="utf-8").read(), re.S)
found = [b.strip() for b in blocks if sys.argv[2] in b]
if len(found) != 1 or "\n" in found[0]:
    sys.exit(f"README.md: {len(found)} one-line ```bash blocks hold {sys.argv[2]!r}, not 1")
print(found[0])
PY
}

demo="$(readme_command "msbridge demo")"
fast="$(readme_command '-m "not slow"')"
git clone -q "$root" "$work/msbridge"
cd "$work/msbridge"
for command in "$demo" "$fast"; do
    echo "[front door] $command"
    start=$SECONDS
    env -u CI bash -c "$command"
    echo "[front door] passed in $((SECONDS - start)) s"
done
