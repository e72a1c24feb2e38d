"""``messaging completion bash|zsh`` (messaging.cli.completion): scripts generated from the real
parser, run in the real shells."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from messaging.cli.completion import command_specs, completion_script
from messaging.cli.main import build_parser
from tests.conftest import cli

#: Words typed (the last one being completed), and what completion offers for them.
PROBES = [
    # Every command starting with t (tail, token, topics, ...), as the parser has them.
    ("messaging t", " ".join(name for spec in command_specs(build_parser()) if spec.path == ""
                             for name in spec.subcommands if name.startswith("t"))),
    ("messaging token ''", "create list revoke"),
    ("messaging token create --", "--help --name --scope --tokens --token-file"),
    ("messaging broker --fsync ''", "always interval never"),
    ("messaging broker --data ./d --log-format ''", "text json"),
    ("messaging completion ''", "bash zsh"),
    ("messaging tail --format j", "json"),
    ("messaging stream ''", "create delete head tail"),
    ("messaging stream create --co", "--content-type --context"),
    ("messaging stream tail --f", "--follow --format --from"),
    ("messaging broker --data ''", ""),  # a value without choices: file names (-o default)
]


def offers(lines: Iterable[str]) -> list[list[str]]:
    """Each line's words, sorted (the shells list them in the parser's order)."""
    return [sorted(line.split()) for line in lines]


def test_specs_follow_the_parser() -> None:
    specs = {spec.path: spec for spec in command_specs(build_parser())}
    assert {"broker", "token", "completion", "publish", "tail", "consumers", "topics",
            "ping", "topic", "stream", "context"} <= set(specs[""].subcommands)
    assert set(specs["stream"].subcommands) == {"create", "delete", "head", "tail"}
    assert specs[""].subcommands["token"] == "make, list and revoke bearer tokens"
    assert set(specs["token"].subcommands) == {"create", "list", "revoke"}
    assert specs["broker"].choices["--fsync"] == ["always", "interval", "never"]
    assert "--insecure" in specs["broker"].options
    assert "--insecure" not in specs["broker"].takes_value  # a switch
    assert specs["completion"].positionals == ["bash", "zsh"]
    for shell in ("bash", "zsh"):
        script = completion_script(build_parser(), shell)
        for spec in specs.values():
            for word in [*spec.subcommands, *spec.options]:
                assert word in script, (shell, spec.path, word)
    with pytest.raises(ValueError, match="unknown shell 'fish'"):
        completion_script(build_parser(), "fish")


def _script(tmp_path: Path, shell: str) -> Path:
    result = cli("completion", shell)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    path = tmp_path / f"messaging.{shell}"
    path.write_text(result.stdout)
    return path


@pytest.mark.e2e  # runs the CLI and bash
def test_bash_completes_commands_options_and_choices(tmp_path: Path) -> None:
    script = _script(tmp_path, "bash")
    probes = "\n".join(
        f'COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _messaging; '
        'echo "${COMPREPLY[*]}"' for words, _offered in PROBES)
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c",
         f"source {script} && complete -p messaging && {{\n{probes}\n}}"],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "complete -o default -F _messaging messaging"
    assert offers(lines[1:]) == offers(offered for _words, offered in PROBES)


@pytest.mark.e2e  # runs the CLI and zsh
def test_zsh_script_parses_and_completes(tmp_path: Path) -> None:
    script = _script(tmp_path, "zsh")
    text = script.read_text()
    assert text.startswith("#compdef messaging\n")
    if shutil.which("zsh") is None:  # no zsh here: at least every command is in the script
        for spec in command_specs(build_parser()):
            assert all(f"{name}:" in text for name in spec.subcommands)
        return
    assert subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True,
                          timeout=30).returncode == 0
    # zsh's completion builtins print what they are given that starts with the word being
    # completed (as zsh itself matches), so the words offered can be read.
    stubs = ('offer() { print -r -- "${(@M)argv:#${words[CURRENT]}*}" }; '
             'compadd() { [[ $1 == -- ]] && shift; offer "$@" }; '
             '_describe() { local -a names=("${(@P)${@[-1]}}"); offer "${names[@]%%:*}" }; '
             '_files() { print -r -- "" }; compdef() { : }')
    probes = "\n".join(f"words=({words}); CURRENT=${{#words}}; _messaging"
                       for words, _offered in PROBES)
    result = subprocess.run(["zsh", "-f", "-c", f"{stubs}\nsource {script}\n{probes}"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert offers(result.stdout.splitlines()) == offers(offered for _words, offered in PROBES)
