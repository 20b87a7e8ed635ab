"""Declared conventions: each one changes what it says (the reference, the draws, the invariants that run), its skips
are Declared, a bad value is refused at load time, and a wrong declaration fails loudly."""

import dataclasses
import re
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the example implementations wrap reference.torch")

import invariants.reference.torch as rt  # noqa: E402
from invariants import REGISTRY, Implementation, all_invariants, run_invariant  # noqa: E402
from invariants import runner as _runner  # noqa: E402
from invariants.boundary import declared_value  # noqa: E402
from invariants.conventions import CONVENTIONS, Declared, declared, rounding_dtype  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402
from invariants.protocol import ImplementationLoadError  # noqa: E402
from invariants.tolerance import tolerance_for  # noqa: E402

all_invariants()
CI = profile_settings("ci")
BIASES = ("b_q", "b_k", "b_v", "b_o")


def _status(inv_name, impl, inv=None):
    """(status, report) of one invariant on impl at the ci profile, through either runner API (an Outcome, or exceptions)."""
    failure = getattr(_runner, "InvariantFailure", ())
    try:
        result = run_invariant(inv or REGISTRY[inv_name], impl, settings=CI)
    except _runner.InvariantSkipped as skipped:
        return "skipped", str(skipped)
    except failure as failed:
        return "failed", str(failed)
    if hasattr(result, "status"):
        return result.status, result.report or result.reason
    return "passed", ""


def _impl(label, dtype="float64", **members):
    """A torch implementation made of `members` (protocol functions and declared constants)."""
    return Implementation(SimpleNamespace(BACKEND="torch", **members), label=label, backend="torch", dtype=dtype)


def _names(*components):
    return [name for name, inv in REGISTRY.items() if inv.component in components]


def assert_declared_skip(name, impl, convention):
    reason = REGISTRY[name].skip_reason(impl)
    assert isinstance(reason, Declared), (name, reason)
    assert f"declares {convention} = " in reason, reason
    status, report = _status(name, impl)
    assert status == "skipped" and convention in report, report


def assert_passes(names, impl, *, skipped=()):
    """Every invariant in `names` passes on impl, except those in `skipped`, which are skipped with a Declared reason."""
    for name in names:
        status, report = _status(name, impl)
        if name in skipped:
            assert status == "skipped" and isinstance(REGISTRY[name].skip_reason(impl), Declared), (name, report)
        else:
            assert status == "passed", f"{name}: {report}"


# -- the table ------------------------------------------------------------------------------------------------


def test_every_convention_says_what_it_changes_and_its_default_is_allowed():
    for name, convention in CONVENTIONS.items():
        assert convention.name == name
        assert convention.changes and convention.changes.count(". ") == 0, name  # one sentence
        assert convention.default is None or convention.problem(convention.default) is None, name


EPS = ("a float from 1e-16 to 0.001; real norms use 1e-12 (BERT) to 1e-3 (Keras), most 1e-5 (GPT-2, PyTorch) "
       "or 1e-6 (Llama, T5)")
