"""The adapter toolkit: put a class-based implementation (an nn.Module, the lesson's numpy classes) behind the protocol in a few lines.

An adapter says three things, and the toolkit does the rest:

1. **A layout**: a plain dict from the module's parameter names to the suite's weights,
   `{"c_attn.weight": cat("W_q", "W_k", "W_v", dim=1), "out_proj.weight": T("W_o")}`. A value
   is a key of the suite's params, or `T`, `cat`, `heads`, `zeros` of one, or any callable of the
   params; `norm(name, "ln1")` lays out a LayerNorm's gain and bias, `under(prefix, layout)`
   prefixes a sublayer's names and `each("blocks", layout)` lays out every block of a model (the
   dict key holds `{}` for the block's index). Attention biases
   the suite did not draw (`b_q, b_k, b_v, b_o`) read as zeros, so a module that always has them
   takes the bias-free protocol functions too.
2. **A builder**: a function that makes the module from sizes named as the protocol names them
   (`d_model, n_heads, d_ff, eps, vocab, n_layers, max_len`, and `causal`, `dtype`, `device`);
   the toolkit passes each builder only the keywords it declares (all of them to `**kwargs`),
   builds once per shape, dtype and device, moves the module there and puts it in eval mode.
   `part="transformer.h.0.attn"` takes one submodule of what was built.
3. **A forward**: how the module is called, e.g. `lambda block, x, causal: block(x, mask=...)`.

The protocol-function factories (`layer_norm`, `attention`, `cross_attention`, `feed_forward`,
`transformer_block`, `decoder_block`, `gpt_logits`, `cross_entropy`, `gpt_param_count`, and for the modern decoder `rope`,
`swiglu`, `llama_block`, `llama_logits`, `llama_decode`, `gqa_attention`) combine them into a function with the
protocol's signature. For a torch module the weights go in through `torch.func.functional_call`:
nothing is copied, so autograd reaches the suite's tensors; any other object (a numpy class) gets
them as attributes for the length of the call, and its own values back afterwards. `call`,
`module`, `capture`, `substitute` and `causal_mask` are the pieces, for adapters that need something else
(`substitute` and `capture(..., inputs=True)` run an attention core on the suite's q, k and v: docs/adapters.md).

Errors: `gpt_logits` turns the library's own refusal of bad ids (IndexError, RuntimeError, ...)
into the protocol's ValueError, only when the ids are bad (ids outside [0, V) or T > max_len),
so a real bug never hides behind it. A layout that names a parameter the module lacks is a
KeyError naming it; one that leaves out a parameter the forward uses makes the output NaN (the
toolkit fills a torch module's own weights with NaN), which the suite reports.
"""

from __future__ import annotations

import functools
import inspect
import operator
import sys
import warnings
from contextlib import contextmanager

import numpy as np

__all__ = [
    "T", "cat", "heads", "zeros", "norm", "under", "each", "weights",
    "module", "quiet", "call", "capture", "substitute", "causal_mask", "bad_ids", "ToolkitError",
    "layer_norm", "rms_norm", "attention", "cross_attention", "feed_forward", "transformer_block", "decoder_block", "gpt_logits", "cross_entropy",
    "gpt_param_count", "visible_keys", "held_positions", "rope", "swiglu", "llama_block", "llama_logits", "llama_decode",
    "llama_logits_by_decoding", "gqa_attention",
]

OPTIONAL_BIASES = {"b_q": "W_q", "b_k": "W_k", "b_v": "W_v", "b_o": "W_o"}  # a bias the suite did not draw is zeros, sized by its weight


class ToolkitError(Exception):
    """An error of the adapter or of the toolkit (a layout, a slot rule, a cache it cannot read), never the code's refusal of an input.

    The laws read its type's name (ImplementationError.original; the gate's worker reports it as data) and never advise a
    declaration for it: invariants.laws.decoding reports a llama_decode that raised one as an error, not as a refused split.
    """


