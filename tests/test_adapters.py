"""The adapters pass chosen invariants (few examples here; the full suite runs in tox -e external), stay short, and the toolkit does what it says."""

import ast
import io
import tokenize
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

pytest.importorskip("torch", reason="the adapters wrap torch code; torch is not installed")

import torch  # noqa: E402

from invariants import REGISTRY, Implementation, all_invariants, load_implementation, run_invariant  # noqa: E402
from invariants.adapters import toolkit as tk  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

all_invariants()
FEW = settings(max_examples=8, derandomize=True, database=None, deadline=None)
ADAPTERS = Path(__file__).resolve().parent.parent / "invariants" / "adapters"

CHOSEN = {  # adapter: (dtype, invariants)
    "torch_sdpa": ("float64", ("attention.causal_non_leakage", "attention.causal_weights_pattern",
                               "attention.weights_are_distributions", "attention.agrees_with_reference")),
    "torch_mha": ("float64", ("attention.causal_non_leakage", "attention.causal_gradient",
                              "attention.multi_head_is_sum_of_heads", "attention.agrees_with_reference")),
    "torch_encoder_layer": ("float64", ("attention.causal_gradient", "attention.agrees_with_reference",
                                        "feed_forward.feed_forward_agrees_with_reference", "block.residual_identity",
                                        "block.causal_non_leakage", "block.permutation_equivariant", "block.agrees_with_reference")),
    "gpt2": ("float64", ("block.residual_identity", "block.causal_non_leakage", "block.agrees_with_reference",
                         "model.causal_non_leakage", "model.refuses_bad_ids", "model.agrees_with_reference",
                         "counts.gpt2_exact_counts")),
    "hooked_transformer": ("float64", ("attention.weights_are_distributions", "attention.multi_head_is_sum_of_heads",
                                       "block.permutation_equivariant", "block.agrees_with_reference",
                                       "model.tied_output", "model.refuses_bad_ids", "model.agrees_with_reference")),
    "torch_decoder_layer": ("float64", ("cross_attention.sees_every_memory_position", "cross_attention.cross_agrees_with_reference",
                                        "cross_attention.block_causal_non_leakage", "cross_attention.block_agrees_with_reference")),
    "whisper": ("float64", ("attention.causal_non_leakage", "block.residual_identity", "block.agrees_with_reference",
                            "cross_attention.memory_permutation_invariance", "cross_attention.block_agrees_with_reference",
                            "norms.layer_norm_known_values")),
    "gpt_neo": ("float32", ("attention.causal_non_leakage", "attention.agrees_with_reference", "block.agrees_with_reference",
                            "model.causal_non_leakage", "model.tied_output", "model.agrees_with_reference")),
    "vit": ("float32", ("attention.weights_are_distributions", "attention.permutation_equivariance", "block.residual_identity",
                        "block.permutation_equivariant", "block.agrees_with_reference")),
    "x_transformers": ("float32", ("attention.causal_non_leakage", "attention.agrees_with_reference", "norms.layer_norm_affine",
                                   "feed_forward.feed_forward_agrees_with_reference", "block.residual_identity", "block.agrees_with_reference")),
    "mixtral": ("float32", ("moe.top_k_gates_select_top_k", "moe.top_k_gates_agrees_with_reference",
                            "moe.load_balancing_loss_agrees_with_reference", "moe.moe_top_1_is_chosen_expert",
                            "moe.moe_agrees_with_reference")),
}
NEEDS = {"gpt2": "transformers", "gpt_neo": "transformers", "mixtral": "transformers", "vit": "transformers", "whisper": "transformers",
         "hooked_transformer": "transformer_lens", "x_transformers": "x_transformers"}

LINE_BUDGETS = {  # code lines per adapter: the README's promise is a few lines, 25 at most
    "torch_sdpa.py": 25,
    "torch_mha.py": 25,
    "torch_encoder_layer.py": 25,
    "gpt2.py": 25,
    "hooked_transformer.py": 25,
    "mixtral.py": 25,
    "vit.py": 25,
    "gpt_neo.py": 25,
    "torch_decoder_layer.py": 25,
    "whisper.py": 25,
    "x_transformers.py": 25,
    "torchtune_llama3.py": 25,  # the modern decoder's six functions on plain PyTorch code (issue 26)
    "olmo_core.py": 25,
    "nanochat.py": 25,
}


def _adapter(name, dtype):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"invariants.adapters.{name} wraps {NEEDS[name]}, "
                                                         f"which is not installed (pip install -e '.[external]')")
    return load_implementation(f"invariants.adapters.{name}", dtype=dtype)


