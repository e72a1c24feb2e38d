"""The argument parser every ``messaging`` command is made of: :class:`Parser`.

It differs from :class:`argparse.ArgumentParser` in three ways, as users of ``rpk`` and ``nats``
expect:

- no abbreviations (``allow_abbrev=False``): ``--form latest`` is an unknown option, not
  ``--format latest``;
- an error is one line from the parser of the (sub)command it concerns, then where its help
  is: ``messaging tail: error: ...`` and ``see 'messaging tail --help'``, never the
  top-level usage; unrecognized arguments are reported by the subcommand that was given them;
- an unknown option is followed by the options it may have meant (``did you mean
  --format?``), or by a parser's own hint (:attr:`Parser.hint`: ``broker --port 9000``
  suggests ``--bind 127.0.0.1:9000``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

#: A parser's hint for arguments it did not recognize: the words in, a suggestion or None.
Hint = Callable[[Sequence[str]], str | None]


class Parser(argparse.ArgumentParser):
    """An argument parser without abbreviations whose errors are one line and a pointer to
    ``--help`` (see the module docstring). Its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, hint: Hint | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        #: Turns unrecognized arguments into a suggestion (None: the closest options).
        self.hint = hint

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """Parse the command line; arguments nothing took are an error of the subcommand
        that was given them."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen_parser(self, parsed).unrecognized(extras)
        return parsed

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """Fail for ``extras``, with what they may have meant."""
        suggestion = (self.hint(extras) if self.hint is not None else None) or (
            self._closest_options(extras))
        self.error(f"unrecognized arguments: {' '.join(extras)}"
                   + (f" ({suggestion})" if suggestion else ""))

    def _closest_options(self, extras: Sequence[str]) -> str | None:
        """``did you mean --format?`` for the first unknown option that resembles some."""
        import difflib  # only for a command line with a mistake

        known = [option for option in self._option_string_actions if option.startswith("--")]
        for word in extras:
            if not word.startswith("--"):
                continue
            typed = word.split("=", 1)[0]
            close = [option for option in known if option.startswith(typed)]
            close += difflib.get_close_matches(typed, known, n=3, cutoff=0.75)
            close = sorted(dict.fromkeys(close))[:3]
            if close:
                return "did you mean " + " or ".join(close) + "?"
        return None

    def error(self, message: str) -> NoReturn:
        """One line, ``PROG: error: MESSAGE``, then ``see 'PROG --help'``; exit status 2."""
        folded = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {folded}\nsee '{self.prog} --help'\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        """Print ``message`` on standard error (flushed) and exit with ``status``."""
        if message:
            sys.stderr.write(message)
            sys.stderr.flush()
        sys.exit(status)


def chosen_parser(parser: argparse.ArgumentParser,
                  parsed: argparse.Namespace) -> Parser:
    """The parser of the innermost subcommand ``parsed`` names (``parser`` itself when it
    names none)."""
    for action in parser._actions:  # argparse keeps them private; completion reads them too
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(parsed, action.dest, None)
            child = action.choices.get(name) if isinstance(name, str) else None
            if child is not None:
                return chosen_parser(child, parsed)
    assert isinstance(parser, Parser)
    return parser
