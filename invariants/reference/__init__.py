"""The reference implementation: numpy (`reference.numpy`) and torch (`reference.torch`, CPU and CUDA).

`import reference` gives the numpy reference's protocol functions, so `reference` itself is
a valid `--impl` target; the torch one is imported only when asked for, since torch is an extra.
"""

from invariants.reference.counts import GPT2_SIZES, param_breakdown  # noqa: F401
from invariants.reference.numpy import *  # noqa: F401,F403  (see reference.numpy.__all__)
from invariants.reference.numpy import BACKEND, PROTOCOL_VERSION  # noqa: F401
