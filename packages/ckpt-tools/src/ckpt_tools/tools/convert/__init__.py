"""Streaming conversion between DCP shard directories and safetensors, with bounded memory.

Every other tool (torch's `dcp_to_torch_save`, accelerate's `merge_fsdp_weights`) loads the whole
model into RAM before writing it. Here the safetensors header is computed from the DCP chunk table
first, then each tensor's bytes are copied from its chunks, in file order, straight out of the `.distcp`
records (`dcp.records.locate_chunk_data`). Bytes that need no change never pass through Python; a dtype
cast works block by block (`chunk_copy.py`); only a tensor whose chunks are not row ranges (split along
an inner dimension) is assembled in memory, one tensor at a time. torch is imported only for those two
cases. One module per direction (`to_safetensors.py`, `to_dcp.py`); `plan.py` decides where a
conversion writes and what it may delete.
"""

from ckpt_tools.files.sharded_safetensors import parse_size
from ckpt_tools.tools.convert.result import ConversionResult, Progress
from ckpt_tools.tools.convert.to_dcp import convert_safetensors_to_dcp
from ckpt_tools.tools.convert.to_safetensors import (
    check_deletable_source,
    convert_dcp_to_safetensors,
    delete_source,
)

__all__ = [
    "ConversionResult",
    "Progress",
    "check_deletable_source",
    "convert_dcp_to_safetensors",
    "convert_safetensors_to_dcp",
    "delete_source",
    "parse_size",
]
