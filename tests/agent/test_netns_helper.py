"""The test helper that makes another host leaves the machine as it found it: no namespace,
no veth, and no /run/netns mount or folder that was not there before."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import netns_dir
from tests.agent import netns


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def test_another_host_leaves_nothing_behind() -> None:
    if (why_not := netns.unavailable_reason()) is not None:
        pytest.skip(why_not)
    before, links = netns_dir.snapshot(), _links()
    with netns.other_host() as other:
        assert netns_dir.is_mount(netns_dir.NETNS_DIR)  # what `ip netns add` does the first time
        done = netns.run_python("print('inside')", netns=other.name)
        assert done.returncode == 0 and done.stdout == "inside\n"
    assert netns_dir.snapshot() == before
    if os.path.isdir(netns_dir.NETNS_DIR):
        assert other.name not in os.listdir(netns_dir.NETNS_DIR)
    assert _links().count("dxh") == links.count("dxh")
