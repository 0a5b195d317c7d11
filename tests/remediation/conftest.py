"""Fixtures of the remediation tests: a real Slurm cluster (slurmctld + three slurmd on
loopback, munge with its own key), started once per module and stopped with every daemon."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.remediation.slurm_cluster import SlurmCluster, missing


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    lacking = missing()
    if lacking:
        pytest.fail(
            f"Slurm not installed ({', '.join(lacking)}): apt-get install --no-install-recommends "
            "slurmctld slurmd slurm-client munge (listed in scripts/system-packages.txt)"
        )
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# the control plane's fixtures (PostgreSQL, server processes), for the end-to-end tests here
from tests.control.conftest import db_url, pg_cluster, pg_url, server_processes  # noqa: E402, F401
