#!/usr/bin/env bash
# The appliance's local S3 endpoint: Debian's Ceph RGW on loopback over a one-OSD RADOS cluster
# kept in one folder (a monitor, a BlueStore OSD on a sparse file, radosgw). Ceph 16.2 has no
# dbstore backend, so RGW needs that small cluster under it. Never listens beyond 127.0.0.1.
# Usage: rgw-single-node.sh start DIR PORT   create the cluster in DIR on first use, start the
#                                           daemons that are not running, wait until RGW
#                                           answers; prints AWS_ACCESS_KEY_ID=… and
#                                           AWS_SECRET_ACCESS_KEY=… of its one user
#        rgw-single-node.sh stop DIR        stop the daemons (radosgw, the OSD, the monitor)
#        rgw-single-node.sh check           exit 0 when every Ceph binary it needs is here
set -euo pipefail

BINARIES=(ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph)

die() { echo "rgw-single-node: $*" >&2; exit 1; }

check() {
    local name missing=()
    for name in "${BINARIES[@]}"; do
        command -v "$name" >/dev/null 2>&1 || missing+=("$name")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "rgw-single-node: not installed: ${missing[*]}" >&2
        return 1
    fi
}

conf() {
    local dir=$1 port=$2 fsid=$3 mon_port=$4
    cat <<EOF
# written by rgw-single-node.sh: a one-node RADOS cluster for the appliance's RGW
[global]
fsid = $fsid
mon_host = 127.0.0.1:$mon_port
mon_initial_members = a
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
# msgr v1 on IPv4 loopback only: the v2 and IPv6 binds are what keep a single node from starting
ms_bind_msgr2 = false
ms_bind_ipv6 = false
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
# the OSD is placed in the CRUSH map once, at set-up: the update a restarted OSD sends on its
# own start is refused here ("wrong fsid") and stops it
osd_class_update_on_start = false
osd_crush_update_on_start = false
osd_memory_target = 1073741824
run_dir = $dir/run
log_file = $dir/log/\$name.log
admin_socket = $dir/run/\$name.asok
pid_file = $dir/run/\$name.pid
mon_data = $dir/mon
osd_data = $dir/osd
osd_objectstore = bluestore
bluestore_block_path = $dir/osd.block
bluestore_block_create = true
bluestore_block_size = 21474836480
osd_max_object_name_len = 256
osd_max_object_namespace_len = 64
[client.rgw.a]
rgw_frontends = beast endpoint=127.0.0.1:$port
rgw_data = $dir/rgw
EOF
}

running() {  # running DIR NAME: the daemon's pid file names a live process
    local pidfile="$1/run/$2.pid"
    [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

answers() {  # answers PORT: RGW answers an anonymous ListBuckets
    { exec 8<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
    printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&8
    local reply=""
    IFS= read -r -t 5 reply <&8 || true
    exec 8<&- 8>&-
    [[ "$reply" == "HTTP/1."?" 200"* ]]
}

start() {
    local dir=$1 port=$2
    check || exit 1
    mkdir -p "$dir"/{mon,osd,run,log,rgw}
    chmod 0700 "$dir"
    local c=(-c "$dir/ceph.conf")
    if [[ ! -f "$dir/ceph.conf" ]]; then
        local fsid mon_port osd_uuid
        fsid=$(cat /proc/sys/kernel/random/uuid)
        mon_port=$((port + 1))
        conf "$dir" "$port" "$fsid" "$mon_port" >"$dir/ceph.conf.new"
        mv "$dir/ceph.conf.new" "$dir/ceph.conf"
        monmaptool --create --fsid "$fsid" --addv a "v1:127.0.0.1:$mon_port" "$dir/monmap" >/dev/null
        ceph-mon "${c[@]}" --mkfs -i a --monmap "$dir/monmap" >>"$dir/log/setup.log" 2>&1
    fi
    running "$dir" mon.a || ceph-mon "${c[@]}" -i a >>"$dir/log/setup.log" 2>&1
    if [[ ! -f "$dir/osd/mkfs_done" ]]; then
        osd_uuid=$(cat /proc/sys/kernel/random/uuid)
        timeout 60 ceph "${c[@]}" osd new "$osd_uuid" >"$dir/osd-id" 2>>"$dir/log/setup.log" ||
            die "the monitor did not answer (see $dir/log)"
        ceph-osd "${c[@]}" -i "$(cat "$dir/osd-id")" --mkfs --osd-uuid "$osd_uuid" \
            >>"$dir/log/setup.log" 2>&1 || die "ceph-osd --mkfs failed (see $dir/log/setup.log)"
        {
            ceph "${c[@]}" osd crush add-bucket localhost host &&
                ceph "${c[@]}" osd crush move localhost root=default &&
                ceph "${c[@]}" osd crush add "osd.$(cat "$dir/osd-id")" 1.0 host=localhost
        } >>"$dir/log/setup.log" 2>&1 || die "placing the OSD in the CRUSH map failed"
    fi
    running "$dir" "osd.$(cat "$dir/osd-id")" ||
        setsid ceph-osd "${c[@]}" -i "$(cat "$dir/osd-id")" </dev/null >>"$dir/log/setup.log" 2>&1 &
    running "$dir" client.rgw.a ||
        setsid radosgw "${c[@]}" -n client.rgw.a </dev/null >>"$dir/log/setup.log" 2>&1 &
    local _
    for _ in $(seq 240); do
        answers "$port" && break
        sleep 0.5
    done
    answers "$port" || die "radosgw did not answer on 127.0.0.1:$port in 120 s (see $dir/log)"
    if [[ ! -f "$dir/user.env" ]]; then
        local key secret
        key=DENPEX$(od -An -tx1 -N7 /dev/urandom | tr -d ' \n' | tr a-f A-F)
        secret=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
        radosgw-admin "${c[@]}" user create --uid denpex --display-name "denpex control plane" \
            --access-key "$key" --secret "$secret" >>"$dir/log/setup.log" 2>&1 ||
            die "radosgw-admin user create failed (see $dir/log/setup.log)"
        (umask 077; printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$key" "$secret" >"$dir/user.env")
    fi
    cat "$dir/user.env"
}

stop() {
    local dir=$1 name pid _
    for name in client.rgw.a "osd.$(cat "$dir/osd-id" 2>/dev/null || echo 0)" mon.a; do
        running "$dir" "$name" || continue
        pid=$(cat "$dir/run/$name.pid")
        kill "$pid"
        for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"  # radosgw can hang waiting for RADOS
    done
    return 0
}

case "${1:-}" in
    start) [[ $# -eq 3 ]] || die "usage: start DIR PORT"; start "$2" "$3" ;;
    stop) [[ $# -eq 2 ]] || die "usage: stop DIR"; stop "$2" ;;
    check) check ;;
    *) die "usage: rgw-single-node.sh start DIR PORT | stop DIR | check" ;;
esac