RATIO = "an int from 1 to 64; real networks use 4 (GPT-2, BERT, ViT), 8 (M2M-100), 16 (T5-3B), at most 64 (T5-11B)"
BAD = [
    ("GELU_FORM", "exact", "GELU_FORM = 'exact' is not allowed: expected 'tanh' or 'erf'"),
    ("ATTENTION_BIASES", 1, "ATTENTION_BIASES = 1 is not allowed: expected True or False"),
    ("CAUSAL_ONLY", "yes", "CAUSAL_ONLY = 'yes' is not allowed: expected True or False"),
    ("ENCODER_ONLY", 1, "ENCODER_ONLY = 1 is not allowed: expected True or False"),
    ("ATTENTION_WEIGHTS", None, "ATTENTION_WEIGHTS = None is not allowed: expected True or False"),
    ("LAYER_NORM_EPS", 0.0, f"LAYER_NORM_EPS = 0.0 is not allowed: expected {EPS}"),
    ("LAYER_NORM_EPS", 1, f"LAYER_NORM_EPS = 1 is not allowed: expected {EPS}"),
    ("LAYER_NORM_EPS", 1e300, f"LAYER_NORM_EPS = 1e+300 is not allowed: expected {EPS}"),  # every LayerNorm would return its bias
    ("LAYER_NORM_EPS", 2e-3, f"LAYER_NORM_EPS = 0.002 is not allowed: expected {EPS}"),
    ("LAYER_NORM_EPS", float("inf"), f"LAYER_NORM_EPS = inf is not allowed: expected {EPS}"),
    ("LAYER_NORM_EPS", float("nan"), f"LAYER_NORM_EPS = nan is not allowed: expected {EPS}"),
    ("RMS_NORM_EPS", -1e-6, f"RMS_NORM_EPS = -1e-06 is not allowed: expected {EPS}"),
    ("RMS_NORM_EPS", 1e300, f"RMS_NORM_EPS = 1e+300 is not allowed: expected {EPS}"),
    ("RMS_NORM_EPS", 1e-17, f"RMS_NORM_EPS = 1e-17 is not allowed: expected {EPS}"),
    ("FEED_FORWARD_RATIO", 0, f"FEED_FORWARD_RATIO = 0 is not allowed: expected {RATIO}"),
    ("FEED_FORWARD_RATIO", 50_000, f"FEED_FORWARD_RATIO = 50000 is not allowed: expected {RATIO}"),  # drew weights up to 8 GiB
    ("FEED_FORWARD_RATIO", 65, f"FEED_FORWARD_RATIO = 65 is not allowed: expected {RATIO}"),
    ("FEED_FORWARD_RATIO", True, f"FEED_FORWARD_RATIO = True is not allowed: expected {RATIO}"),
    ("FEED_FORWARD_RATIO", 4.0, f"FEED_FORWARD_RATIO = 4.0 is not allowed: expected {RATIO}"),
    ("ROPE_PAIRING", np.zeros(2), "ROPE_PAIRING = 'an array of shape (2,)' is not allowed: expected 'half_split' or 'interleaved'"),
    ("TOP_K_TIES", "lower_index", "TOP_K_TIES = 'lower_index' is not allowed: expected 'lower' or 'any'"),
    ("EXPERT_FFN", "silu", "EXPERT_FFN = 'silu' is not allowed: expected 'gelu' or 'swiglu'"),
    ("ROPE_THETA", 1e9, "ROPE_THETA = 1000000000.0 is not allowed: expected a float from 10000.0 to 10000000.0; real RoPE uses "
     "10,000 (Llama 2), 500,000 (Llama 3), 1,000,000 (Qwen2, CodeLlama), at most 10,000,000 (Qwen2.5-1M)"),
    ("MAX_DECODE_CHUNK", 0, "MAX_DECODE_CHUNK = 0 is not allowed: expected an int from 1 to 2147483647; one-token steps (1) in "
     "most generate loops; chunked prefill and speculative decoding take more"),
    ("COMPUTE_DTYPE", "float16", "COMPUTE_DTYPE = 'float16' is not allowed: expected 'float32'"),
]


@pytest.mark.parametrize("name, value, message", BAD, ids=lambda v: repr(v))
def test_a_bad_declaration_is_refused_when_the_implementation_loads(name, value, message):
    assert CONVENTIONS[name].problem(declared_value(value)) == message  # read as the suite and the gate read it
    with pytest.raises(ImplementationLoadError, match="^" + re.escape(f"bad: {message}")):
        _impl("bad", gelu=rt.gelu, **{name: value})


def test_the_references_declarations_skip_nothing():
    impl = Implementation(rt, label="reference.torch", backend="torch")
    assert impl.declarations == {"GELU_FORM": "tanh", "ATTENTION_BIASES": True, "ROPE_PAIRING": "half_split", "QKV_BIASES": True,
                                 "FULLY_MASKED_ROWS": "zeros"}
    assert not [name for name, inv in REGISTRY.items() if isinstance(inv.skip_reason(impl), Declared)]


# -- GELU_FORM ------------------------------------------------------------------------------------------------


def erf_members():
    def feed_forward(x, W1, b1, W2, b2):
        return rt.feed_forward(x, W1, b1, W2, b2, gelu_form="erf")

    def transformer_block(x, params, n_heads, causal):
        return rt.transformer_block(x, params, n_heads, causal, gelu_form="erf")

    def gpt_logits(ids, params, n_heads):
        return rt.gpt_logits(ids, params, n_heads, gelu_form="erf")

    def moe(x, router, experts, k):
        return rt.moe(x, router, experts, k, gelu_form="erf")

    return dict(gelu=rt.gelu_erf, feed_forward=feed_forward, transformer_block=transformer_block, gpt_logits=gpt_logits, moe=moe)


