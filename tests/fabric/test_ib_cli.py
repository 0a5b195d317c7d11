"""`denpex agent --once --json` on a fixture tree with a flapping InfiniBand port: the port
that is down now is net.link_down evidence with host and port; with a state_dir, a second
run sees the link drops that happened since the first."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from denpex.agent.config import load_config
from denpex.agent.daemon import Agent
from denpex.fabric.ib.collector import IbCollector

FIXTURES = Path(__file__).parent / "fixtures"


def denpex(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", *args], capture_output=True, text=True, timeout=120
    )


def once(sysfs: Path, *extra: str) -> dict:
    result = denpex(
        *("agent", "--once", "--json", "--collectors", "ib", "--host", "node7"),
        *("--sysfs", str(sysfs), *extra),
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_agent_pipeline_carries_ib_evidence(tmp_path: Path) -> None:
    """Through the agent's own pipeline, whatever the registry holds."""
    config = load_config(None, {"host": "node7", "roots.sysfs": str(FIXTURES / "ib_flap" / "sys")})
    agent = Agent(config, collector_classes=(IbCollector,), persist=False)
    events, evidence = agent.collect_once()
    assert agent.unavailable == {}
    (down,) = [e for e in evidence if e.signature == "net.link_down.ib_port_down"]
    assert down.id and down.category == "net.link_down" and down.event.host == "node7"
    assert (down.captures["device"], down.captures["port"]) == ("mlx5_1", "1")
    assert any(e.body == "ib_port_state" and e.attrs["device"] == "mlx5_1" for e in events)


def test_once_json_reports_the_down_port_with_host_and_port() -> None:
    data = once(FIXTURES / "ib_flap" / "sys")
    (down,) = [e for e in data["evidence"] if e["signature"] == "net.link_down.ib_port_down"]
    assert down["category"] == "net.link_down" and down["host"] == "node7"
    assert down["captures"]["device"] == "mlx5_1" and down["captures"]["port"] == "1"
    assert down["action"] == "check_fabric"


def test_a_second_once_run_with_a_state_dir_sees_a_flap(tmp_path: Path) -> None:
    tree = tmp_path / "ib_node"
    shutil.copytree(FIXTURES / "ib_node", tree)
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"collectors:\n  ib: {{state_dir: {json.dumps(str(tmp_path / 'state'))}, "
        "expected_rate_gbps: 100}\n"
    )
    first = once(tree / "sys", "--config", str(config))
    assert first["evidence"] == []
    downed = tree / "sys/class/infiniband/mlx5_2/ports/1/counters/link_downed"
    downed.write_text("1\n")  # the link dropped and came back between the two runs
    second = once(tree / "sys", "--config", str(config))
    (flap,) = second["evidence"]
    assert flap["signature"] == "net.link_down.ib_port_flap" and flap["host"] == "node7"
    assert (flap["captures"]["device"], flap["captures"]["port"]) == ("mlx5_2", "1")
