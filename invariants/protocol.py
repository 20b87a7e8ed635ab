"""The implementation protocol (version 2: version 1 plus the modern decoder) and the wrapper that lets the suite call any implementation.

An implementation is a namespace (a module, a file, an object) that defines some of the
functions in FUNCTIONS, plus BACKEND = "numpy" or "torch". The suite calls them positionally,
exactly as the signatures below are written, with arrays of the implementation's backend,
dtype and device; docs/protocol.md is the user-facing description of the same table.

`Implementation` wraps such a namespace: it rounds the suite's numpy inputs to the dtype and
hands them to a transport, which converts to the backend, calls, and converts the answer back
to numpy (invariants.boundary), so that every invariant is written once, in numpy, whatever
the implementation runs on and whichever process it runs in.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from invariants.answers import NUMBER, TEXT, Either, broadcast, chunk_count, floats, heads, ints, shape_of
from invariants.asserts import assert_close, assert_equal, assert_form, assert_value
from invariants.boundary import (
    CallError,
    OutputError,  # noqa: F401 - raised through here by every transport
    answer,
    first_line,
    rounded,
    to_backend,
    to_numpy,
    where,
)
from invariants.conventions import CONVENTIONS, read_declarations, returns_weights, rounding_dtype
from invariants.tolerance import DTYPES, Tolerance, tolerance_for

PROTOCOL_VERSION = 2
BACKENDS = ("numpy", "torch")


@dataclass(frozen=True)
class ProtocolFunction:
    """One function of the protocol, its entry: how the suite calls it, what it answers, how a report shows a call, what it builds on,
    which declarations it honours.

    Its valid inputs, drawn to honour an implementation's declarations, are invariants.inputs.VALID_INPUTS[name], registered
    (@valid_inputs) by the component module whose HOLDS lists it; the laws written once over every entry (dtypes, shapes,
    finite: invariants.laws.table_laws) read `outputs`, `floating`, `answer_form` and `leaks`. A law calls it through the entry:
    `FUNCTIONS[name].called(impl, inputs, call, x=...)` on a dict of drawn inputs named by its params.
    """

    name: str
    params: tuple[str, ...]  # passed positionally, in this order
    returns: str  # what it answers, as docs/protocol.md's table says it (generated: python -m invariants --protocol)
    summary: str
    arguments: str = ""  # what its arguments are, as that table says it; every entry has one
    # its arguments -> the form of the answer they call for (invariants.answers: an Array, TEXT, Either, or a tuple of them, one per
    # output); the gate holds a worker's declared answer to it, the shape law an answer itself; every entry has one
    answer_form: Callable[..., Any] | None = None
    outputs: tuple[str, ...] = ("out",)  # the answer's parts by name, one name for a single array or value
    floating: tuple[str, ...] = ("out",)  # those that are floating arrays in the input dtype; () for ints, counts and text
    shown: tuple[str, ...] = ()  # the params a report shows with their shape or value; the others appear by name
    builds_on: tuple[str, ...] = ()  # the protocol functions it is composed of (the diagnosis's dependencies)
    # its rounding budget (ROUNDINGS): how many roundings of its dtype a correct answer composes, the factor its checks
    # scale the dtype's tolerance by, measured with the factor and never tuned to pass; None where no check scales by one
    roundings: int | None = None
    version: int = 1  # the protocol version that added it (docs/protocol.md has one table per version)
    details: str = ""  # Markdown printed under that table: params, the computation (generated too)
    # the declared conventions (invariants.conventions.CONVENTIONS) it honours, beyond the two `declarations` adds for every entry of
    # its kind; declarations() lists, from these, the functions that honour each convention (the README's table)
    honours: tuple[str, ...] = ()
    leaks: str = ""  # where a dtype typically leaks in it: the start of its dtype law's hint (invariants.laws.dtypes)

    def __post_init__(self):
        if not self.arguments:
            raise ValueError(f"protocol function {self.name} needs `arguments`, the text of its row in docs/protocol.md")
        if self.answer_form is None:
            raise ValueError(f"protocol function {self.name} needs `answer_form`, the form of the answer its arguments call for")
        unknown = [name for name in self.honours if name not in CONVENTIONS]
        if unknown:
            raise ValueError(f"protocol function {self.name} honours {', '.join(unknown)}: not declarable conventions "
                             "(invariants.conventions.CONVENTIONS)")

    @property
    def declarations(self):
        """Every convention it honours: `honours`, ATTENTION_WEIGHTS where it answers weights (out alone under False) and COMPUTE_DTYPE
        where it answers floats (held to float32's rounding in a float64 run)."""
        implied = (("ATTENTION_WEIGHTS",) if "weights" in self.outputs else ()) + (("COMPUTE_DTYPE",) if self.floating else ())
        return tuple(name for name in CONVENTIONS if name in self.honours or name in implied)

    @property
    def answers_arrays(self):
        """Whether it answers arrays (floats, ids or counts), not a lone number or text: the shape law draws those."""
        return self.outputs != VALUE["outputs"]

    @property
    def signature(self):
        return f"{self.name}({', '.join(self.params)})"

    def describe(self, args, note="", *, every=False, dtype=None):
        """The call as a report shows it: attention(x[2, 3, 4], W_q, W_k, W_v, W_o, n_heads=2, causal=True) and `note`.

        args: the arguments in protocol order, or {param: value} (a param not in it appears by name).
        every=True shows every param; dtype names the floating dtype its arrays were handed over in.
        """
        values = args if isinstance(args, dict) else dict(zip(self.params, args, strict=True))
        shown = self.params if every else self.shown
        text = f"{self.name}({', '.join(_shown(p, values[p], dtype) if p in shown and p in values else p for p in self.params)})"
        return f"{text} {note}" if note else text

    def answered(self, impl, args):
        """Call impl with `args` and split its answer into this entry's parts: (the call as a report shows it, [(label, part, value, form)]).

        One (label, part, value, form) per output, `form` the part's answer_form; out alone where impl declares
        ATTENTION_WEIGHTS = False. A tuple of another length is a violation that names the parts.
        """
        __tracebackhide__ = True
        call = self.describe(args, every=True, dtype=impl.dtype)
        parts = self._split(impl, impl.call(self.name, *args), args, call)
        if len(parts) == 1:
            return call, [(self.signature, *parts[0])]
        return call, [(f"{self.signature}[{i}] ({part})", part, value, form) for i, (part, value, form) in enumerate(parts)]

    def arguments_of(self, inputs):
        """The call's arguments, in protocol order, from a dict of drawn inputs named by the params (the strategies' *_inputs draw those)."""
        return tuple(inputs[param] for param in self.params)

    def called(self, impl, inputs, call, **changes):
        """checked() on the inputs dict with `changes` swapped in: the parts of impl's answer, each held to its form (weights None
        where impl declares ATTENTION_WEIGHTS = False)."""
        __tracebackhide__ = True
        return self.checked(impl, self.arguments_of({**inputs, **changes}), call)

    def assert_parts(self, got, expected, what, call, tolerances=None, *, select=None):
        """Each part of the answer `got` that impl returned equals that part of `expected`: bitwise where `tolerances` is None, else
        within tolerances[part]. The weights come first (an error there is the output's cause) and are left out where impl returns
        none (None: ATTENTION_WEIGHTS = False); `select` maps (part, value) to the elements compared, on both sides; a failure names
        "<name> <output|weights> <what>"."""
        __tracebackhide__ = True
        parts = sorted(zip(self.outputs, got, expected, strict=True), key=lambda answered: answered[0] != "weights")
        for part, got_part, expected_part in parts:
            if got_part is None:
                continue
            if select is not None:
                got_part, expected_part = select(part, got_part), select(part, expected_part)
            label = f"{self.name} {'output' if part == 'out' else part} {what}".rstrip()
            if tolerances is None:
                assert_equal(got_part, expected_part, label, call)
            else:
                assert_close(got_part, expected_part, label, tolerances[part], call)

    def checked(self, impl, args, call):
        """impl.<name>(*args) as a tuple of its parts (out, weights), each held to its answer_form; weights None under ATTENTION_WEIGHTS = False.

        The parts are named as the laws' reports name them ("attention output", "attention weights"); `call` is how they show the call.
        """
        __tracebackhide__ = True
        parts = self._split(impl, impl.call(self.name, *args), args, call)
        values = tuple(assert_form(value, form, f"{self.name} {'output' if part == 'out' else part}", call) for part, value, form in parts)
        return values + (None,) * (len(self.outputs) - len(values))

    def _split(self, impl, answer, args, call):
        """[(part, value, form)] of an answer: out alone where impl declares ATTENTION_WEIGHTS = False; a tuple of another length is a violation."""
        __tracebackhide__ = True
        outputs, form = self.outputs, self.answer_form(*args)
        if len(outputs) == 1:
            return [(outputs[0], answer, form)]
        if "weights" in outputs and not returns_weights(impl):
            assert_value(len(answer) if isinstance(answer, tuple) else 1, 1,
                         f"number of arrays {self.name} returned (out alone, as ATTENTION_WEIGHTS = False declares)", call)
            return [(outputs[0], answer, form[0])]
        assert_value(len(answer) if isinstance(answer, tuple) else 1, len(outputs), f"number of arrays {self.name} returned ({', '.join(outputs)})",
                     call)
        return list(zip(outputs, answer, form, strict=True))


def _shown(param, value, dtype):
    """One argument as a call shows it: an array by its shape (index lists and masks by value), a scalar by its value."""
    if isinstance(value, np.ndarray):
        if value.dtype == bool:  # a key mask: one row of 0/1 per batch item
            return f"{param}=[{', '.join(''.join('1' if m else '0' for m in row) for row in np.atleast_2d(value))}]"
        if value.dtype.kind in "iu" and value.ndim <= 1:  # positions, chunks
            return f"{param}={value.tolist()}"
        kind = f" {'int64' if value.dtype.kind in 'iu' else dtype}" if dtype else ""
        return f"{param}{list(value.shape)}{kind}"
    if isinstance(value, dict):  # params: by name; with the dtype, its keys and the dtype its arrays went in
        return f"{param}={{{', '.join(value)}}} in {dtype}" if dtype else param
    if isinstance(value, (list, tuple)):  # experts
        return f"{param}[{len(value)}]"
    return f"{param}={value!r}"


VALUE: dict[str, Any] = dict(outputs=("value",), floating=())  # an int, a count or a str: no dtype to keep
ATTENTION: dict[str, Any] = dict(outputs=("out", "weights"), floating=("out", "weights"))  # out alone where ATTENTION_WEIGHTS = False

QK_NORM_DETAILS = """\
**qk_norm_attention** is causal grouped-query attention with QK-norm, as in Qwen3 and Gemma 3: params
`W_q (d, H·D)`, `W_k (d, H_kv·D)`, `W_v (d, H_kv·D)`, `W_o (H·D, d)`, and the gains `q_norm (D,)` and
`k_norm (D,)`, each shared by every head. d need not be H·D (Qwen3 sets head_dim apart; the suite draws both).

```
q, k, v = split_heads(x·W_q), split_heads(x·W_k), split_heads(x·W_v)      # (B, H, T, D), (B, H_kv, T, D) twice
q, k = RMSNorm(q; q_norm), RMSNorm(k; k_norm)     # each head over its own D features, eps 1e-5 (or RMS_NORM_EPS); never v
q, k = RoPE(q, positions), RoPE(k, positions)      # after the norm
out = merge_heads(gqa_attention(q, k, v, causal=True, None, None))·W_o
```

Only the per-head variant is this function. OLMo 2 normalises the whole projection (all H·D features at once, gains of
width H·D and H_kv·D: transformers' `Olmo2Attention`); it is another function, and it fails
`qk_norm.head_rescaling_invariant` and `qk_norm.agrees_with_reference` if adapted with the gains tiled
(tests/test_qk_norm.py). Gemma 3 multiplies by (1 + w): an adapter passes w = gain − 1. The declarations it honours:
`ROPE_PAIRING`, `ROPE_THETA`, `RMS_NORM_EPS`, `ATTENTION_WEIGHTS = False` (`qk_norm.weights_bounded_below` is then
skipped) and `COMPUTE_DTYPE = "float32"` (a float64 run holds the four laws held to rounding to float32's: `agrees_with_reference`,
`relative_positions`, `repeated_kv_heads`, `head_rescaling_invariant`). `invariants/adapters/qwen3.py` puts transformers'
`Qwen3Attention` behind it.
"""

ROUTING_DETAILS = """\
**grouped_top_k_gates** is DeepSeek-V3's router (`noaux_tc`; transformers' `DeepseekV3TopkRouter`, DeepSeek-V3's
`inference/model.py` `Gate`). The experts form `n_group` groups of E/n_group consecutive experts, at least two in each:

```
s = σ(router_logits)                        # (N, E) affinities
c = s + bias                                # the balancing bias steers the choice only
group score = the sum of the two largest c of the group; keep the topk_group best groups
chosen = the k largest c among the experts of the kept groups (never one of a dropped group)
gates = s[chosen] (/ Σ s[chosen] where norm_topk_prob) · routed_scaling_factor, 0 elsewhere
```

The gates sum to `routed_scaling_factor` where `norm_topk_prob` (DeepSeek-V3: True, 2.5; n_group 8, topk_group 4, k 8 of
256). The report (§2.1.2) scores a group (a node) by its K_r/M highest affinities, which is 8/4 = 2 for the published model;
the code sums the top two whatever k and topk_group are, and the protocol follows the code. Where scores tie, any of the tied
experts or groups may be chosen. **softmax_top_k_gates** is Qwen3-MoE's (`Qwen3MoeTopKRouter`; Qwen2-MoE and OLMoE with
`norm_topk_prob = False`): with `norm_topk_prob` it equals `top_k_gates`, Mixtral's and gpt-oss's top-k on the logits then a
softmax over the chosen. **expert_bias_update** is the auxiliary-loss-free balancing step (§2.1.2; Megatron-LM's
`get_updated_expert_bias`): `bias + rate · sign(mean(tokens_per_expert) − tokens_per_expert)`.
"""

ROPE_SCALING_DETAILS = """\
**rope_frequencies** answers what transformers' `ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len)` does, for `d_head` the
rotated width (`int(head_dim · partial_rotary_factor)`) and θ_i = base^(-2i/d_head), L_0 = `original_max_position_embeddings`:

```
default   θ_i                                                     factor 1
linear    θ_i / s                                                 factor 1     (rope at positions / s)
dynamic   θ_i of base · (s·max(seq_len, L_0)/L_0 − (s − 1))^(d/(d−2))   factor 1     (plain rope up to L_0)
llama3    θ_i where 2π/θ_i < L_0/high_freq_factor; θ_i / s where 2π/θ_i > L_0/low_freq_factor;
          between, (1 − γ)·θ_i/s + γ·θ_i, γ = (L_0·θ_i/2π − low_freq_factor)/(high_freq_factor − low_freq_factor)   factor 1
yarn      θ_i/s·r_i + θ_i·(1 − r_i), r_i the ramp from 0 (pairs up to where beta_fast rotations fit in L_0, floored where truncate)
          to 1 (from where beta_slow do, ceiled);  factor yarn_mscale(s, mscale)/yarn_mscale(s, mscale_all_dim) where both are
          set, else 0.1·ln s + 1
longrope  θ_i / short_factor[i] for seq_len ≤ L_0, θ_i / long_factor[i] past it;  factor √(1 + ln S / ln L_0), S = max_position_embeddings / L_0
```

yarn_mscale(s, m) = 0.1·m·ln s + 1 (1 for s ≤ 1). The attention factor multiplies cos and sin. **softmax_scale** is 1/√d_head,
times yarn_mscale(s, mscale_all_dim)² where a YaRN config sets `mscale_all_dim`: DeepSeek-V2/V3 fold the magnitude into the
softmax scale (and their attention factor is then 1), so a score's rotary part is scaled by yarn_mscale(s, mscale)² in all.
Frequencies and factors are config constants: held to float32's rounding whatever the run's dtype, never rounded to bfloat16.
The answer is a function of the arguments alone: a cache of cos and sin grown for a long sequence is recomputed for a short one.
**partial_rope** turns the first int(D · partial_rotary_factor) features of each head (GPT-NeoX's `rotary_pct`, Phi-2 0.4,
StableLM 0.25, ChatGLM 0.5) in the declared `ROPE_PAIRING` within that width, and passes the rest through bit for bit.
"""

SCORES_DETAILS = """\
**alibi_attention** is BLOOM's, MPT's and Baichuan's attention: no rotary; head h adds `-slopes[h]·(S − T + i − j)` to query
i's scaled score `q·k/√D` of key j, the query at position S − T + i (bottom-right, as a KV cache puts it). BLOOM adds
`slopes[h]·j` (key positions counted in real tokens, the cumulative sum of the mask) and MPT `slopes[h]·(j − S + 1)`: each
differs from the protocol's by a constant per row, which the softmax cancels, wherever the padding is on the left or the
right. **alibi_slopes** are Press et al.'s (2022, §3, and their code's `get_slopes`), as BLOOM's `build_alibi_tensor`
computes them: for H = 8, 1/2, 1/4, ..., 1/256; for H = 12 the eight of H = 8, then 2^(-0.5), 2^(-1.5), 2^(-2.5), 2^(-3.5).
**softcapped_attention** caps the scaled scores, `cap·tanh(s / cap)`, then masks (Gemma 2: `attn_logit_softcapping` 50,
`final_logit_softcapping` 30, which is **softcap** on the logits); a mask applied first would turn −∞ into −cap and leak.
**sink_attention** is gpt-oss's: `softmax([s_1 .. s_S, sinks[h]])` with the sink's column dropped, so each row's weights
sum to `1 − e^sink / (e^sink + Σ e^s)`, and a row that sees no key gets weights 0 and output 0 whatever FULLY_MASKED_ROWS says.
"""

MLA_DETAILS = """\
**mla_attention** is DeepSeek-V2's multi-head latent attention (§2.1; DeepSeek-V3, Kimi K2; transformers'
`DeepseekV3Attention`, DeepSeek-V3's `inference/model.py` `MLA`). params: `W_q (d, H·(D_n + D_r))` where the query is not
compressed (DeepSeek-V2-Lite), else `W_dq (d, r_q)`, `q_norm (r_q,)`, `W_uq (r_q, H·(D_n + D_r))`; `W_dkv (d, r_kv)`,
`kv_norm (r_kv,)`, `W_kr (d, D_r)`, `W_uk (r_kv, H·D_n)`, `W_uv (r_kv, H·D_v)`, `W_o (H·D_v, d)`. The widths are read from
them: D_n = qk_nope_head_dim, D_r = qk_rope_head_dim (even), D_v = v_head_dim, r_q = q_lora_rank, r_kv = kv_lora_rank.

```
q = split_heads(RMSNorm(x·W_dq; q_norm)·W_uq)          # (B, H, T, D_n + D_r), or split_heads(x·W_q)
q = [q[..., :D_n], RoPE(q[..., D_n:], positions)]       # each head: D_n position-free features, then D_r rotated
c = RMSNorm(x·W_dkv; kv_norm)                           # (B, T, r_kv): the latent, eps 1e-5 (or RMS_NORM_EPS)
k_r = RoPE(x·W_kr, positions)                           # (B, T, D_r): ONE RoPE key, shared by every head
k_h = [c·W_uk_h, k_r], v_h = c·W_uv_h                   # head h's key and value
out = merge_heads(softmax(q_h·k_hᵀ · mscale²/√(D_n + D_r), causal)·v_h)·W_o
```

`mscale` is YaRN's attention factor 0.1·mscale_all_dim·ln(factor) + 1 (DeepSeek-V3: factor 40, mscale_all_dim 1, so 1.369),
folded squared into the softmax scale; 1 without YaRN. **mla_decode** runs the same in chunks on its own cache and answers
the cache after the last chunk: per token the latent c and the rotated k_r, `r_kv + D_r` numbers whatever H (DeepSeek-V3:
576 where per-head keys and values would be 128·(192 + 128) = 40,960). Any method that equals `mla_attention` is right; the
paper's absorbed one folds W_uk into the query (q_h·W_uk_hᵀ against c) and W_uv into the output. RoPE pairs: DeepSeek's
code rotates interleaved pairs (2i, 2i + 1) (`view_as_complex`), as transformers does with `rope_interleave = True` (its
default); `rope_interleave = False` is half-split, for weights permuted at conversion. Declare `ROPE_PAIRING`. The
declarations it honours: `ROPE_PAIRING`, `ROPE_THETA`, `RMS_NORM_EPS`, `ATTENTION_WEIGHTS = False`, `COMPUTE_DTYPE = "float32"`.
"""

GEMMA_DETAILS = """\
**geglu** is Gemma's MLP (Gemma 1, 2 and 3; transformers' `Gemma3MLP`): `down_proj(GELU(gate_proj(x)) * up_proj(x))` with the
tanh GELU (`gelu_pytorch_tanh`), the form Gemma's checkpoints were trained with; the exact GELU is another function
(huggingface/transformers#29402, mlc-ai/mlc-llm#2106). GELU_FORM does not apply to it. **scaled_embedding** multiplies the rows
`table[ids]` by √d rounded to the table's dtype first (`Gemma3TextScaledWordEmbedding`: `embed_scale.to(weight.dtype)`): in
bfloat16 √3072 = 55.43 becomes 55.5 and √2048 = 45.25 stays, and a product with 55.43 rounded afterwards differs from Gemma's.
**gemma_rms_norm** is `Gemma3RMSNorm`: `x / √(mean(x²) + eps) · (1 + w)`, with x, w and the whole product in float32 (or wider)
and one rounding back to x's dtype; Llama rounds the normalised x to its dtype and then multiplies by its gain.
"""

LAYER_TYPES_DETAILS = """\
**hybrid_logits** and **hybrid_decode** take transformers' `layer_types`, one per block: `"sliding_attention"` (a local layer:
each query sees its last `window` keys, itself included, with RoPE base `rope_bases["sliding_attention"]`) or `"full_attention"`
(a global layer: every earlier key, RoPE base `rope_bases["full_attention"]`). Gemma 2 alternates them from a sliding layer 0
(window 4096, one base 10,000); Gemma 3 has five local layers to one global (`layer_types[i]` full where (i + 1) % 6 == 0; window
1024; bases 10,000 local and 1,000,000 global); gpt-oss alternates from a sliding layer 0 (window 128); Qwen2 with
`use_sliding_window` has its first `max_window_layers` layers full and the rest sliding. A model with one type everywhere is
`llama_logits` (every layer full: no window; every layer sliding: that window). **hybrid_decode**'s cache may keep only the last
w − 1 positions (or more) in a sliding layer and must keep every position in a full one. A model with one `rope_theta` for every
layer (Qwen2, Gemma 2, gpt-oss) declares `ROPE_BASE_PER_LAYER_TYPE = False` and is given equal bases.
"""

STREAMING_DETAILS = """\
**streaming_attention** is StreamingLLM's (Xiao et al. 2023, §3.2; mit-han-lab/streaming-llm's `StartRecentKVCache` with its
`pos_shift` attention): a cache of `cache_size` slots keeps the first `n_sink` tokens (the attention sinks; the paper keeps 4)
and the last `cache_size − n_sink`, so query t sees keys j ≤ t with j < n_sink or j > t − (cache_size − n_sink): every key
while t < cache_size. RoPE is applied at the positions **within the cache**, not in the text: the m keys a query sees sit at
0 .. m − 1 in order and the query at m − 1 (the paper's cache [0, 1, 2, 3, 6, 7, 8] decoding token 9 is at 0 .. 7). A window
key then keeps its distance to the query and a sink sits next to the window, so at t ≥ cache_size a query sees what the last
query of a fresh stream of its cache's tokens sees; with `n_sink = 0` it is `gqa_attention` with `window = cache_size` on
`rope`'s queries and keys. Keys are cached before RoPE and rotated at each step (the paper), or cached rotated and re-rotated
by the shift at each eviction (transformers' `SinkCache`, llama.cpp's K-shift): the same numbers. q, k and v are given before
RoPE. **streaming_decode** runs it one token at a time on the implementation's own cache and answers, after each token, the
tokens its slots hold (−1 for an empty one): the sinks and the last `cache_size − n_sink − 1` (what the next query needs),
never one the current query did not see, none twice. Each query's scale is 1/√D.
"""

FUNCTIONS = {
    f.name: f
    for f in (
        ProtocolFunction(
            "softmax",
            ("x", "axis"),
            "same shape; exp(x)/Σexp(x) along `axis`",
            "exp(x)/Σexp(x) along axis",
            arguments="any float array",
            shown=("x", "axis"),
            leaks=("softmax's answer is not in x's dtype: the sum or the max is taken in float64 (dtype=np.float64), or "
                   "the exponentials are written into a new buffer in the default dtype"),
            answer_form=lambda x, axis: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "layer_norm",
            ("x", "gain", "bias", "eps"),
            "(..., d): population variance, eps inside √",
            "per-row LayerNorm, population variance",
            arguments="x (..., d), gain (d,), bias (d,), eps float",
            shown=("x", "eps"),
            honours=("LAYER_NORM_EPS", "LAYER_NORM_BIAS"),
            leaks=("eps or the width d enters layer_norm as a numpy float64 scalar (eps = np.float64(eps), x.sum(-1) / "
                   "np.float64(d), var + np.array(eps))"),
            answer_form=lambda x, gain, bias, eps: floats(broadcast(x, gain, bias)),
        ),
        ProtocolFunction(
            "rms_norm",
            ("x", "gain", "eps"),
            "(..., d): x / √(mean(x²) + eps) · gain",
            "per-row RMSNorm",
            arguments="x (..., d), gain (d,)",
            shown=("x", "eps"),
            honours=("RMS_NORM_EPS",),
            leaks=("eps or 1/√d enters rms_norm as a numpy float64 scalar (np.float64(eps), x / np.sqrt(d), "
                   "np.mean(x**2, dtype=np.float64))"),
            answer_form=lambda x, gain, eps: floats(broadcast(x, gain)),
        ),
        ProtocolFunction(
            "gelu",
            ("x",),
            "same shape; tanh or erf form (they differ by < 4.8e-4)",
            "GELU (tanh or erf form)",
            arguments="any",
            shown=("x",),
            honours=("GELU_FORM",),
            leaks=("GELU's constant √(2/π) is np.sqrt(2 / np.pi), a numpy float64 scalar (math.sqrt(2 / math.pi) is a "
                   "Python float), or the erf form goes through math.erf / scipy in float64"),
            answer_form=lambda x: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "cross_entropy",
            ("logits", "targets"),
            "scalar: mean NLL in nats",
            "mean NLL in nats; logits (..., V), int targets (...)",
            arguments="logits (..., V), targets (...) int",
            outputs=("loss",), floating=("loss",), shown=("logits",),
            leaks=("the loss comes back as a Python float (loss.item(), float(loss)), or it is averaged in float64 "
                   "(np.mean(..., dtype=np.float64), a sum divided by np.float64(N))"),
            answer_form=lambda logits, targets: NUMBER,
        ),
        ProtocolFunction(
            "attention",
            ("x", "W_q", "W_k", "W_v", "W_o", "n_heads", "causal"),
            "`(out (B, T, d), weights (B, H, T, T))`; `out` alone with `ATTENTION_WEIGHTS = False`",
            "multi-head self-attention; x (B, T, d), each W (d, d)",
            arguments="x (B, T, d), each W (d, d)",
            # the roundings between its inputs and its output (q, k, q·kᵀ, /√D, the softmax, v, weights @ v, @ W_o), where the table
            # allows for one operation; the softmax also passes the scores' absolute error on as the weights' relative error.
            # Measured on reference.torch over 2000 examples: the worst error is 0.32 of the bound so scaled in float16 (the weights),
            # 0.16 in bfloat16.
            **ATTENTION, shown=("x", "n_heads", "causal"), builds_on=("softmax",), roundings=8,
            honours=("CAUSAL_ONLY", "ENCODER_ONLY"),
            leaks=("the scores are scaled by 1 / np.sqrt(D), a numpy float64 scalar (math.sqrt(D) or D ** -0.5 keep the "
                   "dtype), or the causal mask is a float array of 0 and -inf made in float64 or torch's default dtype "
                   "and added to the scores"),
            answer_form=lambda x, W_q, W_k, W_v, W_o, n_heads, causal: (floats(shape_of(x)), floats(heads(x, n_heads, shape_of(x)[-2]))),
        ),
        ProtocolFunction(
            "feed_forward",
            ("x", "W1", "b1", "W2", "b2"),
            "(..., d): GELU between",
            "GELU MLP; W1 (d, F), W2 (F, d)",
            arguments="x (..., d), W1 (d, F), b1 (F,), W2 (F, d), b2 (d,)",
            shown=("x", "W1"), builds_on=("gelu",),
            honours=("GELU_FORM", "FEED_FORWARD_BIASES", "FEED_FORWARD_RATIO"),
            leaks=("GELU's √(2/π) is np.sqrt(2 / np.pi) (a numpy float64 scalar), or the hidden layer is written into a "
                   "buffer in the default dtype"),
            answer_form=lambda x, W1, b1, W2, b2: floats(shape_of(x)[:-1] + shape_of(W2)[-1:]),
        ),
        ProtocolFunction(
            "transformer_block",
            ("x", "params", "n_heads", "causal"),
            "(B, T, d): pre-norm",
            "pre-norm block; params: ln1_g ln1_b W_q W_k W_v W_o ln2_g ln2_b W1 b1 W2 b2",
            arguments="x (B, T, d), params dict (below)",
            shown=("x", "n_heads", "causal"), builds_on=("layer_norm", "attention", "feed_forward"),
            honours=("GELU_FORM", "ATTENTION_BIASES", "CAUSAL_ONLY", "ENCODER_ONLY",
                     "LAYER_NORM_EPS", "LAYER_NORM_BIAS", "FEED_FORWARD_BIASES", "FEED_FORWARD_RATIO"),
            leaks=("a part of the block promotes (layer_norm's eps, attention's 1 / np.sqrt(D), GELU's np.sqrt(2 / "
                   "np.pi)), or the residual stream is accumulated in a new buffer of the default dtype"),
            answer_form=lambda x, params, n_heads, causal: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "gpt_logits",
            ("ids", "params", "n_heads"),
            "(B, T, V); `ValueError` for ids ∉ [0, V) or T > max_len",
            "decoder-only LM; params: wte (V, d), wpe (max_len, d), blocks [...], lnf_g, lnf_b; ValueError on bad ids",
            arguments="ids (B, T) int, params dict (below)",
            outputs=("logits",), floating=("logits",), shown=("ids", "n_heads"), builds_on=("transformer_block", "layer_norm"),
            honours=("GELU_FORM", "ATTENTION_BIASES", "LAYER_NORM_EPS", "LAYER_NORM_BIAS", "FEED_FORWARD_BIASES", "FEED_FORWARD_RATIO"),
            leaks=("the embeddings are gathered into a new buffer of the default dtype (np.zeros((B, T, d)), "
                   "torch.zeros(B, T, d)), or a part promotes (layer_norm's eps, attention's 1 / np.sqrt(D), GELU's "
                   "np.sqrt(2 / np.pi))"),
            answer_form=lambda ids, params, n_heads: floats(shape_of(ids) + shape_of(params["wte"])[:1]),
        ),
        ProtocolFunction(
            "gpt_param_count",
            ("vocab", "d_model", "n_layers", "max_len", "attn_bias"),
            "int: tied output counted once",
            "exact count, tied output",
            arguments="ints, bool",
            **VALUE,
            answer_form=lambda *args: NUMBER,
        ),
        ProtocolFunction(
            "top_k_gates",
            ("router_logits", "k"),
            "(N, E): softmax over each row's k kept scores, 0 elsewhere",
            "softmax over each token's k kept scores, 0 elsewhere",
            arguments="(N, E), int",
            outputs=("gates",), floating=("gates",), shown=("router_logits", "k"), builds_on=("softmax",),
            honours=("TOP_K_TIES",),
            leaks=("the gates are scattered into np.zeros(shape) / torch.zeros(N, E) in the default dtype instead of "
                   "zeros_like(router_logits), or the kept scores' softmax is taken in float64"),
            answer_form=lambda router_logits, k: floats(shape_of(router_logits)),
        ),
        ProtocolFunction(
            "moe",
            ("x", "router", "experts", "k"),
            "(N, d)",
            "x (N, d), router (d, E), experts [{W1, b1, W2, b2}] (EXPERT_FFN = 'swiglu': [{W_gate, W_up, W_down}])",
            arguments='x (N, d), router (d, E), experts: list of E dicts `W1 b1 W2 b2` (or `W_gate W_up W_down` under `EXPERT_FFN = "swiglu"`)',
            shown=("x", "experts", "k"), builds_on=("top_k_gates", "feed_forward", "swiglu"),
            honours=("GELU_FORM", "FEED_FORWARD_BIASES", "FEED_FORWARD_RATIO", "EXPERT_FFN", "TOP_K_TIES"),
            leaks=("the output buffer is np.zeros((N, d)) / torch.zeros(N, d) in the default dtype instead of "
                   "zeros_like(x), or the gates or the router scores are taken in float64"),
            answer_form=lambda x, router, experts, k: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "load_balancing_loss",
            ("router_logits", "k"),
            "scalar: E·Σ f_i·P_i (Switch)",
            "Switch loss E·Σ f_i·P_i",
            arguments="(N, E), int",
            outputs=("loss",), floating=("loss",), shown=("router_logits", "k"), builds_on=("softmax", "tokens_per_expert"),
            honours=("TOP_K_TIES",),
            leaks=("the routing shares f are float64 (np.bincount(...) / (N * k) is float64 whatever the logits: cast it "
                   "to router_logits.dtype), or the loss comes back as a Python float (.item())"),
            answer_form=lambda router_logits, k: NUMBER,
        ),
        ProtocolFunction(
            "tokens_per_expert",
            ("router_logits", "k"),
            "(E,) ints summing to N·k",
            "tokens routed to each expert",
            arguments="(N, E), int",
            outputs=("counts",), floating=(), shown=("router_logits", "k"),
            answer_form=lambda router_logits, k: ints(shape_of(router_logits)[-1:]),
        ),
        ProtocolFunction(
            "moe_n_params",
            ("d_model", "n_experts"),
            "int: router + all experts",
            "router + all experts",
            arguments="ints",
            **VALUE,
            honours=("EXPERT_FFN",),  # the closed-form counts are of GELU experts
            answer_form=lambda *args: NUMBER,
        ),
        ProtocolFunction(
            "moe_active_params",
            ("d_model", "n_experts", "k"),
            "int: router + k experts",
            "router + k experts",
            arguments="ints",
            **VALUE,
            honours=("EXPERT_FFN",),  # the closed-form counts are of GELU experts
            answer_form=lambda *args: NUMBER,
        ),
        ProtocolFunction(
            "inference_flops_per_token",
            ("n_params",),
            "≈ 2N",
            "≈ 2N",
            arguments="a number",
            **VALUE,
            answer_form=lambda *args: NUMBER,
        ),
        ProtocolFunction(
            "training_flops",
            ("n_params", "n_tokens"),
            "≈ 6ND",
            "≈ 6ND",
            arguments="numbers",
            **VALUE,
            answer_form=lambda *args: NUMBER,
        ),
        ProtocolFunction(
            "build_vocab",
            ("text",),
            "str: sorted distinct characters",
            "sorted distinct characters",
            arguments="str",
            **VALUE,
            answer_form=lambda text: TEXT,
        ),
        ProtocolFunction(
            "encode",
            ("text", "vocab"),
            "(n,) ints",
            "characters -> ids",
            arguments="text str, vocab str",
            outputs=("ids",), floating=(),
            answer_form=lambda text, vocab: ints((len(text),)),
        ),
        ProtocolFunction(
            "decode",
            ("ids", "vocab"),
            "str",
            "ids -> characters",
            arguments="ids (n,) int, vocab str",
            **VALUE,
            answer_form=lambda ids, vocab: TEXT,
        ),
        ProtocolFunction(
            "get_batch",
            ("data", "batch_size", "seq_len", "seed"),
            "`(x, y)`, each (batch, seq); y is x shifted by one",
            "y is x shifted by one",
            arguments="data (n,) int",
            outputs=("x", "y"), floating=(),
            answer_form=lambda data, batch_size, seq_len, seed: (ints((batch_size, seq_len)), ints((batch_size, seq_len))),
        ),
        # version 2: the modern decoder
        ProtocolFunction(
            "rope",
            ("x", "positions", "base"),
            "(..., T, D): pair i of the vector at position p rotated counter-clockwise by p·θ_i, θ_i = base^(-2i/D)",
            "rotary embedding: pair i at position p rotated by p·base^(-2i/D)",
            arguments="x (..., T, D), D even; positions (T,) int; base float (10,000 for Llama 2, 500,000 for Llama 3)",
            # roundings: the rotated value: x·cos, the partner·sin, their sum, and cos/sin themselves rounded to the dtype
            shown=("x", "positions", "base"), roundings=4, version=2,
            honours=("ROPE_PAIRING", "ROPE_THETA"),
            leaks="rope's answer is not in x's dtype: cos and sin left in float32 or float64 (round them to x's dtype)",
            answer_form=lambda x, positions, base: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "gqa_attention",
            ("q", "k", "v", "causal", "key_mask", "window"),
            "`(out (B, H, T, D), weights (B, H, T, S))`; `out` alone with `ATTENTION_WEIGHTS = False`",
            "grouped-query attention core; q (B, H, T, D), k, v (B, H_kv, S, D), S >= T; key_mask (B, S) bool or None; window or None",
            arguments=("q (B, H, T, D), k and v (B, H_kv, S, D), T ≤ S; causal bool; key_mask (B, S) bool (True: may be seen) or None; window "
                       "int ≥ 1 or None (only with causal)"),
            # roundings: attention's chain
            **ATTENTION, shown=("q", "k", "causal", "key_mask", "window"), builds_on=("softmax",), roundings=8, version=2,
            honours=("CAUSAL_ONLY", "ENCODER_ONLY", "FULLY_MASKED_ROWS", "SLIDING_WINDOW", "KEY_MASK", "CAUSAL_ALIGNMENT"),
            leaks="gqa_attention's out or weights are not in q's dtype: a mask or a softmax in float32 kept",
            answer_form=lambda q, k, v, causal, key_mask, window: (floats(shape_of(q)[:-1] + shape_of(v)[-1:]),
                                                                 floats(shape_of(q)[:-1] + shape_of(k)[-2:-1])),
        ),
        ProtocolFunction(
            "swiglu",
            ("x", "W_gate", "W_up", "W_down"),
            "(..., d): (SiLU(x·W_gate) ⊙ x·W_up)·W_down",
            "(SiLU(x·W_gate) ⊙ x·W_up)·W_down",
            arguments="x (..., d), W_gate and W_up (d, F), W_down (F, d)",
            # roundings: x·W twice, SiLU's exp and division, the product, the last matmul: a few roundings at the terms' scale
            shown=("x", "W_gate"), roundings=4, version=2,
            leaks="swiglu's answer is not in x's dtype: SiLU computed in float32 or float64 and kept",
            answer_form=lambda x, W_gate, W_up, W_down: floats(shape_of(x)[:-1] + shape_of(W_down)[-1:]),
        ),
        ProtocolFunction(
            "llama_block",
            ("x", "params", "n_heads", "n_kv_heads", "rope_base", "window"),
            "(B, T, d)",
            "RMSNorm pre-norm block, GQA with RoPE, SwiGLU; params: attn_norm W_q W_k W_v W_o ffn_norm W_gate W_up W_down (+ b_q b_k b_v)",
            arguments="x (B, T, d), params (below), ints, float, int or None",
            # roundings: two norms, attention's chain and SwiGLU's, two residual sums: the GPT block's 4 × 2, for the extra RoPE and gate
            shown=("n_heads", "n_kv_heads", "rope_base", "window"), builds_on=("rms_norm", "rope", "gqa_attention", "swiglu"), roundings=8,
            version=2,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "QKV_BIASES", "SLIDING_WINDOW", "ROPE_THETA", "CHUNKS_WITHIN_WINDOW"),
            leaks="llama_block's answer is not in x's dtype: an RMSNorm upcast to float32 not cast back",
            answer_form=lambda x, params, n_heads, n_kv_heads, rope_base, window: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "llama_logits",
            ("ids", "params", "n_heads", "n_kv_heads", "rope_base", "window"),
            "(B, T, V); `ValueError` for ids ∉ [0, V)",
            "Llama-style LM; params: embed (V, d), blocks [...], norm (d,), W_out (d, V); ValueError on ids outside [0, V)",
            arguments="ids (B, T) int, params (below)",
            outputs=("logits",), floating=("logits",), shown=("ids", "n_heads", "n_kv_heads", "rope_base", "window"),
            builds_on=("llama_block", "rms_norm"), version=2,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "QKV_BIASES", "SLIDING_WINDOW", "ROPE_THETA", "CHUNKS_WITHIN_WINDOW"),
            leaks="llama_logits' answer is not in the params' dtype: the final norm or the head upcast",
            answer_form=lambda ids, params, *rest: floats(shape_of(ids) + shape_of(params["embed"])[:1]),
        ),
        ProtocolFunction(
            "llama_decode",
            ("ids", "params", "n_heads", "n_kv_heads", "rope_base", "window", "chunks"),
            "`(logits (B, T, V), cache_positions (n, L, H_kv, S) int)`, or `(logits, cache_sizes (n,) int)` for a cache that grows by what it holds",
            "prefill chunks[0] tokens, then each chunk on the implementation's own KV cache",
            arguments="as `llama_logits`, and chunks (n,) int ≥ 1 summing to T",
            outputs=("logits", "cache_sizes"), floating=("logits",), shown=("ids", "n_heads", "n_kv_heads", "rope_base", "window", "chunks"),
            builds_on=("llama_block", "rms_norm"), version=2,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "QKV_BIASES", "SLIDING_WINDOW", "ROPE_THETA", "MAX_DECODE_CHUNK", "CHUNKS_WITHIN_WINDOW",
                     "DECODE_CHUNKS_WITHIN_WINDOW"),
            leaks="llama_decode's logits are not in the params' dtype: the cache or the head upcast",
            answer_form=lambda ids, params, n_heads, n_kv_heads, rope_base, window, chunks: (
                floats(shape_of(ids) + shape_of(params["embed"])[:1]),
                # cache_positions (n, L, heads, slots): the heads and slots are the cache's own, for the cache law to judge; or cache_sizes (n,)
                Either((ints((chunk_count(chunks), len(params["blocks"]), None, None)), ints((chunk_count(chunks),))))),
        ),
        ProtocolFunction(
            "cross_attention",
            ("x", "memory", "W_q", "W_k", "W_v", "W_o", "n_heads"),
            "`(out (B, T, d), weights (B, H, T, S))`; `out` alone with `ATTENTION_WEIGHTS = False`",
            "queries from x (B, T, d), keys and values from memory (B, S, d), no mask",
            arguments="x (B, T, d), memory (B, S, d), each W (d, d)",
            # roundings: attention's chain
            **ATTENTION, shown=("x", "memory", "n_heads"), builds_on=("softmax",), roundings=8, version=2,
            leaks="cross_attention's out or weights are not in x's dtype",
            answer_form=lambda x, memory, W_q, W_k, W_v, W_o, n_heads: (floats(shape_of(x)), floats(heads(x, n_heads, shape_of(memory)[-2]))),
        ),
        ProtocolFunction(
            "decoder_block",
            ("x", "memory", "params", "n_heads"),
            "(B, T, d)",
            "pre-norm encoder-decoder block: causal self-attention, cross-attention, GELU feed-forward",
            arguments="x (B, T, d), memory (B, S, d), params (below)",
            shown=("x", "memory", "n_heads"), builds_on=("layer_norm", "attention", "cross_attention", "feed_forward"), version=2,
            honours=("GELU_FORM", "LAYER_NORM_EPS", "LAYER_NORM_BIAS", "FEED_FORWARD_BIASES", "FEED_FORWARD_RATIO"),
            leaks="decoder_block's answer is not in x's dtype",
            answer_form=lambda x, memory, params, n_heads: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "qk_norm_attention",
            ("x", "params", "n_heads", "n_kv_heads", "positions", "rope_base"),
            "`(out (B, T, d), weights (B, H, T, T))`, causal; `out` alone with `ATTENTION_WEIGHTS = False`",
            "causal GQA with QK-norm: each head's q and k RMS-normalised over D before RoPE; params: W_q W_k W_v W_o q_norm k_norm (D,)",
            arguments="x (B, T, d), params (below), ints, positions (T,) int, float",
            **ATTENTION, shown=("x", "n_heads", "n_kv_heads", "positions", "rope_base"), builds_on=("rms_norm", "rope", "gqa_attention"),
            # roundings: attention's chain after two projections, a per-head RMSNorm and RoPE; reference.torch needs 1.3 of one
            # rounding in float16, 0.6 in bfloat16, 0.04 in float32 (3,000 random calls each)
            roundings=8, version=2, details=QK_NORM_DETAILS,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "ROPE_THETA"),
            answer_form=lambda x, params, n_heads, n_kv_heads, positions, rope_base: (floats(shape_of(x)),
                                                                                    floats(heads(x, n_heads, shape_of(x)[-2]))),
        ),
        # version 2: MoE routing as shipped (Mixtral's and gpt-oss's router is top_k_gates)
        ProtocolFunction(
            "grouped_top_k_gates",
            ("router_logits", "bias", "k", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor"),
            "(N, E): the chosen experts' σ(r), normalised where `norm_topk_prob`, × `routed_scaling_factor`; 0 elsewhere",
            "DeepSeek-V3's router: sigmoid affinities, the bias in the choice only, group-limited top-k",
            arguments=("router_logits (N, E), bias (E,), k int, n_group int dividing E, topk_group int, norm_topk_prob bool, "
                       "routed_scaling_factor float"),
            outputs=("gates",), floating=("gates",), shown=("router_logits", "k", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor"),
            version=2, details=ROUTING_DETAILS,  # builds on no entry: sigmoid affinities, its own grouped choice
            answer_form=lambda router_logits, *rest: floats(shape_of(router_logits)),
        ),
        ProtocolFunction(
            "softmax_top_k_gates",
            ("router_logits", "k", "norm_topk_prob"),
            "(N, E): softmax over all E experts, the k largest kept (divided by their sum where `norm_topk_prob`), 0 elsewhere",
            "Qwen3-MoE's router: softmax, top-k, norm_topk_prob",
            arguments="router_logits (N, E), k int, norm_topk_prob bool",
            outputs=("gates",), floating=("gates",), shown=("router_logits", "k", "norm_topk_prob"), builds_on=("softmax", "top_k_gates"),
            version=2, honours=("TOP_K_TIES",),
            answer_form=lambda router_logits, k, norm_topk_prob: floats(shape_of(router_logits)),
        ),
        ProtocolFunction(
            "expert_bias_update",
            ("bias", "tokens_per_expert", "rate"),
            "(E,): bias − rate where an expert's load is above the mean, + rate below it, unchanged at it",
            "DeepSeek-V3's auxiliary-loss-free update of the balancing bias",
            arguments="bias (E,), tokens_per_expert (E,) int, rate float",
            outputs=("bias",), floating=("bias",), shown=("bias", "tokens_per_expert", "rate"), version=2,
            answer_form=lambda bias, tokens_per_expert, rate: floats(shape_of(bias)),
        ),
        # version 2: multi-head latent attention (DeepSeek-V2/V3, Kimi K2)
        ProtocolFunction(
            "mla_attention",
            ("x", "params", "n_heads", "positions", "rope_base", "mscale"),
            "`(out (B, T, d), weights (B, H, T, T))`, causal; `out` alone with `ATTENTION_WEIGHTS = False`",
            "causal multi-head latent attention: keys and values from a normalised latent, a RoPE key shared by the heads",
            arguments="x (B, T, d), params (below), int, positions (T,) int, float, mscale float (1 without YaRN)",
            **ATTENTION, shown=("x", "n_heads", "positions", "rope_base", "mscale"), builds_on=("rms_norm", "rope", "softmax"),
            # roundings: attention's chain after two projections in a row, a latent RMSNorm (two where the query is compressed) and RoPE
            roundings=8, version=2, details=MLA_DETAILS,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "ROPE_THETA"),
            answer_form=lambda x, params, n_heads, positions, rope_base, mscale: (floats(shape_of(x)), floats(heads(x, n_heads, shape_of(x)[-2]))),
        ),
        ProtocolFunction(
            "mla_decode",
            ("x", "params", "n_heads", "positions", "rope_base", "mscale", "chunks"),
            "`(out (B, T, d), cache (B, T, r_kv + D_r))`: the cache after the last chunk",
            "mla_attention in chunks on the implementation's own cache of each token's latent and RoPE key",
            arguments="as `mla_attention`, and chunks (n,) int ≥ 1 summing to T",
            outputs=("out", "cache"), floating=("out", "cache"), shown=("x", "n_heads", "positions", "rope_base", "mscale", "chunks"),
            builds_on=("mla_attention",), roundings=8, version=2,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "ROPE_THETA"),
            # the cache's width is the implementation's own, for the cache law to judge
            answer_form=lambda x, params, n_heads, positions, rope_base, mscale, chunks: (floats(shape_of(x)), floats(shape_of(x)[:-1] + (None,))),
        ),
        # version 2: RoPE scaling and partial rotary
        ProtocolFunction(
            "rope_frequencies",
            ("d_head", "base", "scaling", "seq_len"),
            "`(inv_freq (d_head/2,), attention_factor)`: the scaled RoPE's inverse frequencies and the factor on cos and sin",
            "a scaled RoPE's frequencies at a length: linear, dynamic NTK, llama3, YaRN, LongRoPE (transformers' ROPE_INIT_FUNCTIONS)",
            arguments=("d_head int (the rotated width), base float, scaling dict (`rope_type` and that type's settings under "
                       "transformers' names), seq_len int (the positions' count; read by dynamic and longrope)"),
            # config constants with no input dtype: held to float32's rounding whatever the run's dtype (transformers computes them in float32)
            outputs=("inv_freq", "attention_factor"), floating=(), shown=("d_head", "base", "scaling", "seq_len"), version=2,
            details=ROPE_SCALING_DETAILS,
            answer_form=lambda d_head, base, scaling, seq_len: (floats((d_head // 2,)), NUMBER),
        ),
        ProtocolFunction(
            "softmax_scale",
            ("d_head", "scaling"),
            "float: 1/√d_head, × yarn_mscale(factor, mscale_all_dim)² for a YaRN config with `mscale_all_dim` (DeepSeek)",
            "the scale of q·kᵀ, with DeepSeek's YaRN mscale folded in",
            arguments="d_head int (the whole query-key width), scaling dict as `rope_frequencies`",
            **VALUE, shown=("d_head", "scaling"), version=2,
            answer_form=lambda d_head, scaling: NUMBER,
        ),
        ProtocolFunction(
            "partial_rope",
            ("x", "positions", "base", "partial_rotary_factor"),
            "(..., T, D): `rope` on the first int(D·partial_rotary_factor) features, frequencies over that width; the rest unchanged",
            "RoPE on the first part of each head (GPT-NeoX, Phi-2, StableLM, GLM)",
            arguments="x (..., T, D); positions (T,) int; base float; partial_rotary_factor float in (0, 1], int(D·factor) even",
            # roundings: rope's
            shown=("x", "positions", "base", "partial_rotary_factor"), builds_on=("rope",), roundings=4, version=2,
            honours=("ROPE_PAIRING", "ROPE_THETA"),
            leaks="partial_rope's answer is not in x's dtype: cos and sin left in float32, or the pass-through part upcast by the concatenation",
            answer_form=lambda x, positions, base, partial_rotary_factor: floats(shape_of(x)),
        ),
        # version 2: attention scores as shipped (ALiBi, softcapping, attention sinks)
        ProtocolFunction(
            "alibi_slopes",
            ("n_heads",),
            "(H,) floats: 2^(-8/H)·(1, ..., H) as powers for H a power of two; else the largest power of two P's, then 2P's odd ones",
            "ALiBi's per-head slopes (Press et al. 2022; BLOOM's build_alibi_tensor)",
            arguments="n_heads int ≥ 1",
            outputs=("slopes",), floating=(), shown=("n_heads",), version=2, details=SCORES_DETAILS,
            answer_form=lambda n_heads: floats((n_heads,)),
        ),
        ProtocolFunction(
            "alibi_attention",
            ("q", "k", "v", "slopes", "key_mask"),
            "`(out (B, H, T, D), weights (B, H, T, S))`, causal; `out` alone with `ATTENTION_WEIGHTS = False`",
            "causal GQA with ALiBi: head h adds -slopes[h]·(distance back) to each scaled score; no rotary",
            arguments="q (B, H, T, D), k and v (B, H_kv, S, D), T ≤ S; slopes (H,); key_mask (B, S) bool or None",
            # roundings: attention's chain (the bias adds one rounding, within its budget)
            **ATTENTION, shown=("q", "k", "key_mask"), builds_on=("softmax", "gqa_attention"), roundings=8, version=2,
            honours=("KEY_MASK", "FULLY_MASKED_ROWS", "CAUSAL_ALIGNMENT"),
            leaks="alibi_attention's out or weights are not in q's dtype: the bias built in float32 (or float64) and kept",
            answer_form=lambda q, k, v, slopes, key_mask: (floats(shape_of(q)[:-1] + shape_of(v)[-1:]),
                                                           floats(shape_of(q)[:-1] + shape_of(k)[-2:-1])),
        ),
        ProtocolFunction(
            "softcap",
            ("x", "cap"),
            "same shape: cap·tanh(x / cap)",
            "softcapping (Gemma 2's final logits): x to first order, never beyond ±cap",
            arguments="any, cap float > 0",
            # roundings: x / cap, tanh, · cap
            shown=("x", "cap"), roundings=3, version=2,
            leaks="softcap's answer is not in x's dtype: tanh taken in float32 or float64 and kept",
            answer_form=lambda x, cap: floats(shape_of(x)),
        ),
        ProtocolFunction(
            "softcapped_attention",
            ("q", "k", "v", "causal", "key_mask", "window", "cap"),
            "as `gqa_attention`, the scaled scores softcapped before the mask",
            "gqa_attention with cap·tanh(s / cap) on the scaled scores, before the mask (Gemma 2's attn_logit_softcapping)",
            arguments="as `gqa_attention`, and cap float > 0",
            # roundings: attention's chain and the cap's three
            **ATTENTION, shown=("q", "k", "causal", "key_mask", "window", "cap"), builds_on=("softmax", "gqa_attention", "softcap"),
            roundings=11, version=2,
            honours=("CAUSAL_ONLY", "ENCODER_ONLY", "FULLY_MASKED_ROWS", "SLIDING_WINDOW", "KEY_MASK", "CAUSAL_ALIGNMENT"),
            leaks="softcapped_attention's out or weights are not in q's dtype: the tanh or the softmax in float32 kept",
            answer_form=lambda q, k, v, causal, key_mask, window, cap: (floats(shape_of(q)[:-1] + shape_of(v)[-1:]),
                                                                        floats(shape_of(q)[:-1] + shape_of(k)[-2:-1])),
        ),
        ProtocolFunction(
            "sink_attention",
            ("q", "k", "v", "causal", "key_mask", "window", "sinks"),
            "as `gqa_attention`; each row's weights sum to 1 − its sink's share (0 where it sees no key)",
            "gqa_attention with gpt-oss's per-head sink logit in each softmax's denominator, its column then dropped",
            arguments="as `gqa_attention`, and sinks (H,)",
            # roundings: attention's chain
            **ATTENTION, shown=("q", "k", "causal", "key_mask", "window"), builds_on=("softmax", "gqa_attention"), roundings=8, version=2,
            honours=("CAUSAL_ONLY", "ENCODER_ONLY", "SLIDING_WINDOW", "KEY_MASK", "CAUSAL_ALIGNMENT"),
            leaks="sink_attention's out or weights are not in q's dtype: the sinks or the softmax in float32 kept",
            answer_form=lambda q, k, v, causal, key_mask, window, sinks: (floats(shape_of(q)[:-1] + shape_of(v)[-1:]),
                                                                          floats(shape_of(q)[:-1] + shape_of(k)[-2:-1])),
        ),
        # version 2: Gemma's details
        ProtocolFunction(
            "geglu",
            ("x", "W_gate", "W_up", "W_down"),
            "(..., d): (GELU_tanh(x·W_gate) ⊙ x·W_up)·W_down",
            "GeGLU with the tanh GELU (Gemma's MLP, gelu_pytorch_tanh)",
            arguments="x (..., d), W_gate and W_up (d, F), W_down (F, d)",
            # roundings: swiglu's, GELU's tanh in place of SiLU's exp
            shown=("x", "W_gate"), builds_on=("gelu",), roundings=4, version=2, details=GEMMA_DETAILS,
            leaks="geglu's answer is not in x's dtype: GELU's √(2/π) is np.sqrt(2 / np.pi), a numpy float64 scalar",
            answer_form=lambda x, W_gate, W_up, W_down: floats(shape_of(x)[:-1] + shape_of(W_down)[-1:]),
        ),
        ProtocolFunction(
            "scaled_embedding",
            ("ids", "table"),
            "(..., d): table[ids] · √d, the normaliser √d rounded to the table's dtype first",
            "Gemma's embedding: the rows times √d_model in the model's dtype",
            arguments="ids (...) int in [0, V), table (V, d)",
            shown=("ids", "table"), version=2,
            leaks="scaled_embedding's answer is not in the table's dtype: √d is a numpy float64 scalar (np.sqrt(d))",
            answer_form=lambda ids, table: floats(shape_of(ids) + shape_of(table)[-1:]),
        ),
        ProtocolFunction(
            "gemma_rms_norm",
            ("x", "w", "eps"),
            "(..., d): x / √(mean(x²) + eps) · (1 + w), in float32 at least, rounded to x's dtype once",
            "Gemma's RMSNorm: the gain 1 + w, applied before the cast back",
            arguments="x (..., d), w (d,), eps float",
            # roundings: the mean square, the root, the division, the gain: all in float32 or wider, then one rounding to x's dtype
            shown=("x", "eps"), roundings=2, version=2,  # its own norm: the reference computes it apart from rms_norm
            leaks="gemma_rms_norm's answer is not in x's dtype: the float32 result never cast back, or 1 + w made a float64 array",
            answer_form=lambda x, w, eps: floats(broadcast(x, w)),
        ),
        # version 2: per-layer attention types (Gemma 2 and 3, gpt-oss, Qwen2's max_window_layers)
        ProtocolFunction(
            "hybrid_logits",
            ("ids", "params", "n_heads", "n_kv_heads", "layer_types", "window", "rope_bases"),
            "(B, T, V): `llama_logits`, block i with the window and RoPE base of its type; `ValueError` for ids ∉ [0, V)",
            "a Llama-style LM whose layers are local (sliding) or global (full), each type with its own RoPE base",
            arguments=("ids (B, T) int, params as `llama_logits`, ints, layer_types (L,) str, window int ≥ 1 or None (no sliding layer), "
                       "rope_bases {layer type: float}"),
            outputs=("logits",), floating=("logits",), shown=("ids", "n_heads", "n_kv_heads", "layer_types", "window", "rope_bases"),
            builds_on=("llama_logits",), version=2, details=LAYER_TYPES_DETAILS,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "QKV_BIASES", "CHUNKS_WITHIN_WINDOW", "ROPE_BASE_PER_LAYER_TYPE"),
            leaks="hybrid_logits' answer is not in the params' dtype: the final norm or the head upcast",
            answer_form=lambda ids, params, *rest: floats(shape_of(ids) + shape_of(params["embed"])[:1]),
        ),
        ProtocolFunction(
            "hybrid_decode",
            ("ids", "params", "n_heads", "n_kv_heads", "layer_types", "window", "rope_bases", "chunks"),
            "as `llama_decode`: `(logits (B, T, V), cache_positions (n, L, H_kv, S) int)` or `(logits, cache_sizes (n,) int)`",
            "hybrid_logits in chunks on the implementation's own cache: sliding layers may keep only the last w keys, full ones keep all",
            arguments="as `hybrid_logits`, and chunks (n,) int ≥ 1 summing to T",
            outputs=("logits", "cache_sizes"), floating=("logits",),
            shown=("ids", "n_heads", "n_kv_heads", "layer_types", "window", "rope_bases", "chunks"),
            builds_on=("hybrid_logits", "llama_decode"), version=2,
            honours=("RMS_NORM_EPS", "ROPE_PAIRING", "QKV_BIASES", "MAX_DECODE_CHUNK", "CHUNKS_WITHIN_WINDOW",
                     "DECODE_CHUNKS_WITHIN_WINDOW", "ROPE_BASE_PER_LAYER_TYPE"),
            leaks="hybrid_decode's logits are not in the params' dtype: the cache or the head upcast",
            answer_form=lambda ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases, chunks: (
                floats(shape_of(ids) + shape_of(params["embed"])[:1]),
                Either((ints((chunk_count(chunks), len(params["blocks"]), None, None)), ints((chunk_count(chunks),))))),
        ),
        # version 2: StreamingLLM's attention sinks (a rolling cache that keeps the first tokens)
        ProtocolFunction(
            "streaming_attention",
            ("q", "k", "v", "n_sink", "cache_size", "rope_base"),
            "`(out (B, H, T, D), weights (B, H, T, T))`; `out` alone with `ATTENTION_WEIGHTS = False`",
            "causal GQA through StreamingLLM's cache: each query sees the first n_sink keys and the last cache_size - n_sink, RoPE within the cache",
            arguments=("q (B, H, T, D), k and v (B, H_kv, T, D), before RoPE; n_sink int ≥ 0, cache_size int > n_sink (the slots, sinks "
                       "included), rope_base float"),
            # roundings: attention's chain and RoPE's on the query and the keys
            **ATTENTION, shown=("q", "k", "n_sink", "cache_size", "rope_base"), builds_on=("rope", "gqa_attention"), roundings=8,
            version=2, details=STREAMING_DETAILS, honours=("ROPE_PAIRING", "ROPE_THETA"),
            leaks="streaming_attention's out or weights are not in q's dtype: cos and sin or the softmax in float32 kept",
            answer_form=lambda q, k, v, n_sink, cache_size, rope_base: (floats(shape_of(q)[:-1] + shape_of(v)[-1:]),
                                                                        floats(shape_of(q)[:-1] + shape_of(k)[-2:-1])),
        ),
        ProtocolFunction(
            "streaming_decode",
            ("q", "k", "v", "n_sink", "cache_size", "rope_base"),
            "`(out (B, H, T, D), held (T, slots) int)`: held[t] the tokens the cache's slots hold once token t is in, -1 for an empty slot",
            "streaming_attention decoded token by token on the implementation's own rolling cache of sinks and a window",
            arguments="as `streaming_attention`",
            outputs=("out", "held"), floating=("out",), shown=("q", "k", "n_sink", "cache_size", "rope_base"),
            builds_on=("streaming_attention",), roundings=8, version=2, honours=("ROPE_PAIRING", "ROPE_THETA"),
            leaks="streaming_decode's out is not in q's dtype: the cache or the softmax in float32 kept",
            # the slots are the cache's own, for the cache law to judge
            answer_form=lambda q, k, v, n_sink, cache_size, rope_base: (floats(shape_of(q)[:-1] + shape_of(v)[-1:]),
                                                                        ints((shape_of(q)[-2], None))),
        ),
    )
}