def _is_torch(value):
    """Whether value is a torch tensor (torch is never imported here for a numpy adapter)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _nn_module(value):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


# -- layouts: the suite's weights under a module's names --------------------------------------------


def _source(spec, params):
    """The array that `spec` (a params key, or a callable of params) stands for."""
    if callable(spec):
        return spec(params)
    if spec in params:
        return params[spec]
    if spec in OPTIONAL_BIASES and OPTIONAL_BIASES[spec] in params:
        weight = params[OPTIONAL_BIASES[spec]]  # (d_in, d_out): the bias has d_out entries
        return weight.new_zeros(weight.shape[-1]) if _is_torch(weight) else np.zeros(weight.shape[-1], weight.dtype)
    raise ToolkitError(f"the layout reads {spec!r}, which the suite's params do not hold (they hold {', '.join(sorted(map(str, params)))})")


def T(spec):  # noqa: N802 - named like the transpose it is
    """The (d_in, d_out) weight transposed to (d_out, d_in), the layout nn.Linear stores; contiguous, as a module's own parameters
    are (code may .view() what it computes from them)."""

    def transposed(params):
        value = _source(spec, params).T
        return value.contiguous() if _is_torch(value) else value

    return transposed


def cat(*specs, dim=0):
    """The arrays concatenated along `dim`: fused projections, e.g. in_proj_weight = cat(T("W_q"), T("W_k"), T("W_v"))."""

    def concatenated(params):
        parts = [_source(s, params) for s in specs]
        if _is_torch(parts[0]):
            import torch

            return torch.cat(parts, dim=dim)
        return np.concatenate(parts, axis=dim)

    return concatenated


def heads(spec, *, rows=False):
    """Split per head (n_heads from the params): W (d, H·D) -> (H, d, D), a bias (H·D,) -> (H, D); rows=True: W_o (H·D, d) -> (H, D, d)."""

    def split(params):
        value, n_heads = _source(spec, params), params["n_heads"]
        if rows or value.ndim == 1:
            return value.reshape(n_heads, -1, *value.shape[1:])  # (H·D, ...) -> (H, D, ...)
        per_head = value.reshape(value.shape[0], n_heads, -1)  # (d, H·D) -> (d, H, D)
        return per_head.permute(1, 0, 2) if _is_torch(per_head) else per_head.transpose(1, 0, 2)  # (H, d, D)

    return split


def zeros(spec, axis=0):
    """Zeros of the length of axis `axis` of `spec`: a bias the module has and the protocol does not (an unembedding's b_U)."""

    def zero(params):
        like = _source(spec, params)
        return like.new_zeros(like.shape[axis]) if _is_torch(like) else np.zeros(like.shape[axis], like.dtype)

    return zero


def norm(name, key, *, weight="weight", bias="bias"):
    """A LayerNorm's layout: norm("ln_1", "ln1") is {"ln_1.weight": "ln1_g", "ln_1.bias": "ln1_b"} (the suite's gain and bias)."""
    return {f"{name}.{weight}": f"{key}_g", f"{name}.{bias}": f"{key}_b"}


def under(prefix, layout):
    """The layout of a submodule: every name prefixed, e.g. under("attn.", ATTENTION)."""
    return {prefix + name: spec for name, spec in layout.items()}


class each:  # noqa: N801 - reads as a layout value, like T and cat
    """Every element of params[key] laid out with `layout`, under the dict key with its index: {"transformer.h.{}.": each("blocks", BLOCK)}."""

    def __init__(self, key, layout):
        self.key, self.layout = key, layout


def weights(layout, params):
    """{module name: array} for `layout` applied to the suite's `params` (a dict; n_heads passes on to each block)."""
    out = {}
    for name, spec in layout.items():
        if isinstance(spec, each):
            shared = {k: v for k, v in params.items() if k == "n_heads"}
            for i, item in enumerate(params[spec.key]):
                out.update(weights(under(name.format(i), spec.layout), {**item, **shared}))
        else:
            out[name] = _source(spec, params)
    return out


# -- modules: building once, calling with the suite's weights ------------------------------------------


def _accepted(build):
    """The keywords build takes (None: any, it has **kwargs)."""
    parameters = inspect.signature(build).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters}


@functools.lru_cache(maxsize=64)
def _built(build, part, sizes, dtype, device):
    kwargs = dict(sizes)
    made = build(**kwargs)
    if part:
        made = made.get_submodule(part) if _nn_module(made) else operator.attrgetter(part)(made)
    if _nn_module(made):
        import torch

        made = torch.nn.Module.to(made, device=device)  # nn.Module's own .to: some libraries override it (HookedTransformer)
        # floating tensors only: .to(dtype) would cast a complex RoPE table (Meta's freqs_cis) to real, dropping its imaginary part
        made._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
        made.eval()
        with torch.no_grad():  # its own weights are never meant to be used: one the layout forgets makes the output NaN, loudly
            for parameter in made.parameters():
                parameter.fill_(float("nan"))
    return made


