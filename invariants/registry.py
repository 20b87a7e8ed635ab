"""The registry of invariants: one entry per property, declared where its check is written.

    @invariant(requires=("attention",), hint="the mask is applied after the softmax ...")
    def causal_non_leakage(impl, case):
        '''Changing tokens at positions >= j leaves attention outputs at positions < j exactly equal.'''
        ...

The docstring's first sentence is the statement a student reads; the hint names the likely
bug. `case.draw(strategy, label)` draws inputs (labelled in the failure report); `impl`
is an invariants.protocol.Implementation. An Invariant is callable as inv(impl, case), so it
can be used inside anyone's own hypothesis test.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

# One module per component, in the order a lesson meets them, with the protocol functions whose laws it holds
# (invariants.diagnosis reads what each builds on from their entries); dtypes holds a law over every entry.
COMPONENTS = {
    "softmax": ("softmax", "cross_entropy"), "norms": ("layer_norm", "rms_norm"), "activation": ("gelu",), "attention": ("attention",),
    "feed_forward": ("feed_forward",), "block": ("transformer_block",), "model": ("gpt_logits",),
    "moe": ("top_k_gates", "moe", "load_balancing_loss", "tokens_per_expert"), "rope": ("rope",), "gqa": ("gqa_attention",),
    "masking": ("gqa_attention",), "swiglu": ("swiglu",), "llama": ("llama_block", "llama_logits"), "decoding": ("llama_decode",),
    "qk_norm": ("qk_norm_attention",),
    "cross_attention": ("cross_attention", "decoder_block"),
    "counts": ("gpt_param_count", "moe_n_params", "moe_active_params", "inference_flops_per_token", "training_flops"),
    "course": ("build_vocab", "encode", "decode", "get_batch"), "dtypes": (),
}

REGISTRY: dict = {}


@dataclass(frozen=True)
class Invariant:
    """A property every correct implementation has, and the bug its failure points to."""

    name: str  # "<component>.<property>", e.g. "attention.causal_non_leakage"
    component: str
    statement: str  # one sentence
    hint: str  # the likely bug when it fails
    requires: tuple  # protocol functions it calls
    backends: tuple  # backends it applies to ("torch" only for autograd checks)
    in_process: bool  # needs the implementation's own callables (autograd, training), not just answers
    check: Callable = field(repr=False)
    applies: Callable = field(default=None, repr=False)  # impl -> a reason it does not apply, or None

    def __call__(self, impl, case):
        return self.check(impl, case)

    def skip_reason(self, impl):
        """Why this invariant cannot run on impl (missing functions, another backend), or None."""
        if impl.backend not in self.backends:
            return f"{self.name} needs the {' or '.join(self.backends)} backend (this run is {impl.backend})"
        if self.in_process and not impl.in_process:
            return f"{self.name} needs the implementation's own callables (autograd); {impl.label} answers from another process"
        return impl.missing(self.requires) or (self.applies(impl) if self.applies else None)


def invariant(*, requires, hint, backends=("numpy", "torch"), in_process=False, applies=None):
    """Register the decorated check(impl, case) as an Invariant named after its module and function.

    in_process=True marks checks that call impl.raw(name) (autograd through the implementation).
    applies(impl) returns a reason the invariant does not apply (a dtype it is ill-posed in, a
    convention the implementation declares), or None; the run is then skipped with that reason.
    """

    def register(check):
        component = check.__module__.rsplit(".", 1)[-1]
        doc = (check.__doc__ or "").strip()
        if not doc or not hint:
            raise ValueError(f"invariant {check.__name__} needs a one-sentence docstring and a hint")
        statement = " ".join(doc.split("\n\n")[0].split())
        inv = Invariant(f"{component}.{check.__name__}", component, statement, hint, tuple(requires), tuple(backends), in_process, check, applies)
        if inv.name in REGISTRY:
            raise ValueError(f"invariant {inv.name} is registered twice")
        REGISTRY[inv.name] = inv
        return inv

    return register


def all_invariants():
    """Every registered invariant, component by component (importing the component modules)."""
    for component in COMPONENTS:
        importlib.import_module(f"invariants.{component}")
    order = {component: i for i, component in enumerate(COMPONENTS)}
    return sorted(REGISTRY.values(), key=lambda inv: order[inv.component])
