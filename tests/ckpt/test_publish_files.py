"""What a publish selects, the card it writes, and publishing to fsspec targets (memory://, a local dir)."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import fsspec
import pytest
from huggingface_hub import ModelCard
from publish_fixtures import SINGLE_FILES, make_step_dir, sha256, snapshot, tensors

from ckpt_tools import PublishError, layout, publish_model, select_publish_files
from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError
from ckpt_tools.tools.model_card import gather_card_info, render_model_card
from ckpt_tools.tools.publish import is_fsspec_target


def _model(step_dir):
    return step_dir / layout.PRETRAINED_MODEL_DIR


def test_selection_keeps_what_a_user_needs_and_never_training_state(tmp_path):
    model = _model(make_step_dir(tmp_path))
    (model / "notes.txt").write_text("scratch")

    assert select_publish_files(model) == sorted(name for name in SINGLE_FILES if name != "README.md")


def test_selection_of_a_sharded_model_takes_the_shards_its_index_names(tmp_path):
    model = _model(make_step_dir(tmp_path, weights="sharded"))
    (model / layout.sharded_model_name(1, 9)).write_bytes(b"stale shard of an older conversion")

    selected = select_publish_files(model)

    assert {layout.MODEL_INDEX, layout.sharded_model_name(1, 2), layout.sharded_model_name(2, 2)} <= set(
        selected
    )
    assert layout.sharded_model_name(1, 9) not in selected


def test_selection_refuses_an_index_naming_a_missing_shard(tmp_path):
    model = _model(make_step_dir(tmp_path, weights="sharded"))
    (model / layout.sharded_model_name(2, 2)).unlink()
    with pytest.raises(
        CorruptCheckpointError, match=r"names model-00002-of-00002\.safetensors, which is missing"
    ):
        select_publish_files(model)


def test_selection_refuses_a_directory_without_weights(tmp_path):
    with pytest.raises(NotACheckpointError, match="has no model weights"):
        select_publish_files(tmp_path)


def test_hub_ids_and_fsspec_targets_are_told_apart():
    assert not is_fsspec_target("acme/act-pusht")
    for target in ("s3://bucket/prefix", "memory://x", "file:///tmp/x", "/tmp/x", "./out", "~/models"):
        assert is_fsspec_target(target), target


def test_publish_to_memory_copies_the_selection_byte_for_byte(tmp_path):
    step_dir = make_step_dir(tmp_path, weights="sharded")
    before = snapshot(tmp_path)
    target = f"memory://published-{uuid.uuid4().hex}/act"

    os.symlink(step_dir.name, tmp_path / layout.CHECKPOINTS_DIR / layout.LAST)

    result = publish_model(tmp_path, target)  # a run's output_dir: its checkpoints/last is published

    fs, root = fsspec.core.url_to_fs(target)
    arrived = sorted(path.rsplit("/", 1)[-1] for path in fs.ls(root, detail=False))
    assert arrived == result.files  # no temporary names left behind
    assert result.commit_oid is None and result.url == target
    for name in result.files:
        if name != "README.md":
            local = _model(step_dir) / name
            assert fs.cat_file(f"{root}/{name}") == local.read_bytes(), name
    assert ModelCard(fs.cat_file(f"{root}/README.md").decode()).data.library_name == "ckpt-tools"
    assert snapshot(tmp_path) == before


def test_publish_to_a_local_directory_replaces_an_older_publish(tmp_path):
    step_dir = make_step_dir(tmp_path / "run", weights="adapter")
    target = tmp_path / "models" / "act"
    target.mkdir(parents=True)
    (target / layout.ADAPTER_SAFETENSORS).write_bytes(b"an older adapter")

    os.symlink(step_dir.name, tmp_path / "run" / layout.CHECKPOINTS_DIR / layout.LAST)

    result = publish_model(tmp_path / "run" / layout.CHECKPOINTS_DIR / layout.LAST, str(target))

    assert sorted(os.listdir(target)) == result.files
    assert sha256(target / layout.ADAPTER_SAFETENSORS) == sha256(
        _model(step_dir) / layout.ADAPTER_SAFETENSORS
    )
    card = (target / "README.md").read_text()
    assert f'model_dir = "{target}"' in card and "snapshot_download" not in card


def test_hub_only_options_are_refused_for_fsspec_targets(tmp_path):
    step_dir = make_step_dir(tmp_path)
    with pytest.raises(PublishError, match="apply to Hub repos only"):
        publish_model(step_dir, "memory://x", private=True)
    with pytest.raises(PublishError, match="apply to Hub repos only"):
        publish_model(step_dir, "memory://x", revision="dev")


def test_a_failed_fsspec_publish_leaves_no_temporary_files(tmp_path, monkeypatch):
    step_dir = make_step_dir(tmp_path)
    target = tmp_path / "out"
    before = snapshot(tmp_path / layout.CHECKPOINTS_DIR)
    real_mv = fsspec.implementations.local.LocalFileSystem.mv

    def mv_fails_on_config(self, src, dst, **kwargs):
        if dst.endswith(layout.TRAIN_CONFIG):
            raise PermissionError(13, "read-only bucket")
        return real_mv(self, src, dst, **kwargs)

    monkeypatch.setattr(fsspec.implementations.local.LocalFileSystem, "mv", mv_fails_on_config)
    with pytest.raises(PublishError, match=r"cannot write to .*read-only bucket.*nothing local was deleted"):
        publish_model(step_dir, str(target))

    assert not [name for name in os.listdir(target) if name.startswith(layout.TMP_PREFIX)]
    assert snapshot(tmp_path / layout.CHECKPOINTS_DIR) == before


def test_an_existing_readme_is_published_as_is(tmp_path):
    model = _model(make_step_dir(tmp_path))
    (model / "README.md").write_text("---\nlicense: mit\n---\n# hand-written card\n")
    target = tmp_path / "out"

    publish_model(model, str(target))

    assert (target / "README.md").read_text() == (model / "README.md").read_text()


def test_card_from_a_bare_converted_model_dir_uses_configs_and_extras(tmp_path):
    model = _model(make_step_dir(tmp_path))
    info = gather_card_info(None, str(model), select_publish_files(model), {"final_loss": 1.5, "run": "a|b"})
    card = ModelCard(render_model_card(info, "acme/act"))

    assert info.topology is None and info.steps == 100  # from train_config.json: no training_state here
    assert "| Final loss | 1.5 |" in card.text
    assert "| run | a\\|b |" in card.text
    assert "Topology" not in card.text
    assert card.data.tags == ["ckpt-tools", "act"]


def test_card_leaves_out_what_the_run_does_not_say(tmp_path):
    model = tmp_path / "bare"
    model.mkdir()
    (model / layout.POLICY_CONFIG).write_text(json.dumps({"dim": 3}))
    card = ModelCard(render_model_card(gather_card_info(None, str(model), [], None), "acme/x"))

    assert card.data.library_name == "ckpt-tools" and card.data.license is None
    assert "| Steps |" not in card.text and "# Policy" in card.text


def test_the_cards_loading_instructions_work_on_a_published_sharded_model(tmp_path):
    import torch

    import ckpt_tools

    step_dir = make_step_dir(tmp_path / "run", weights="sharded")
    target = tmp_path / "published"
    publish_model(step_dir, str(target))
    assert "ckpt_tools.load_model_state_dict(model_dir)" in (target / "README.md").read_text()

    loaded = ckpt_tools.load_model_state_dict(str(target))

    expected = tensors(0)
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(loaded[name], torch.from_numpy(value)), name


@pytest.mark.parametrize(
    ("base", "published", "noted"),
    [
        ("{tmp}/hf/hub/models--lerobot--act_base/snapshots/0123abcd", "lerobot/act_base", False),
        ("{tmp}/my/base_model", "{tmp}/my/base_model", True),
        ("lerobot/act_base", "lerobot/act_base", False),
    ],
)
def test_published_adapter_names_a_base_others_can_fetch(tmp_path, base, published, noted):
    """A base from huggingface_hub's cache is published as its Hub id; any other local base is kept
    and the result carries one note about it. The checkpoint's own file is never changed."""
    step_dir = make_step_dir(tmp_path / "run", weights="adapter")
    local_config = _model(step_dir) / layout.ADAPTER_CONFIG
    config = json.loads(local_config.read_text())
    local_config.write_text(json.dumps({**config, "base_model_name_or_path": base.format(tmp=tmp_path)}))
    before = local_config.read_bytes()

    result = publish_model(step_dir, str(tmp_path / "published"))

    sent = json.loads((tmp_path / "published" / layout.ADAPTER_CONFIG).read_text())
    assert sent["base_model_name_or_path"] == published.format(tmp=tmp_path)
    assert sent["r"] == config["r"]
    assert local_config.read_bytes() == before
    if noted:
        (note,) = result.notes
        assert f"local base model {tmp_path}/my/base_model" in note and "\n" not in note
    else:
        assert result.notes == []