def quiet(build):
    """build with its DeprecationWarnings and FutureWarnings silenced: a notice for the adapter's author, not for the suite's report."""

    @functools.wraps(build)  # inspect.signature follows __wrapped__: the keywords build declares still decide what it is given
    def quietly(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            return build(*args, **kwargs)

    return quietly


def module(build, *, like, part=None, fresh=False, **sizes):
    """build(**sizes), given the sizes it declares (and like's dtype and device where it asks), built once per shape, in eval mode.

    A torch module is moved to like's dtype and device (a no-op where the builder already built it
    there). Its own weights are filled with NaN: the suite's always replace them (call). fresh=True
    builds a new one every time, for a module with state (a KV cache that must start empty).
    """
    accepted = _accepted(build)
    torch_like = _is_torch(like)
    offered = {**sizes, "dtype": like.dtype, "device": like.device if torch_like else "cpu"}
    given = tuple(sorted((k, v) for k, v in offered.items() if accepted is None or k in accepted))
    made = _built.__wrapped__ if fresh else _built
    return made(build, part, given, like.dtype if torch_like else None, like.device if torch_like else None)


@functools.lru_cache(maxsize=256)
def _names(target):
    """Every parameter and buffer name of a torch module (tied ones under each name)."""
    return {n for n, _ in target.named_parameters(remove_duplicate=False)} | {n for n, _ in target.named_buffers(remove_duplicate=False)}


def _check_names(target, given):
    unknown = sorted(set(given) - _names(target))
    if unknown:
        raise ToolkitError(f"the layout names {', '.join(unknown)}, which {type(target).__name__} does not have (see its named_parameters())")


@functools.lru_cache(maxsize=256)
def _tied(target):
    """The groups of names that share one tensor in a torch module (a head tied to the token table), each group of two or more."""
    groups = {}
    for name, tensor in target.named_parameters(remove_duplicate=False):
        groups.setdefault(id(tensor), []).append(name)
    return [set(names) for names in groups.values() if len(names) > 1]


def _unties(target, values):
    """Whether `values` give two or more names of one tied group of target's: the suite's weights untie them."""
    return any(len(group & values.keys()) > 1 for group in _tied(target))


@functools.cache
def _bound_class():
    import torch

    class Bound(torch.nn.Module):
        """forward(module, *args) as a module, so that functional_call can run any method or function on `module`."""

        def __init__(self, module, forward):
            super().__init__()
            self.module, self.forward_fn = module, forward

        def forward(self, *args, **kwargs):
            return self.forward_fn(self.module, *args, **kwargs)

    return Bound


@contextmanager
def _assigned(target, values):
    """Set target's dotted attributes to values for the block, and put the old ones back after."""
    saved = {}
    try:
        for name, value in values.items():
            owner_path, _, attr = name.rpartition(".")
            owner = operator.attrgetter(owner_path)(target) if owner_path else target
            saved[name] = (owner, attr, getattr(owner, attr))
            setattr(owner, attr, value)
        yield target
    finally:
        for owner, attr, old in saved.values():
            setattr(owner, attr, old)


def call(target, values, *args, forward=None, **kwargs):
    """forward(target, *args, **kwargs) (default target(*args, **kwargs)) with target's parameters replaced by `values` ({name: array}).

    A torch module runs through torch.func.functional_call (nothing copied; autograd reaches the
    arrays); any other object has the values set as attributes for the call. Where values name two
    parameters the module ties (lm_head.weight and the token table), each gets its own array
    (functional_call's tie_weights=False); where they name one of them, the tie holds.
    """
    forward = forward or (lambda m, *a, **k: m(*a, **k))
    if not _nn_module(target):
        with _assigned(target, values):
            return forward(target, *args, **kwargs)
    from torch.func import functional_call

    _check_names(target, values)
    return functional_call(_bound_class()(target, forward), {"module." + k: v for k, v in values.items()}, args, kwargs,
                           tie_weights=not _unties(target, values))


@contextmanager
def capture(target, name, *, inputs=False):
    """Collect what target's submodule `name` outputs (inputs=True: its first input) during the block (a forward hook); for
    another object, its attribute `name` after."""
    seen = []
    if not _nn_module(target):
        try:
            yield seen
        finally:
            seen.append(operator.attrgetter(name)(target))
        return
    submodule = target.get_submodule(name)
    if inputs:
        handle = submodule.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
    else:
        handle = submodule.register_forward_hook(lambda _module, _inputs, output: seen.append(output))
    try:
        yield seen
    finally:
        handle.remove()


@contextmanager
def substitute(target, outputs):
    """Make each submodule `name` of target return outputs[name] instead of what it computes, during the block (forward hooks).

    An attention core that cannot be called alone runs on the suite's q, k and v this way: substitute
    the q, k and v projections' outputs, make RoPE the identity, capture the output projection's input.
    """
    handles = [target.get_submodule(name).register_forward_hook(lambda _module, _inputs, _output, value=value: value)
               for name, value in outputs.items()]
    try:
        yield target
    finally:
        for handle in handles:
            handle.remove()


def causal_mask(x, causal=True, *, additive=False):
    """The (T, T) mask for x (B, T, d), None in encoder mode: True above the diagonal (where a query may not look), or -inf there if additive."""
    if not causal:
        return None
    T = x.shape[1]
    if _is_torch(x):
        import torch

        blocked = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        return torch.zeros(T, T, dtype=x.dtype, device=x.device).masked_fill(blocked, float("-inf")) if additive else blocked
    blocked = np.triu(np.ones((T, T), dtype=bool), 1)
    return np.where(blocked, -np.inf, 0.0).astype(x.dtype) if additive else blocked


def bad_ids(ids, vocab, max_len):
    """Whether the protocol requires gpt_logits to refuse ids: an id outside [0, vocab), or a sequence longer than max_len."""
    if ids.shape[-1] > max_len:
        return True
    return bool((ids.numel() if _is_torch(ids) else ids.size) > 0 and (ids.min() < 0 or ids.max() >= vocab))


# -- protocol functions from a builder, a layout and a forward ---------------------------------------


def _named(fn, name, what):
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = what
    return fn


def _default_forward(target, *args):
    return target(*args)


def layer_norm(build, forward=None, *, layout=None, part=None):
    """layer_norm(x, gain, bias, eps) from build(d_model, eps); layout default {"weight": "gain", "bias": "bias"} (nn.LayerNorm's names)."""
    layout = layout or {"weight": "gain", "bias": "bias"}

    def layer_norm(x, gain, bias, eps=1e-5):
        target = module(build, like=x, part=part, d_model=x.shape[-1], eps=eps)
        return call(target, weights(layout, {"gain": gain, "bias": bias}), x, forward=forward or _default_forward)

    return _named(layer_norm, "layer_norm", f"layer_norm(x, gain, bias, eps) through {getattr(build, '__name__', build)}")


def rms_norm(build, forward=None, *, layout=None, part=None):
    """rms_norm(x, gain, eps) from build(d_model, eps); layout default {"weight": "gain"} (nn.RMSNorm's and most Llamas' name)."""
    layout = layout or {"weight": "gain"}

    def rms_norm(x, gain, eps=1e-5):
        target = module(build, like=x, part=part, d_model=x.shape[-1], eps=eps)
        return call(target, weights(layout, {"gain": gain}), x, forward=forward or _default_forward)

    return _named(rms_norm, "rms_norm", f"rms_norm(x, gain, eps) through {getattr(build, '__name__', build)}")


def attention(build, layout, forward, *, weights_from=None, part=None):
    """attention(x, W_q, W_k, W_v, W_o, n_heads, causal) from build(d_model, n_heads, causal) and forward(module, x, causal).

    forward returns (out, weights), or out alone with weights_from naming the submodule whose
    output is the (B, H, T, T) weights (captured with a hook), or out alone for an implementation
    that declares ATTENTION_WEIGHTS = False.
    """

    def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True):
        target = module(build, like=x, part=part, d_model=x.shape[-1], n_heads=n_heads, causal=causal)
        values = weights(layout, {"W_q": W_q, "W_k": W_k, "W_v": W_v, "W_o": W_o, "n_heads": n_heads})
        return _attended(target, values, weights_from, forward, x, causal)

    return _named(attention, "attention", "attention(x, W_q, W_k, W_v, W_o, n_heads, causal) -> (out (B, T, d), weights (B, H, T, T))")


