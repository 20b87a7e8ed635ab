"""Root conftest: loads the suite's pytest plugin (implementation, backend, device and dtype
selection, the invariants profile), which lives in invariants/plugin.py so that an installed
copy gets it through the `pytest11` entry point too; and pytester for the project's own tests."""

pytest_plugins = ["invariants.plugin", "pytester"]
