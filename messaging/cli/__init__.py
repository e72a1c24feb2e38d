"""The ``messaging`` command: the broker, the client commands, token management."""
