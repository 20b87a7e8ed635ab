"""python -m invariants.gate: the same command as invariants-gate."""

import sys

from invariants.gate.cli import main

sys.exit(main())
