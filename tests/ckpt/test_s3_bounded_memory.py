"""Conversion and publishing stream from and to a bucket in bounded memory: a tensor many times the
copy pieces passes through `ckpt convert` (bucket to bucket) and `ckpt push` (bucket to bucket) while
the process's peak RSS grows, above the S3 client's floor, by far less than the tensor.

Each command runs in a fresh process that first reaches the floor (imports, the client's session, a
metadata read), so the kernel's high-water mark measures only what streaming adds.
"""

from __future__ import annotations

from pathlib import Path

import fsspec
import torch
from safetensors.torch import load_file, save_file

from ckpt_tools import convert_safetensors_to_dcp, layout
from helpers.high_water import run_child

_MEASURE = """
import json, sys
from ckpt_tools.files import storage
from ckpt_tools.tools.convert import convert_dcp_to_safetensors
from ckpt_tools.tools.publish import publish_model
command, source, target = sys.argv[1:]
storage.list_names(source)
before = peak_kib()
if command == "convert":
    convert_dcp_to_safetensors(source, target)
else:
    publish_model(source, target)
print(json.dumps({"grew_kib": peak_kib() - before, "torch": "torch" in sys.modules}))
"""

SIZE_MIB = 64


def _grew_kib(command: str, source: str, target: str) -> int:
    measured = run_child(_MEASURE, command, source, target)
    assert measured["torch"] is False
    return int(measured["grew_kib"])


def test_bucket_convert_and_push_stream_in_bounded_memory(s3_bucket: str, tmp_path: Path) -> None:
    """A 64 MiB tensor: each command grows by less than 3/4 of it. What streaming holds is about 30 MB
    for the 8 MiB upload part (fsspec's buffer, the part cut from it, the HTTP send) and a few MiB of
    read-ahead; s3fs's default 50 MB blocks, 8 MiB reads with an 8 MiB read-ahead, or a whole shard
    read at once each exceed the bound."""
    tensor = torch.arange(SIZE_MIB * 2**20 // 4, dtype=torch.float32).reshape(-1, 256)
    source = tmp_path / layout.MODEL_SAFETENSORS
    save_file({"big": tensor, "small": torch.ones(3)}, str(source))
    convert_safetensors_to_dcp(source, tmp_path / layout.MODEL_DCP_DIR)
    fs = fsspec.filesystem("s3", use_listings_cache=False)
    remote = f"{s3_bucket}/source/{layout.MODEL_DCP_DIR}"
    fs.put(str(tmp_path / layout.MODEL_DCP_DIR), remote.removeprefix("s3://"), recursive=True)

    converted, published = f"{s3_bucket}/converted", f"{s3_bucket}/published"
    grew = {
        "convert": _grew_kib("convert", remote, converted),
        "push": _grew_kib("push", converted, published),
    }
    assert all(kib < SIZE_MIB * 1024 * 3 // 4 for kib in grew.values()), grew
    local = tmp_path / "published.safetensors"
    fs.get_file(f"{published}/{layout.MODEL_SAFETENSORS}".removeprefix("s3://"), str(local))
    got = load_file(str(local))
    assert torch.equal(got["big"], tensor) and torch.equal(got["small"], torch.ones(3))
