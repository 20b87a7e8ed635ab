"""Adapters: third-party implementations behind the suite's protocol, and templates for your own.

Each module is an implementation the suite can load (BACKEND plus protocol functions):

    pytest --pyargs invariants --impl adapters.torch_sdpa        F.scaled_dot_product_attention
    pytest --pyargs invariants --impl adapters.torch_mha         nn.MultiheadAttention (batch_first)
    pytest --pyargs invariants --impl adapters.gpt2              transformers' GPT-2 block, model and parameter count
    pytest --pyargs invariants --impl adapters.mixtral --impl-dtype float32   transformers' Mixtral MoE block and balance loss

An adapter converts conventions (weight layouts, averaged weights, a loss off by a factor)
and says so in its docstring; it never re-implements the maths it stands for. The
transformers adapters build tiny random-config models locally, from the suite's weights:
nothing is downloaded. docs/power.md explains each conversion.
"""
