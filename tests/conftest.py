"""What every test shares: the gate's course secret kept in a test folder, never in the user's home or the repository."""

from __future__ import annotations

import pytest

from invariants.gate.secret import HOME_ENV, KEPT_FILE


@pytest.fixture(autouse=True, scope="session")
def _course_secret_for_tests(tmp_path_factory):
    """A fixed, published course secret, so that gradings without a secret of their own are reproducible from run to run."""
    home = tmp_path_factory.mktemp("gate-secret-home")
    home.chmod(0o700)
    kept = home / KEPT_FILE
    kept.write_text("tests/conftest.py: a published secret, for reproducible gradings\n")
    kept.chmod(0o600)
    patch = pytest.MonkeyPatch()
    patch.setenv(HOME_ENV, str(home))
    patch.delenv("GATE_SECRET", raising=False)  # the shipped assignments' variable: a developer's own must not change the tests' seeds
    yield kept
    patch.undo()
