"""benchmarks/soak_compare.py measures a revision the way its figures in docs/power.md were measured."""

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("soak_compare", Path(__file__).parent.parent / "benchmarks" / "soak_compare.py")
soak_compare = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(soak_compare)


def test_measure_counts_the_drawn_examples_and_scales_each_invariant_to_the_soak():
    table = soak_compare.measure(5, {"softmax.softmax_rows_sum_to_one", "counts.gpt2_exact_counts"})
    assert set(table) == {f"{target} {dtype}" for target, dtype in soak_compare.RUNS}
    for invariants, examples, seconds, minutes, failed, engine_minutes in table.values():
        assert invariants == 2 and failed == 0  # the two named, nothing else; the references pass them
        # softmax: 5 by the engine and 6 drawn directly (hypothesis may add a rejected draw or two); GPT-2's one table example
        assert 12 <= examples <= 16
        # softmax runs the full soak (ENGINE_EXAMPLES at the engine's rate, the rest at the direct rate), some 900 times the
        # examples measured; the known-value table runs its one example once
        assert minutes * 60 > 100 * seconds > 0 and engine_minutes * 60 > 100 * seconds
