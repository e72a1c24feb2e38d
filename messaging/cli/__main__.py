"""``python -m messaging.cli``: the ``messaging`` command."""

import sys

from messaging.cli.main import main

sys.exit(main())
