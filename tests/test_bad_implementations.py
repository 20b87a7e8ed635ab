"""Bad options: one usage error before anything runs; a target that loads but answers badly: one line per invariant, never a crash."""

import textwrap

import pytest

from invariants.protocol import PROTOCOL_VERSION
from invariants.registry import all_invariants

try:  # imported here, not inside a pytester test: pytester would unload it after the test, and torch cannot load twice
    import torch
except ImportError:
    torch = None

NORMS = textwrap.dedent(
    """
    import numpy as np
    BACKEND = "numpy"

    def rms_norm(x, gain, eps=1e-5):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain
    """
)

UNLOADABLE = {
    # name: (module source or None for a missing file, the usage error)
    "missing_file": (None, "--impl='{path}' cannot be loaded: no file or folder '{path}'"),
    "syntax_error": ("def layer_norm(x:\n", "--impl='{path}' cannot be loaded: importing '{path}' raised SyntaxError"),
    "no_protocol": ("BACKEND = 'numpy'\ndef helper():\n    return 1\n", "--impl='{path}' cannot be loaded: '{path}' provides none of the protocol"),
    "no_backend": ("def layer_norm(x, gain, bias, eps):\n    return x\n", "--impl='{path}' cannot be loaded: '{path}' does not say its backend"),
}
BAD_OPTIONS = {
    # name: (options, the usage error)
    "dtype": (("--impl-dtype", "float8"), "--impl-dtype='float8' is not one of float64, float32, float16, bfloat16"),
    "backend": (("--impl-backend", "jax"), "--impl-backend='jax' is not one of numpy, torch (leave it out to use the target's BACKEND)"),
    "device": (("--impl-device", "tpu"), "--impl-device='tpu' is not one of cpu, cuda, cuda:N (cuda for a torch implementation)"),
    "numpy_on_cuda": (("--impl-device", "cuda"), "--impl-device='cuda' cannot run reference.numpy, a numpy implementation: "
                      "numpy runs on the cpu only; use cpu, or choose a torch implementation"),
    "numpy_bfloat16": (("--impl-dtype", "bfloat16"), "--impl-dtype='bfloat16' cannot run reference.numpy, a numpy implementation: "
                       "numpy has no bfloat16; choose float64, float32 or float16, or a torch implementation"),
}
CASES = {
    # name: (module source, expected text in every failing test's message)
    "wrong_signature": (NORMS + "def layer_norm(x):\n    return x\n", "layer_norm(x) cannot be called as layer_norm(x, gain, bias, eps)"),
    "wrong_shape": (NORMS + "def layer_norm(x, gain, bias, eps):\n    return x[..., :1]\n", "shape of layer_norm output="),
    "returns_none": (NORMS + "def layer_norm(x, gain, bias, eps):\n    return None\n", "layer_norm returned a builtins.NoneType, not an array"),
    "nan_output": (NORMS + "def layer_norm(x, gain, bias, eps):\n    return x * np.nan\n", "=nan, but should be finite"),
    "raises": (NORMS + "def layer_norm(x, gain, bias, eps):\n    return 1 / 0\n", "layer_norm raised ZeroDivisionError: division by zero (at "),
}


