"""Hypothesis strategies for transformer components, for anyone testing their own code: `from strategies import norm_rows`.

The code lives in invariants/strategies/ (its docstring lists each module's strategies) so that the suite reaches
it by a name that no file of a user's (a strategies.py in the working directory) can shadow; this package exports
its public names.
"""

from invariants.strategies import *  # noqa: F401,F403
from invariants.strategies import __all__  # noqa: F401
