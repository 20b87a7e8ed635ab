"""Declared conventions: module-level constants with which an implementation says how it differs from the reference without being wrong.

    GELU_FORM = "erf"          # in the implementation's module (or adapter class)
    ATTENTION_BIASES = True    # transformer_block and gpt_logits read b_q, b_k, b_v, b_o

A declaration picks which reference applies, which inputs are drawn, or which invariants run; it
never turns a false law true, and loosens no tolerance but to the rounding it declares (COMPUTE_DTYPE:
float32's, rounding_dtype), so it can only make the suite check less; a
numeric one is bounded to the values real code uses (EPS_BOUNDS, RATIO_BOUNDS), so no declared value
makes the reference trivial (an eps of 1e300 made every LayerNorm its bias). An invariant skipped
because of a declaration says so with a `Declared` reason (see `declared_skip`), and the run's
summary counts those skips apart. A wrong declaration fails loudly: the comparisons use the
declared convention only (declaring "erf" for a tanh GELU fails gelu_agrees_with_reference, and
the block's and the model's agreement with the reference).
"""

from __future__ import annotations

import functools
import reprlib
from dataclasses import dataclass

import numpy as np

from invariants.boundary import declared_value, rounded
from invariants.reference.numpy import EPS as PROTOCOL_EPS  # 1e-5: the eps the suite passes to layer_norm and rms_norm, and the protocol's block uses


class Declared(str):
    """A skip reason that comes from a declared convention (counted apart in the summary)."""


# Where real code sits, for the numeric conventions' bounds (a declaration outside them is refused).
# eps: BERT's LayerNorm 1e-12; GPT-2's and PyTorch's nn.LayerNorm default 1e-5; Llama's, T5's and Gemma's norms 1e-6 or 1e-5;
# Keras's LayerNormalization default 1e-3, the largest in common use; torch.nn.RMSNorm(eps=None) uses finfo(dtype).eps, 2.2e-16 in
# float64, the smallest. The norm invariants' rows have a variance of 1e-2 or more (strategies.norms.norm_rows: std >= 0.1), ten
# times the largest eps, and the blocks' inputs and the models' embeddings are grid values of std 1, so a norm at any allowed eps
# still depends on its input (tests/test_declaration_bounds.py): an eps of 1e300 turned every LayerNorm into its bias, and every
# block and model into constants that code without them could return.
EPS_BOUNDS = (1e-16, 1e-3)
EPS_IN_REAL_CODE = "real norms use 1e-12 (BERT) to 1e-3 (Keras), most 1e-5 (GPT-2, PyTorch) or 1e-6 (Llama, T5)"
# d_ff / d_model: 4 in GPT-2, BERT, ViT, Whisper and the original Transformer; 8 in M2M-100 1.2B; 16 in T5-3B; 64 in
# T5-11B (d_ff 65,536 at d_model 1,024), the widest in use. The parent draws ratio·d_model hidden units per network (d_model
# <= 18 in the suite, so d_ff <= 1,152 at 64: the ci profile's feed_forward, block, model and moe agreement checks take
# 0.1-0.2 s at 64 as at 4); FEED_FORWARD_RATIO = 50,000 drew weights until the parent hit its 8 GiB cap.
RATIO_BOUNDS = (1, 64)
RATIO_IN_REAL_CODE = "real networks use 4 (GPT-2, BERT, ViT), 8 (M2M-100), 16 (T5-3B), at most 64 (T5-11B)"
# RoPE base θ: 10,000 in RoFormer, GPT-NeoX, GPT-J, Llama 1 and 2, Mistral 7B v0.1 (the smallest in use); 500,000 in Llama 3;
# 1,000,000 in CodeLlama, Qwen2 and Mistral-Nemo; 10,000,000 in Qwen2.5-7B-Instruct-1M (the largest). θ_0 = 1 at any base,
# so pair 0 turns by p radians whatever is declared, and the rope invariants still see every pair rotate at 10,000.
THETA_BOUNDS = (1e4, 1e7)
THETA_IN_REAL_CODE = "real RoPE uses 10,000 (Llama 2), 500,000 (Llama 3), 1,000,000 (Qwen2, CodeLlama), at most 10,000,000 (Qwen2.5-1M)"
# Tokens per decode chunk after the prefill: 1 in the one-token generate loops of from-scratch decoders; the suite draws at
# most 6 tokens per sequence, so any limit of 6 or more narrows nothing; 2**31 - 1 is an int32's largest.
CHUNK_BOUNDS = (1, 2**31 - 1)
CHUNK_IN_REAL_CODE = "one-token steps (1) in most generate loops; chunked prefill and speculative decoding take more"