def _attended(target, values, weights_from, forward, *args):
    """forward(target, *args) with `values`, and (out, the weights captured at weights_from) where weights_from names a submodule."""
    if weights_from is None:
        return call(target, values, *args, forward=forward)
    with capture(target, weights_from) as seen:
        out = call(target, values, *args, forward=forward)
    return out, seen[-1]


def cross_attention(build, layout, forward, *, weights_from=None, part=None):
    """cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads) from build(d_model, n_heads) and forward(module, x, memory).

    forward returns (out, weights (B, H, T, S)), or out alone with weights_from (as for attention)
    or under ATTENTION_WEIGHTS = False. No mask: every query sees every memory position.
    """

    def cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads):
        target = module(build, like=x, part=part, d_model=x.shape[-1], n_heads=n_heads)
        values = weights(layout, {"W_q": W_q, "W_k": W_k, "W_v": W_v, "W_o": W_o, "n_heads": n_heads})
        return _attended(target, values, weights_from, forward, x, memory)

    what = "cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads) -> (out (B, T, d), weights (B, H, T, S))"
    return _named(cross_attention, "cross_attention", what)


def feed_forward(build, layout, forward=None, *, part=None):
    """feed_forward(x, W1, b1, W2, b2) from build(d_model, d_ff) and forward(module, x) (default module(x))."""

    def feed_forward(x, W1, b1, W2, b2):
        target = module(build, like=x, part=part, d_model=x.shape[-1], d_ff=W1.shape[1])
        return call(target, weights(layout, {"W1": W1, "b1": b1, "W2": W2, "b2": b2}), x, forward=forward or _default_forward)

    return _named(feed_forward, "feed_forward", "feed_forward(x, W1, b1, W2, b2) -> (..., d)")


def transformer_block(build, layout, forward, *, part=None):
    """transformer_block(x, params, n_heads, causal) from build(d_model, n_heads, d_ff, causal) and forward(module, x, causal)."""

    def transformer_block(x, params, n_heads, causal=True):
        target = module(build, like=x, part=part, d_model=x.shape[-1], n_heads=n_heads, d_ff=params["W1"].shape[1], causal=causal)
        return call(target, weights(layout, {**params, "n_heads": n_heads}), x, causal, forward=forward)

    return _named(transformer_block, "transformer_block", "transformer_block(x, params, n_heads, causal) -> (B, T, d)")


