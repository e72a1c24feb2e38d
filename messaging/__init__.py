"""messaging: an HTTP messaging broker with durable segmented topics."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("messaging")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
