"""messaging: an HTTP messaging broker with durable segmented topics.

The face of the package: :class:`Client`, :class:`Conn`, :class:`Consumer`,
:class:`Message`, :class:`MessagingError` and ``__version__``. The client names are imported
on first use, so that importing a part of the package (the codec in a Spark executor, say)
does not load the HTTP client.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("messaging")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

_FACE = {"Client": "messaging.client.client", "Conn": "messaging.client.conn",
         "Consumer": "messaging.client.consumer", "Message": "messaging.frames",
         "MessagingError": "messaging.errors"}

__all__ = ["Client", "Conn", "Consumer", "Message", "MessagingError", "__version__"]

if TYPE_CHECKING:
    from messaging.client.client import Client
    from messaging.client.conn import Conn
    from messaging.client.consumer import Consumer
    from messaging.errors import MessagingError
    from messaging.frames import Message


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'messaging' has no attribute {name!r}")
    return getattr(import_module(module), name)