@dataclass(frozen=True)
class Convention:
    """One declarable constant: its allowed values, the value assumed when it is absent, and what it changes."""

    name: str
    allowed: tuple  # the allowed values, or the allowed type (a tuple of one class)
    default: object
    changes: str  # one sentence: what it changes; the functions it changes are those whose entries honour it (protocol.declarations)
    bounds: tuple | None = None  # for an allowed type: (lowest, highest) value, both allowed
    real: str = ""  # where real code sits within the bounds, for the message

    def problem(self, value):
        """Why `value` cannot be declared for this convention, or None."""
        if self.bounds is not None:
            (kind,), (low, high) = self.allowed, self.bounds
            ok = isinstance(value, kind) and not isinstance(value, bool) and low <= value <= high  # NaN fails both comparisons
            expected = f"{'an' if kind is int else 'a'} {kind.__name__} from {low!r} to {high!r}; {self.real}"
        else:
            ok = any(type(value) is type(a) and value == a for a in self.allowed)  # the type first: an array has no truth value
            expected = " or ".join(map(repr, self.allowed))
        return None if ok else f"{self.name} = {reprlib.repr(value)} is not allowed: expected {expected}"  # a long value cut short


CONVENTIONS = {
    c.name: c
    for c in (
        Convention("GELU_FORM", ("tanh", "erf"), None,
                   "compared with the reference in the declared GELU form only (undeclared: either form, one form for a whole call)"),
        Convention("ATTENTION_BIASES", (True, False), False,
                   "True: the params are also drawn with the attention biases b_q, b_k, b_v, b_o (undeclared or False: never, so an "
                   "implementation without them passes)"),
        Convention("CAUSAL_ONLY", (True, False), False,
                   "True: the invariants of encoder mode (causal=False) are skipped and every other one runs with causal=True only"),
        Convention("ENCODER_ONLY", (True, False), False,
                   "True (no decoder mode: ViT- and BERT-style encoders): the invariants of decoder mode (causal=True) are skipped and "
                   "every other one runs with causal=False only"),
        Convention("ATTENTION_WEIGHTS", (True, False), True,
                   "False: the function returns its output alone (no weights), the weight invariants are skipped and the "
                   "others check the output only"),
        Convention("LAYER_NORM_EPS", (float,), None,
                   "layer_norm always uses this eps, whatever it is passed: the norm invariants pass it, the references of what is "
                   "built on it use it, and the scale law (which needs eps/c²) is skipped",
                   bounds=EPS_BOUNDS, real=EPS_IN_REAL_CODE),
        Convention("LAYER_NORM_BIAS", (True, False), True,
                   "False (a LayerNorm without a bias: nn.LayerNorm(bias=False), x-transformers, nanoGPT's bias=False): every LayerNorm "
                   "is given zero biases (bias, ln1_b, ln2_b, ln3_b, lnf_b)"),
        Convention("FEED_FORWARD_BIASES", (True, False), True,
                   "False (feed-forward layers without biases: nn.TransformerEncoderLayer(bias=False), nanoGPT's bias=False): every "
                   "GELU feed-forward network is given zero b1 and b2"),
        Convention("RMS_NORM_EPS", (float,), None,
                   "rms_norm always uses this eps, whatever it is passed: the invariants pass it, the references of what is built on it "
                   "use it, and the scale law (which needs eps/c²) is skipped", bounds=EPS_BOUNDS, real=EPS_IN_REAL_CODE),
        Convention("FEED_FORWARD_RATIO", (int,), None,
                   "the feed-forward networks are drawn with the hidden width d_ff = ratio·d_model only (undeclared: feed_forward "
                   "takes any width, the blocks, the model and the experts 4·d_model)",
                   bounds=RATIO_BOUNDS, real=RATIO_IN_REAL_CODE),
        Convention("EXPERT_FFN", ("gelu", "swiglu"), "gelu",
                   "'swiglu' (Mixtral, Qwen-MoE, DeepSeek-MoE, OLMoE): the experts are drawn as SwiGLU networks "
                   "{W_gate, W_up, W_down} without biases and compared with the implementation's swiglu (not feed_forward) "
                   "and the reference's; the closed-form MoE counts (GELU experts of 8d² + 5d) are skipped"),
        Convention("TOP_K_TIES", ("lower", "any"), "lower",
                   "'any': the tie-rule invariant is skipped and the gates are checked against any valid top-k set"),
        Convention("ROPE_PAIRING", ("half_split", "interleaved"), None,
                   "compared with the reference in the declared pairing only: pairs (i, i + D/2) (HF, GPT-NeoX) or (2i, 2i + 1) "
                   "(Meta's Llama, GPT-J); undeclared, either, one pairing for a whole call"),
        Convention("QKV_BIASES", (True, False), False,
                   "True: the params are also drawn with the biases b_q, b_k, b_v (Qwen2) (undeclared or False: never)"),
        Convention("FULLY_MASKED_ROWS", ("zeros", "uniform", "any"), "zeros",
                   "what a query that sees no key (every key padded) gets: zero weights and output (the reference, "
                   "SDPA, flash-attention), 'uniform' weights 1/S on every key (an additive finfo.min mask), or 'any' finite values; "
                   "never NaN"),
        Convention("SLIDING_WINDOW", (True, False), True,
                   "False (no sliding window, as transformers' Llama): always passed window=None, and the window invariants are "
                   "skipped"),
        Convention("ROPE_THETA", (float,), None,
                   "drawn with this RoPE base only (undeclared: 10,000, 500,000 and 100), for code whose base is fixed",
                   bounds=THETA_BOUNDS, real=THETA_IN_REAL_CODE),
        Convention("ROPE_BASE_PER_LAYER_TYPE", (True, False), True,
                   "False (one rope_theta for every layer, as in Qwen2, Gemma 2 and gpt-oss; Gemma 3 has one per type): the local and "
                   "global layers are drawn with one RoPE base, and the law that changes one type's base alone is skipped"),
        Convention("COMPUTE_DTYPE", ("float32",), None,
                   "'float32' (RMSNorm, RoPE, LayerNorm or the softmax computed in float32 whatever the input dtype): in a float64 "
                   "run every invariant held to rounding holds it to float32's tolerance (none is skipped), the exact ones run as "
                   "they are; float32 and narrower runs are unchanged"),
        Convention("MAX_DECODE_CHUNK", (int,), None,
                   "decodes are drawn with at most this many tokens in every chunk after the prefill (1: one-token steps)",
                   bounds=CHUNK_BOUNDS, real=CHUNK_IN_REAL_CODE),
        Convention("CHUNKS_WITHIN_WINDOW", (True, False), False,
                   "True (a cache of w slots that refuses a longer prompt or chunk): with a window w, every chunk of a decode (the "
                   "prefill included) and every whole sequence of a forward is drawn with at most w tokens"),
        Convention("DECODE_CHUNKS_WITHIN_WINDOW", (True, False), False,
                   "True (a ring cache of w slots whose full forward takes any length): with a window w, every chunk of a decode (the "
                   "prefill included) is drawn with at most w tokens, and the forwards still get any length"),
        Convention("KEY_MASK", (True, False), True,
                   "False (an attention core without a key-padding mask, as most Llama code): always passed key_mask=None, and "
                   "the invariants of padding are skipped"),
        Convention("CAUSAL_ALIGNMENT", ("bottom_right", "top_left"), "bottom_right",
                   "'top_left' (SDPA's is_causal when L != S: query i sees keys 0..i): drawn with as many queries as keys only, "
                   "and the invariant of queries shorter than keys is skipped"),
    )
}


