"""Hypothesis strategies for transformer components: shapes, weights, well-posed inputs, dtypes.

Importable by anyone testing their own implementation; every strategy validates its
arguments (InvalidArgument names the argument, its value and the fix) and says in its
docstring where it keeps a property well-posed. Values shrink towards simple numbers (0, 1, -1,
1/2, ...: see strategies/core.py), so a shrunk counterexample reads like x = [[1.], [0.]].
One module per component, each naming its public strategies in `__all__` and saying in its docstring what they
draw (`help(invariants.strategies.norms)`); this package exports every module's `__all__`, found by listing the package,
so a component's strategies module is all it takes to make its names public. `__init__.pyi` spells the same exports
out for type checkers (generated: `python -m invariants.strategies > invariants/strategies/__init__.pyi`).

Each *_inputs strategy draws a dict in the order its protocol function takes it; attention_args, gqa_args,
cross_args and qk_norm_args turn one into the call's positional arguments.
"""

import importlib
import pkgutil

from invariants.strategies._validation import InvalidArgument


def component_modules():
    """The names of this package's modules that are not private (underscored), sorted."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


def _exports():
    """{public name: value}: InvalidArgument, then each component module's `__all__`; a name two modules export is refused."""
    found = {"InvalidArgument": InvalidArgument}
    for name in component_modules():
        module = importlib.import_module(f"invariants.strategies.{name}")
        if twice := sorted(set(module.__all__) & set(found)):
            raise ImportError(f"invariants.strategies.{name} exports {twice}, which another module of invariants.strategies already does")
        found.update({public: getattr(module, public) for public in module.__all__})
    return found


_EXPORTS = _exports()
globals().update(_EXPORTS)
__all__ = list(_EXPORTS)
