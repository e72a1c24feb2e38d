"""``python -m messaging``: the ``messaging`` command."""

import sys

from messaging.cli.main import main

sys.exit(main())