def test_an_optimizers_dcp_shards_alone_are_no_weights_to_convert(tmp_path):
    """Only model or adapter DCP shards earn the "convert first" hint; an optimizer's never does."""
    step_dir = make_step_dir(tmp_path, weights="none")
    shutil.rmtree(step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR)
    (step_dir / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_DCP_DIR / layout.DCP_METADATA).write_bytes(b"m")
    with pytest.raises(NotACheckpointError, match=f"^{step_dir} has no model weights"):
        select_publish_files(step_dir)


def _hub_cache_snapshot(tmp_path, model):
    """`model` as huggingface_hub's cache stores it: every file a relative link into `blobs/`."""
    repo = tmp_path / "hub" / "models--ns--policy"
    snapshot_dir = repo / "snapshots" / ("0" * 40)
    snapshot_dir.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for path in sorted(model.iterdir()):
        if path.is_file():
            blob = repo / "blobs" / uuid.uuid4().hex
            shutil.copyfile(path, blob)
            (snapshot_dir / path.name).symlink_to(os.path.relpath(blob, snapshot_dir))
    return snapshot_dir


def test_a_hub_cache_snapshot_publishes_every_file_through_its_links(tmp_path):
    """The snapshot's files are links into the repo's blobs/: followed, by selection and copy alike
    (they were listed as `other` and dropped: "no model weights", a processor file missing)."""
    model = _model(make_step_dir(tmp_path / "run"))
    cached = _hub_cache_snapshot(tmp_path, model)
    expected = select_publish_files(model)
    assert select_publish_files(cached) == expected
    publish_model(cached, str(tmp_path / "published"))
    for name in expected:
        copy = tmp_path / "published" / name
        assert copy.is_file() and not copy.is_symlink() and sha256(copy) == sha256(model / name), name


def test_a_link_leading_outside_a_hub_snapshot_or_a_model_dir_is_refused(tmp_path):
    model = _model(make_step_dir(tmp_path / "run"))
    cached = _hub_cache_snapshot(tmp_path, model)
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "hf_x"}')
    (cached / "policy_preprocessor_extra.json").symlink_to(secret)  # a processor-named file: selected
    with pytest.raises(CorruptCheckpointError, match="is a link leading outside the directory"):
        publish_model(cached, str(tmp_path / "published"))
    assert not (tmp_path / "published").exists()
