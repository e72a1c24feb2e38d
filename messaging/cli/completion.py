"""``messaging completion bash|zsh``: shell completion generated from the real argument parser.

The parser is walked once (:func:`command_specs`): every command path (``""``, ``token``,
``token create``, ...) with its subcommands, options, the options that take a value, and their
choices. Each script is a table of those words (one shell ``case``) and a small function that
finds the command path in the words typed so far and offers subcommands, options, an option's
choices, or file names where nothing else fits. A new option or subcommand appears in the
completion without touching this module.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field

from messaging.cli.parsing import Parser

SHELLS = ("bash", "zsh")


@dataclass(slots=True)
class CommandSpec:
    """What completes after one command path (``""`` is ``messaging`` itself)."""

    path: str
    #: Subcommand names and their help.
    subcommands: dict[str, str] = field(default_factory=dict)
    #: Option strings (``-h``, ``--help``, ...) and their help.
    options: dict[str, str] = field(default_factory=dict)
    #: The option strings that take a value.
    takes_value: list[str] = field(default_factory=list)
    #: The choices of options that have some.
    choices: dict[str, list[str]] = field(default_factory=dict)
    #: The choices of positional arguments (e.g. ``completion bash|zsh``).
    positionals: list[str] = field(default_factory=list)


def command_specs(parser: argparse.ArgumentParser, path: str = "") -> Iterator[CommandSpec]:
    """The spec of ``parser`` (at ``path``) and of every subcommand below it."""
    spec = CommandSpec(path)
    children: list[tuple[str, argparse.ArgumentParser]] = []
    # argparse keeps its actions private; walking them is how completion tools read a parser.
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                spec.subcommands[name] = helps.get(name, "")
                children.append((name, child))
        elif action.option_strings:
            for option in action.option_strings:
                spec.options[option] = action.help or ""
                if action.nargs != 0:
                    spec.takes_value.append(option)
                    if action.choices is not None:
                        spec.choices[option] = [str(c) for c in action.choices]
        elif action.choices is not None:
            spec.positionals.extend(str(c) for c in action.choices)
    yield spec
    for name, child in children:
        yield from command_specs(child, f"{path} {name}".strip())


def _table(function: str, array: str, rows: list[tuple[str, list[str]]]) -> list[str]:
    """A shell function that sets ``array`` to the words of a key (``PATH|KIND``)."""
    lines = [f"{function}() {{", f"    {array}=()", '    case "$1" in']
    for key, words in rows:
        if words:
            quoted = " ".join(shlex.quote(w) for w in words)
            lines.append(f"        {shlex.quote(key)}) {array}=({quoted}) ;;")
    lines += ["    esac", "}"]
    return lines


def _rows(specs: list[CommandSpec], *, described: bool) -> list[tuple[str, list[str]]]:
    """The table's rows: per command path its subcommands, positional choices, options,
    options that take a value and each option's choices; when ``described`` (zsh), also its
    subcommands and options as ``NAME:HELP`` for ``_describe``."""
    rows: list[tuple[str, list[str]]] = []
    for spec in specs:
        rows.append((f"{spec.path}|subcommands", list(spec.subcommands)))
        rows.append((f"{spec.path}|positionals", spec.positionals))
        rows.append((f"{spec.path}|options", list(spec.options)))
        rows.append((f"{spec.path}|takes", spec.takes_value))
        rows.extend((f"{spec.path}|{option}", choices)
                    for option, choices in spec.choices.items())
        if described:
            rows.append((f"{spec.path}|described subcommands", _described(spec.subcommands)))
            rows.append((f"{spec.path}|described options", _described(spec.options)))
    return rows


def _described(items: dict[str, str]) -> list[str]:
    """``NAME:HELP`` words (``_describe`` splits at the first colon not escaped)."""
    return [name.replace(":", "\\:") + ":" + " ".join(text.split())
            for name, text in items.items()]


_BASH = r"""
_messaging_has() {  # _messaging_has WORD KEY: whether WORD is one of KEY's words
    local w
    _messaging_words "$2"
    for w in "${_messaging_reply[@]}"; do
        [[ $w == "$1" ]] && return 0
    done
    return 1
}

_messaging_offer() {  # _messaging_offer KEY...: the words of KEYs that start with $cur
    local key w
    for key in "$@"; do
        _messaging_words "$key"
        for w in "${_messaging_reply[@]}"; do
            [[ $w == "$cur"* ]] && COMPREPLY+=("$w")
        done
    done
}

