#!/usr/bin/env bash
# The upgrade canary (docs/ray-versions.md), in two steps around the venv builds; make canary
# RAY=<version> [SUITES=...] [ARGS=...] [FRESH=1] runs them:
#   scripts/canary.sh check VERSION
#       refuse a Ray outside the supported range (chaos.ray_support's message), or the default
#       Ray itself, before anything is built
#   scripts/canary.sh run VERSION SUITE... [-- PYTEST_ARGS...]
#       after make setup and .venv-canary/VERSION: the suites with -m chaos once on the default
#       Ray (.venv) and once on VERSION, each session into reports/canary/<its Ray>/summary.json,
#       then the behaviour-difference table (python -m chaos.canary compare) to stdout and
#       reports/canary/VERSION-vs-<default>.md.  Exit status: the table's (0: no behaviour
#       differs, 1: some does), or 1 when a session ran no tests or recorded none.
#
# The default's session is reused when reports/canary/<default>/summary.json was written by
# an earlier canary for the same selection (suites and pytest arguments), the same default Ray
# and the same harness (a hash of chaos/, suites/ and the project files), so checking several
# candidate releases runs the default once; FRESH=1 runs it again.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "canary: $1" >&2; exit "${2:-1}"; }

# The default Ray as constraints.txt pins it (run checks what .venv actually has).
pinned_default() { sed -n 's/^ray==\([^ ;#]*\).*/\1/p' constraints.txt | head -n1; }

check() {
    local version=$1 py=.venv/bin/python
    [ "$version" != "$(pinned_default)" ] || die "refused: Ray $version is the default (constraints.txt): \
nothing to compare it with; name another supported release" 2
    [ -x "$py" ] || py=${PYTHON:-python3}
    "$py" - "$version" <<'EOF' || exit $?
import sys
version = sys.argv[1]
try:
    from chaos.ray_support import SUPPORTED, unsupported_reason
except ImportError as e:
    sys.exit(f"canary: cannot check Ray {version} against the supported range ({e}); run make setup first")
reason = unsupported_reason(version)
if reason:
    print(f"canary: refused: {reason}", file=sys.stderr)
    sys.exit(2)
print(f"canary: Ray {version} is inside the supported range {SUPPORTED}")
EOF
}

installed_ray() { "$1" -c 'from chaos.ray_support import installed_ray_version as v; print(v())'; }

# What decides whether a default session can be reused: the selection, the Ray, the harness.
session_key() {
    local ray=$1; shift
    printf 'ray=%s\nselection=%s\nharness=%s\n' "$ray" "$*" "$(
        find chaos suites conftest.py pyproject.toml constraints.txt -type f \
            \( -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.toml' -o -name '*.txt' \) \
            -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)"
}

# session PYTHON DIR PYTEST_ARGS...: one pytest session into DIR/summary.json (stale results removed first).
session() {
    local py=$1 dir=$2 rc=0; shift 2
    rm -rf "$dir/summary.d" "$dir/summary.json" "$dir/canary-session.txt"
    mkdir -p "$dir"
    echo "canary: $py -m pytest -m chaos $* --chaos-reports $dir"
    "$py" -m pytest -m chaos "$@" --chaos-reports "$dir" -p no:cacheprovider -rA --durations=0 || rc=$?
    # 0: all passed, 1: some failed -- both are results to compare; anything else ran no tests.
    [ "$rc" -le 1 ] || die "the session in $dir ended with pytest exit status $rc (no results to compare)"
    [ -f "$dir/summary.json" ] || die "the session in $dir wrote no summary.json: no test got as far as its run \
(the pytest output above says why)"
}

run() {
    local version=$1; shift
    local selection=() args=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do selection+=("$1"); shift; done
    [ $# -eq 0 ] || { shift; args=("$@"); }
    [ ${#selection[@]} -gt 0 ] || die "no suites selected (SUITES=...)" 2
    local canary_py=.venv-canary/$version/bin/python default default_dir canary_dir key
    [ -x "$canary_py" ] || die "$canary_py missing: make canary builds it (make .venv-canary/$version/.installed)"
    [ "$(installed_ray "$canary_py")" = "$version" ] || die "$canary_py runs Ray $(installed_ray "$canary_py"), not $version"
    default=$(installed_ray .venv/bin/python)
    [ "$default" != "$version" ] || die "Ray $version is what .venv runs: nothing to compare" 2
    default_dir=reports/canary/$default canary_dir=reports/canary/$version

    key=$(session_key "$default" "${selection[@]}" -- "${args[@]}")
    if [ -z "${FRESH:-}" ] && [ -f "$default_dir/summary.json" ] && [ -f "$default_dir/canary-session.txt" ] \
            && [ "$(cat "$default_dir/canary-session.txt")" = "$key" ]; then
        echo "canary: reusing the default Ray $default's session in $default_dir (same suites, Ray and harness; FRESH=1 reruns it)"
    else
        echo "canary: default Ray $default (.venv)"
        session .venv/bin/python "$default_dir" "${selection[@]}" "${args[@]}"
        echo "$key" > "$default_dir/canary-session.txt"
    fi
    echo "canary: candidate Ray $version ($canary_py)"
    session "$canary_py" "$canary_dir" "${selection[@]}" "${args[@]}"
    session_key "$version" "${selection[@]}" -- "${args[@]}" > "$canary_dir/canary-session.txt"

    local out=reports/canary/$version-vs-$default.md rc=0
    .venv/bin/python -m chaos.canary compare "$default_dir/summary.json" "$canary_dir/summary.json" \
        --labels "$default" "$version" --out "$out" || rc=$?
    echo "canary: table written to $out"
    [ "$rc" -ne 1 ] || echo "canary: Ray $version behaves differently from $default (marked ≠ above)" >&2
    exit "$rc"
}

case "${1:-}" in
    check) [ $# -eq 2 ] || die "usage: $0 check VERSION" 2; check "$2" ;;
    run) [ $# -ge 2 ] || die "usage: $0 run VERSION SUITE... [-- PYTEST_ARGS...]" 2; shift; run "$@" ;;
    *) die "usage: $0 check VERSION | run VERSION SUITE... [-- PYTEST_ARGS...]" 2 ;;
esac
