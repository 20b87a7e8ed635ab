"""The reference implementation's public name: `--impl reference.numpy`, `--impl reference.torch`, or `reference` (numpy).

The code lives in invariants/reference/ so that the suite reaches it by a name that no file of a user's
(a reference.py in the working directory) can shadow; reference.numpy, reference.torch, reference.counts and
reference.text are those modules themselves, and `import reference` gives the numpy reference's protocol functions.
"""

from invariants.reference import *  # noqa: F401,F403
from invariants.reference import BACKEND, GPT2_SIZES, PROTOCOL_VERSION, param_breakdown  # noqa: F401
