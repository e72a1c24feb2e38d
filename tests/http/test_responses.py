"""The error answer of the API: whatever the message holds, the header line is printable."""

from __future__ import annotations

from messaging.http.responses import error_response
from tests.raw_http import PRINTABLE_HEADER


def test_error_response_escapes_every_non_printable_character() -> None:
    message = "".join(map(chr, range(256))) + "\u2028\U0001f600"
    response = error_response(400, message)
    header = response.headers["X-Broker-Error"]
    assert PRINTABLE_HEADER.fullmatch(header.encode("ascii"))
    assert response.text == header + "\n"
    assert r"\x00" in header and r"\x7f" in header and r"\u2028" in header
    assert "".join(map(chr, range(32, 127))) in header  # printable ASCII kept as is
