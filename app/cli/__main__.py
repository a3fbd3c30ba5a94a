"""``python -m app.cli …``, the same as ``txlog …``."""

import sys

from app.cli import main

sys.exit(main())
