"""python -m gate: the same command as invariants-gate."""

import sys

from gate.cli import main

sys.exit(main())
