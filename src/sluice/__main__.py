"""`python -m sluice`: the same entry point as the `sluice` console script."""

import sys

from sluice.cli import main

sys.exit(main())