GELU_CHECKS = ["activation.gelu_agrees_with_reference", "feed_forward.feed_forward_agrees_with_reference",
               "block.agrees_with_reference", "model.agrees_with_reference", "moe.moe_agrees_with_reference"]


@pytest.mark.parametrize("name", GELU_CHECKS)
def test_gelu_form_erf_declared_for_erf_code_passes(name):
    status, report = _status(name, _impl("erf code", GELU_FORM="erf", **erf_members()))
    assert status == "passed", report


@pytest.mark.parametrize("name", GELU_CHECKS)
def test_a_wrong_gelu_form_declaration_fails_loudly(name):
    impl = _impl("tanh code", GELU_FORM="erf", gelu=rt.gelu, feed_forward=rt.feed_forward, transformer_block=rt.transformer_block,
                 gpt_logits=rt.gpt_logits, moe=rt.moe)
    status, report = _status(name, impl)
    assert status == "failed", report
    assert "GELU_FORM = 'erf'" in report
    if name.startswith(("activation", "block")):  # the values show the other form
        assert "it agrees with the tanh form instead: is GELU_FORM declared wrongly?" in report, report


def test_a_gelu_form_declaration_is_held_to_even_without_gelu_itself():
    block = erf_members()["transformer_block"]
    status, report = _status("block.agrees_with_reference", _impl("erf block", GELU_FORM="tanh", transformer_block=block))
    assert status == "failed" and "GELU_FORM = 'tanh'" in report, report


# -- ATTENTION_BIASES -----------------------------------------------------------------------------------------


def strict_block(x, params, n_heads, causal):
    """A block that cannot take attention biases at all: it refuses params that hold them."""
    if any(name in params for name in BIASES):
        raise ValueError("this block has no attention biases")
    return rt.transformer_block(x, params, n_heads, causal)


def strict_gpt(ids, params, n_heads):
    for block in params["blocks"]:
        if any(name in block for name in BIASES):
            raise ValueError("this model has no attention biases")
    return rt.gpt_logits(ids, params, n_heads)


def test_undeclared_attention_biases_are_never_drawn():
    impl = _impl("bias-free", transformer_block=strict_block, gpt_logits=strict_gpt, attention=rt.attention, feed_forward=rt.feed_forward,
                 layer_norm=rt.layer_norm)
    assert_passes(_names("block", "model"), impl)


@pytest.mark.parametrize("name", ["block.agrees_with_reference", "model.agrees_with_reference"])
def test_declared_attention_biases_are_drawn(name):
    impl = _impl("declares biases", ATTENTION_BIASES=True, transformer_block=strict_block, gpt_logits=strict_gpt)
    status, report = _status(name, impl)
    assert status == "error" and "this " in report and "has no attention biases" in report, report
    assert _status(name, _impl("declares none", ATTENTION_BIASES=False, transformer_block=strict_block, gpt_logits=strict_gpt))[0] == "passed"


# -- CAUSAL_ONLY ----------------------------------------------------------------------------------------------


def decoder_attention(x, W_q, W_k, W_v, W_o, n_heads, causal):
    if not causal:
        raise NotImplementedError("decoder only: causal=False is not supported")
    return rt.attention(x, W_q, W_k, W_v, W_o, n_heads, causal)


def decoder_block(x, params, n_heads, causal):
    if not causal:
        raise NotImplementedError("decoder only: causal=False is not supported")
    return rt.transformer_block(x, params, n_heads, causal)


ENCODER_MODE = ("attention.last_position_mask_free", "attention.permutation_equivariance", "block.permutation_equivariant")


def test_causal_only_skips_encoder_mode_and_runs_the_rest_causal():
    impl = _impl("decoder only", CAUSAL_ONLY=True, attention=decoder_attention, transformer_block=decoder_block, layer_norm=rt.layer_norm,
                 feed_forward=rt.feed_forward)
    for name in ENCODER_MODE:
        assert_declared_skip(name, impl, "CAUSAL_ONLY")
    assert_passes(_names("attention", "block"), impl, skipped=ENCODER_MODE)


def test_without_the_declaration_a_decoder_only_attention_is_called_in_encoder_mode():
    status, report = _status("attention.permutation_equivariance", _impl("decoder only", attention=decoder_attention))
    assert status == "error" and "causal=False is not supported" in report, report


