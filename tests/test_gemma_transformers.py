"""The Gemma laws held to code nobody here wrote: transformers' Gemma 2 and Gemma 3 RMSNorm, MLP and scaled embedding.

Each module is built from a config with the published model's settings (rms_norm_eps 1e-6, gelu_pytorch_tanh) at the drawn
widths (no download), its weights copied from the suite's arguments, in the run's dtype. The adapters are namespaces of this
file (an --impl target too: `--impl tests/test_gemma_transformers.py:Gemma3Modules`). ci profile, float32 and bfloat16: zero
false alarms.
"""

import pytest

pytest.importorskip("transformers", reason="the modules are transformers' own")

import torch  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import Gemma2Config, Gemma2MLP, Gemma2RMSNorm, Gemma2TextScaledWordEmbedding  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3MLP, Gemma3RMSNorm, Gemma3TextConfig, Gemma3TextScaledWordEmbedding  # noqa: E402

from invariants import REGISTRY, Implementation, all_invariants, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

all_invariants()
CI = profile_settings("ci")
GEMMA_ACTIVATION = "gelu_pytorch_tanh"  # hidden_activation in every published Gemma 2 and 3 config.json


def _modules(config_class, mlp_class, norm_class, embedding_class):
    """A namespace putting one Gemma generation's modules behind geglu, scaled_embedding and gemma_rms_norm."""

    def geglu(x, W_gate, W_up, W_down):
        d, F = W_gate.shape
        config = config_class(hidden_size=d, intermediate_size=F, hidden_activation=GEMMA_ACTIVATION, num_attention_heads=1,
                              num_key_value_heads=1, head_dim=2)  # one head of an even width: any d is a valid config
        mlp = mlp_class(config).to(x.dtype)
        with torch.no_grad():
            for linear, weight in ((mlp.gate_proj, W_gate), (mlp.up_proj, W_up), (mlp.down_proj, W_down)):
                linear.weight.copy_(weight.T)  # nn.Linear holds (out, in)
            return mlp(x)

    def scaled_embedding(ids, table):
        V, d = table.shape
        embedding = embedding_class(V, d, padding_idx=None, embed_scale=d**0.5).to(table.dtype)
        with torch.no_grad():
            embedding.weight.copy_(table)
            return embedding(ids)

    def gemma_rms_norm(x, w, eps):
        norm = norm_class(x.shape[-1], eps=eps).to(x.dtype)
        with torch.no_grad():
            norm.weight.copy_(w)
            return norm(x)

    return type(f"{config_class.__name__}Modules", (), {"BACKEND": "torch", "geglu": staticmethod(geglu),
                                                         "scaled_embedding": staticmethod(scaled_embedding),
                                                         "gemma_rms_norm": staticmethod(gemma_rms_norm)})


Gemma2Modules = _modules(Gemma2Config, Gemma2MLP, Gemma2RMSNorm, Gemma2TextScaledWordEmbedding)
Gemma3Modules = _modules(Gemma3TextConfig, Gemma3MLP, Gemma3RMSNorm, Gemma3TextScaledWordEmbedding)
ADAPTERS = {"Gemma2Modules": Gemma2Modules, "Gemma3Modules": Gemma3Modules}
LAWS = [name for name in REGISTRY if name.startswith("gemma.")]
CASES = [(adapter, name, dtype) for adapter in ADAPTERS for name in LAWS for dtype in ("float32", "bfloat16")]


@pytest.mark.parametrize(("adapter", "name", "dtype"), CASES, ids=[f"{a}-{n}-{d}" for a, n, d in CASES])
def test_transformers_gemma_modules_pass_the_gemma_laws_at_ci(adapter, name, dtype):
    outcome = run_invariant(REGISTRY[name], Implementation(ADAPTERS[adapter], label=adapter, backend="torch", dtype=dtype), settings=CI)
    assert outcome.status in ("passed", "skipped"), outcome.report or outcome.reason


def test_every_law_runs_on_the_modules_in_some_dtype():
    """No law is skipped in both dtypes: each holds transformers' modules to something."""
    assert len(LAWS) >= 6
    ran = {name for adapter, name, dtype in CASES
           if REGISTRY[name].applies is None or REGISTRY[name].applies(Implementation(ADAPTERS[adapter], label=adapter, backend="torch",
                                                                                        dtype=dtype)) is None}
    assert ran == set(LAWS)


def test_the_bfloat16_normaliser_is_gemmas():
    """√3072 = 55.43 is 55.5 in bfloat16 and √2048 = 45.25 stays: transformers' embedding multiplies by those (ones times it)."""
    for d, normaliser in ((3072, 55.5), (2048, 45.25)):
        ones = torch.ones(1, d, dtype=torch.bfloat16)
        assert Gemma3Modules.scaled_embedding(torch.zeros(1, 1, dtype=torch.long), ones)[0, 0, 0].item() == normaliser


class LlamaNormOnGemmaWeights:
    """transformers' LlamaRMSNorm given the gain 1 + w: it casts the normalised x to the dtype before the gain."""

    BACKEND = "torch"

    @staticmethod
    def gemma_rms_norm(x, w, eps):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        norm = LlamaRMSNorm(x.shape[-1], eps=eps).to(x.dtype)
        with torch.no_grad():
            norm.weight.copy_(1 + w)
            return norm(x)


def test_llamas_cast_first_norm_fails_the_bfloat16_law():
    outcome = run_invariant(REGISTRY["gemma.gemma_rms_norm_rounded_once"],
                            Implementation(LlamaNormOnGemmaWeights, label="LlamaRMSNorm", backend="torch", dtype="bfloat16"), settings=CI)
    assert outcome.status == "failed", outcome.status