def decoder_block(build, layout, forward, *, part=None):
    """decoder_block(x, memory, params, n_heads) from build(d_model, n_heads, d_ff) and forward(module, x, memory) (causal self-attention inside)."""

    def decoder_block(x, memory, params, n_heads):
        target = module(build, like=x, part=part, d_model=x.shape[-1], n_heads=n_heads, d_ff=params["W1"].shape[1])
        return call(target, weights(layout, {**params, "n_heads": n_heads}), x, memory, forward=forward)

    return _named(decoder_block, "decoder_block", "decoder_block(x, memory, params, n_heads) -> (B, T, d)")


def gpt_logits(build, layout, forward, *, refuses=(IndexError, RuntimeError), check_ids=False, part=None):
    """gpt_logits(ids, params, n_heads) from build(vocab, d_model, n_layers, max_len, n_heads, d_ff) and forward(module, ids).

    An exception of a `refuses` type becomes the protocol's ValueError where the ids are bad
    (bad_ids), and propagates unchanged otherwise. check_ids=True refuses bad ids before the call,
    for a library that accepts some without complaint (say so in the adapter's docstring).
    """

    def gpt_logits(ids, params, n_heads):
        (vocab, d_model), max_len, blocks = params["wte"].shape, params["wpe"].shape[0], params["blocks"]
        d_ff = blocks[0]["W1"].shape[1] if blocks else 4 * d_model
        sizes = {"vocab": vocab, "d_model": d_model, "n_layers": len(blocks), "max_len": max_len, "n_heads": n_heads, "d_ff": d_ff}
        if check_ids and bad_ids(ids, vocab, max_len):
            raise ValueError(f"ids of shape {tuple(ids.shape)} outside [0, {vocab}) or longer than max_len {max_len}")
        target = module(build, like=params["wte"], part=part, **sizes)
        try:
            return call(target, weights(layout, {**params, "n_heads": n_heads}), ids, forward=forward)
        except refuses as exc:
            if not bad_ids(ids, vocab, max_len):
                raise
            raise ValueError(f"refused ids of shape {tuple(ids.shape)} (vocab {vocab}, max_len {max_len}): {type(exc).__name__}: {exc}") from exc

    return _named(gpt_logits, "gpt_logits", "gpt_logits(ids, params, n_heads) -> (B, T, V); ValueError on bad ids")


def cross_entropy(loss):
    """cross_entropy(logits, targets) from a loss of (N, V) logits and (N,) targets: the leading axes are flattened into N."""

    def cross_entropy(logits, targets):
        return loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return _named(cross_entropy, "cross_entropy", f"cross_entropy(logits, targets) through {getattr(loss, '__name__', loss)}")


def gpt_param_count(build, *, without=()):
    """gpt_param_count(vocab, d_model, n_layers, max_len, attn_bias) as sum(numel) over build(...) on the meta device (no memory), tied tensors once.

    attn_bias=False leaves out the parameters whose names end with one of `without` (the
    attention biases of a model that cannot drop them).
    """
    import torch

    def gpt_param_count(vocab, d_model, n_layers, max_len, attn_bias=True):
        accepted = _accepted(build)
        sizes = {"vocab": vocab, "d_model": d_model, "n_layers": n_layers, "max_len": max_len}
        with torch.device("meta"):
            model = build(**{k: v for k, v in sizes.items() if accepted is None or k in accepted})
        return sum(p.numel() for name, p in model.named_parameters() if attn_bias or not name.endswith(tuple(without)))

    return _named(gpt_param_count, "gpt_param_count", "gpt_param_count(vocab, d_model, n_layers, max_len, attn_bias) -> int")


# -- the modern decoder (protocol version 2): a plain PyTorch Llama with its own RoPE tables and cache ----------


def visible_keys(positions, slots, *, window=None):
    """(n, slots) bool, True where the query at positions[i] may see the key in slot j (position j): j <= positions[i], within the window."""
    import torch

    query, key = positions[:, None], torch.arange(slots, device=positions.device)[None, :]
    seen = key <= query
    return seen & (key > query - window) if window is not None else seen