# {protocol function: its rounding budget}, read from the entries (field `roundings`): how many roundings of its dtype a correct
# answer composes, the factor its checks scale the tolerance table by (Tolerance.scaled, reference_tolerance)
ROUNDINGS = {entry.name: entry.roundings for entry in FUNCTIONS.values() if entry.roundings is not None}


@dataclass(frozen=True)
class Declaration:
    """One declarable convention as the docs list it: its name, what it changes, its values, and the functions whose entries honour it."""

    name: str
    meaning: str  # one sentence (Convention.changes)
    allowed: tuple  # the allowed values, or the allowed type (a tuple of one class) within `bounds`
    bounds: tuple | None  # (lowest, highest) for a numeric one, both allowed
    default: object  # assumed where it is not declared (None: undeclared)
    honoured_by: tuple[str, ...]  # protocol functions, in the protocol's order


def declarations():
    """Every declarable convention (invariants.conventions.CONVENTIONS, in its order) with the protocol functions that honour it,
    read from the entries (ProtocolFunction.declarations): the one source of the README's table of conventions."""
    return [Declaration(c.name, c.changes, c.allowed, c.bounds, c.default,
                        tuple(entry.name for entry in FUNCTIONS.values() if c.name in entry.declarations))
            for c in CONVENTIONS.values()]


