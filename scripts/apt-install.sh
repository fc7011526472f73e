#!/usr/bin/env bash
# Installs the Debian packages named after the first argument (the log prefix: provision, demo) that are not
# installed yet; scripts/provision.sh (the tests) and scripts/demo share it.
#
# Idempotent: installs only what is missing, runs `apt-get update` only when a package to install has no
# candidate (or once when an install fails on stale lists), and needs root only when something is missing.
set -euo pipefail
name=$1
shift
PACKAGES=("$@")

log() { printf '%s: %s\n' "$name" "$*"; }
die() { printf '%s: ERROR: %s\n' "$name" "$*" >&2; exit 1; }

is_installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}
has_candidate() {
    local candidate
    candidate=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2 }')
    [[ -n $candidate && $candidate != "(none)" ]]
}

command -v dpkg-query >/dev/null || die "dpkg-query not found: this needs Debian 12 or 13 (apt)"
missing=()
for pkg in "${PACKAGES[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
    log "Debian packages already installed: ${PACKAGES[*]}"
    exit 0
fi
log "missing Debian packages: ${missing[*]}"
[[ $(id -u) -eq 0 ]] || die "run as root to install them (apt-get install needs it), or install them first"
need_update=0
for pkg in "${missing[@]}"; do
    has_candidate "$pkg" || need_update=1
done
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg run instead of failing on its lock.
apt_opts=(-o DPkg::Lock::Timeout=900)
if ((need_update)); then
    log "package lists lack some of them: apt-get update"
    apt-get "${apt_opts[@]}" update
fi
# --no-install-recommends: docker-compose would otherwise pull in the docker.io engine.
log "apt-get install ${missing[*]}"
# A machine image's package lists can be older than its installed packages (seen: libcurl4 installed
# at a newer point release than the lists' libcurl4-openssl-dev depends on): refresh them and retry once.
if ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"; then
    ((need_update)) && die "apt-get install ${missing[*]} failed after apt-get update"
    log "apt-get install failed on these package lists: apt-get update, then once more"
    apt-get "${apt_opts[@]}" update
    apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"
fi