def read_declarations(namespace):
    """{name: plain value} for every convention `namespace` declares (invariants.boundary.declared_value); ValueError naming the first bad value."""
    found = {}
    for name, convention in CONVENTIONS.items():
        if hasattr(namespace, name):
            value = declared_value(getattr(namespace, name))
            problem = convention.problem(value)
            if problem:
                raise ValueError(problem)
            found[name] = value
    if found.get("CAUSAL_ONLY") and found.get("ENCODER_ONLY"):
        raise ValueError("CAUSAL_ONLY = True and ENCODER_ONLY = True leave attention no mode to run in: declare one of them")
    return found


def declared(impl, name):
    """The value `impl` declares for convention `name`, or the convention's default."""
    return impl.declarations.get(name, CONVENTIONS[name].default)


def declared_skip(name, when, why):
    """An `applies=` function for the registry: a Declared skip reason where impl's value of `name` satisfies `when`, else None.

        applies=declared_skip("CAUSAL_ONLY", lambda only: only, "it compares causal and encoder mode")
    """
    if name not in CONVENTIONS:
        raise ValueError(f"{name} is not a declarable convention (see invariants.conventions.CONVENTIONS)")

    def applies(impl):
        value = declared(impl, name)
        return Declared(f"{impl.label} declares {name} = {value!r}: {why}") if when(value) else None

    return applies


