"""A throwaway Redis server for the tests: redis-server on a unix socket in a temporary folder, nothing saved, stopped after.

    with redis_server(tmp_path) as url:      # "unix:///.../redis.sock"
        ...                                   # --examples-db url

Debian's redis-server package (`apt-get install redis-server`; .ci/run installs it, as it installs
bubblewrap). Where it is missing the caller skips with REDIS_MISSING, unless TI_REQUIRE_REDIS=1 (set by
.ci/run once it is installed) makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

REDIS_MISSING = "redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it where it runs as root)"
START_SECONDS = 10


def redis_server_path():
    """redis-server's path, or None where it is missing and TI_REQUIRE_REDIS is not set; RuntimeError where it is required."""
    path = shutil.which("redis-server")
    if path is None and os.environ.get("TI_REQUIRE_REDIS") == "1":
        raise RuntimeError(f"TI_REQUIRE_REDIS=1 but {REDIS_MISSING}")
    return path


@contextmanager
def redis_server(folder, *, executable="redis-server"):
    """Start redis-server on a unix socket in `folder`, yield its redis:// URL, stop it (terminate, then kill) on the way out."""
    folder = Path(folder)
    socket = folder / "redis.sock"
    server = subprocess.Popen(
        [executable, "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
         "--dir", str(folder), "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        url = f"unix://{socket}"
        _wait_until_it_answers(url, server)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_until_it_answers(url, server):
    import redis

    deadline = time.monotonic() + START_SECONDS
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"redis-server exited with status {server.returncode} before it answered")
        try:
            if redis.Redis.from_url(url).ping():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis-server did not answer at {url} within {START_SECONDS} s")
        time.sleep(0.05)
