"""Publishing to the Hub: the real huggingface_hub client against the loopback Hub server.

`tests/conftest.py` turns Xet off and points HF_HOME at an empty directory before huggingface_hub is
imported, so the client speaks the plain HTTP + LFS protocol the server implements and never picks up
a developer's token.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import traceback
import uuid
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import ModelCard
from huggingface_hub.errors import HfHubHTTPError
from publish_fixtures import DATASET, POLICY_TYPE, SINGLE_FILES, make_step_dir, sha256, snapshot

from ckpt_tools import PublishError, UsageError, layout, publish_model
from ckpt_tools.tools.hub_commit import _map_hub_failure

TOKEN = "hf_loopbackSECRETtoken1234567890"
REPO = "acme/act-pusht"


def _model_dir(step_dir: Path) -> Path:
    return step_dir / layout.PRETRAINED_MODEL_DIR


def _assert_no_token(*texts: str) -> None:
    for text in texts:
        assert TOKEN not in text
        assert TOKEN[3:15] not in text


def _assert_chain_dropped(error: BaseException) -> None:
    """The client's exception holds the request and its Authorization header: it must be neither the
    cause nor the context of the error (a reporter walking `__context__` ignores `from None`)."""
    assert error.__cause__ is None and error.__context__ is None
    _assert_no_token("".join(traceback.format_exception(error)))


def test_publish_uploads_the_model_files_in_one_commit(tmp_path, hub, caplog, capsys):
    step_dir = make_step_dir(tmp_path)
    before = snapshot(tmp_path)
    caplog.set_level(logging.DEBUG)

    result = publish_model(
        step_dir, REPO, token=TOKEN, endpoint=hub.url, extra_card_info={"final_loss": 0.0421}
    )

    assert result.files == sorted(SINGLE_FILES)
    assert result.url == f"{hub.url}/{REPO}"
    arrived = hub.files(REPO)
    assert sorted(arrived) == sorted(SINGLE_FILES)
    for name, data in arrived.items():
        if name != "README.md":
            assert hashlib.sha256(data).hexdigest() == sha256(_model_dir(step_dir) / name), name
    commits = hub.repo(REPO).commits
    assert len(commits) == 1 and commits[0].oid == result.commit_oid
    assert commits[0].summary == "Upload model from step 000010 with ckpt-tools"
    assert hub.routes().count("commit") == 1
    # the token was used (every API call carried it) and appears nowhere on our side
    api_calls = [r for r in hub.state.requests if r.route not in ("lfs_upload",)]
    assert all(r.authorization == f"Bearer {TOKEN}" for r in api_calls)
    captured = capsys.readouterr()
    _assert_no_token(caplog.text, captured.out, captured.err, arrived["README.md"].decode())
    assert snapshot(tmp_path) == before  # nothing local written, moved or deleted


def test_published_card_is_a_valid_model_card_describing_the_run(tmp_path, hub):
    publish_model(
        make_step_dir(tmp_path), REPO, token=TOKEN, endpoint=hub.url, extra_card_info={"final_loss": 0.0421}
    )

    text = hub.files(REPO)["README.md"].decode()
    card = ModelCard(text)
    assert card.data.library_name == "ckpt-tools"
    assert card.data.license == "apache-2.0"
    assert POLICY_TYPE in card.data.tags
    assert card.data.datasets == [DATASET]
    body = card.text
    for expected in (
        "| Policy type | act |",
        f"| Dataset | {DATASET} |",
        "| Steps | 10 |",
        "| Topology | HSDP 2x2 (4 ranks) |",
        "| Effective batch size | 24 (batch_size 2 x 4 ranks x 3 accumulation steps) |",
        "| Mixed precision | bf16 |",
        "| Final loss | 0.0421 |",
        f'snapshot_download("{REPO}")',
        "ckpt_tools.load_model_state_dict(model_dir)",
    ):
        assert expected in body, expected


def test_sharded_model_to_a_private_repo_on_a_branch(tmp_path, hub):
    step_dir = make_step_dir(tmp_path, weights="sharded")

    result = publish_model(
        _model_dir(step_dir), REPO, private=True, revision="v1", commit_message="first", endpoint=hub.url
    )

    shards = [layout.sharded_model_name(1, 2), layout.sharded_model_name(2, 2)]
    assert set(shards) | {layout.MODEL_INDEX} <= set(result.files)
    assert layout.MODEL_SAFETENSORS not in result.files
    repo = hub.repo(REPO)
    assert repo.private
    assert hub.files(REPO, "main") == {}
    assert sorted(hub.files(REPO, "v1")) == result.files
    assert [(c.branch, c.summary) for c in repo.commits] == [("v1", "first")]
    for name in shards:
        assert hashlib.sha256(hub.files(REPO, "v1")[name]).hexdigest() == sha256(_model_dir(step_dir) / name)


def test_publishing_again_is_a_second_commit_to_the_existing_repo(tmp_path, hub):
    step_dir = make_step_dir(tmp_path, weights="adapter")
    publish_model(step_dir, REPO, endpoint=hub.url)
    result = publish_model(step_dir, REPO, endpoint=hub.url)

    assert {layout.ADAPTER_SAFETENSORS, layout.ADAPTER_CONFIG} <= set(result.files)
    assert len(hub.repo(REPO).commits) == 2
    assert "peft" in ModelCard(hub.files(REPO)["README.md"].decode()).data.tags


def test_server_error_on_commit_is_one_line_with_a_retry_hint(tmp_path, hub, caplog, capsys):
    step_dir = make_step_dir(tmp_path)
    before = snapshot(tmp_path)
    hub.fail("commit", 500)
    caplog.set_level(logging.DEBUG)

    with pytest.raises(PublishError, match=r"Hub server error \(HTTP 500\).*retry later") as info:
        publish_model(step_dir, REPO, token=TOKEN, endpoint=hub.url)

    message = str(info.value)
    assert "\n" not in message and "nothing was deleted" in message
    _assert_chain_dropped(info.value)
    assert hub.repo(REPO).commits == []
    captured = capsys.readouterr()
    _assert_no_token(message, caplog.text, captured.out, captured.err)
    assert snapshot(tmp_path) == before


def test_unauthorized_names_the_fix(tmp_path, hub):
    hub.fail("create", 401)
    with pytest.raises(PublishError, match=r"not authorized .*HTTP 401.*HF_TOKEN.*hf auth login") as info:
        publish_model(make_step_dir(tmp_path), REPO, token=TOKEN, endpoint=hub.url)
    _assert_no_token(str(info.value))
    _assert_chain_dropped(info.value)
    assert hub.routes() == ["create", "repo_info"]  # the client checks whether the repo exists anyway
    assert "commit" not in hub.routes()


def test_a_token_without_create_scope_still_commits_to_an_existing_repo(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    publish_model(step_dir, REPO, endpoint=hub.url)
    hub.fail("create", 403)

    result = publish_model(step_dir, REPO, endpoint=hub.url)

    assert result.commit_oid == hub.repo(REPO).commits[-1].oid
    assert len(hub.repo(REPO).commits) == 2


def test_unreachable_endpoint_says_so(tmp_path):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    step_dir = make_step_dir(tmp_path)
    before = snapshot(tmp_path)

    with pytest.raises(PublishError, match=rf"cannot reach http://127.0.0.1:{port} .*HF_ENDPOINT") as info:
        publish_model(step_dir, REPO, token=TOKEN, endpoint=f"http://127.0.0.1:{port}")

    _assert_no_token(str(info.value))
    assert snapshot(tmp_path) == before


def test_an_lfs_upload_failure_wrapped_by_the_client_is_mapped():
    # The client retries a failed LFS PUT for ~23 s, then raises a RuntimeError around the HTTP error;
    # build that shape directly instead of waiting for it.
    request = httpx2.Request("PUT", "http://hub/lfs", headers={"authorization": f"Bearer {TOKEN}"})
    http_error = HfHubHTTPError("503 Server Error", response=httpx2.Response(503, request=request))
    try:
        try:
            raise http_error
        except HfHubHTTPError as exc:
            raise RuntimeError("Error while uploading 'model.safetensors' to the Hub.") from exc
    except RuntimeError as wrapped:
        mapped = _map_hub_failure(wrapped, "http://hub", "committing to acme/x")
    assert mapped is not None and "Hub server error (HTTP 503)" in str(mapped)
    _assert_no_token(str(mapped))


def test_dcp_only_model_is_refused_before_any_request(tmp_path, hub):
    with pytest.raises(PublishError, match=r"only DCP shards \(pytorch_model_fsdp_0/\).*run `ckpt convert"):
        publish_model(make_step_dir(tmp_path, weights="dcp_only"), REPO, endpoint=hub.url)
    assert hub.routes() == []


def test_a_config_holding_the_token_is_not_published(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    config = _model_dir(step_dir) / layout.TRAIN_CONFIG
    config.write_text(json.dumps({"wandb": {"env": f"HF_TOKEN={TOKEN}"}}))

    with pytest.raises(PublishError, match=r"train_config\.json contains your Hub token") as info:
        publish_model(step_dir, REPO, token=TOKEN, endpoint=hub.url)
    _assert_no_token(str(info.value))
    assert hub.routes() == []


def _ckpt(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    ckpt = Path(sys.executable).parent / "ckpt"
    return subprocess.run(
        [str(ckpt), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


def test_cli_push_reads_endpoint_and_token_from_the_environment(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN}

    done = _ckpt("push", str(step_dir), REPO, "--json", "--commit-message", "from the CLI", env=env)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["files"] == sorted(SINGLE_FILES)
    assert result["commit_oid"] == hub.repo(REPO).commits[0].oid
    assert hub.repo(REPO).commits[0].summary == "from the CLI"
    assert all(r.authorization == f"Bearer {TOKEN}" for r in hub.state.requests if r.route == "commit")
    _assert_no_token(done.stdout, done.stderr)

    hub.fail("commit", 503)
    failed = _ckpt("push", str(step_dir), REPO, env=env)
    assert failed.returncode == 1
    assert failed.stderr.startswith("error: Hub server error (HTTP 503)")
    assert failed.stderr.count("\n") == 1
    _assert_no_token(failed.stdout, failed.stderr)


def test_a_model_on_an_fsspec_store_publishes_to_the_hub(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    store = f"memory://store-{uuid.uuid4().hex}/act"
    publish_model(step_dir, store)  # now a bare model directory on memory://

    result = publish_model(store, REPO, endpoint=hub.url)

    assert result.files == sorted(SINGLE_FILES)
    arrived = hub.files(REPO)
    assert hashlib.sha256(arrived[layout.MODEL_SAFETENSORS]).hexdigest() == sha256(
        _model_dir(step_dir) / layout.MODEL_SAFETENSORS
    )
    assert hub.repo(REPO).commits[0].summary == "Upload model with ckpt-tools"


def test_publishing_again_to_the_same_branch_is_a_second_commit_on_it(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    publish_model(step_dir, REPO, revision="v1", endpoint=hub.url)
    publish_model(step_dir, REPO, revision="v1", endpoint=hub.url)
    assert [c.branch for c in hub.repo(REPO).commits] == ["v1", "v1"]


def test_a_token_of_eight_characters_is_looked_for_too(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    short = "hf_a1b2c"
    (_model_dir(step_dir) / layout.TRAIN_CONFIG).write_text(json.dumps({"env": f"HF_TOKEN={short}"}))
    with pytest.raises(PublishError, match=r"train_config\.json contains your Hub token"):
        publish_model(step_dir, REPO, token=short, endpoint=hub.url)
    assert hub.routes() == []


def test_a_refusal_carries_the_servers_message_on_one_line_and_other_errors_pass_through():
    request = httpx2.Request("POST", "http://hub/api/x", headers={"authorization": f"Bearer {TOKEN}"})
    response = httpx2.Response(422, request=request)
    explained = HfHubHTTPError("422", response=response, server_message="bad\n  revision name")
    mapped = _map_hub_failure(explained, "http://hub", "committing to acme/x")
    assert (
        str(mapped)
        == "the Hub refused committing to acme/x (HTTP 422: bad revision name); nothing was deleted"
    )
    bare = _map_hub_failure(HfHubHTTPError("422", response=response), "http://hub", "committing to acme/x")
    assert str(bare) == "the Hub refused committing to acme/x (HTTP 422); nothing was deleted"
    assert _map_hub_failure(ValueError("not the client's"), "http://hub", "committing to acme/x") is None


def test_a_tag_names_the_commit_and_moves_to_a_later_publish_of_the_same_step(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    first = publish_model(step_dir, REPO, token=TOKEN, endpoint=hub.url, tag="step-000010")
    assert hub.repo(REPO).tags == {"step-000010": first.commit_oid}
    (_model_dir(step_dir) / "config.json").write_text(json.dumps({"type": POLICY_TYPE, "changed": True}))
    second = publish_model(step_dir, REPO, token=TOKEN, endpoint=hub.url, tag="step-000010")
    assert second.commit_oid != first.commit_oid
    assert hub.repo(REPO).tags == {"step-000010": second.commit_oid}  # moved, not refused
    assert json.loads(hub.tagged(REPO, "step-000010")["config.json"])["changed"] is True


def test_training_state_is_published_under_its_own_path_only_when_asked(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    publish_model(step_dir, REPO, token=TOKEN, endpoint=hub.url)
    assert not any(name.startswith("training_state/") for name in hub.files(REPO))
    result = publish_model(step_dir, REPO, token=TOKEN, endpoint=hub.url, training_state=True)
    state = step_dir / layout.TRAINING_STATE_DIR
    expected = {f"training_state/{p.relative_to(state)}" for p in state.rglob("*") if p.is_file()}
    assert expected and expected <= set(result.files)
    for name in expected:
        assert hub.files(REPO)[name] == (step_dir / name).read_bytes()
    bare = shutil.copytree(_model_dir(step_dir), tmp_path / "converted")  # a model directory alone
    with pytest.raises(UsageError, match="is a model directory, not a step directory"):
        publish_model(bare, REPO, token=TOKEN, endpoint=hub.url, training_state=True)


def test_server_errors_and_rate_limits_are_transient_refusals_are_not(tmp_path, hub):
    step_dir = make_step_dir(tmp_path)
    for status, transient in ((503, True), (429, True), (403, False), (422, False)):
        hub.fail("commit", status)
        with pytest.raises(PublishError) as failed:
            publish_model(step_dir, REPO, token=TOKEN, endpoint=hub.url)
        assert failed.value.transient is transient, status