def first_reason(*conditions):
    """An `applies=` function for the registry: the reason of the first of `conditions` (applies= functions) that gives one."""

    def applies(impl):
        return next((reason for reason in (condition(impl) for condition in conditions) if reason), None)

    return applies


NO_ENCODER_MODE = declared_skip("CAUSAL_ONLY", bool, "it has no encoder mode (causal=False), which this invariant is about")
NO_DECODER_MODE = declared_skip("ENCODER_ONLY", bool, "it has no decoder mode (causal=True), which this invariant is about")


def rounding_dtype(impl):
    """The dtype whose rounding impl's answers carry, which every tolerance it is held to is read from: float32 where it computes in
    float32 (COMPUTE_DTYPE = "float32") in a float64 run, else the run's dtype."""
    return "float32" if impl.dtype == "float64" and declared(impl, "COMPUTE_DTYPE") == "float32" else impl.dtype


def input_as_rounded(impl, got, x):
    """What an exact identity law (the output is the input x) holds impl's answer `got` to: x as impl receives it, or x rounded to
    rounding_dtype(impl) where got is that: code that computes in float32 rounds x first, and x·1 + 0 is then x rounded, exactly."""
    seen = impl.as_seen(x)
    if rounding_dtype(impl) == impl.dtype or np.array_equal(got, seen):
        return seen
    return rounded(seen, rounding_dtype(impl)).astype(np.float64)


# -- what a declaration means, for the invariants that read it -------------------------------


def layer_norm_eps(impl):
    """The eps layer_norm is passed and the reference's norms use for impl: LAYER_NORM_EPS where declared, else 1e-5."""
    eps = declared(impl, "LAYER_NORM_EPS")
    return PROTOCOL_EPS if eps is None else eps


def rms_norm_eps(impl):
    """The eps rms_norm is passed for impl: RMS_NORM_EPS where declared, else 1e-5."""
    eps = declared(impl, "RMS_NORM_EPS")
    return PROTOCOL_EPS if eps is None else eps


def attention_biases(impl):
    """The attn_bias choice of the block and model strategies for impl: None (with and without) if it declares support, else False."""
    return None if declared(impl, "ATTENTION_BIASES") else False


# the params' biases that a declaration can leave out, by convention
_BIASES_LEFT_OUT = {"LAYER_NORM_BIAS": frozenset({"ln1_b", "ln2_b", "ln3_b", "lnf_b"}), "FEED_FORWARD_BIASES": frozenset({"b1", "b2"})}


def has_layer_norm_bias(impl):
    """Whether impl's LayerNorms add a bias (the default), or take none (LAYER_NORM_BIAS = False)."""
    return declared(impl, "LAYER_NORM_BIAS")


def biases_as_declared(impl, strategy):
    """strategy (of params dicts, their lists nested in them) with the norm and feed-forward biases impl declares it has not set to zeros.

    The zeros are what the implementation computes with, so they are what the failure report shows.
    """
    left_out = frozenset().union(*(names for name, names in _BIASES_LEFT_OUT.items() if not declared(impl, name)))
    return strategy.map(functools.partial(_zero_biases, names=left_out)) if left_out else strategy


def _zero_biases(value, names):
    if isinstance(value, dict):
        return {k: np.zeros_like(v) if k in names else _zero_biases(v, names) for k, v in value.items()}
    if isinstance(value, list):  # a model's blocks, moe's experts
        return [_zero_biases(v, names) for v in value]
    return value


def causal_modes(impl):
    """The causal flags impl can take: (True,) where CAUSAL_ONLY is declared, (False,) where ENCODER_ONLY is, else (True, False)."""
    if declared(impl, "CAUSAL_ONLY"):
        return (True,)
    return (False,) if declared(impl, "ENCODER_ONLY") else (True, False)


def returns_weights(impl):
    """Whether impl's attention answers (out, weights) (the default) or out alone (ATTENTION_WEIGHTS = False)."""
    return declared(impl, "ATTENTION_WEIGHTS")


def expert_function(impl):
    """The protocol function an expert of impl's moe is: "swiglu" where EXPERT_FFN = "swiglu" is declared, else "feed_forward"."""
    return "swiglu" if declared(impl, "EXPERT_FFN") == "swiglu" else "feed_forward"


def d_ff_for(impl, d_model, default=None):
    """The hidden width impl's feed-forward networks take at d_model: ratio·d_model where FEED_FORWARD_RATIO is declared, else `default`."""
    ratio = declared(impl, "FEED_FORWARD_RATIO")
    return default if ratio is None else ratio * d_model