def rope(apply, *, layout="bthd", from_zero=False):
    """rope(x, positions, base) from apply(x, positions, base), x in the code's layout: "bthd" (B, T, H, D) or "bhtd" (B, H, T, D).

    The suite's positions are T non-negative ints in any order (distinct in its draws; all 0 in
    rope.position_zero_is_identity). from_zero=True is for code that rotates only positions
    0 .. P - 1 (no positions argument, or a start offset left at 0): each row of x is placed at its
    position in a sequence of its own, max(positions) + 1 rows long, rotated there and read back, so
    apply gets positions arange(P). RoPE acts on each position alone: nothing is approximated.
    """
    import torch

    def rope(x, positions, base):
        T_, D = x.shape[-2:]
        rows, positions = x.reshape(-1, T_, D), positions.to(x.device)  # (N, T, D)
        if from_zero:
            at, every = positions.repeat(rows.shape[0]), torch.arange(rows.shape[0] * T_, device=x.device)  # row i of N·T sits at at[i]
            rows = rows.new_zeros(len(every), int(positions.max()) + 1, D).index_put((every, at), rows.reshape(-1, D))  # (N·T, P, D)
        axis = 2 if layout == "bthd" else 1  # where the code keeps its head axis
        rotated = apply(rows.unsqueeze(axis), torch.arange(rows.shape[1], device=x.device) if from_zero else positions, base).squeeze(axis)
        return (rotated[every, at] if from_zero else rotated).reshape(x.shape)

    return _named(rope, "rope", f"rope(x, positions, base) through {getattr(apply, '__name__', apply)}")


def swiglu(build, layout, forward=None, *, part=None):
    """swiglu(x, W_gate, W_up, W_down) from build(d_model, d_ff) and forward(module, x) (default module(x))."""

    def swiglu(x, W_gate, W_up, W_down):
        target = module(build, like=x, part=part, d_model=x.shape[-1], d_ff=W_gate.shape[1])
        return call(target, weights(layout, {"W_gate": W_gate, "W_up": W_up, "W_down": W_down}), x, forward=forward or _default_forward)

    return _named(swiglu, "swiglu", "swiglu(x, W_gate, W_up, W_down) -> (..., d)")


def _llama_sizes(params, n_heads, n_kv_heads, rope_base, window, shape):
    """What a Llama builder may ask for: d_model, n_heads, n_kv_heads, d_head, d_ff, rope_base, window, max_len (T), max_batch (B),
    qkv_bias (and vocab, n_layers), from the params and the (B, T) of the call."""
    blocks = params.get("blocks", [params])  # a model's, or a block's own params
    (d_model, q_width), d_ff, block = blocks[0]["W_q"].shape, blocks[0]["W_gate"].shape[1], blocks[0]
    sizes = {"d_model": d_model, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "d_head": q_width // n_heads, "d_ff": d_ff,
             "rope_base": float(rope_base), "window": window, "max_len": shape[1], "max_batch": shape[0], "qkv_bias": "b_q" in block}
    if "embed" in params:
        sizes.update(vocab=params["embed"].shape[0], n_layers=len(blocks))
    return sizes


def _offered(forward, positions, window, slots=None):
    """The keywords forward names of `positions` (n,) and `visible`: the (n, S) mask of visible_keys over S slots (default n)."""
    extra = {"positions": positions} if _asks(forward, "positions") else {}
    if _asks(forward, "visible"):
        extra["visible"] = visible_keys(positions, len(positions) if slots is None else slots, window=window)
    return extra


def llama_block(build, layout, forward=None, *, part=None):
    """llama_block(x, params, n_heads, n_kv_heads, rope_base, window) from build(d_model, n_heads, n_kv_heads, d_head, d_ff, rope_base,
    window, max_len, max_batch, qkv_bias) and forward(module, x) (default module(x)): positions 0 .. T - 1, causal.

    A forward that names `positions` gets them (T,), one that names `visible` the (T, T) mask, True where a query may see a key
    (causal, the window applied), for a block whose caller makes its RoPE tables and mask: build the whole model, lay the
    block's weights out under("layers.0.", BLOCK), and call model.layers[0] with the model's own tables (docs/adapters.md).
    """

    def llama_block(x, params, n_heads, n_kv_heads, rope_base, window):
        target = module(build, like=x, part=part, **_llama_sizes(params, n_heads, n_kv_heads, rope_base, window, x.shape[:2]))
        forward_ = forward or _default_forward
        extra = _offered(forward_, _arange(x.shape[1], x), window)
        return call(target, weights(layout, params), x, forward=forward_, **extra)

    return _named(llama_block, "llama_block", "llama_block(x, params, n_heads, n_kv_heads, rope_base, window) -> (B, T, d)")


def _refused(ids, vocab, check_ids, refuses, run):
    """run(), with the protocol's ValueError for ids outside [0, vocab): raised before (check_ids) or for a refuses-type error of run()."""
    if check_ids and bad_ids(ids, vocab, ids.shape[-1]):
        raise ValueError(f"ids of shape {tuple(ids.shape)} outside [0, {vocab})")
    try:
        return run()
    except refuses as exc:
        if not bad_ids(ids, vocab, ids.shape[-1]):
            raise
        raise ValueError(f"refused ids of shape {tuple(ids.shape)} (vocab {vocab}): {type(exc).__name__}: {exc}") from exc


