"""``python -m messaging``: the ``messaging`` command."""

import sys

from messaging.cli import main

sys.exit(main())
