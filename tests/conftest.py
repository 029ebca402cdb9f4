"""Settings every test process needs before any library reads them at import time.

huggingface_hub reads `HF_HUB_DISABLE_XET` and `HF_HOME` when it is first imported, and safetensors or
peft may import it from any test module, so they are set here, before test modules are collected:
uploads use plain HTTP (what the loopback Hub server in `helpers/hub_server.py` speaks), and no token
from the developer's login cache or environment is ever used or sent by a test.
"""

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="ckpt-tests-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
    os.environ.pop(_name, None)


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