def llama_logits(build, layout, forward=None, *, refuses=(IndexError, RuntimeError), check_ids=False, part=None):
    """llama_logits(ids, params, n_heads, n_kv_heads, rope_base, window) from build(vocab, n_layers and llama_block's sizes) and
    forward(module, ids) (default module(ids)) -> (B, T, V); bad ids become ValueError as in gpt_logits. forward may name
    `positions` and `visible`, as llama_block's."""

    def llama_logits(ids, params, n_heads, n_kv_heads, rope_base, window):
        sizes = _llama_sizes(params, n_heads, n_kv_heads, rope_base, window, ids.shape)
        target = module(build, like=params["embed"], part=part, **sizes)
        forward_ = forward or _default_forward
        extra = _offered(forward_, _arange(ids.shape[-1], params["embed"]), window)
        run = functools.partial(call, target, weights(layout, params), ids, forward=forward_, **extra)
        return _refused(ids, sizes["vocab"], check_ids, refuses, run)

    return _named(llama_logits, "llama_logits", "llama_logits(ids, params, n_heads, n_kv_heads, rope_base, window) -> (B, T, V)")


SLOT_RULES = ("grow", "whole", "ring")


def held_positions(keys, t, slots, *, axes="bhsd"):
    """(L, H_c, S) positions held by per-layer key caches `keys` after t tokens, -1 where none: H_c and S read from the keys' shape
    (axes names where the head "h" and slot "s" axes are), the position of each slot from the slot rule:

    "grow": the S slots hold the last S positions (a cache that grows, or grows and drops the oldest);
    "whole": slot p holds position p once written (allocated for the whole sequence); "ring": slot p mod S holds the latest p.
    """
    import torch

    if slots not in SLOT_RULES:
        raise ToolkitError(f"slots={slots!r} is not a slot rule: expected one of {', '.join(map(repr, SLOT_RULES))}")
    tables = []
    for cached in keys:
        H_c, S = cached.shape[axes.index("h")], cached.shape[axes.index("s")]
        slot = torch.arange(S)
        if slots == "grow":
            held = t - S + slot  # negative (not -1) where the cache holds more than it has seen: the law fails it
        elif slots == "whole":
            held = torch.where(slot < t, slot, -1)
        else:
            held = torch.where(slot < t, slot + S * torch.div(t - 1 - slot, S, rounding_mode="floor"), -1)
        tables.append(held.expand(H_c, S))
    return _padded(tables)  # layers whose caches hold different slot counts: -1 past a layer's own


def _asks(forward, name):
    """Whether forward names the argument `name` (or takes **kwargs)."""
    accepted = _accepted(forward)
    return accepted is None or name in accepted


def _arange(n, like):
    import torch

    return torch.arange(n, device=like.device)


def _padded(tables):
    """Position tables (..., S_i) of different slot counts stacked into one (n, ..., S), -1 in the slots a table does not have."""
    import torch

    S = max(table.shape[-1] for table in tables)
    return torch.stack([torch.nn.functional.pad(table, (0, S - table.shape[-1]), value=-1) for table in tables])


@contextmanager
def _own(what):
    """Any error of the block (the toolkit's bookkeeping, or an adapter function it calls) as a ToolkitError naming `what`."""
    try:
        yield
    except ToolkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - the adapter's or the toolkit's own mistake, never the code's refusal of an input
        raise ToolkitError(f"{what} raised {type(exc).__name__}: {exc}") from exc


def llama_decode(build, layout, step, *, keys, slots="grow", axes="bhsd", refuses=(IndexError, RuntimeError), check_ids=False, part=None):
    """llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, chunks) -> (logits, cache_positions) from build(llama_logits's
    sizes, max_len = T, and batch) and step(module, chunk_ids, positions) -> (B, n, V), the code's own call on a chunk at positions
    (n,) (positions[0]: the start offset, for code that takes one).

    The module is built afresh for every call (its cache starts empty) and is called once per chunk;
    keys(module) returns its per-layer key caches, read after each chunk by held_positions(keys, t,
    slots, axes=axes); the tables of a cache that grows are padded with -1 to the last one's slots. A
    step that names a `visible` argument also gets visible_keys(positions, S, window=window): the (n, S)
    mask over the cache's S slots (slots "whole": read from the keys) or over the S = start + n keys a
    growing cache holds once the chunk is in. An error of the toolkit's own bookkeeping or of keys()
    is a ToolkitError (the laws never read it as a refusal); the step's own errors are the code's.
    The function's `cache_slots` attribute names the slot rule, for the run's header.
    """
    import torch

    if slots not in SLOT_RULES:
        raise ToolkitError(f"slots={slots!r} is not a slot rule: expected one of {', '.join(map(repr, SLOT_RULES))}")
    if slots == "ring" and _asks(step, "visible"):
        raise ToolkitError("a ring cache's slots do not hold positions 0 .. S - 1 in order: build its mask in step, not from `visible`")

    def llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, chunks):
        sizes = _llama_sizes(params, n_heads, n_kv_heads, rope_base, window, ids.shape)
        target = module(build, like=params["embed"], part=part, fresh=True, batch=ids.shape[0], **sizes)
        with _own("the layout"):
            values = weights(layout, params)
        logits, table, start = [], [], 0
        for n in (int(c) for c in chunks):
            positions = torch.arange(start, start + n, device=ids.device)
            extra = {}
            if _asks(step, "visible"):  # the (n, S) mask over a whole-sequence cache's S slots, or over the start + n keys a growing one holds
                with _own(f"keys(module) (axes={axes!r})"):
                    S = keys(target)[0].shape[axes.index("s")] if slots == "whole" else start + n
                extra["visible"] = visible_keys(positions, S, window=window)
            run = functools.partial(call, target, values, ids[:, start : start + n], positions, forward=step, **extra)
            logits.append(_refused(ids, sizes["vocab"], check_ids, refuses, run))
            start += n
            with _own(f"reading the cache after {start} tokens (keys(module), axes={axes!r}, slots={slots!r})"):
                table.append(held_positions(keys(target), start, slots, axes=axes))
        return torch.cat(logits, dim=1), _padded(table)

    what = "llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, chunks) -> (logits (B, T, V), cache_positions (n, L, H_c, S))"
    decode = _named(llama_decode, "llama_decode", what)
    decode.cache_slots = slots
    return decode


