"""Weights for the block and the model, model configurations, and token ids.

block_params and gpt_params draw every array as grid values (strategies/core.py) with the usual
fan-in scaling (to a power of two), so activations stay near unit size through a few blocks and a
failing example shrinks towards zeros, ones and halves, weights and ids alike. init_block_params
and init_gpt_params build weights of the same scales from one seed, for anyone who wants to
rebuild a model outside hypothesis (the overfit gate does). Layouts follow the protocol (invariants/protocol.py): W (in, out), so a
layer is x @ W + b.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_int, check_int_range
from invariants.strategies.core import array_dicts, byte_arrays, cached_strategy, grid_reader, integers, just, sampled_from, weight_part
from invariants.strategies.norms import gain_values

__all__ = ["GPTConfig", "block_params", "gpt_configs", "gpt_params", "init_block_params", "init_gpt_params", "token_ids"]

GRID_VALUES = grid_reader(1.0)  # embeddings: grid values of std 1
ATTENTION_BIAS_NAMES = ("b_q", "b_k", "b_v", "b_o")
BIAS_STD = 0.2  # biases and norm shifts: small next to the unit-size activations, large enough to matter


def _check_bias_choice(attn_bias):
    if attn_bias is not None and not isinstance(attn_bias, bool):
        raise InvalidArgument(f"attn_bias={attn_bias!r} must be True, False or None (None draws both)")


def _bias_choices(attn_bias):
    return st.booleans() if attn_bias is None else just(attn_bias)


def init_block_params(d_model: int, seed: int, *, d_ff: int | None = None, attn_bias: bool = False) -> dict[str, np.ndarray]:
    """One pre-norm block's params from `seed`: ln1_g ln1_b W_q W_k W_v W_o ln2_g ln2_b W1 b1 W2 b2 (+ b_q b_k b_v b_o).

    Matrices are standard normal / √fan_in, norm gains uniform in [0.5, 1.5], biases N(0, 0.2²);
    d_ff defaults to 4·d_model.
    """
    check_int("d_model", d_model, low=1)
    d, F = d_model, 4 * d_model if d_ff is None else d_ff
    check_int("d_ff", F, low=1)
    rng = np.random.default_rng(seed)

    def matrix(fan_in, fan_out):
        return rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)

    def bias(n):
        return BIAS_STD * rng.standard_normal(n)

    params = {
        "ln1_g": rng.uniform(0.5, 1.5, d), "ln1_b": bias(d),  # (d,)
        "W_q": matrix(d, d), "W_k": matrix(d, d), "W_v": matrix(d, d), "W_o": matrix(d, d),  # (d, d)
        "ln2_g": rng.uniform(0.5, 1.5, d), "ln2_b": bias(d),  # (d,)
        "W1": matrix(d, F), "b1": bias(F),  # (d, F), (F,)
        "W2": matrix(F, d), "b2": bias(d),  # (F, d), (d,)
    }
    if attn_bias:
        params.update({name: bias(d) for name in ATTENTION_BIAS_NAMES})  # (d,) each
    return params


def _norm_gain(b):
    """LayerNorm gains from bytes b: 1 + GRID/2 clipped to [1/2, 3/2] (multiples of 1/128), 1 once shrunk."""
    return np.minimum(gain_values(b), 1.5)


_BIAS = grid_reader(1 / 4)  # biases: grid values / 4 (std 1/4, the nearest power of two to BIAS_STD)


def _block_parts(d, F, attn_bias):
    """array_dicts parts of one block: ln1_g ln1_b W_q W_k W_v W_o ln2_g ln2_b W1 b1 W2 b2 (+ b_q b_k b_v b_o)."""
    parts = [
        ("ln1_g", (d,), _norm_gain), ("ln1_b", (d,), _BIAS),  # (d,)
        *(weight_part(name, (d, d)) for name in ("W_q", "W_k", "W_v", "W_o")),  # (d, d)
        ("ln2_g", (d,), _norm_gain), ("ln2_b", (d,), _BIAS),  # (d,)
        weight_part("W1", (d, F)), ("b1", (F,), _BIAS),  # (d, F), (F,)
        weight_part("W2", (F, d)), ("b2", (d,), _BIAS),  # (F, d), (d,)
    ]
    if attn_bias:
        parts += [(name, (d,), _BIAS) for name in ATTENTION_BIAS_NAMES]  # (d,) each
    return parts


@cache
def _block_params(d, F, attn_bias):
    return array_dicts(_block_parts(d, F, attn_bias))


@cached_strategy
def block_params(d_model: int, *, d_ff: int | None = None, attn_bias: bool | None = None) -> SearchStrategy[dict[str, Any]]:
    """Params dicts for one pre-norm block of width d_model: grid values, each array at init_block_params's scale.

    Matrices have std 1/√fan_in, norm gains lie in [1/2, 3/2] and biases have std 1/4 (powers of two
    and multiples of them: exact in every dtype), all shrinking towards 0 (gains towards 1). d_ff is
    the feed-forward width (None: 4·d_model). attn_bias=True adds GPT-2's attention biases
    b_q b_k b_v b_o, False leaves them out, None draws both kinds.
    """
    check_int("d_model", d_model, low=1)
    if d_ff is not None:
        check_int("d_ff", d_ff, low=1)
    _check_bias_choice(attn_bias)
    F = 4 * d_model if d_ff is None else d_ff
    return _bias_choices(attn_bias).flatmap(lambda bias: _block_params(d_model, F, bias))


@dataclass(frozen=True)
class GPTConfig:
    """A GPT-2-shaped model: vocabulary V, positions max_len, L blocks of H heads of width D; d_model = H·D, d_ff = ff_ratio·d_model."""

    vocab: int
    max_len: int
    n_layers: int
    n_heads: int
    d_head: int
    attn_bias: bool
    ff_ratio: int = 4  # GPT-2's feed-forward width is 4·d_model

    @property
    def d_model(self):
        return self.n_heads * self.d_head

    @property
    def d_ff(self):
        return self.ff_ratio * self.d_model


@cached_strategy
def gpt_configs(*, min_vocab: int = 2, max_vocab: int = 12, min_max_len: int = 1, max_max_len: int = 8, min_layers: int = 1, max_layers: int = 2,
                min_heads: int = 1, max_heads: int = 3, min_d_head: int = 1, max_d_head: int = 6, attn_bias: bool | None = None,
                ff_ratio: int = 4) -> SearchStrategy[GPTConfig]:
    """GPTConfig with every field in its [min, max] range; d_model = n_heads·d_head, valid by construction.

    attn_bias=None draws models with and without attention biases. ff_ratio fixes the blocks'
    feed-forward width d_ff = ff_ratio·d_model (GPT-2's 4). Shrinks towards the edge cases: the
    smallest vocabulary, max_len 1, one head of width 1 (d_model 1).
    """
    check_int_range("vocab", min_vocab, max_vocab, low=1)
    check_int_range("max_len", min_max_len, max_max_len, low=1)
    check_int_range("layers", min_layers, max_layers, low=0)
    check_int_range("heads", min_heads, max_heads, low=1)
    check_int_range("d_head", min_d_head, max_d_head, low=1)
    _check_bias_choice(attn_bias)
    check_int("ff_ratio", ff_ratio, low=1)
    return st.builds(
        GPTConfig,
        vocab=integers(min_vocab, max_vocab),
        max_len=integers(min_max_len, max_max_len),
        n_layers=integers(min_layers, max_layers),
        n_heads=integers(min_heads, max_heads),
        d_head=integers(min_d_head, max_d_head),
        attn_bias=_bias_choices(attn_bias),
        ff_ratio=just(ff_ratio),
    )


def init_gpt_params(config: GPTConfig, seed: int, *, embedding_std: float = 1.0) -> dict[str, Any]:
    """A model's params from `seed`: wte (V, d), wpe (max_len, d), blocks [...], lnf_g, lnf_b (d,).

    Embedding tables are N(0, embedding_std²); each block comes from init_block_params, of width config.d_ff.
    """
    if not isinstance(config, GPTConfig):
        raise InvalidArgument(f"config={config!r} must be a GPTConfig")
    d = config.d_model
    rng = np.random.default_rng(seed)
    block_seeds = rng.integers(0, 2**32, size=config.n_layers)  # (L,)
    return {
        "wte": embedding_std * rng.standard_normal((config.vocab, d)),  # (V, d)
        "wpe": embedding_std * rng.standard_normal((config.max_len, d)),  # (max_len, d)
        "blocks": [init_block_params(d, int(s), d_ff=config.d_ff, attn_bias=config.attn_bias) for s in block_seeds],
        "lnf_g": rng.uniform(0.5, 1.5, d),  # (d,)
        "lnf_b": BIAS_STD * rng.standard_normal(d),  # (d,)
    }


@cache
def _gpt_params(config):
    d = config.d_model
    embeddings = array_dicts([("wte", (config.vocab, d), GRID_VALUES), ("wpe", (config.max_len, d), GRID_VALUES)])  # (V, d), (max_len, d)
    blocks = [_block_params(d, config.d_ff, config.attn_bias)] * config.n_layers
    final = array_dicts([("lnf_g", (d,), _norm_gain), ("lnf_b", (d,), _BIAS)])  # (d,) each
    return _params_tree(embeddings, blocks, final)


@st.composite  # decorated once (see strategies.core._array_dicts)
def _params_tree(draw, embeddings, blocks, final):
    """{wte, wpe, blocks [...], lnf_g, lnf_b}: the embeddings, each block and the final norm, drawn in that order."""
    tree = draw(embeddings)
    tree["blocks"] = [draw(block) for block in blocks]
    return tree | draw(final)


def gpt_params(config: GPTConfig) -> SearchStrategy[dict[str, Any]]:
    """Params trees for a model of `config` (a GPTConfig): grid values at init_gpt_params's scales (embeddings of std 1)."""
    if not isinstance(config, GPTConfig):
        raise InvalidArgument(f"config={config!r} must be a GPTConfig; draw one from gpt_configs()")
    return _gpt_params(config)


ID_PATTERNS = ("random", "one repeated id", "only 0 and vocab - 1")


@cached_strategy
def token_ids(vocab: int, *, min_batch: int = 1, max_batch: int = 3, min_seq: int = 1, max_seq: int = 8) -> SearchStrategy[np.ndarray]:
    """int64 arrays (B, T) of ids in [0, vocab), B and T in their [min, max] ranges; ids shrink towards 0.

    Besides about uniform random ids, generates on purpose one id repeated everywhere (every
    attention score ties) and only the extreme ids 0 and vocab - 1 (off-by-one table lookups).
    """
    check_int("vocab", vocab, low=1)
    check_int_range("batch", min_batch, max_batch, low=1)
    check_int_range("seq", min_seq, max_seq, low=1)

    @st.composite
    def ids(draw):
        B, T = draw(integers(min_batch, max_batch)), draw(integers(min_seq, max_seq))
        pattern = draw(sampled_from(ID_PATTERNS))
        b = draw(byte_arrays((B, T))).astype(np.int64)
        if pattern == "one repeated id":
            return np.full((B, T), _ids(b.flat[0], vocab), dtype=np.int64)
        if pattern == "only 0 and vocab - 1":
            return np.where(b % 2 == 1, vocab - 1, 0).astype(np.int64)
        return _ids(b, vocab)

    return ids()


def _ids(b, vocab):
    """ids in [0, vocab) from bytes b: b mod vocab for a vocabulary of up to 256, spread over it beyond."""
    b = np.asarray(b, dtype=np.int64)
    return b % vocab if vocab <= 256 else b * vocab // 256
