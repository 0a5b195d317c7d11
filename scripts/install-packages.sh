#!/usr/bin/env bash
# Installs the Debian packages named in the given list files (one per line, '#' comments)
# that are not installed yet, with apt-get (through sudo when not root). Without dpkg it does
# nothing; with packages missing and no apt-get it says which and fails.
# Usage: bash scripts/install-packages.sh LIST...
set -euo pipefail

command -v dpkg >/dev/null || exit 0
wanted=()
for list in "$@"; do
    while read -r pkg; do
        [[ -z "$pkg" || "$pkg" == \#* ]] && continue
        dpkg -s "$pkg" >/dev/null 2>&1 || wanted+=("$pkg")
    done < "$list"
done
[[ ${#wanted[@]} -eq 0 ]] && exit 0
if ! command -v apt-get >/dev/null; then
    echo "install-packages: missing Debian packages (${wanted[*]}) and no apt-get; install them by hand" >&2
    exit 1
fi
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
echo "install-packages: installing ${wanted[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${wanted[@]}"
