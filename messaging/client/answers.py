"""A broker's answer as the client holds it (:class:`Response`), and reading what the API
promises out of it: an index header, a JSON object, ids and indexes, a list of URLs, a
content type.

An answer that is not shaped as the API promises raises
:class:`~messaging.errors.NotABrokerError` naming the URL that gave it: whatever answered is
not a broker of this version (a wrong port, a proxy's error page).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from messaging.errors import InvalidURLError, NotABrokerError, is_unsigned
from messaging.failover import base_url, unique
from messaging.frames import FRAMES_CONTENT_TYPE
from messaging.headers import INDEX_HEADER
from messaging.json_ids import parse_u64, with_integers

#: The fields of a topic's and of a consumer's row that hold ids and indexes: ints here,
#: whether the broker wrote them as numbers or (from 2^53 up) as strings.
TOPIC_INTEGERS = ("id", "first_index", "last_index", "index", "subscribers")
CONSUMER_INTEGERS = ("topic", "index", "last_index", "lag")


@dataclass(frozen=True, slots=True)
class Response:
    """A successful broker answer; ``url`` is the broker (``scheme://host:port``) that gave it."""

    status: int
    headers: dict[str, str]
    body: bytes
    url: str = ""

    def json(self) -> Any:
        """The body as JSON (:class:`NotABrokerError` if it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
            raise NotABrokerError.at(self.url, "its answer is not JSON") from err


def broker_index(response: Response) -> int:
    """The index a publish was stored at (its ``X-Broker-Index`` header)."""
    value = response.headers.get(INDEX_HEADER)
    if value is None:
        raise NotABrokerError.at(response.url, f"its answer has no {INDEX_HEADER}")
    if not is_unsigned(value):
        raise NotABrokerError.at(response.url, f"invalid {INDEX_HEADER} {value!r}")
    return int(value)


def json_object(response: Response) -> dict[str, Any]:
    """The body, which must be a JSON object."""
    result = response.json()
    if not isinstance(result, dict):
        raise NotABrokerError.at(response.url, "its answer is not a JSON object")
    return result


def integers(response: Response, row: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """``row`` with its id and index ``fields`` as ints (:func:`json_ids.with_integers`)."""
    try:
        return with_integers(row, fields)
    except ValueError as err:
        raise NotABrokerError.at(response.url, f"its answer holds an {err}") from err


def index_field(response: Response, result: dict[str, Any], name: str) -> int:
    """An index of a JSON answer: a number, or a decimal string from 2^53 up (json_ids)."""
    try:
        return parse_u64(result.get(name), name)
    except ValueError as err:
        raise NotABrokerError.at(response.url, f"its answer has no valid {name!r} index") from err


def url_list(response: Response) -> list[str]:
    """The ``{"urls": [...]}`` of a ping (or cluster change) answer."""
    result = response.json()
    urls = result.get("urls") if isinstance(result, dict) else None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise NotABrokerError.at(response.url, 'its answer is not {"urls": [...]}')
    try:
        return unique(base_url(u) for u in urls)
    except InvalidURLError as err:
        raise NotABrokerError.at(response.url, f"it listed an {err}") from err


def check_content_type(url: str, content_type: str, wanted: str) -> None:
    """Raise unless the answer from ``url`` is of the ``wanted`` media type."""
    if content_type.split(";")[0].strip().lower() != wanted:
        what = "frames" if wanted == FRAMES_CONTENT_TYPE else wanted
        raise NotABrokerError.at(url, f"it sent {content_type or 'no content type'}, not {what}")