def _one_usage_error(result, expected):
    """The run stopped at configure time (exit 4) and said why in one line, nothing else."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    said = [line for line in result.outlines + result.errlines if line.strip()]
    assert len(said) == 1 and said[0].startswith("ERROR: " + expected), said


@pytest.mark.parametrize("name", UNLOADABLE)
def test_a_target_that_cannot_be_loaded_is_one_usage_error(pytester, name):
    source, expected = UNLOADABLE[name]
    path = pytester.path / f"{name}.py"
    if source is not None:
        path.write_text(source)
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", str(path), "-p", "no:cacheprovider", "-q")
    _one_usage_error(result, expected.format(path=path))


@pytest.mark.parametrize("name", BAD_OPTIONS)
def test_an_option_the_target_cannot_take_is_one_usage_error(pytester, name):
    options, expected = BAD_OPTIONS[name]
    _one_usage_error(pytester.runpytest_subprocess("--pyargs", "invariants", *options, "-p", "no:cacheprovider", "-q"), expected)


def test_a_bad_environment_variable_is_named_in_the_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("TI_DEVICE", "tpu")
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "-p", "no:cacheprovider", "-q")
    _one_usage_error(result, "TI_DEVICE='tpu' is not one of cpu, cuda, cuda:N")


@pytest.mark.parametrize("name", CASES)
def test_bad_implementation_fails_every_layer_norm_invariant_with_a_one_line_reason(pytester, name):
    source, expected = CASES[name]
    path = pytester.path / f"{name}.py"
    path.write_text(source)
    result = pytester.runpytest_subprocess(
        "--pyargs", "invariants", "--impl", str(path), "-k", "layer_norm and not dtypes and not shapes and not finite", "--invariants-profile=ci",
        "-p", "no:cacheprovider", "-rfE"
    )
    outcomes = result.parseoutcomes()
    output = result.stdout.str()
    n_bad = outcomes.get("failed", 0) + outcomes.get("errors", 0)
    assert outcomes.get("passed", 0) == 0 and n_bad >= 7, output
    assert output.count(expected.format(path=path)) >= n_bad, output  # one diagnosis per invariant
    assert "Traceback" not in output


def test_partial_implementation_runs_what_it_has_and_says_what_it_skipped(pytester):
    path = pytester.path / "partial.py"
    path.write_text(NORMS)
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", str(path), "-k", "norms", "--invariants-profile=ci", "-rs")
    outcomes = result.parseoutcomes()
    rms_only = [inv for inv in all_invariants() if inv.component == "norms" and inv.requires == ("rms_norm",)]
    assert len(rms_only) >= 2 and outcomes["passed"] == len(rms_only)  # every norms invariant that needs rms_norm alone
    assert outcomes["skipped"] >= 7
    result.stdout.fnmatch_lines([f"*{path} does not provide layer_norm (protocol v{PROTOCOL_VERSION})*"])
    result.stdout.fnmatch_lines([f"transformer-invariants: {len(rms_only)} invariants passed, * examples run (fewest *, most * per invariant)"])


def test_a_misspelt_protocol_function_is_named_with_the_name_it_nearly_spells(pytester):
    """`attentoin` is named (under -q too, where no header is shown) with `attention`; a helper with another name is left alone."""
    path = pytester.path / "misspelt.py"
    path.write_text(NORMS + "def attentoin(x, W_q, W_k, W_v, W_o, n_heads, causal):\n    return x\n\ndef split_heads(x):\n    return x\n")
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", str(path), "-k", "rms_norm_scale or causal_non_leakage",
                                           "-p", "no:cacheprovider", "-q", "-rs")
    warning = f"WARNING: in {path}, attentoin is no protocol function: did you mean attention? (the invariants that need it are skipped)"
    assert result.outlines.count(warning) == 1 and "split_heads" not in result.stdout.str(), result.stdout.str()
    result.stdout.fnmatch_lines([f"SKIPPED*{path} does not provide attention (protocol v{PROTOCOL_VERSION}); attentoin is no protocol "
                                 "function: did you mean attention?"])


def test_module_object_target_and_dtype_options(pytester):
    path = pytester.path / "classy.py"
    path.write_text(textwrap.dedent(
        """
        import numpy as np

        class Norms:
            BACKEND = "numpy"

            @staticmethod
            def rms_norm(x, gain, eps=1e-5):
                return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain
        """
    ))
    result = pytester.runpytest_subprocess(
        "--pyargs", "invariants", "--impl", f"{path}:Norms", "--impl-dtype", "float32", "-k", "rms_norm_scale", "--invariants-profile=ci"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*implementation {path}:Norms (numpy, cpu, float32)*"])


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.skipif(torch is not None and torch.cuda.is_available(),
                    reason="this machine has a GPU: the CUDA run is exercised for real by tox -e torch-cuda")
@pytest.mark.parametrize("quiet", [(), ("-q",)], ids=["default", "quiet"])
def test_cuda_asked_of_a_machine_without_it_is_one_usage_error(pytester, quiet):
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", "reference.torch", "--impl-device", "cuda", "-k", "norms",
                                           "-p", "no:cacheprovider", *quiet)
    _one_usage_error(result, "--impl-device='cuda' cannot run here: torch.cuda.is_available() is False on this machine; use cpu, "
                             "or run where a GPU is")


def test_unknown_profile_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("TI_PROFILE", "fast")
    _one_usage_error(pytester.runpytest_subprocess("--pyargs", "invariants", "-k", "norms"), "TI_PROFILE='fast' is not one of dev, ci, thorough")


def test_help_is_given_whatever_the_options_say(pytester):
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", "no_such_module", "--impl-device", "tpu", "--help")
    assert result.ret == pytest.ExitCode.OK and "--impl-device=IMPL_DEVICE" in result.stdout.str()


def test_a_target_by_its_name_before_the_move_is_told_its_new_name(pytester):
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", "adapters.torch_sdpa", "-p", "no:cacheprovider", "-q")
    _one_usage_error(result, "--impl='adapters.torch_sdpa' cannot be loaded: no module named 'adapters.torch_sdpa'; did you mean "
                             "'invariants.adapters.torch_sdpa'?")