def llama_logits_by_decoding(llama_decode, *, max_chunk=None):
    """llama_logits from a llama_decode, for code whose forward only runs through its cache: the whole sequence as one chunk,
    or in chunks of at most max_chunk tokens (1: code that takes one-token steps only)."""
    import torch

    def llama_logits(ids, params, n_heads, n_kv_heads, rope_base, window):
        T = ids.shape[-1]
        chunks = [T] if max_chunk is None else [min(max_chunk, T - start) for start in range(0, T, max_chunk)]
        return llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, torch.tensor(chunks))[0]

    return _named(llama_logits, "llama_logits", "llama_logits(ids, params, n_heads, n_kv_heads, rope_base, window) -> (B, T, V), by decoding")


@contextmanager
def _identities(target, names):
    """Make each submodule `name` of target return its first input, without running (a RoPE the suite's q and k bypass), during the block."""
    parts = [target.get_submodule(name) for name in names]
    try:
        for part in parts:
            part.forward = lambda x, *_args, **_kwargs: x  # an instance attribute: nn.Module.__call__ finds it before the class's forward
        yield target
    finally:
        for part in parts:
            del part.forward


def gqa_attention(build, forward, *, q, k, v, out, identity=(), part=None):
    """gqa_attention(q, k, v, causal, key_mask, window) -> out (B, H, T, D) from an attention module whose core cannot be called alone.

    build(d_model, n_heads, n_kv_heads, d_head, max_len = S, window, batch) makes the module (with its
    cache); forward(module, x, positions) calls it on x (B, n, d) at positions (n,), as llama_decode's step (`visible` too: the (n,
    S) mask over a cache of S slots, slot j holding position j). The projections
    named q, k, v are made to return the suite's q, k, v (rows (B, n, heads·D)), the submodules named
    in `identity` (its RoPE) return their input, and what reaches `out` is the answer. The S - T
    cached keys go in first, as a prefill at start 0 with zero queries; the T queries follow at S - T.
    Declare ATTENTION_WEIGHTS = False, CAUSAL_ONLY = True and KEY_MASK = False where the code has no
    weights, encoder mode or padding mask.
    """

    import torch

    def rows(t):
        return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)  # (B, heads, n, D) -> (B, n, heads·D)

    def gqa_attention(q_, k_, v_, causal, key_mask, window):
        (B, H, T_, D), (H_kv, S) = q_.shape, k_.shape[1:3]
        target = module(build, like=q_, part=part, fresh=True, d_model=H * D, n_heads=H, n_kv_heads=H_kv, d_head=D, max_len=S,
                        window=window, batch=B, max_batch=B)
        with _identities(target, identity), capture(target, out, inputs=True) as seen:
            for start, end in ((0, S - T_), (S - T_, S)) if S > T_ else ((0, S),):  # the cached keys' prefill, then the queries
                queries = q_ if end == S else q_.new_zeros(B, H, end - start, D)
                with substitute(target, {q: rows(queries), k: rows(k_[:, :, start:end]), v: rows(v_[:, :, start:end])}):
                    at = torch.arange(start, end, device=q_.device)
                    extra = {"visible": visible_keys(at, S, window=window)} if _asks(forward, "visible") else {}
                    forward(target, q_.new_zeros(B, end - start, H * D), at, **extra)
        return seen[-1].reshape(B, T_, H, D).transpose(1, 2)

    return _named(gqa_attention, "gqa_attention", "gqa_attention(q, k, v, causal, key_mask, window) -> out (B, H, T, D)")
