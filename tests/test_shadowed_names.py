"""A user's own files named like the suite's public packages never break the suite, and a second `invariants` is named."""

import subprocess
import sys
import textwrap

import pytest

NORMS = textwrap.dedent(
    """
    import numpy as np
    BACKEND = "numpy"

    def rms_norm(x, gain, eps=1e-5):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain
    """
)


@pytest.fixture
def shadowing_project(pytester):
    """A project whose working directory holds its own strategies.py and reference.py, and a test importing both and the suite."""
    pytester.makepyfile(strategies="OWN = 'strategies'\n", reference="OWN = 'reference'\n", my_norm=NORMS)
    pytester.makepyfile(test_own=textwrap.dedent(
        """
        import reference
        import strategies
        import invariants.laws.attention
        from invariants import all_invariants

        def test_their_files_and_the_suite_both_load():
            assert (strategies.OWN, reference.OWN) == ("strategies", "reference") and len(all_invariants()) > 0
        """
    ))
    return pytester


def test_the_users_own_strategies_and_reference_modules_do_not_stop_collection(shadowing_project):
    result = shadowing_project.runpytest_subprocess("-p", "no:cacheprovider", "-q", "test_own.py")
    assert result.ret == 0, result.stdout.str()


def test_the_suite_runs_on_a_target_beside_a_users_reference_py(shadowing_project):
    result = shadowing_project.runpytest_subprocess("--pyargs", "invariants", "--impl", "my_norm.py", "-k", "rms_norm",
                                                    "-p", "no:cacheprovider", "-q")
    assert result.ret == 0 and "INTERNALERROR" not in result.stdout.str(), result.stdout.str()
    result.stdout.fnmatch_lines(["transformer-invariants: * invariants passed*"])


def test_the_public_names_are_the_suites_modules_themselves():
    """`reference.numpy` is invariants.reference.numpy (one module, not a copy), and `strategies` exports its public names."""
    code = ("import reference, reference.numpy, reference.counts, strategies, invariants.reference.numpy as inner, invariants.strategies as s; "
            "assert reference.numpy is inner and reference.layer_norm is inner.layer_norm and reference.counts.GPT2_SIZES; "
            "assert strategies.__all__ == s.__all__ and all(getattr(strategies, n) is getattr(s, n) for n in s.__all__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_another_distribution_providing_invariants_is_named_in_one_line(pytester):
    """A distribution like the package index's `invariants` (a state-modelling library) that also installs invariants/ is named."""
    info = pytester.path / "site" / "invariants-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: invariants\nVersion: 0.1.0\n")
    (info / "top_level.txt").write_text("invariants\n")
    pytester.makepyfile(my_norm=NORMS)
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", "my_norm.py", "-k", "rms_norm_scale", "-p", "no:cacheprovider",
                                           "-q", f"--rootdir={pytester.path}", "-o", f"pythonpath={info.parent}")
    lines = [line for line in result.outlines if "also provides the package 'invariants'" in line]
    assert lines == ["transformer-invariants: the distribution 'invariants' also provides the package 'invariants'; the two share its "
                     "files, so uninstall one (pip uninstall invariants)"], result.stdout.str()
