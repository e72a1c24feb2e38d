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
    duration_of,
    parse_duration,
    parse_size,
    show_duration,
    show_size,
    size_of,
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
                                               ("1h", 3600), ("2.5s", 2.5), (" 5 S ", 5),
                                               ("7d", 7 * 86400), ("0", 0), ("0.0", 0),
                                               ("0s", 0)])
def test_durations_are_read_with_their_unit_and_zero_without(text: str, seconds: float,
                                                            ) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-1s", "１s", "1e3"])
def test_durations_that_are_not_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "number"), [("12", "12"), (" 2.5 ", "2.5"), ("600", "600")])
def test_a_duration_without_a_unit_is_refused_in_one_line(text: str, number: str) -> None:
    """``12`` was 12 s as a flag and 12 ms in a JSON body: no path guesses any more."""
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse_duration(text)
    assert str(refused.value) == (f"invalid duration {number}: add a unit: {number}s, "
                                  f"{number}h (units: ms, s, m, h, d)")


@pytest.mark.parametrize(("value", "seconds"), [("12h", 43200), (0, 0), (0.0, 0), ("0", 0),
                                                ("500ms", 0.5)])
def test_a_json_or_toml_duration_is_read_as_its_text(value: object, seconds: float) -> None:
    assert duration_of(value) == pytest.approx(seconds)


@pytest.mark.parametrize(("value", "reason"), [(12, "add a unit: 12s, 12h"),
                                               (2.5, "add a unit: 2.5s, 2.5h"),
                                               (-1, "use e.g."), (True, "expected a duration"),
                                               (None, "expected a duration"),
                                               ([1], "expected a duration")])
def test_a_json_or_toml_duration_needs_its_unit(value: object, reason: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=reason):
        duration_of(value)


@pytest.mark.parametrize(("value", "size"), [(4096, 4096), ("4096", 4096), ("4K", 4096),
                                             (0, 0), ("1G", 1 << 30)])
def test_a_json_or_toml_size_is_bytes_or_a_size_text(value: object, size: int) -> None:
    assert size_of(value) == size


@pytest.mark.parametrize("value", [1.5, True, None, "lots", [1]])
def test_a_json_or_toml_size_that_is_not_one_is_refused(value: object) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        size_of(value)


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


@pytest.mark.parametrize("name", ["retention-age", "truncation-interval", "subscriber-timeout",
                                  "long-poll-timeout", "header-timeout", "object-sweep-grace",
                                  "local-retention-age"])
def test_every_duration_setting_needs_its_unit_in_a_file_and_the_environment(
        tmp_path: Path, name: str) -> None:
    """Every duration of BrokerConfig, from a TOML number, TOML text or the environment."""
    from messaging.config import load_config
    from messaging.errors import ConfigError

    field = name.replace("-", "_")
    file = tmp_path / "broker.toml"
    for line in (f"{name} = 12\n", f'{name} = "12"\n'):
        file.write_text(line)
        with pytest.raises(ConfigError) as refused:
            load_config({}, {}, file)
        assert str(refused.value) == (f"{file}: {name}: invalid duration 12: add a unit: 12s, "
                                      "12h (units: ms, s, m, h, d)")
    variable = f"MESSAGING_{field.upper()}"
    with pytest.raises(ConfigError, match=f"^{variable}: invalid duration 12: add a unit"):
        load_config({}, {variable: "12"}, None)
    file.write_text(f'{name} = "12h"\n')
    assert getattr(load_config({}, {}, file), field) == 12 * 3600
    assert getattr(load_config({}, {variable: "12s"}, None), field) == 12


def test_every_duration_flag_reads_durations() -> None:
    """Each option that is a duration parses one (and says so): none reads bare seconds."""
    from messaging.config import positive_duration

    durations = {name for name, option, _default in broker_options()
                 if option.metavar == "DURATION"
                 or option.parse in (parse_duration, positive_duration)}
    assert durations == {"retention_age", "truncation_interval", "subscriber_timeout",
                         "long_poll_timeout", "header_timeout", "object_sweep_grace",
                         "local_retention_age", "cluster_sync_interval", "object_store_timeout",
                         "max_clock_offset", "cluster_apply_linger", "intake_window"}
    for name, option, _default in broker_options():
        if name in durations:
            assert option.parse is not None and option.metavar == "DURATION", name
            assert option.parse("90s") == 90, name
            with pytest.raises(argparse.ArgumentTypeError, match="add a unit"):
                option.parse("90")


def test_the_apply_linger_is_20ms_by_default_and_reaches_the_etcd_settings() -> None:
    from messaging.config import load_config

    base = {"etcd": "http://127.0.0.1:2379", "cluster": "c"}
    settings = load_config(base, {}, None).etcd_settings()
    assert settings is not None and settings.apply_linger == 0.02
    settings = load_config(base, {"MESSAGING_CLUSTER_APPLY_LINGER": "0"},
                           None).etcd_settings()
    assert settings is not None and settings.apply_linger == 0  # each revision as it comes
    settings = load_config(base, {"MESSAGING_CLUSTER_APPLY_LINGER": "5ms"},
                           None).etcd_settings()
    assert settings is not None and settings.apply_linger == 0.005


def test_the_kafka_listener_is_set_in_a_file_the_environment_and_flags(tmp_path: Path) -> None:
    from messaging.config import load_config
    from messaging.errors import ConfigError

    assert load_config({}, {}, None).kafka_bind is None  # off by default
    file = tmp_path / "broker.toml"
    file.write_text('kafka-bind = "127.0.0.1:9092"\nkafka-auto-create = "off"\n')
    config = load_config({}, {}, file)
    assert (config.kafka_bind, config.kafka_auto_create) == (("127.0.0.1", 9092), "off")
    config = load_config({}, {"MESSAGING_KAFKA_BIND": "[::1]:9093",
                              "MESSAGING_KAFKA_ADVERTISE": "kafka.example:9092"}, file)
    assert config.kafka_bind == ("::1", 9093)
    assert config.kafka_advertise == ("kafka.example", 9092)
    file.write_text('kafka-bind = "9092"\n')
    with pytest.raises(ConfigError, match="kafka-bind: invalid address '9092'"):
        load_config({}, {}, file)
