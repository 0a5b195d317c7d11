"""Agent configuration: defaults, file, overrides, and errors that name every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.agent.config import ConfigError, load_config
from denpex.agent.registry import COLLECTORS

NAMES = tuple(c.name for c in COLLECTORS)


def test_defaults_listen_on_loopback_and_need_no_file():
    config = load_config(known_collectors=NAMES)
    assert config.listen.startswith("127.0.0.1:")
    assert config.roots.procfs == "/proc" and config.otlp["endpoint"] is None
    assert config.collector("kmsg").enabled


def test_a_file_overrides_defaults_and_the_command_line_overrides_the_file(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        "listen: 0.0.0.0:9999\nroots: {procfs: /fixtures/proc}\n"
        "spool: {fsync: always}\n"
        "collectors:\n  disk: {interval_s: 60, checkpoint_dirs: [/ckpt]}\n  ebpf: {enabled: false}\n"
    )
    config = load_config(str(path), {"listen": "127.0.0.1:1234"}, known_collectors=NAMES)
    assert config.listen == "127.0.0.1:1234"
    assert config.roots.procfs == "/fixtures/proc" and config.roots.sysfs == "/sys"
    assert config.spool["fsync"] == "always" and config.spool["max_bytes"] > 0
    assert config.collector("disk").interval_s == 60
    assert config.collector("disk").options == {"checkpoint_dirs": ["/ckpt"]}
    assert not config.collector("ebpf").enabled


def test_every_problem_is_named_at_once(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        "spool: {fsync: sometimes}\notlp: {endpoint: collector:4318}\n"
        "collectors:\n  kmsgg: {}\n  psi: {interval_s: -1}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_config(str(path), known_collectors=NAMES)
    text = str(error.value)
    for expected in (
        "spool.fsync",
        "otlp.endpoint",
        "collectors.kmsgg",
        "collectors.psi.interval_s",
    ):
        assert expected in text
    assert len(error.value.problems) == 4


def test_unknown_settings_and_unreadable_files_are_refused(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("listne: 1.2.3.4:5\n")
    with pytest.raises(ConfigError, match="unknown setting 'listne'"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "absent.yaml"))
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(path))


def test_the_shipped_configurations_load_and_never_listen_off_loopback_without_a_token(
    tmp_path,
):
    import yaml

    from denpex.agent.config import is_loopback, parse_listen

    bundle = Path(__file__).resolve().parents[2] / "dist_scripts" / "bundle"
    config = load_config(str(bundle / "config" / "agent.yaml"))
    assert is_loopback(parse_listen(config.listen)[0])
    documents = list(yaml.safe_load_all((bundle / "k8s" / "daemonset.yaml").read_text()))
    (config_map,) = [d for d in documents if d["kind"] == "ConfigMap"]
    path = tmp_path / "agent.yaml"
    path.write_text(config_map["data"]["agent.yaml"])
    daemonset = load_config(str(path))
    assert not is_loopback(parse_listen(daemonset.listen)[0])
    assert daemonset.api["token_file"] and daemonset.api["metrics"] == "open"
