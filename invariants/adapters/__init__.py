"""Adapters: third-party implementations behind the suite's protocol, and the toolkit to write your own (docs/adapters.md).

Each module is an implementation the suite can load (BACKEND plus protocol functions), with `pytest --pyargs invariants`:

    --impl invariants.adapters.torch_sdpa            F.scaled_dot_product_attention
    --impl invariants.adapters.torch_mha             nn.MultiheadAttention (batch_first)
    --impl invariants.adapters.torch_encoder_layer   nn.TransformerEncoderLayer(norm_first=True): a pre-norm block, erf GELU
    --impl invariants.adapters.torch_decoder_layer   nn.TransformerDecoderLayer(norm_first=True): the encoder-decoder's decoder block
    --impl invariants.adapters.gpt2                  transformers' GPT-2 block, model and parameter count
    --impl invariants.adapters.gpt_neo --impl-dtype float32   transformers' GPT-Neo (unscaled scores, CAUSAL_ONLY)
    --impl invariants.adapters.whisper               transformers' Whisper encoder and decoder layers (cross-attention)
    --impl invariants.adapters.hooked_transformer    TransformerLens's HookedTransformer: GPT-2 re-implemented, with hooks
    --impl invariants.adapters.vit --impl-dtype float32   transformers' ViTLayer: a pre-norm encoder block (ENCODER_ONLY)
    --impl invariants.adapters.mixtral --impl-dtype float32   transformers' Mixtral MoE block and balance loss

invariants.adapters.toolkit is how they are written: a layout (the suite's weights under the module's
parameter names), a builder (the module for a shape) and a forward (how it is called) make a
protocol function. An adapter converts conventions (weight layouts, averaged weights, a loss off
by a factor) and says so in its docstring; it never re-implements the maths it stands for. The
transformers and TransformerLens adapters build tiny models locally from the suite's weights:
nothing is downloaded. docs/power.md explains each conversion.
"""