@pytest.mark.parametrize(
    "adapter, invariant", [(a, i) for a, (_, names) in CHOSEN.items() for i in names], ids=lambda v: v
)
def test_adapter_passes_invariant(adapter, invariant):
    impl = _adapter(adapter, CHOSEN[adapter][0])
    assert invariant in REGISTRY, f"{invariant} is not a registered invariant"
    outcome = run_invariant(REGISTRY[invariant], impl, settings=FEW)
    assert outcome.passed, outcome.report or outcome.reason


def test_mixtral_declares_no_tie_rule_and_skips_the_tie_invariant():
    impl = _adapter("mixtral", "float32")
    assert impl.namespace.TOP_K_TIES == "any"
    outcome = run_invariant(REGISTRY["moe.top_k_gates_tie_rule"], impl, settings=FEW)
    assert outcome.status == "skipped" and outcome.declared and "TOP_K_TIES" in outcome.reason, outcome


def test_mixtral_balance_loss_is_transformers_divided_by_k():
    _adapter("mixtral", "float32")
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    from invariants.adapters.mixtral import load_balancing_loss

    logits = torch.tensor([[0.5, 0.0, -1.0, 2.0], [1.0, 1.5, 0.0, -0.5], [0.0, 0.25, 3.0, 1.0]])
    k = 2
    assert load_balancing_loss(logits, k) * k == load_balancing_loss_func((logits,), 4, k)


def test_gpt2_counts_the_tied_head_once():
    _adapter("gpt2", "float64")
    from invariants.adapters.gpt2 import gpt_param_count

    assert gpt_param_count(50257, 768, 12, 1024, True) == 124_439_808
    assert gpt_param_count(50257, 768, 12, 1024, False) == 124_402_944


def test_x_transformers_float32_softmax_passes_a_float64_run_declared_and_fails_it_undeclared():
    # x-transformers' Attend computes softmax(..., dtype=float32) whatever the input dtype, which caps a float64 model at float32:
    # its COMPUTE_DTYPE = "float32" holds a float64 run to float32 rounding; without the declaration float64's catches the cap
    law, settings = REGISTRY["attention.agrees_with_reference"], profile_settings("ci")
    declared = _adapter("x_transformers", "float64")
    assert declared.declarations["COMPUTE_DTYPE"] == "float32"
    assert run_invariant(law, declared, settings=settings).passed
    undeclared = _adapter("x_transformers", "float64")
    undeclared.declarations = {k: v for k, v in undeclared.declarations.items() if k != "COMPUTE_DTYPE"}
    outcome = run_invariant(law, undeclared, settings=settings)
    assert outcome.status == "failed" and "lower precision than its inputs" in outcome.hint, outcome.report


# -- adapters in a few lines ---------------------------------------------------------------------


