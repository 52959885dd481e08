"""``python -m autoloop.cli``: the same as the ``autoloop`` command."""

import sys

from autoloop.cli.main import main

sys.exit(main())
