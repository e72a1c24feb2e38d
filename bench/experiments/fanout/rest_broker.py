"""Our broker with the fan-out's rest threshold set from the command line, for the fan-out
experiment: ``python -m bench.experiments.fanout.rest_broker REST_FROM broker ARGS...``.

``REST_FROM`` replaces :data:`messaging.http.fanout.REST_FROM` (seconds a slice of followers must
keep the loop busy before a rest follows it); ``inf`` means never rest. Nothing else differs
from ``python -m messaging.cli.main broker ARGS...``.
"""

from __future__ import annotations

import math
import sys

from messaging.cli.main import main
from messaging.http import fanout

if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: rest_broker REST_FROM broker ARGS...")
    try:
        rest_from = float(sys.argv[1])
    except ValueError:
        sys.exit(f"rest_broker: REST_FROM must be a number of seconds, not {sys.argv[1]!r}")
    if math.isnan(rest_from) or rest_from < 0:
        sys.exit("rest_broker: REST_FROM must be 0 or more")
    fanout.REST_FROM = rest_from
    sys.exit(main(sys.argv[2:]))
