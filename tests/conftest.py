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

os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="ckpt-tests-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
    os.environ.pop(_name, None)
