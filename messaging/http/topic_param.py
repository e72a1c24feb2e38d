"""The topic a read names: ``topicID`` as a topic id, or as a named stream's name.

``topicID=7`` is topic 7; ``topicID=orders`` is the topic that holds the stream ``orders``
(found in the broker's catalog, :mod:`messaging.broker.catalog`). A value of ASCII digits is
always an id (a stream whose name is all digits is read by its id); any other printable text
is a name. Read scopes are checked by id *and* by name: a token whose ``read`` scope lists a
stream's name may read it through its id and through its name, and one that lists the id
may read it through either too.

A write (``POST /messaging/messages``) names its topic by id only: a name is a stream's, and
a stream is written through ``/v1/stream/NAME``. A 400 for a ``topicID`` that is neither says
which forms it takes and where names go.
"""

from __future__ import annotations

from aiohttp import web

from messaging.broker.view import BrokerView
from messaging.errors import BadRequestError, NotFoundError, StreamGoneError
from messaging.http.auth import Principal, principal_of
from messaging.json_ids import U64_LIMIT

_MAX_U64_DIGITS = len(str(U64_LIMIT - 1))
#: What a topic reference may be, for the 400 of one that is not.
_ID_OR_NAME = ("expected a topic id (an unsigned integer below 2^64) or a stream's name (the "
               "NAME of /v1/stream/NAME)")


def topic_reference(text: str | None, param: str = "topicID") -> int | str | None:
    """What ``text`` names: a topic id (int), a stream's name (str), or None when it is
    missing or empty; 400 for an id past 2^64 - 1 or a name with control characters."""
    if text is None or text == "":
        return None
    if text.isascii() and text.isdigit():
        return _topic_id(text, param)
    if not text.isprintable():
        raise BadRequestError(f"invalid {param} {text!r}: {_ID_OR_NAME}")
    return text


def topic_to_write(text: str | None, param: str = "topicID") -> int | None:
    """The topic id a write names (None when ``text`` is missing or empty); 400 for anything
    else, saying that a name is a stream's and is written through ``/v1/stream/NAME``."""
    if text is None or text == "":
        return None
    if text.isascii() and text.isdigit():
        return _topic_id(text, param)
    raise BadRequestError(
        f"invalid {param} {text!r}: a publish names its topic by id (an unsigned integer "
        "below 2^64); names are streams': create one with PUT /v1/stream/NAME and append "
        "with POST /v1/stream/NAME (reads take a stream's name as topicID)")


def _topic_id(digits: str, param: str) -> int:
    if len(digits) > _MAX_U64_DIGITS or int(digits) >= U64_LIMIT:
        raise BadRequestError(f"invalid {param} {digits!r}: {_ID_OR_NAME}")
    return int(digits)


def readable(principal: Principal, broker: BrokerView, topic_id: int) -> bool:
    """Whether the principal may read a topic (by its id, or by its stream's name)."""
    if principal.can("read", str(topic_id)):
        return True
    name = broker.stream_name(topic_id)
    return name is not None and principal.can("read", name)


def require_read(principal: Principal, broker: BrokerView, topic_id: int) -> None:
    """403 unless :func:`readable`."""
    if not readable(principal, broker, topic_id):
        principal.require("read", str(topic_id), f"topic {topic_id}")


def resolve(broker: BrokerView, reference: int | str, param: str = "topicID") -> int:
    """The topic id of a reference: an id as it is; a name through the catalog (404 for a name
    no stream has, 410 for a deleted stream)."""
    if isinstance(reference, int):
        return reference
    stream = broker.committed.stream(reference)
    if stream is None:
        raise NotFoundError(f"invalid {param} {reference!r}: not a topic id, and no stream has "
                            "that name")
    if stream.deleted:
        raise StreamGoneError(f"stream {reference!r} was deleted")
    return stream.topic


def topic_to_read(request: web.Request, broker: BrokerView, param: str = "topicID",
                  ) -> int | None:
    """The topic a read names in the query parameter ``param`` (None when it names none),
    once the request's token may read it (see :func:`readable_reference`)."""
    reference = topic_reference(request.query.get(param), param)
    if reference is None:
        return None
    return readable_reference(principal_of(request), broker, reference, param)


def readable_reference(principal: Principal, broker: BrokerView, reference: int | str,
                       param: str = "topicID") -> int:
    """The topic id of ``reference`` once ``principal`` may read it, by id or by name; a name
    it may not read is refused (403) before anyone learns whether a stream has it."""
    if isinstance(reference, str) and not principal.can("read", reference):
        stream = broker.committed.stream(reference)
        if stream is None or not principal.can("read", str(stream.topic)):
            principal.require("read", reference, f"stream {reference!r}")
    topic_id = resolve(broker, reference, param)
    require_read(principal, broker, topic_id)
    return topic_id
