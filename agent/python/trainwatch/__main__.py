"""`python -m trainwatch run [options] -- COMMAND...` (trainwatch.cli)."""

import sys

from .cli import main

sys.exit(main())
