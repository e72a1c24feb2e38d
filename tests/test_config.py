"""Broker settings: sizes and durations as text and back, and flags built from BrokerConfig."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.config import (
    BrokerConfig,
    broker_options,
    parse_duration,
    parse_size,
    show_duration,
    show_size,
)


@given(st.integers(0, 1 << 50))
def test_a_shown_size_reads_back_the_same(size: int) -> None:
    assert parse_size(show_size(size)) == size


@pytest.mark.parametrize(("size", "text"), [(0, "0"), (1, "1"), (1023, "1023"), (1024, "1K"),
                                            (1536, "1536"), (10 << 20, "10M"), (1 << 30, "1G"),
                                            (3 << 40, "3T"), (2048 << 30, "2T")])
def test_sizes_are_shown_in_the_largest_exact_unit(size: int, text: str) -> None:
    assert show_size(size) == text


@pytest.mark.parametrize(("text", "size"), [("10M", 10 << 20), ("10MiB", 10 << 20),
                                            ("10mb", 10 << 20), ("1g", 1 << 30), (" 7 ", 7),
                                            ("4K", 4096), ("0", 0), ("2T", 2 << 40)])
def test_sizes_are_read_with_or_without_a_unit(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1", "1.5M", "10X", "１０", "1 0"])
def test_sizes_that_are_not_sizes_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        parse_size(text)


@given(st.integers(1, 10**6), st.sampled_from([1, 60, 3600]))
def test_a_shown_duration_reads_back_the_same(count: int, unit: int) -> None:
    seconds = float(count * unit)
    assert parse_duration(show_duration(seconds)) == seconds


@pytest.mark.parametrize(("seconds", "text"), [(0.001, "1ms"), (0.5, "500ms"), (1.5, "1500ms"),
                                               (10.0, "10s"), (90.0, "90s"), (600.0, "10m"),
                                               (3600.0, "1h"), (5400.0, "90m")])
def test_durations_are_shown_in_the_largest_exact_unit(seconds: float, text: str) -> None:
    assert show_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "seconds"), [("100ms", 0.1), ("10s", 10), ("10m", 600),
                                               ("1h", 3600), ("2.5", 2.5), (" 5 S ", 5)])
def test_durations_are_read_with_or_without_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-1s", "１s", "1e3"])
def test_durations_that_are_not_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        parse_duration(text)


def test_flag_defaults_are_broker_config_defaults() -> None:
    config = BrokerConfig()
    options = list(broker_options())
    assert len(options) >= 10
    flags = [option.flag for _name, option, _default in options]
    assert len(set(flags)) == len(flags) and all(f.startswith("--") for f in flags)
    for name, option, default in options:
        assert default == getattr(config, name), name
        if option.parse is not None and default is not None:  # --help shows it: it reads back
            assert option.parse(option.show(default)) == default, name


def test_config_file_environment_and_flags_precedence(tmp_path: Path) -> None:
    from messaging.config import load_config
    from messaging.errors import ConfigError

    file = tmp_path / "broker.toml"
    file.write_text('bind = "127.0.0.1:9000"\nmax-segment-size = "64M"\nfsync = "never"\n'
                    'access-log = true\nmax_topic_size = 1048576\n')
    config = load_config({}, {}, file)
    assert (config.host, config.port, config.max_segment_size) == ("127.0.0.1", 9000, 64 << 20)
    assert config.fsync == "never" and config.access_log and config.max_topic_size == 1 << 20
    environ = {"MESSAGING_MAX_SEGMENT_SIZE": "32M", "MESSAGING_BIND": "127.0.0.1:9001",
               "MESSAGING_ACCESS_LOG": "false", "MESSAGING_LOG_LEVEL": "debug"}
    config = load_config({}, environ, file)
    assert (config.port, config.max_segment_size, config.access_log) == (9001, 32 << 20, False)
    assert config.log_level == "DEBUG"
    config = load_config({"max_segment_size": 1 << 20}, environ, file)
    assert config.max_segment_size == 1 << 20  # the command line wins
    file.write_text("max-segmnt-size = 1\n")
    with pytest.raises(ConfigError, match=r"broker.toml: max-segmnt-size: unknown setting"):
        load_config({}, {}, file)
    file.write_text("fsync = 'sometimes'\n")
    with pytest.raises(ConfigError, match="'sometimes' is not one of always, interval, never"):
        load_config({}, {}, file)
    file.write_text("this is not toml")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config({}, {}, file)
    with pytest.raises(ConfigError, match="MESSAGING_MAX_TOPIC_SIZE: invalid size"):
        load_config({}, {"MESSAGING_MAX_TOPIC_SIZE": "lots"}, None)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config({}, {}, tmp_path / "absent.toml")
