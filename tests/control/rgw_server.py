"""Debian's Ceph RGW as a single-node S3 server on loopback for the object-store tests: one
monitor (msgr v1 only, auth none between daemons), one OSD and radosgw's beast frontend, each
a foreground child of the test, stopped by pid (radosgw first: it waits for RADOS on exit).
RGW itself checks S3 signatures, Content-MD5 and its users' keys, which moto does not.

Ceph 16.2 (Debian 12) has no dbstore backend (rgw_backend_store arrived in Ceph 17), so RGW
needs this small RADOS cluster under it. What made it start here: a monmap and mon_host with
only a v1 address, ms_bind_msgr2=false, ms_bind_ipv6=false with public_addr=127.0.0.1, a memstore
OSD (RAM only) and pools of 8 placement groups for its single OSD. The OSD is placed in the
CRUSH map by the `ceph` tool before it starts (osd_crush_update_on_start off): left to itself,
it sends `osd crush create-or-move` as soon as it has authenticated, and about one start in
six that command left before the monitor's map reached it, with a zero fsid, which the
monitor refuses (`wrong fsid`) and the OSD exits 1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx

from tests.control.pg import free_port

BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
ACCESS_KEY = "DENPEXTESTACCESS0000"
SECRET_KEY = "denpex-rgw-test-secret"


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


class CephRgw:
    def __init__(self, root: Path, objectstore: str = "memstore") -> None:
        self.root = root
        self.mon_port, self.rgw_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.rgw_port}"
        self.conf = root / "ceph.conf"
        self.objectstore = objectstore
        self.procs: list[subprocess.Popen[bytes]] = []
        self.keys = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def _conf(self, fsid: str) -> str:
        r = self.root
        return f"""[global]
fsid = {fsid}
mon_host = [v1:127.0.0.1:{self.mon_port}]
mon_initial_members = a
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
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
osd_class_update_on_start = false
osd_crush_update_on_start = false
run_dir = {r}/run
log_file = {r}/log/$name.log
admin_socket = {r}/run/$name.asok
mon_data = {r}/mon
osd_data = {r}/osd
osd_objectstore = {self.objectstore}
memstore_device_bytes = 1073741824
bluestore_block_path = {r}/osd.block
bluestore_block_create = true
bluestore_block_size = 2147483648
osd_max_object_name_len = 256
osd_max_object_namespace_len = 64
[client.rgw.a]
rgw_frontends = beast endpoint=127.0.0.1:{self.rgw_port}
rgw_data = {r}/rgw
"""

    def _run(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run([*args], capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def _daemon(self, *args: str, log: str) -> None:
        with open(self.root / "log" / log, "ab") as out:
            self.procs.append(subprocess.Popen([*args, "-f"], stdout=out, stderr=out))

    def start(self, timeout: float = 120) -> CephRgw:
        for folder in ("mon", "osd", "run", "log", "rgw"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        fsid = str(uuid.uuid4())
        self.conf.write_text(self._conf(fsid))
        c = ("-c", str(self.conf))
        monmap = str(self.root / "monmap")
        address = f"v1:127.0.0.1:{self.mon_port}"
        self._run("monmaptool", "--create", "--fsid", fsid, "--addv", "a", address, monmap)
        self._run("ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", monmap)
        self._daemon("ceph-mon", *c, "-i", "a", log="mon-stdout.log")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", *c, "osd", "new", osd_uuid, timeout=timeout).strip()
        self._run("ceph-osd", *c, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid, timeout=timeout)
        place = ("osd", "crush", "add", f"osd.{osd_id}", "1.0", "root=default", "host=localhost")
        self._run("ceph", *c, *place, timeout=timeout)
        self._daemon("ceph-osd", *c, "-i", osd_id, log="osd-stdout.log")
        self._daemon("radosgw", *c, "-n", "client.rgw.a", log="rgw-stdout.log")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = [
                f"{p.args[0]} (exit {p.returncode})" for p in self.procs if p.poll() is not None
            ]
            if exited:
                raise AssertionError(f"{', '.join(exited)} exited: {self._logs()}")
            try:
                if httpx.get(self.url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"RGW did not answer in {timeout} s: {self._logs()}")
        made = self._run(
            *("radosgw-admin", *c, "user", "create", "--uid", "denpex"),
            *("--display-name", "denpex", "--access-key", ACCESS_KEY, "--secret", SECRET_KEY),
        )
        assert json.loads(made)["keys"][0]["access_key"] == ACCESS_KEY
        return self

    def _logs(self) -> str:
        return " | ".join(
            f"{p.name}: {p.read_text()[-800:]}" for p in sorted((self.root / "log").glob("*.log"))
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):  # radosgw, then the OSD, then the monitor
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()  # radosgw can hang on exit waiting for RADOS
                    proc.wait(10)
        self.procs.clear()
