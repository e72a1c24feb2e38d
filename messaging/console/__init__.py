"""The web console's files (``static/``), served at ``/console`` by
:mod:`messaging.http.console`: plain ES modules over the broker's public HTTP API."""
