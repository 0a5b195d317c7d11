#!/usr/bin/env bash
# Slurm HealthCheckProgram (also run by the prolog and epilog): one bounded `denpex agent
# --once --json` pass; a critical finding goes to `denpex node-check`, the remediation engine
# (policy tier, guards, hash-chained audit), which cordons the node when the policy says so.
# Finishes within DENPEX_HEALTHCHECK_TIMEOUT (default 20 s, well inside Slurm's 60 s limit).
# Usage: denpex-healthcheck.sh [--dry-run] [--input FILE] [--timeout S] [--help]
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: denpex-healthcheck.sh [--dry-run] [--input FILE] [--timeout S]

Runs `denpex agent --once --json` under a hard timeout; when it reports evidence of severity
critical (e.g. a GPU fallen off the bus) it hands the report to `denpex node-check`: the
remediation policy decides (Observe, the default, only records; AutoSafe and above drain the
node with a "denpex:" reason), the guards (blast radius, unhealthy share, rate limit) apply,
and the decision is appended to the local audit. It acts only when Slurm ran it
(SLURMD_NODENAME is set) and scontrol exists; otherwise, or with --dry-run, it prints what
the policy would do.
Exit status: 0 healthy or drained; 1 critical finding (the prolog fails so Slurm requeues the
job); a check that times out or fails is reported, never fatal (exit 0).

  --dry-run    never run scontrol; print what would be run
  --input F    read the agent's JSON from F instead of running denpex (tests)
  --timeout S  hard limit for the denpex pass (default 20; Slurm kills the check at 60)
Environment: DENPEX (the binary, default @PREFIX@/bin/denpex), DENPEX_AGENT_CONFIG
(default @PREFIX@/etc/agent.yaml when it exists), DENPEX_REMEDIATION_POLICY (default
@PREFIX@/etc/remediation.yaml when it exists), DENPEX_NODE_AUDIT (default
@PREFIX@/var/node-audit.jsonl), DENPEX_HEALTHCHECK_TIMEOUT.
USAGE
}

DENPEX=${DENPEX:-@PREFIX@/bin/denpex}
CONFIG=${DENPEX_AGENT_CONFIG:-@PREFIX@/etc/agent.yaml}
POLICY=${DENPEX_REMEDIATION_POLICY:-@PREFIX@/etc/remediation.yaml}
AUDIT=${DENPEX_NODE_AUDIT:-@PREFIX@/var/node-audit.jsonl}
TIMEOUT=${DENPEX_HEALTHCHECK_TIMEOUT:-20}
DRY_RUN=0
INPUT=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) DRY_RUN=1; shift ;;
        --input) INPUT=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "denpex-healthcheck: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ "$TIMEOUT" =~ ^[0-9]+$ && "$TIMEOUT" -ge 1 && "$TIMEOUT" -le 50 ]] || {
    echo "denpex-healthcheck: --timeout must be 1..50 s (Slurm kills the check at 60 s)" >&2
    exit 2
}
log() { echo "denpex-healthcheck: $*" >&2; }

out=$(mktemp "${TMPDIR:-/tmp}/denpex-hc.XXXXXX")
trap 'rm -f "$out"' EXIT
if [[ -n "$INPUT" ]]; then
    cp "$INPUT" "$out"
else
    args=(agent --once --json)
    [[ -f "$CONFIG" ]] && args+=(--config "$CONFIG")
    rc=0
    timeout -k 3 "$TIMEOUT" "$DENPEX" "${args[@]}" >"$out" 2>/dev/null || rc=$?
    if [[ $rc -ne 0 ]]; then
        # a check that cannot run is not evidence against the node: report, do not drain
        log "denpex agent --once failed or timed out (status $rc after at most ${TIMEOUT}s); node left as is"
        exit 0
    fi
fi

# evidence objects are pretty-printed with "category" before "severity": a quick look for a
# critical one, so a healthy node never starts the engine
category=$(awk '
    /"category": "/ { c = $0; sub(/.*"category": "/, "", c); sub(/".*/, "", c) }
    /"severity": "critical"/ { print c; exit }
' "$out")
if [[ -z "$category" ]]; then
    exit 0
fi

node=${SLURMD_NODENAME:-$(hostname -s)}
args=(node-check --input "$out" --node "$node" --audit "$AUDIT")
[[ -f "$POLICY" ]] && args+=(--policy "$POLICY")
if [[ $DRY_RUN -eq 1 || -z "${SLURMD_NODENAME:-}" ]] || ! command -v scontrol >/dev/null; then
    args+=(--dry-run)
fi
log "critical finding ($category) on $node; the remediation engine decides"
rc=0
timeout -k 3 15 "$DENPEX" "${args[@]}" || rc=$?
if [[ $rc -ne 0 && $rc -ne 1 ]]; then
    log "denpex node-check failed (status $rc); node left as is"
fi
exit 1