def describe_call(name, args, note="", **options):
    """FUNCTIONS[name].describe(args, note, **options): the one way a report shows a call of the protocol."""
    return FUNCTIONS[name].describe(args, note, **options)


class ImplementationLoadError(Exception):
    """The --impl target could not be imported or holds none of the protocol."""


class ImplementationError(Exception):
    """A protocol function raised, or could not be called with the protocol's arguments; `refused`: a law reads it as a refusal of the
    input (a decode split the implementation would not take), not a crash."""

    def __init__(self, message, original=None, *, refused=False):
        super().__init__(message)
        self.original = original
        self.refused = refused


class TransportLost(BaseException):  # noqa: N818 - a BaseException, so hypothesis stops at once instead of shrinking
    """The implementation can no longer be reached: its process died, hung or ran past a time limit.

    `cause` names which ("died", "call_timeout", ...); `out_of_time` is True when a clock, not
    the implementation, ended the run, so that a counterexample already found still stands.
    """

    def __init__(self, cause, message, *, out_of_time=False):
        super().__init__(message)
        self.cause, self.message, self.out_of_time = cause, message, out_of_time


class InProcess:
    """The transport that calls the implementation's own functions in this process."""

    in_process = True

    def __init__(self, namespace, *, backend, device, dtype):
        self.namespace = namespace
        self.backend, self.device, self.dtype = backend, device, dtype
        self.callables = {name: getattr(namespace, name) for name in FUNCTIONS if callable(getattr(namespace, name, None))}
        self.functions = frozenset(self.callables)
        self.declarations = read_declarations(namespace)

    def call(self, name, args):
        """The answer to name(*args), rounded() numpy in, plain numpy out; ImplementationError or OutputError otherwise."""
        try:
            return answer(self.callables[name], name, FUNCTIONS[name].params, args, backend=self.backend, device=self.device, dtype=self.dtype)
        except CallError as exc:
            raise ImplementationError(exc.message, original=exc.original) from None

    def raw(self, name):
        return self.callables[name]


