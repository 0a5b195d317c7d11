#!/usr/bin/env bash
# Slurm Epilog: after a job ends on this node, a denpex health check so the next job does not
# land on a node the last one broke. A critical finding drains the node; the epilog itself
# always succeeds (a failing epilog would drain with a less useful reason).
# Usage (slurm.conf): Epilog=/etc/slurm/denpex-epilog.sh   (--dry-run for a manual try)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DENPEX_HEALTHCHECK_TIMEOUT=${DENPEX_EPILOG_TIMEOUT:-15}
"$here/denpex-healthcheck.sh" "$@" || true
