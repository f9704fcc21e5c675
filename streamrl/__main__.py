"""``python -m streamrl``: the ``streamrl`` console script."""

import sys

from streamrl.launch.cli import main

sys.exit(main())
