"""Settings every test process needs before any library reads them at import time, and a time-out in a
fixture that says which fixture it was.

huggingface_hub reads `HF_HUB_DISABLE_XET` and `HF_HOME` when it is first imported, and safetensors or
peft may import it from any test module, so they are set here, before test modules are collected:
uploads use plain HTTP (what the loopback Hub server in `helpers/hub_server.py` speaks), and no token
from the developer's login cache or environment is ever used or sent by a test.
"""

import atexit
import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="ckpt-tests-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
    os.environ.pop(_name, None)


def launches_processes(item: pytest.Item) -> bool:
    """Whether a test starts processes of its own (torchrun launches): the files of
    `tests/distributed/` and any test marked `distributed`."""
    return "distributed" in item.path.parts or item.get_closest_marker("distributed") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order `pytest -n 2 --dist loadfile --no-loadscope-reorder` (pytest-xdist; what `nox -s
    tests` runs) hands files out in: the two workers split the suite by test file, so a module fixture
    (a training run) is built once, and the files that launch processes go first, so the suite ends on
    short in-process files that keep both workers busy to the last (the order is otherwise collection's,
    the same on every worker, as xdist requires). Two launches may share the machine then, as may a
    launch and an in-process test: the time bounds of every launch (a stalled rank, a worker that stops
    delivering) are written for a 2-core machine that busy."""
    launching = {item.path for item in items if launches_processes(item)}
    items.sort(key=lambda item: item.path not in launching)


PYTEST_TIMEOUT = re.compile(r"Timeout \(>(?P<limit>[0-9.]+)s\) from pytest-timeout")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """pytest-timeout's limit covers a test's setup, so a slow module fixture (one that trains) can time
    out inside the first test that asks for it, and every other test of the module then errors with the
    same bare "Timeout (>300.0s) from pytest-timeout." This names the fixture that was still setting up,
    its scope and file, and how long it had run of the test's limit, so the report says it was time."""
    start = time.monotonic()
    try:
        return (yield)
    except pytest.fail.Exception as failed:
        timed_out = PYTEST_TIMEOUT.search(str(failed))
        if timed_out is None or getattr(failed, "fixture_named", False):
            raise  # another failure, or one an inner fixture already named
        code = getattr(fixturedef.func, "__code__", None)
        where = ""
        if code is not None:
            path = Path(code.co_filename)
            with contextlib.suppress(ValueError):
                path = path.relative_to(request.config.rootpath)
            where = f", {path}:{code.co_firstlineno}"
        item = getattr(request, "_pyfuncitem", request.node)
        message = (
            f"Timeout in fixture {fixturedef.argname!r} ({fixturedef.scope} scope{where}): it had been "
            f"setting up for {time.monotonic() - start:.0f} s when pytest-timeout's {timed_out['limit']} s "
            f"for {item.nodeid} ran out. A fixture too slow for this machine (or a busy machine), not a "
            "failed check: make the fixture smaller, or give the tests a longer @pytest.mark.timeout."
        )
        # Reworded in place: pytest keeps this exception object for the fixture (a module fixture's
        # other tests raise it again), and its traceback shows where the fixture was when time ran out.
        failed.msg = message
        failed.args = (message,)
        failed.fixture_named = True  # type: ignore[attr-defined]
        raise


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for a module of tiny-tensor tests (`pytestmark =
    pytest.mark.usefixtures("one_thread")`): two threads on a busy 2-core machine spin many times slower
    than one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3-compatible server on 127.0.0.1, started once per session; the process environment
    gets its endpoint and (random) credentials the way a user sets them, so torchrun ranks and CLI
    subprocesses reach it too. Restored and stopped at the end of the session."""
    from helpers.s3_server import start_s3_server

    server = start_s3_server()
    saved = {name: os.environ.get(name) for name in server.env}
    os.environ.update(server.env)
    yield server
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    server.stop()


@pytest.fixture
def s3_bucket(s3_server) -> Iterator[str]:
    """A fresh, empty bucket (`s3://<name>`) for one test, deleted with its objects afterwards."""
    import uuid

    import fsspec

    fs = fsspec.filesystem("s3", use_listings_cache=False)
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    yield f"s3://{name}"
    fs.rm(name, recursive=True)