# -- ENCODER_ONLY ---------------------------------------------------------------------------------------------


def _refuse_decoder_mode(causal):
    if causal:
        raise NotImplementedError("encoder only: causal=True is not supported")


def encoder_attention(x, W_q, W_k, W_v, W_o, n_heads, causal):
    _refuse_decoder_mode(causal)
    return rt.attention(x, W_q, W_k, W_v, W_o, n_heads, causal)


def encoder_block(x, params, n_heads, causal):
    _refuse_decoder_mode(causal)
    return rt.transformer_block(x, params, n_heads, causal)


def encoder_gqa_attention(q, k, v, causal, key_mask=None, window=None):
    _refuse_decoder_mode(causal)
    return rt.gqa_attention(q, k, v, causal, key_mask, window)


def _always_causal(function):
    """function with causal=True whatever it is passed (the flag ignored, the mask hard-coded)."""
    return lambda x, params, n_heads, causal: function(x, params, n_heads, True)


DECODER_MODE = ("attention.causal_non_leakage", "attention.causal_gradient", "attention.causal_weights_pattern",
                "attention.last_position_mask_free", "block.causal_non_leakage", "gqa.queries_shorter_than_keys",
                "masking.window_key_count", "masking.window_outside_keys_ignored", "masking.window_covering_all_keys_is_causal",
                "masking.masks_compose_in_low_precision")


def _encoder(**members):
    return _impl("encoder only", ENCODER_ONLY=True, layer_norm=rt.layer_norm, feed_forward=rt.feed_forward, **members)


def test_encoder_only_skips_decoder_mode_and_runs_the_rest_in_encoder_mode():
    impl = _encoder(attention=encoder_attention, transformer_block=encoder_block, gqa_attention=encoder_gqa_attention)
    for name in DECODER_MODE:
        assert_declared_skip(name, impl, "ENCODER_ONLY")
    assert_passes(_names("attention", "block", "gqa", "masking"), impl, skipped=DECODER_MODE)


def test_without_the_declaration_an_encoder_only_attention_is_called_in_decoder_mode():
    status, report = _status("attention.causal_non_leakage", _impl("encoder only", attention=encoder_attention))
    assert status == "error" and "causal=True is not supported" in report, report


def test_encoder_only_declared_for_a_block_that_always_masks_fails():
    impl = _encoder(attention=rt.attention, transformer_block=_always_causal(rt.transformer_block))
    status, report = _status("block.permutation_equivariant", impl)
    assert status == "failed", report


def test_causal_only_and_encoder_only_together_are_refused():
    with pytest.raises(ImplementationLoadError, match="leave attention no mode to run in"):
        _impl("neither", CAUSAL_ONLY=True, ENCODER_ONLY=True, attention=rt.attention)


# -- ATTENTION_WEIGHTS ----------------------------------------------------------------------------------------


def sdpa_style(x, W_q, W_k, W_v, W_o, n_heads, causal):
    """Attention that returns its output alone (as F.scaled_dot_product_attention does)."""
    return rt.attention(x, W_q, W_k, W_v, W_o, n_heads, causal)[0]


