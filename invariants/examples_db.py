"""The example database the invariants share across runs, workers and machines, and the key each invariant's examples go under.

    --examples-db redis://host:6379/0     TI_EXAMPLES_DB   Redis (hypothesis.extra.redis), for workers on many machines
    --examples-db path/to/folder                           a folder (hypothesis's DirectoryBasedExampleDatabase), one machine

An invariant's examples are filed under `example_key(invariant, implementation)`: its name, the
implementation's name (the --impl target as given), backend and dtype, and nothing else. So a failure
replays after a new release of the suite (no source hash in the key), after the invariants are
reordered (no parametrize index), and after the implementation is edited (its name stays: a fixed bug
replays and passes; one still there fails at once, shrunk). Another implementation, or the same in
another dtype, has another key and never sees it. The device is left out: a failure found on the cpu
is worth replaying on cuda.
"""

from __future__ import annotations

import functools
import hashlib

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

KEY_FORMAT = b"transformer-invariants examples 1"  # bumped only if the choices an invariant draws stop replaying
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def example_key(invariant, impl):
    """The 48-byte database key of `invariant` (its name) on `impl` (an Implementation): stable across releases and edits."""
    parts = (KEY_FORMAT, invariant.encode(), impl.label.encode(), impl.backend.encode(), impl.dtype.encode())
    return hashlib.sha384(b"\0".join(parts)).digest()  # 48 bytes, the length HypoFuzz expects of a key


class ExamplesDatabaseError(ValueError):
    """--examples-db names a database this machine cannot open; the message says why and what to do."""


@functools.cache  # one per address and process: HypoFuzz checks that every test's database equals the default one, session after session
def open_database(address):
    """The example database at `address`: a redis:// (rediss://, unix://) URL, or a folder; ExamplesDatabaseError if it cannot be reached."""
    if not address.startswith(REDIS_SCHEMES):
        return DirectoryBasedExampleDatabase(address)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as missing:
        raise ExamplesDatabaseError(f"needs the redis client ({missing}): pip install 'transformer-invariants[fuzz]'") from None
    client = redis.Redis.from_url(address, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ExamplesDatabaseError(f"no Redis server answers there: {exc}") from None
    return RedisExampleDatabase(client)


class FuzzTargetKeys(ExampleDatabase):
    """The shared database as HypoFuzz's workers see it: each fuzz target's key swapped for its invariant's example_key.

    HypoFuzz keys a target by a digest of the test function's source and pytest node id; every
    entry it writes (failures, its coverage corpus, reports) starts with that key. Here the key's
    first 48 bytes become the invariant's own key, and change events come back under the target's,
    so what a worker finds replays in any run of the suite (invariants.runner) and survives a release.
    """

    def __init__(self, db):
        super().__init__()
        self.db = db
        self._to_shared = {}  # fuzz target's key -> example_key
        self._to_target = {}

    def alias(self, target_key, key):
        """File the fuzz target `target_key`'s entries under `key`."""
        self._to_shared[target_key], self._to_target[key] = key, target_key

    def _shared(self, key):
        return self._to_shared.get(key[:48], key[:48]) + key[48:]

    def save(self, key, value):
        self.db.save(self._shared(key), value)

    def fetch(self, key):
        return self.db.fetch(self._shared(key))

    def delete(self, key, value):
        self.db.delete(self._shared(key), value)

    def move(self, src, dest, value):
        self.db.move(self._shared(src), self._shared(dest), value)

    def _start_listening(self):
        self.db.add_listener(self._relay)

    def _stop_listening(self):
        self.db.remove_listener(self._relay)

    def _relay(self, event):
        kind, (key, value) = event
        self._broadcast_change((kind, (self._to_target.get(key[:48], key[:48]) + key[48:], value)))

    def __eq__(self, other):  # each pytest session of a process (HypoFuzz collects in every worker) makes its own, of the same database
        return type(other) is type(self) and other.db == self.db

    def __hash__(self):
        return hash((type(self), self.db))

    def __repr__(self):
        return f"FuzzTargetKeys({self.db!r})"
