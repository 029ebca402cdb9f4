"""The files that make a directory of weights a usable model: the policy and training configs and the
normalization processors (and, for a PEFT adapter, its adapter_config.json).

`ckpt convert --output DIR` and `ckpt merge-adapter -o DIR` copy them beside the weights they write,
so DIR works as `--policy.path`, with `trainer.load_policy` and with `ckpt push`.
"""

from __future__ import annotations

from ckpt_tools.errors import OutputExistsError
from ckpt_tools.files import storage
from ckpt_tools.format import layout

_CONFIGS = (layout.POLICY_CONFIG, layout.TRAIN_CONFIG)
_PROCESSOR_PREFIXES = (layout.PREPROCESSOR, layout.POSTPROCESSOR)


def companion_names(model_dir: str, *, adapter: bool) -> list[str]:
    """The companion files present in `model_dir`, sorted."""
    wanted = (*_CONFIGS, layout.ADAPTER_CONFIG) if adapter else _CONFIGS
    return sorted(
        n for n in storage.list_names(model_dir) if n in wanted or n.startswith(_PROCESSOR_PREFIXES)
    )


def check_companions(model_dir: str, out_dir: str, names: list[str], overwrite: bool) -> None:
    """Refuse, before anything is written, to replace a different file of the same name in `out_dir`."""
    if overwrite or _same_dir(model_dir, out_dir):
        return
    for name in names:
        target = layout.join(out_dir, name)
        if storage.exists(target) and storage.read_bytes(target) != storage.read_bytes(
            layout.join(model_dir, name)
        ):
            raise OutputExistsError(f"{target} already exists; pass --overwrite to replace it")


def copy_companions(model_dir: str, out_dir: str, names: list[str]) -> list[str]:
    """Copy `names` from `model_dir` into `out_dir`; returns the paths written (none in place)."""
    if _same_dir(model_dir, out_dir):
        return []
    written = []
    for name in names:
        storage.write_bytes(layout.join(out_dir, name), storage.read_bytes(layout.join(model_dir, name)))
        written.append(layout.join(out_dir, name))
    return written


def _same_dir(a: str, b: str) -> bool:
    return storage.resolve(a)[1].rstrip("/") == storage.resolve(b)[1].rstrip("/")