def unscaled_sdpa_style(x, W_q, W_k, W_v, W_o, n_heads, causal):
    """The same with the scores not scaled by 1/√D (a bug): W_q·√D undoes the scale."""
    return sdpa_style(x, W_q * (x.shape[-1] // n_heads) ** 0.5, W_k, W_v, W_o, n_heads, causal)


WEIGHT_CHECKS = ("attention.causal_weights_pattern", "attention.weights_are_distributions")


def test_attention_without_weights_skips_the_weight_invariants_and_checks_the_output():
    impl = _impl("SDPA-style", ATTENTION_WEIGHTS=False, attention=sdpa_style, transformer_block=rt.transformer_block, layer_norm=rt.layer_norm)
    for name in WEIGHT_CHECKS:
        assert_declared_skip(name, impl, "ATTENTION_WEIGHTS")
    assert_passes([*_names("attention"), "block.attention_sublayer_alone"], impl, skipped=WEIGHT_CHECKS)


def test_attention_without_weights_is_still_checked():
    impl = _impl("unscaled SDPA-style", ATTENTION_WEIGHTS=False, attention=unscaled_sdpa_style)
    status, report = _status("attention.agrees_with_reference", impl)
    assert status == "failed" and "attention output" in report, report


def test_attention_that_declares_no_weights_must_answer_its_output_alone():
    impl = _impl("says no weights, returns them", ATTENTION_WEIGHTS=False, attention=rt.attention)
    status, report = _status("attention.zero_output_projection", impl)
    assert status == "failed" and "out alone, as ATTENTION_WEIGHTS = False declares" in report, report
    status, report = _status("attention.zero_output_projection", _impl("returns no weights", attention=sdpa_style))
    assert status == "failed" and "(out, weights)" in report, report  # without the declaration, weights are part of the answer


# -- LAYER_NORM_EPS and RMS_NORM_EPS --------------------------------------------------------------------------


def fixed_eps_members(eps=1e-6):
    """Norms built with a fixed eps (as nn.LayerNorm(d, eps=1e-6) is), and the block and model that use it."""

    def layer_norm(x, gain, bias, _eps):
        return rt.layer_norm(x, gain, bias, eps)

    def rms_norm(x, gain, _eps):
        return rt.rms_norm(x, gain, eps)

    def transformer_block(x, params, n_heads, causal):
        return rt.transformer_block(x, params, n_heads, causal, eps=eps)

    def gpt_logits(ids, params, n_heads):
        return rt.gpt_logits(ids, params, n_heads, eps=eps)

    return dict(layer_norm=layer_norm, rms_norm=rms_norm, transformer_block=transformer_block, gpt_logits=gpt_logits,
                attention=rt.attention, feed_forward=rt.feed_forward)


EPS_LAWS = ("norms.layer_norm_scale_law", "norms.rms_norm_scale_law")


def test_a_fixed_norm_eps_skips_the_scale_laws_and_is_used_everywhere_else():
    impl = _impl("eps 1e-6", LAYER_NORM_EPS=1e-6, RMS_NORM_EPS=1e-6, **fixed_eps_members())
    assert_declared_skip("norms.layer_norm_scale_law", impl, "LAYER_NORM_EPS")
    assert_declared_skip("norms.rms_norm_scale_law", impl, "RMS_NORM_EPS")
    assert_passes(_names("norms", "block", "model"), impl, skipped=EPS_LAWS)


def test_the_scale_law_is_skipped_because_it_would_be_checked_wrongly():
    impl = _impl("eps 1e-6", LAYER_NORM_EPS=1e-6, **fixed_eps_members())
    unguarded = dataclasses.replace(REGISTRY["norms.layer_norm_scale_law"], applies=None)
    assert _status(unguarded.name, impl, inv=unguarded)[0] == "failed"  # the law needs eps/c², which a fixed eps never takes


@pytest.mark.parametrize("name", ["norms.layer_norm_agrees_with_reference", "block.agrees_with_reference", "model.agrees_with_reference"])
def test_an_undeclared_or_wrong_eps_fails(name):
    assert _status(name, _impl("eps 1e-6, undeclared", **fixed_eps_members()))[0] == "failed"
    assert _status(name, _impl("eps 1e-5, declared 1e-6", LAYER_NORM_EPS=1e-6, **fixed_eps_members(1e-5)))[0] == "failed"


def test_centred_rms_norm_is_layer_norm_needs_one_eps_for_both():
    both = _impl("two eps", LAYER_NORM_EPS=1e-5, RMS_NORM_EPS=1e-6, layer_norm=rt.layer_norm, rms_norm=fixed_eps_members()["rms_norm"])
    assert_declared_skip("norms.rms_norm_of_centred_is_layer_norm", both, "LAYER_NORM_EPS")
    one = _impl("rms eps 1e-6", RMS_NORM_EPS=1e-6, layer_norm=rt.layer_norm, rms_norm=fixed_eps_members()["rms_norm"])
    assert _status("norms.rms_norm_of_centred_is_layer_norm", one)[0] == "passed"  # layer_norm takes the eps it is passed


# -- FEED_FORWARD_RATIO ---------------------------------------------------------------------------------------


def _check_width(W1, ratio=2):
    if W1.shape[1] != ratio * W1.shape[0]:
        raise ValueError(f"this network is built for d_ff = {ratio}·d_model, got W1 {tuple(W1.shape)}")


def width_2_members():
    def feed_forward(x, W1, b1, W2, b2):
        _check_width(W1)
        return rt.feed_forward(x, W1, b1, W2, b2)

    def transformer_block(x, params, n_heads, causal):
        _check_width(params["W1"])
        return rt.transformer_block(x, params, n_heads, causal)

    def gpt_logits(ids, params, n_heads):
        for block in params["blocks"]:
            _check_width(block["W1"])
        return rt.gpt_logits(ids, params, n_heads)

    def moe(x, router, experts, k):
        for expert in experts:
            _check_width(expert["W1"])
        return rt.moe(x, router, experts, k)

    return dict(feed_forward=feed_forward, transformer_block=transformer_block, gpt_logits=gpt_logits, moe=moe,
                attention=rt.attention, layer_norm=rt.layer_norm)


def test_a_fixed_feed_forward_width_is_all_that_is_drawn():
    impl = _impl("d_ff = 2d", FEED_FORWARD_RATIO=2, **width_2_members())
    names = [*_names("feed_forward", "block", "model"), "moe.moe_dense_when_k_equals_n", "moe.moe_top_1_is_chosen_expert",
             "moe.moe_token_permutation_equivariance", "moe.moe_agrees_with_reference"]
    assert_passes(names, impl)


@pytest.mark.parametrize("name", ["feed_forward.feed_forward_agrees_with_reference", "block.agrees_with_reference", "moe.moe_agrees_with_reference"])
def test_without_the_declaration_other_widths_are_drawn(name):
    status, report = _status(name, _impl("d_ff = 2d, undeclared", **width_2_members()))
    assert status == "error" and "built for d_ff = 2·d_model" in report, report


# -- LAYER_NORM_BIAS, FEED_FORWARD_BIASES --------------------------------------------------------------------


NORM_BIASES, FEED_FORWARD_BIASES = ("ln1_b", "ln2_b", "lnf_b"), ("b1", "b2")


def _refuse_biases(params, names):
    for name in names:
        if name in params and bool((params[name] != 0).any()):
            raise ValueError(f"this implementation has no {name}, and was given a nonzero one")


def bias_free_members(*, refuse):
    """Protocol functions without LayerNorm and feed-forward biases: they leave the biases out, or (refuse=True) refuse nonzero ones."""

    def dropped(params, names):
        if refuse:
            _refuse_biases(params, names)
        return {k: torch.zeros_like(v) if k in names else v for k, v in params.items()}

    def layer_norm(x, gain, bias, eps=1e-5):
        return rt.layer_norm(x, gain, dropped({"bias": bias}, ("bias",))["bias"], eps)

    def feed_forward(x, W1, b1, W2, b2):
        p = dropped({"b1": b1, "b2": b2}, FEED_FORWARD_BIASES)
        return rt.feed_forward(x, W1, p["b1"], W2, p["b2"])

    def transformer_block(x, params, n_heads, causal):
        return rt.transformer_block(x, dropped(params, NORM_BIASES + FEED_FORWARD_BIASES), n_heads, causal)

    def gpt_logits(ids, params, n_heads):
        blocks = [dropped(block, NORM_BIASES + FEED_FORWARD_BIASES) for block in params["blocks"]]
        return rt.gpt_logits(ids, {**dropped(params, NORM_BIASES), "blocks": blocks}, n_heads)

    def moe(x, router, experts, k):
        return rt.moe(x, router, [dropped(expert, FEED_FORWARD_BIASES) for expert in experts], k)

    return dict(layer_norm=layer_norm, feed_forward=feed_forward, transformer_block=transformer_block, gpt_logits=gpt_logits, moe=moe,
                attention=rt.attention, gelu=rt.gelu)


BIAS_FREE = dict(LAYER_NORM_BIAS=False, FEED_FORWARD_BIASES=False)
BIAS_READERS = [*[n for n in _names("norms") if n.startswith("norms.layer_norm")], *_names("feed_forward", "block", "model"),
                "moe.moe_dense_when_k_equals_n", "moe.moe_top_1_is_chosen_expert", "moe.moe_agrees_with_reference",
                "dtypes.layer_norm_keeps_dtype", "dtypes.feed_forward_keeps_dtype", "dtypes.transformer_block_keeps_dtype",
                "dtypes.gpt_logits_keeps_dtype"]


def test_declared_bias_free_norms_and_feed_forwards_are_given_zero_biases_everywhere():
    assert_passes(BIAS_READERS, _impl("no norm or feed-forward biases, refusing any", **BIAS_FREE, **bias_free_members(refuse=True)))


@pytest.mark.parametrize("name", ["norms.layer_norm_affine", "feed_forward.feed_forward_zero_W2_gives_b2", "block.agrees_with_reference",
                                  "model.agrees_with_reference", "moe.moe_agrees_with_reference"])
def test_undeclared_bias_free_code_fails_where_it_drops_the_biases(name):
    status, report = _status(name, _impl("no norm or feed-forward biases, undeclared", **bias_free_members(refuse=False)))
    assert status == "failed", report


def test_the_hints_name_the_bias_declarations():
    assert "LAYER_NORM_BIAS = False" in REGISTRY["norms.layer_norm_affine"].hint
    assert "FEED_FORWARD_BIASES = False" in REGISTRY["feed_forward.feed_forward_zero_W2_gives_b2"].hint


def test_torch_encoder_layer_without_biases_passes_with_its_declarations():
    # nn.TransformerEncoderLayer(bias=False): no bias in its LayerNorms, its feed-forward Linears or its attention
    from invariants.adapters import toolkit as tk

    def layer(d_model, n_heads=1, d_ff=1, eps=1e-5):
        return torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation="gelu", layer_norm_eps=eps,
                                                batch_first=True, norm_first=True, bias=False)

    def attend(mha, x, causal):
        return mha(x, x, x, attn_mask=tk.causal_mask(x, causal), need_weights=True, average_attn_weights=False)

    attn = {"in_proj_weight": tk.cat(tk.T("W_q"), tk.T("W_k"), tk.T("W_v")), "out_proj.weight": tk.T("W_o")}
    ffn = {"linear1.weight": tk.T("W1"), "linear2.weight": tk.T("W2")}
    block = {"norm1.weight": "ln1_g", "norm2.weight": "ln2_g", **tk.under("self_attn.", attn), **ffn}
    members = dict(
        GELU_FORM="erf", **BIAS_FREE,
        layer_norm=tk.layer_norm(layer, layout={"weight": "gain"}, part="norm1"),
        attention=tk.attention(layer, attn, attend, part="self_attn"),
        feed_forward=tk.feed_forward(layer, ffn, lambda module, x: module._ff_block(x)),
        transformer_block=tk.transformer_block(layer, block, lambda module, x, causal: module(x, src_mask=tk.causal_mask(x, causal),
                                                                                               is_causal=causal)),
    )
    names = [n for n in BIAS_READERS if not n.startswith(("model.", "moe.", "dtypes.gpt"))]
    assert_passes(names, _impl("nn.TransformerEncoderLayer(bias=False)", **members))


# -- TOP_K_TIES -----------------------------------------------------------------------------------------------


def test_no_tie_rule_skips_the_tie_invariant_with_a_declared_reason():
    impl = _impl("no tie rule", TOP_K_TIES="any", top_k_gates=rt.top_k_gates)
    assert declared(impl, "TOP_K_TIES") == "any"
    assert_declared_skip("moe.top_k_gates_tie_rule", impl, "TOP_K_TIES")
    assert _status("moe.top_k_gates_agrees_with_reference", impl)[0] == "passed"


# -- EXPERT_FFN -----------------------------------------------------------------------------------------------

MOE_LAYER = ["moe.moe_dense_when_k_equals_n", "moe.moe_top_1_is_chosen_expert", "moe.moe_token_permutation_equivariance",
             "moe.moe_agrees_with_reference", "dtypes.moe_keeps_dtype"]
CLOSED_FORM_COUNTS = ["counts.moe_known_counts", "counts.moe_counts_by_part", "counts.mixture_total_minus_active",
                      "counts.active_equals_total_when_all_chosen"]


def _swiglu_moe(**members):
    return _impl("SwiGLU experts", EXPERT_FFN="swiglu", swiglu=rt.swiglu, moe=rt.moe, **members)


def test_swiglu_experts_are_drawn_and_compared_with_swiglu():
    assert_passes(MOE_LAYER, _swiglu_moe())
    status, report = _status("counts.moe_count_matches_params", _swiglu_moe(moe_n_params=lambda d, E: d * E + E * 3 * d * 4 * d))
    assert status == "passed", report


def test_swiglu_experts_skip_the_closed_form_counts_of_gelu_experts():
    impl = _swiglu_moe(moe_n_params=rt.moe_n_params, moe_active_params=rt.moe_active_params)
    for name in CLOSED_FORM_COUNTS:
        assert_declared_skip(name, impl, "EXPERT_FFN")


def test_swiglu_experts_need_swiglu_for_the_laws_that_run_one_expert_alone():
    impl = _impl("SwiGLU experts, no swiglu", EXPERT_FFN="swiglu", moe=rt.moe)
    assert "does not provide swiglu" in REGISTRY["moe.moe_top_1_is_chosen_expert"].skip_reason(impl)
    assert _status("moe.moe_agrees_with_reference", impl)[0] == "passed"


def test_swiglu_experts_with_the_silu_on_the_up_branch_fail():
    def silu_on_up(x, router, experts, k):
        swapped = [{"W_gate": e["W_up"], "W_up": e["W_gate"], "W_down": e["W_down"]} for e in experts]
        return rt.moe(x, router, swapped, k)

    status, report = _status("moe.moe_agrees_with_reference", _impl("SiLU on W_up", EXPERT_FFN="swiglu", moe=silu_on_up))
    assert status == "failed" and "EXPERT_FFN = 'swiglu'" in report, report


def test_declaring_swiglu_for_gelu_experts_fails_loudly():
    def gelu_only(x, router, experts, k):
        return rt.moe(x, router, [{"W1": e["W1"], "b1": e["b1"], "W2": e["W2"], "b2": e["b2"]} for e in experts], k)

    status, report = _status("moe.moe_agrees_with_reference", _impl("GELU-only moe declared SwiGLU", EXPERT_FFN="swiglu", moe=gelu_only))
    assert status == "error" and "KeyError: 'W1'" in report, report


# -- COMPUTE_DTYPE: a declared rounding, checked at its tolerance -----------------------------------------------


def _in_float32(fn):
    """fn computed on float32 copies of its floating tensors, its answers cast back (x.float() ... .type_as(x)), as torch code is."""

    def cast(value, to):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(to)
        return type(value)(cast(v, to) for v in value) if isinstance(value, tuple) else value

    return lambda *args: cast(fn(*cast(args, torch.float32)), torch.float64)


AGREEMENT = ("softmax.softmax_agrees_with_reference", "norms.layer_norm_agrees_with_reference", "attention.agrees_with_reference")


def test_compute_dtype_holds_a_float64_run_to_float32_rounding_and_skips_nothing():
    members = dict(softmax=_in_float32(rt.softmax), layer_norm=_in_float32(rt.layer_norm), attention=_in_float32(rt.attention))
    declared_f32 = _impl("float32 steps", COMPUTE_DTYPE="float32", **members)
    assert rounding_dtype(declared_f32) == "float32" and declared_f32.tolerance == tolerance_for("float32")
    for name in AGREEMENT:
        assert REGISTRY[name].skip_reason(declared_f32) is None, name
        assert _status(name, declared_f32)[0] == "passed", name
    undeclared = _impl("float32 steps", **members)  # the declaration is what widens it: undeclared, float64 rounding is asked
    assert rounding_dtype(undeclared) == "float64"
    for name in AGREEMENT:
        status, report = _status(name, undeclared)
        assert status == "failed" and "(float64)" in report, (name, report)
    assert rounding_dtype(_impl("float32 run", "float32", COMPUTE_DTYPE="float32", **members)) == "float32"


def _decode_within_window(ids, params, n_heads, n_kv_heads, rope_base, window, chunks, **options):
    """A decode whose cache holds w keys (a ring buffer): it refuses a prefill or chunk longer than the window."""
    if window is not None and max(int(n) for n in chunks) > window:
        raise ValueError(f"chunk longer than the window {window}")
    return rt.llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, chunks, **options)


def test_decode_chunks_within_window_narrows_the_decode_alone():
    """DECODE_CHUNKS_WITHIN_WINDOW: a decode that takes chunks of at most w passes; undeclared, its refusal is an error."""
    members = {"llama_logits": rt.llama_logits, "llama_decode": _decode_within_window}
    law = "decoding.decode_matches_full_forward"
    assert _status(law, _impl("ring cache", **members, DECODE_CHUNKS_WITHIN_WINDOW=True))[0] == "passed"
    assert _status(law, _impl("ring cache", **members))[0] == "error"  # the refusal, with the advice to declare
