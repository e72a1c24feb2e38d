"""examples/messaging.service, the systemd unit the README's "Running as a service" points to.

The unit's keys are read with configparser and its ``ExecStart`` command line is parsed by the
package's own argument parser, so a renamed option breaks this test rather than a server's
boot; ``systemd-analyze verify`` checks the whole unit where systemd is installed.
"""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from messaging.cli.main import build_parser
from messaging.config import DEFAULT_MAX_CONNECTIONS, parse_duration

UNIT = Path(__file__).resolve().parents[1] / "examples" / "messaging.service"
#: Where the unit expects the package's virtual environment (its console script).
INSTALLED = "/opt/messaging/bin/messaging"


def read_unit() -> configparser.ConfigParser:
    """The unit's sections and keys (case kept, ``$MAINPID`` and ``%`` left alone)."""
    parser = configparser.ConfigParser(interpolation=None, strict=True, empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_runs_the_broker_with_its_config_as_a_user_of_its_own() -> None:
    service = read_unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == INSTALLED
    args = build_parser().parse_args(argv[1:])
    assert args.command == "broker"
    assert args.config == Path("/etc/messaging/broker.toml")
    assert service["User"] not in ("", "root")
    assert service["Restart"] == "on-failure"


def test_unit_stops_gracefully_and_is_hardened() -> None:
    unit = read_unit()
    service = unit["Service"]
    # SIGTERM is the broker's clean shutdown (finish in-flight publishes, fsync, exit 0):
    # the HTTP server gives requests 5 s and a cluster node drains its etcd writes after.
    assert service["KillSignal"] == "SIGTERM"
    assert parse_duration(service["TimeoutStopSec"]) >= 15
    # One descriptor per connection at least.
    assert int(service["LimitNOFILE"]) > DEFAULT_MAX_CONNECTIONS
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert "/var/lib/messaging" in service["ReadWritePaths"].split()
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.e2e
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    """Where systemd is installed its own checker finds nothing to say (it prints unknown keys
    and bad values but still exits 0, so its output must be empty). It insists that the
    ExecStart program exists: the copy checked runs a stand-in at a temporary path instead
    of /opt/messaging/bin/messaging, the one substitution made. Without systemd-analyze the
    unit must still read as strict INI, as test_unit_* check."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        assert read_unit().has_section("Service")
        return
    stand_in = tmp_path / "bin" / "messaging"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    text = UNIT.read_text()
    assert text.count(INSTALLED) == 1
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(INSTALLED, str(stand_in)))
    result = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr)