def code_lines(source):
    """Lines holding code: not blank, not only a comment, not part of a module, class or function docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    layout = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in layout:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_counts_code_only():
    source = (
        '"""Module docstring,\n\nover lines."""\n\nimport torch  # a comment\n\n# a comment line\n\n\n'
        'def f(x):\n    """Doc."""\n    return {"a": 1,\n            "b": 2}\n'
    )
    assert code_lines(source) == 4  # import, def, and the two lines of the return


@pytest.mark.parametrize("path", sorted(LINE_BUDGETS))
def test_adapter_is_a_few_lines(path):
    budget = LINE_BUDGETS[path]
    count = code_lines((ADAPTERS / path).read_text(encoding="utf-8"))
    assert count <= budget, (f"invariants/adapters/{path} has {count} lines of code, over its budget of {budget}: "
                                 "move what is generic into invariants/adapters/toolkit.py")


# -- the toolkit ---------------------------------------------------------------------------------


def test_layouts_transpose_concatenate_split_heads_and_zero_missing_biases():
    d, H = 4, 2
    W = {name: torch.arange(16.0).reshape(d, d) + i for i, name in enumerate(("W_q", "W_k", "W_v", "W_o"))}
    out = tk.weights({"qkv": tk.cat(tk.T("W_q"), tk.T("W_k"), tk.T("W_v")), "b": tk.cat("b_q", "b_k", "b_v"), "Q": tk.heads("W_q"),
                      "O": tk.heads("W_o", rows=True), "bQ": tk.heads("b_q"), "zero": tk.zeros("W_o", 1)}, {**W, "n_heads": H})
    assert torch.equal(out["qkv"], torch.cat([W["W_q"].T, W["W_k"].T, W["W_v"].T]))  # (3d, d), nn.Linear's layout
    assert torch.equal(out["b"], torch.zeros(3 * d))  # the suite drew no attention biases
    assert out["Q"].shape == (H, d, d // H) and torch.equal(out["Q"][1], W["W_q"][:, 2:])  # head 1: columns D:2D
    assert out["O"].shape == (H, d // H, d) and torch.equal(out["O"][1], W["W_o"][2:])  # head 1: rows D:2D
    assert out["bQ"].shape == (H, d // H) and torch.equal(out["zero"], torch.zeros(d))


def test_norm_lays_out_a_layer_norms_gain_and_bias():
    assert tk.norm("ln_1", "ln1") == {"ln_1.weight": "ln1_g", "ln_1.bias": "ln1_b"}
    assert tk.norm("ln1", "ln2", weight="w", bias="b") == {"ln1.w": "ln2_g", "ln1.b": "ln2_b"}


def test_each_lays_out_every_block_under_its_index():
    blocks = [{"W1": torch.full((2, 3), float(i))} for i in range(3)]
    out = tk.weights({"h.{}.fc.": tk.each("blocks", {"w": tk.T("W1")})}, {"blocks": blocks, "n_heads": 1})
    assert sorted(out) == ["h.0.fc.w", "h.1.fc.w", "h.2.fc.w"] and torch.equal(out["h.2.fc.w"], torch.full((3, 2), 2.0))


def test_a_layout_naming_a_parameter_the_module_lacks_is_a_toolkit_error():
    linear = tk.module(lambda d_model: torch.nn.Linear(d_model, d_model), like=torch.zeros(1, 3), d_model=3)
    with pytest.raises(tk.ToolkitError, match="wieght"):
        tk.call(linear, {"wieght": torch.eye(3), "bias": torch.zeros(3)}, torch.ones(1, 3))


def test_a_parameter_the_layout_forgets_makes_the_output_nan():
    linear = tk.module(lambda d_model: torch.nn.Linear(d_model, d_model), like=torch.zeros(1, 3), d_model=3)
    assert torch.equal(tk.call(linear, {"weight": torch.eye(3), "bias": torch.zeros(3)}, torch.ones(1, 3)), torch.ones(1, 3))
    assert torch.isnan(tk.call(linear, {"weight": torch.eye(3)}, torch.ones(1, 3))).all()


def test_modules_are_built_once_per_shape_dtype_and_device_in_eval_mode():
    def build(d_model, dtype, device):  # declares dtype and device, and is given them
        assert dtype == torch.float64 and device == torch.device("cpu")
        return torch.nn.Sequential(torch.nn.Linear(d_model, d_model), torch.nn.Dropout(0.5))  # built in float32: moved all the same

    a = tk.module(build, like=torch.zeros(2, dtype=torch.float64), d_model=2, n_heads=3)  # n_heads: not declared, not passed
    assert a is tk.module(build, like=torch.zeros(2, dtype=torch.float64), d_model=2)
    assert not a.training and a[0].weight.dtype == torch.float64
    b = tk.module(lambda d_model: torch.nn.Linear(d_model, d_model), like=torch.zeros(2, dtype=torch.float32), d_model=2)
    assert b is not tk.module(lambda d_model: torch.nn.Linear(d_model, d_model), like=torch.zeros(2, dtype=torch.float64), d_model=2)


def test_capture_reads_what_a_submodule_outputs():
    net = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Identity()).eval()
    with tk.capture(net, "0") as seen:
        net(torch.tensor([-1.0, 2.0]))
    assert torch.equal(seen[0], torch.tensor([0.0, 2.0]))


def test_causal_masks():
    x = torch.zeros(1, 3, 2)
    assert tk.causal_mask(x, False) is None
    assert torch.equal(tk.causal_mask(x), torch.tensor([[False, True, True], [False, False, True], [False, False, False]]))
    assert torch.equal(tk.causal_mask(x, additive=True), torch.tensor([[0.0, -np.inf, -np.inf], [0.0, 0.0, -np.inf], [0.0, 0.0, 0.0]]))
    assert np.array_equal(tk.causal_mask(np.zeros((1, 3, 2))), tk.causal_mask(x).numpy())


class _Refusing(torch.nn.Module):
    """A stand-in model: an embedding whose lookup raises IndexError for an id outside the table."""

    def __init__(self, vocab, d_model):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d_model)

    def forward(self, ids):
        return self.wte(ids) @ self.wte.weight.T


_LOGITS = tk.gpt_logits(_Refusing, {"wte.weight": "wte"}, lambda model, ids: model(ids))


@pytest.mark.parametrize("ids", [[[3]], [[-1]]], ids=["id >= V", "negative id"])
def test_gpt_logits_turns_the_refusal_of_bad_ids_into_value_error(ids):
    params = {"wte": torch.eye(3), "wpe": torch.zeros(2, 3), "blocks": []}
    with pytest.raises(ValueError, match="refused ids") as info:
        _LOGITS(torch.tensor(ids), params, 1)
    assert isinstance(info.value.__cause__, IndexError)


def test_gpt_logits_leaves_other_errors_alone():
    broken = tk.gpt_logits(_Refusing, {"wte.weight": "wte"}, lambda model, ids: model(ids)[:, :, 99])  # an IndexError that is a bug
    params = {"wte": torch.eye(3), "wpe": torch.zeros(2, 3), "blocks": []}
    with pytest.raises(IndexError):
        broken(torch.tensor([[0, 1]]), params, 1)
    checked = tk.gpt_logits(_Refusing, {"wte.weight": "wte"}, lambda model, ids: model(ids), check_ids=True)
    with pytest.raises(ValueError, match="outside"):
        checked(torch.tensor([[0, 0, 0]]), params, 1)  # T = 3 > max_len = 2, refused before the call


class _NumpyAttention:
    """A numpy class the way a lesson writes one: fused (in, out) qkv weights and an output layer as attributes."""

    def __init__(self, d_model, n_heads):
        self.n_heads = n_heads
        self.qkv = np.full((d_model, 3 * d_model), np.nan)
        self.out = type("Linear", (), {"weight": np.full((d_model, d_model), np.nan)})()

    def __call__(self, x, causal):
        B, T, d = x.shape
        q, k, v = (m.reshape(B, T, self.n_heads, -1).transpose(0, 2, 1, 3) for m in np.split(x @ self.qkv, 3, axis=-1))  # (B, H, T, D)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + (tk.causal_mask(x, causal, additive=True) if causal else 0.0)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        return (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, d) @ self.out.weight.T, weights


def test_the_toolkit_puts_a_numpy_class_behind_the_protocol():
    layout = {"qkv": tk.cat("W_q", "W_k", "W_v", dim=1), "out.weight": tk.T("W_o")}
    attention = tk.attention(_NumpyAttention, layout, lambda mha, x, causal: mha(x, causal))
    impl = Implementation.from_functions(backend="numpy", attention=attention)
    for name in ("attention.agrees_with_reference", "attention.causal_non_leakage", "attention.multi_head_is_sum_of_heads"):
        outcome = run_invariant(REGISTRY[name], impl, settings=FEW)
        assert outcome.passed, outcome.report or outcome.reason
    mha = tk.module(_NumpyAttention, like=np.zeros((1, 1, 2)), d_model=2, n_heads=1)
    assert np.isnan(mha.qkv).all() and np.isnan(mha.out.weight).all()  # its own values back after every call


# -- the toolkit's modern decoder --------------------------------------------------------------------


def _rope_from_zero_only(x, positions, base):
    """A RoPE that rotates positions 0 .. T - 1 and nothing else (no positions argument): x (N, T, 1, D)."""
    import invariants.reference.torch as rt

    assert torch.equal(positions, torch.arange(x.shape[1])), positions
    return rt.rope(x.transpose(1, 2), positions, base).transpose(1, 2)


@pytest.mark.parametrize("positions", [[5, 0, 2], [0, 0, 0], [3]], ids=["shuffled", "repeated", "one"])
def test_rope_from_zero_places_each_row_at_its_position(positions):
    import invariants.reference.torch as rt

    x, at = torch.randn(2, 3, len(positions), 4, dtype=torch.float64), torch.tensor(positions)  # (B, H, T, D)
    rope = tk.rope(_rope_from_zero_only, from_zero=True)
    assert torch.equal(rope(x, at, 10_000.0), rt.rope(x, at, 10_000.0))  # the same arithmetic on each row, bitwise


def test_visible_keys_is_causal_and_keeps_the_window():
    seen = tk.visible_keys(torch.tensor([2, 3]), 5, window=2)  # queries at 2 and 3 over 5 slots: keys p - 1 and p
    assert seen.tolist() == [[False, True, True, False, False], [False, False, True, True, False]]
    assert tk.visible_keys(torch.tensor([0]), 2).tolist() == [[True, False]]


def test_held_positions_reads_heads_and_slots_from_the_keys_and_positions_from_the_slot_rule():
    keys = [torch.zeros(1, 2, 4, 3)]  # one layer: (B, H_kv = 2, S = 4, D)
    assert tk.held_positions(keys, 3, "whole").tolist() == [[[0, 1, 2, -1]] * 2]
    assert tk.held_positions(keys, 6, "ring").tolist() == [[[4, 5, 2, 3]] * 2]  # slot p % 4 holds the latest p < 6
    assert tk.held_positions(keys, 6, "grow").tolist() == [[[2, 3, 4, 5]] * 2]  # the last 4 of 6
    assert tk.held_positions(keys, 2, "grow").tolist() == [[[-2, -1, 0, 1]] * 2]  # holds more than it has seen: the law fails it
    assert tk.held_positions([torch.zeros(1, 4, 2, 3)], 4, "whole", axes="bshd").shape == (1, 2, 4)  # nanochat's (B, T, H, D)
    with pytest.raises(tk.ToolkitError, match="slots='ragged' is not a slot rule"):
        tk.held_positions(keys, 1, "ragged")