class Implementation:
    """An implementation under test, called with numpy inputs and answering with numpy outputs.

    backend: "numpy" or "torch"; device: "cpu", "cuda", "cuda:1", ...; dtype: one of DTYPES.
    Inputs are rounded to the dtype here (invariants.boundary.rounded), then handed to a
    transport: InProcess for a namespace in this process (the default), the gate's worker
    transport for a submission in another. Both convert through invariants.boundary.answer.
    `raw(name)` gives the function itself, for checks that need autograd (in process only).
    """

    def __init__(self, namespace: object = None, *, label: str, backend: str, device: str = "cpu", dtype: str = "float64",
                 transport: Any = None) -> None:
        if backend not in BACKENDS:
            raise ImplementationLoadError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
        if dtype not in DTYPES:
            raise ImplementationLoadError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        if backend == "numpy" and (device != "cpu" or dtype == "bfloat16"):
            raise ImplementationLoadError(f"the numpy backend runs on cpu without bfloat16, not {device}/{dtype}")
        if (namespace is None) == (transport is None):
            raise TypeError("Implementation needs a namespace or a transport, not both")
        self.label = label
        self.backend = backend
        self.device = device
        self.dtype = dtype
        try:
            self.transport = transport or InProcess(namespace, backend=backend, device=device, dtype=dtype)
        except ValueError as exc:  # a declared convention with a value it cannot take
            raise ImplementationLoadError(f"{label}: {exc}") from None
        self.namespace = namespace
        self.functions = self.transport.functions  # the protocol functions it provides (names)
        self.near_misses = near_misses(namespace, self.functions) if namespace is not None else {}  # {'attentoin': 'attention'}
        self.declarations = self.transport.declarations  # {convention: value} (invariants.conventions)
        self.in_process = self.transport.in_process
        self.calls: list[tuple[str, Any, Any]] | None = None  # records (name, args, answer) while the runner asks for it (repro scripts)

    @classmethod
    def from_functions(cls, *, backend: str, device: str = "cpu", dtype: str = "float64", label: str = "functions",
                       **functions: Callable[..., Any]) -> Implementation:
        """Wrap loose callables: Implementation.from_functions(backend="torch", attention=my_attention)."""
        unknown = sorted(set(functions) - set(FUNCTIONS))
        if unknown:
            raise ImplementationLoadError(f"{', '.join(unknown)} are not protocol functions; see invariants.protocol.FUNCTIONS")
        namespace = type("Functions", (), {k: staticmethod(v) for k, v in functions.items()})
        return cls(namespace, label=label, backend=backend, device=device, dtype=dtype)

    def __repr__(self) -> str:
        return f"{self.label} ({self.backend}, {self.device}, {self.dtype})"

    @property
    def tolerance(self) -> Tolerance:
        """The comparison tolerance for the rounding this implementation's answers carry (invariants.conventions.rounding_dtype)."""
        return tolerance_for(rounding_dtype(self))

    def missing(self, names: Iterable[str]) -> str | None:
        """A skip reason naming the protocol functions this implementation lacks, or None."""
        absent = [name for name in names if name not in self.functions]
        if not absent:
            return None
        misspelt = self.misspelt(absent)
        return f"{self.label} does not provide {', '.join(absent)} (protocol v{PROTOCOL_VERSION})" + (f"; {misspelt}" if misspelt else "")

    def misspelt(self, names: Iterable[str] = tuple(FUNCTIONS)) -> str:
        """'' or what this implementation defines in place of protocol functions in `names` it lacks, nearly spelt (near_misses):
        "attentoin is no protocol function: did you mean attention?"."""
        return "; ".join(f"{got} is no protocol function: did you mean {want}?" for got, want in self.near_misses.items() if want in names)

    # -- conversion (one place: invariants.boundary) ---------------------------------------------

    def to_backend(self, value: Any, *, requires_grad: bool = False) -> Any:
        """numpy (and nested dicts/lists of it) -> the implementation's arrays, rounded to its dtype; other values pass through."""
        return to_backend(rounded(value, self.dtype), backend=self.backend, device=self.device, dtype=self.dtype, requires_grad=requires_grad)

    def to_numpy(self, value: Any, what: str) -> Any:
        """The implementation's answer -> plain numpy (tuples and dicts kept); anything else is an OutputError."""
        return to_numpy(value, what)

    def as_seen(self, value: Any) -> Any:
        """The float64 values the implementation actually receives for `value` (floats rounded to its dtype)."""
        if isinstance(value, dict):
            return {k: self.as_seen(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.as_seen(v) for v in value)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return rounded(value, self.dtype).astype(np.float64, copy=False)  # rounded() made a fresh array
        return value

    def raw(self, name: str) -> Callable[..., Any]:
        """The implementation's own function `name`, taking and returning backend arrays (in process only)."""
        if not self.in_process:
            raise ImplementationError(f"{name} runs in another process: its own callables never reach the suite")
        return self.transport.raw(name)

    # -- calling ------------------------------------------------------------------------------

    def call(self, name: str, *args: Any) -> Any:
        """Call protocol function `name` with numpy arguments; the answer comes back as numpy."""
        if name not in self.functions:
            raise AttributeError(f"{self.label} does not provide {name}")
        args = rounded(args, self.dtype)
        if self.calls is None:
            return self.transport.call(name, args)
        try:
            answer = self.transport.call(name, args)
        except (ImplementationError, OutputError) as exc:
            self.calls.append((name, args, exc))
            raise
        self.calls.append((name, args, answer))
        return answer

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in FUNCTIONS:
            if name not in self.__dict__.get("functions", ()):
                raise AttributeError(f"{self.label} does not provide {name}")
            return lambda *args: self.call(name, *args)
        raise AttributeError(name)


MISSPELT_FROM = 0.85  # difflib's ratio from which a name reads as a protocol name misspelt: attentoin 0.89, layernorm 0.95; silu 0.8


def near_misses(namespace: object, provided: Iterable[str]) -> dict[str, str]:
    """{name: the protocol function it nearly spells} for the public callables of `namespace` within MISSPELT_FROM of a protocol function
    it does not provide (`attentoin`: attention); helpers with other names (split_heads, causal_mask, silu) are no near miss."""
    absent = [name for name in FUNCTIONS if name not in provided]
    found = {}
    for name in dir(namespace):
        nearest = difflib.get_close_matches(name, absent, n=1, cutoff=MISSPELT_FROM) if not name.startswith("_") else []
        if nearest and name not in FUNCTIONS and callable(getattr(namespace, name, None)):
            found[name] = nearest[0]
    return found


def _import_target(target):
    """Import `target`: a dotted module name or a path to a .py file or a package folder."""
    path = Path(target)
    if target.endswith(".py") or os.sep in target or path.exists():
        if not path.exists():
            raise ImplementationLoadError(f"no file or folder {target!r}")
        file = path / "__init__.py" if path.is_dir() else path
        if not file.exists():
            raise ImplementationLoadError(f"{target!r} is a folder without __init__.py")
        name = f"_impl_{abs(hash(str(file.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=[str(path)] if path.is_dir() else None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ImplementationLoadError(f"importing {target!r} raised {type(exc).__name__}: {first_line(exc)}{where(exc)}") from None
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and target.startswith(exc.name):
            raise ImplementationLoadError(f"no module named {target!r}{_moved_hint(target)}") from None
        raise ImplementationLoadError(f"importing {target!r} raised ModuleNotFoundError: {exc}") from None
    except Exception as exc:
        raise ImplementationLoadError(f"importing {target!r} raised {type(exc).__name__}: {first_line(exc)}{where(exc)}") from None


MOVED_UNDER_INVARIANTS = ("adapters", "gate", "mutants", "accounting", "htmlreport")


def _moved_hint(target: str) -> str:
    """Where a module of the packages moved under invariants lives now, for a target written the old way ('' if none is there)."""
    moved = f"invariants.{target}"
    if target.split(".")[0] not in MOVED_UNDER_INVARIANTS:
        return ""
    try:
        found = importlib.util.find_spec(moved) is not None
    except ModuleNotFoundError:  # a parent of it is missing too
        found = False
    return f"; did you mean {moved!r}? (the adapters, gate, mutants, accounting and htmlreport moved under invariants)" if found else ""


def load_target(target: str, *, backend: str | None = None) -> tuple[object, str]:
    """(namespace, backend) of an --impl target, 'pkg.module', 'path/to/file.py' or either followed by ':object'.

    The backend comes from `backend`, else from the target's BACKEND attribute.
    """
    module_part, _, object_part = target.partition(":")
    if len(module_part) == 1 and object_part.startswith("\\"):  # a Windows drive letter, not module:object
        module_part, object_part = target, ""
    namespace = _import_target(module_part)
    for attr in filter(None, object_part.split(".")):
        try:
            namespace = getattr(namespace, attr)
        except AttributeError:
            raise ImplementationLoadError(f"{module_part!r} has no attribute {attr!r}") from None
    if inspect.isclass(namespace):  # a class of static methods or with a no-argument constructor
        try:
            namespace = namespace()
        except Exception as exc:
            raise ImplementationLoadError(f"{target}() raised {type(exc).__name__}: {first_line(exc)}") from None
    backend = backend or getattr(namespace, "BACKEND", None)
    if backend is None:
        raise ImplementationLoadError(f"{target!r} does not say its backend: set BACKEND = 'numpy' or 'torch' in it, or pass --impl-backend")
    if not any(callable(getattr(namespace, name, None)) for name in FUNCTIONS):
        raise ImplementationLoadError(f"{target!r} provides none of the protocol functions ({', '.join(list(FUNCTIONS)[:4])}, ...)")
    return namespace, backend


def load_implementation(target: str = "reference.numpy", *, backend: str | None = None, device: str = "cpu",
                        dtype: str = "float64") -> Implementation:
    """Load an --impl target (load_target) as an Implementation on `device` in `dtype`."""
    namespace, backend = load_target(target, backend=backend)
    if backend == "torch" and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ImplementationLoadError("CUDA requested but torch.cuda.is_available() is False")
    return Implementation(namespace, label=target, backend=backend, device=device, dtype=dtype)
