#!/usr/bin/env bash
# Slurm Prolog: before a job starts on this node, a quick denpex health check. A critical
# finding drains the node and fails the prolog, so Slurm requeues the job elsewhere.
# Usage (slurm.conf): Prolog=/etc/slurm/denpex-prolog.sh   (--dry-run for a manual try)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DENPEX_HEALTHCHECK_TIMEOUT=${DENPEX_PROLOG_TIMEOUT:-15}
exec "$here/denpex-healthcheck.sh" "$@"