_messaging() {
    local cur=${COMP_WORDS[COMP_CWORD]} path="" word i
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if _messaging_has "$word" "$path|takes"; then
            ((i++))  # its value
        elif [[ $word != -* ]] && _messaging_has "$word" "$path|subcommands"; then
            path=${path:+$path }$word
        fi
    done
    if ((COMP_CWORD > 1)) && _messaging_has "${COMP_WORDS[COMP_CWORD-1]}" "$path|takes"; then
        # An option's value: its choices, else file names (complete -o default).
        _messaging_offer "$path|${COMP_WORDS[COMP_CWORD-1]}"
    elif [[ $cur == -* ]]; then
        _messaging_offer "$path|options"
    else
        _messaging_offer "$path|subcommands" "$path|positionals"
    fi
    return 0
}

complete -o default -F _messaging messaging
"""

_ZSH = r"""
_messaging_has() {  # _messaging_has WORD KEY: whether WORD is one of KEY's words
    local -a _messaging_reply
    _messaging_words "$2"
    (( ${_messaging_reply[(Ie)$1]} ))
}

_messaging() {
    local cmdpath="" word cur=${words[CURRENT]} prev=${words[CURRENT-1]}
    local -a _messaging_reply choices
    local -i i
    for ((i = 2; i < CURRENT; i++)); do
        word=${words[i]}
        if _messaging_has "$word" "$cmdpath|takes"; then
            ((i++))  # its value
        elif [[ $word != -* ]] && _messaging_has "$word" "$cmdpath|subcommands"; then
            cmdpath=${cmdpath:+$cmdpath }$word
        fi
    done
    if (( CURRENT > 2 )) && _messaging_has "$prev" "$cmdpath|takes"; then
        _messaging_words "$cmdpath|$prev"
        if (( ${#_messaging_reply} )); then
            compadd -- "${_messaging_reply[@]}"
        else
            _files
        fi
    elif [[ $cur == -* ]]; then
        _messaging_words "$cmdpath|described options"
        _describe -t options option _messaging_reply
    else
        _messaging_words "$cmdpath|positionals"
        choices=("${_messaging_reply[@]}")
        _messaging_words "$cmdpath|described subcommands"
        if (( ${#_messaging_reply} )); then
            _describe -t commands command _messaging_reply
        elif (( ${#choices} )); then
            compadd -- "${choices[@]}"
        else
            _files
        fi
    fi
}

if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    _messaging "$@"  # autoloaded from a file _messaging in $fpath
else
    compdef _messaging messaging  # sourced (after compinit)
fi
"""


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser``'s program for ``shell`` (bash or zsh)."""
    specs = list(command_specs(parser))
    prog = parser.prog
    if shell == "bash":
        header = [f"# bash completion for {prog}, generated from its argument parser by",
                  f"# `{prog} completion bash`. Load it with: source <({prog} completion bash)"]
        table = _table("_messaging_words", "_messaging_reply", _rows(specs, described=False))
        return "\n".join([*header, "", *table]) + "\n" + _BASH
    if shell == "zsh":
        header = [f"#compdef {prog}",
                  f"# zsh completion for {prog}, generated from its argument parser by",
                  f"# `{prog} completion zsh`. Load it with: source <({prog} completion zsh)",
                  "# after compinit, or save it as _messaging in a directory of $fpath."]
        table = _table("_messaging_words", "_messaging_reply", _rows(specs, described=True))
        return "\n".join([*header, "", *table]) + "\n" + _ZSH
    raise ValueError(f"unknown shell {shell!r}: expected one of {', '.join(SHELLS)}")


def add_completion_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``completion bash|zsh``: the script completes the words of the parser of
    every command (this one included)."""
    p = sub.add_parser(
        "completion", help=help_text,
        description="Print the completion script of messaging for SHELL: subcommands, options "
        "and their choices. bash: `messaging completion bash >> ~/.bashrc` (or source <(...)); "
        "zsh: `messaging completion zsh > \"${fpath[1]}/_messaging\"` (or source <(...) after "
        "compinit).")
    p.add_argument("shell", metavar="SHELL", choices=SHELLS, help="bash or zsh")
    p.set_defaults(run=_print_completion)


def _print_completion(args: argparse.Namespace) -> int:
    from messaging.cli.main import build_parser

    print(completion_script(build_parser(), args.shell), end="")
    return 0
