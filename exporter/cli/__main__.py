"""``python -m exporter.cli``: the same as the ``fabricscope`` command."""

import sys

from exporter.cli.main import main

sys.exit(main())
