"""The parser of ``messaging`` (messaging.cli.parsing, messaging.cli.main) in-process: every
(sub)command's parser refuses abbreviations, a one-line error names the subcommand, and a
command line is only ever parsed with its own command's full parser."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from messaging.cli.contexts import looks_like_urls, parse_urls
from messaging.cli.main import COMMANDS, build_parser, command_of, main
from messaging.cli.parsing import Parser


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from parsers(child)


def test_no_parser_takes_abbreviations() -> None:
    every = list(parsers(build_parser()))
    assert len(every) > len(COMMANDS) + 10  # commands and their actions
    for parser in every:
        assert isinstance(parser, Parser), parser.prog
        assert parser.allow_abbrev is False, parser.prog


def test_only_the_named_command_is_built() -> None:
    assert command_of(["--version"]) is None
    assert command_of(["tail", "1"]) == "tail"
    assert command_of(["tial", "1"]) is None
    built = build_parser(["tail"])
    names = {p.prog for p in parsers(built)}
    assert "messaging tail" in names and "messaging topic create" not in names


def test_an_error_is_one_line_and_where_the_help_is(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["topic", "describe", "1", "--fromat", "json"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "messaging topic describe: error: unrecognized arguments: --fromat json (did you mean "
        "--format?)\nsee 'messaging topic describe --help'\n")


def test_host_and_port_are_a_url() -> None:
    assert looks_like_urls("127.0.0.1:8086") and looks_like_urls("a:1,b.example:2")
    assert looks_like_urls("[::1]:8086") and looks_like_urls("http://x")
    assert not looks_like_urls("orders") and not looks_like_urls("7")
    assert not looks_like_urls("chat:room") and not looks_like_urls("a:1,orders")
    assert parse_urls(["127.0.0.1:8086,[::1]:8087", "https://b:1"]) == [
        "http://127.0.0.1:8086", "http://[::1]:8087", "https://b:1"]
