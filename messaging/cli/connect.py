"""Where a client command's requests go: a :class:`~messaging.client.Client` for the brokers,
token and CA the command line names (:mod:`messaging.cli.contexts`), and the cluster's other
nodes learnt from the first that answers, so a failover can reach nodes the command was not
given.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import TYPE_CHECKING, Any

from messaging.cli.contexts import Target, resolve
from messaging.errors import (
    ClientConfigError,
    ConnectionFailedError,
    InvalidURLError,
    MessagingError,
    NotABrokerError,
)

if TYPE_CHECKING:
    from messaging.client.client import Client

#: How long each broker may take to list the cluster's nodes before the next is asked (a
#: busy node can take seconds; a hung one costs this much once, at the start).
LEARN_TIMEOUT = 5.0
#: How often a following tail asks the cluster for its nodes again (nodes that joined since,
#: or had not registered yet when it started).
RELEARN_INTERVAL = 10.0
#: How long a broker may take to start answering a command's request before it counts as
#: failed and the request goes to the next node (a stopped or hung node).
ANSWER_TIMEOUT = 10.0


def connect(args: argparse.Namespace, **options: Any) -> Client:
    """A Client for the command's brokers, token and CA (the :class:`Target`, kept as
    ``args.target`` for the messages of a failure: :func:`messaging.cli.runner.explain`)."""
    from messaging.client.client import Client  # the HTTP library: only once connecting

    target: Target = resolve(args)
    args.target = target
    options.setdefault("timeout", ANSWER_TIMEOUT)
    return Client(target.urls, token=target.token, ca=target.ca, **options)


async def keep_learning(client: Client) -> None:
    """:func:`learn_nodes` every RELEARN_INTERVAL until cancelled; what fails is left to the
    reads, which say so."""
    # Imported here, not above: parsing a command line reads this module's constants, and
    # a command that never runs a loop (publish DATA, --help) should not load asyncio.
    import asyncio

    while True:
        await asyncio.sleep(RELEARN_INTERVAL)
        with contextlib.suppress(MessagingError):
            await learn_nodes(client)


async def learn_nodes(client: Client) -> None:
    """Ask the first broker that answers for the cluster's nodes, so a failover can reach
    nodes the command was not given. A broker that cannot be reached now is the command's
    own error to report (or wait out); a wrong URL (not a broker, TLS mismatch) is reported
    here, at once."""
    import asyncio

    try:
        async with asyncio.timeout(LEARN_TIMEOUT * min(len(client.urls), 3)):
            await client.ping(timeout=LEARN_TIMEOUT)
    except ConnectionFailedError as err:
        if err.refused and not client.reached:
            raise  # nothing listens there: the command would say the same, later
        return
    except TimeoutError:
        return
    except (NotABrokerError, ClientConfigError, InvalidURLError):
        raise  # a wrong URL or setting: no use going on
    except MessagingError as err:
        if err.status == 401:
            raise  # a bad token fails every command alike
        return  # a token that may not ping, a 503: the command has its own say
