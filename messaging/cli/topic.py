"""``messaging topic create|config|describe|delete``: one topic's settings and its deletion,
through ``/messaging/topics/{id}`` (see :mod:`messaging.http.topics`).

TOPIC is a topic id or a stream's name. ``create`` and ``config`` send the same request (a
topic that does not exist yet is created, empty); ``create`` says on standard error whether it
made the topic or found it there (``topic 7 exists, configured``), ``config`` refuses a topic
that does not exist; ``describe`` prints each setting with its value and where it came from;
``delete`` asks nothing (it needs an admin token). Failures are one line on standard error and
exit status 1, as for every client command.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from messaging.cli.arguments import add_connection_options, add_positionals, label
from messaging.cli.connect import connect
from messaging.cli.runner import note, runner
from messaging.config import parse_duration, parse_size, show_duration, show_size
from messaging.errors import MessagingError, NotFoundError
from messaging.json_ids import dumps

if TYPE_CHECKING:
    from messaging.cli.parsing import Parser

#: The settings a topic takes, as options and as the API's keys.
SETTINGS = ("max-topic-size", "retention-age", "max-segment-size", "max-message-size")
#: The one setting that is a duration (ms in the API), not a size.
AGE = "retention-age"


def add_topic_command(sub: argparse._SubParsersAction[Parser], help_text: str) -> None:
    """Register ``messaging topic create|config|describe|delete``."""
    topic = sub.add_parser("topic", help=help_text,
                           description="Manage one topic (TOPIC: a topic id or a stream "
                                       "name). Settings and deletions go through the log: "
                                       "every node of a cluster applies them.")
    actions = topic.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("create", "create a topic (empty), or change its settings"),
                         ("config", "change an existing topic's settings (only those "
                                    "given); a topic that does not exist is an error")):
        p = actions.add_parser(action, help=text, description=text + ".")
        add_positionals(p, "TOPIC")
        for key in SETTINGS:
            if key == AGE:
                p.add_argument(f"--{key}", dest=key.replace("-", "_"), type=_age,
                               metavar="DURATION", help="delete segments whose newest "
                               "message is older: 12h, 7d, ... (0: never, whatever the "
                               "broker's --retention-age)")
                continue
            p.add_argument(f"--{key}", dest=key.replace("-", "_"), type=_size,
                           metavar="SIZE", help="a byte count or 10M, 1G, ...")
        p.add_argument("--reset", action="append", default=[], choices=SETTINGS,
                       metavar="KEY", help="go back to the broker's value of KEY (one of "
                       f"{', '.join(SETTINGS)}; repeatable)")
        p.add_argument("--format", choices=["text", "json"], default="text")
        add_connection_options(p)
        p.set_defaults(run=runner(__name__, "run_configure"), shape=("topic",))

    p = actions.add_parser("describe", help="show a topic and its effective settings")
    add_positionals(p, "TOPIC")
    p.add_argument("--format", choices=["text", "json"], default="text")
    add_connection_options(p)
    p.set_defaults(run=runner(__name__, "run_describe"), shape=("topic",))

    p = actions.add_parser("delete", help="delete a topic: its messages, settings and "
                           "consumer positions, on every node (admin)")
    add_positionals(p, "TOPIC")
    add_connection_options(p)
    p.set_defaults(run=runner(__name__, "run_delete"), shape=("topic",))


def _size(text: str) -> int:
    size = parse_size(text)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: must be above zero")
    return size


def _age(text: str) -> str:
    """A ``--retention-age`` as the API takes it: a duration with its unit (0: off)."""
    seconds = parse_duration(text)  # refuses a bare number other than 0: "add a unit"
    return "0" if seconds == 0 else f"{round(seconds * 1000)}ms"


def settings_of(args: argparse.Namespace) -> dict[str, int | None]:
    """The settings a ``create``/``config`` command line asks for (keyword names)."""
    settings: dict[str, int | None] = {}
    for key in SETTINGS:
        name = key.replace("-", "_")
        value = getattr(args, name)
        if value is not None and key in args.reset:
            raise MessagingError(f"--{key} and --reset {key} contradict each other")
        if value is not None:
            settings[name] = value
        elif key in args.reset:
            settings[name] = None
    return settings


async def run_configure(args: argparse.Namespace) -> int:
    """``messaging topic create|config``: set the settings given, print the topic."""
    settings = settings_of(args)
    async with connect(args) as client:
        try:
            await client.describe_topic(args.topic)
            existed = True
        except NotFoundError as err:
            if args.action == "config":  # a typo must not create a topic: only create does
                raise MessagingError(f"{err}: messaging topic create makes one") from err
            existed = False
        answer = await client.configure_topic(args.topic, **settings)
    if args.action == "create":
        if not existed:
            note(f"created {label(args.topic)}")
        elif settings:
            note(f"{label(args.topic)} exists, configured")
        else:
            note(f"{label(args.topic)} exists (no setting given: left as it was)")
    _show(answer, args.format)
    return 0


async def run_describe(args: argparse.Namespace) -> int:
    """``messaging topic describe``: the topic and its effective settings."""
    async with connect(args) as client:
        answer = await client.describe_topic(args.topic)
    _show(answer, args.format)
    return 0


async def run_delete(args: argparse.Namespace) -> int:
    """``messaging topic delete``: delete the topic on every node."""
    async with connect(args) as client:
        answer = await client.delete_topic(args.topic)
    print(f"deleted topic {answer.get('id', args.topic)}")
    return 0


def _show(answer: dict[str, Any], fmt: str) -> None:
    """A topic's description: its figures, then one line per setting with its source."""
    if fmt == "json":
        print(dumps(answer))  # ids of 2^53 and more as strings, as the API writes them
        return
    name = answer.get("name")
    kafka = (f" (Kafka topic {answer['kafka_topic']!r}, partition "
             f"{answer.get('kafka_partition', '?')})" if "kafka_topic" in answer else "")
    print(f"topic {answer.get('id', '?')}" + (f" (stream {name!r})" if name else "") + kafka)
    for field in ("first_index", "last_index", "size", "segments"):
        print(f"  {field:<18} {answer.get(field, '?')}")
    settings = answer.get("settings")
    if not isinstance(settings, dict):
        return
    print(f"  {'SETTING':<18} {'VALUE':>10}  SOURCE")
    for key, shown in settings.items():
        if isinstance(shown, dict):
            value = shown.get("value")
            if key == AGE:
                text = "off" if not value else show_duration(value / 1000)
            else:
                text = show_size(value) if isinstance(value, int) else str(value)
            print(f"  {key:<18} {text:>10}  {shown.get('source', '?')}")
