#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (written by invariants-bundle gradescope).
# It installs the gate into a virtualenv of its own, pinned by constraints.txt, and makes the course secret root's alone.
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (@PYTHON_MAJOR@, @PYTHON_MINOR@))'; then
    echo "setup.sh: the pinned packages need Python @PYTHON_MAJOR@.@PYTHON_MINOR@ or later, and this image has $(python3 -V 2>&1):" \
         "choose a newer base image (Ubuntu 24.04) in the autograder's settings" >&2
    exit 1
fi
python3 -m venv /autograder/gate
/autograder/gate/bin/pip install --quiet --no-cache-dir --disable-pip-version-check -c constraints.txt @INDEX_OPTIONS@ "./@REQUIREMENT@"
chmod 0700 /autograder/source
chmod 0600 @SECRET_FILE@
