"""The step commit on an object store, against a real S3-compatible server (moto, through s3fs).

S3 has no rename: a step directory is committed by copying every object and deleting the sources,
and `last` is a text object written after the copy. A crash is injected before each store operation
of a commit in turn (the process dies there: nothing after it happens); after each one a reader must
find `last` on a complete step (or no `last`), every step directory holding `training_step.json` must
verify, and the next save of the same step (what an auto-resumed run does) must complete the commit.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Iterator

import fsspec
import pytest
from fsspec.asyn import sync_wrapper
from report_fixtures import tiny_model_state, write_step_dir

from ckpt_tools import layout
from ckpt_tools.files import commit, storage
from ckpt_tools.reports.verify import verify_checkpoint

# The store operations a commit performs (s3fs's coroutines under fsspec's sync methods).
MUTATIONS = ("_cp_file", "_rm", "_rm_file", "_pipe_file", "_put_file")


class Crash(Exception):
    """The process dying at this point: raised instead of the operation, nothing after it runs."""


@contextlib.contextmanager
def store_operations(monkeypatch, crash_at: int | None = None) -> Iterator[list[tuple[str, str]]]:
    """Record every mutating call of the store client ckpt-tools uses as (operation, path); raise
    `Crash` instead of call number `crash_at`. fsspec binds each instance's sync methods (`rm`,
    `pipe_file`) to its coroutines when the instance is made, so both are replaced on the instance."""
    calls: list[tuple[str, str]] = []
    counter = itertools.count()
    store = fs()
    with monkeypatch.context() as patch:
        for name in MUTATIONS:
            original = getattr(store, name)

            async def wrapped(path, *args, _original=original, _name=name, **kwargs):
                if next(counter) == crash_at:
                    raise Crash(f"{_name} {path}")
                calls.append((_name, str(path)))
                return await _original(path, *args, **kwargs)

            patch.setattr(store, name, wrapped)
            patch.setattr(store, name[1:], sync_wrapper(wrapped, obj=store))
        yield calls


def fs() -> fsspec.AbstractFileSystem:
    """The client instance ckpt-tools resolves `s3://` paths to (fsspec caches one per options)."""
    return storage.resolve("s3://any")[0]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Local step directories to upload: step 2, the new step 4 ("new") and a previous step 4 ("old")."""
    root = tmp_path_factory.mktemp("s3-commit")
    write_step_dir(root / "base", step=2, state=tiny_model_state(2))
    write_step_dir(root / "new", step=4, state=tiny_model_state(4))
    write_step_dir(root / "old", step=4, state=tiny_model_state(40))
    return root


def lay_out(template, url: str, *, replace: bool) -> str:
    """A run's checkpoints/ on the store: 000002 complete, `last` on it (on 000004 when `replace`, with
    an older 000004 present), and the new step 4 fully written under `.tmp-000004`."""
    root = f"{url}/checkpoints"
    store = fs()
    store.put(str(template / "base" / "000002"), f"{root}/000002", recursive=True)
    store.put(str(template / "new" / "000004"), f"{root}/.tmp-000004", recursive=True)
    if replace:
        store.put(str(template / "old" / "000004"), f"{root}/000004", recursive=True)
    commit.point_last(root, "000004" if replace else "000002")
    return root


def run_commit(root: str) -> str:
    return commit.commit_step_dir(
        f"{root}/.tmp-000004", root, 4, is_complete=lambda step: verify_checkpoint(step).ok
    )


def assert_consistent(root: str) -> None:
    """What any reader may rely on after a crash: `last` (if any) names a complete step, and every
    step directory that holds `training_step.json` is complete."""
    last = commit.latest_step_dir(root)
    if last is not None:
        report = verify_checkpoint(last)
        assert report.ok, (last, report.problems)
    for name in storage.list_names(root):
        marker = f"{root}/{name}/{layout.TRAINING_STATE_DIR}/{layout.TRAINING_STEP}"
        if layout.is_step_dir_name(name) and fs().exists(marker.removeprefix("s3://")):
            report = verify_checkpoint(f"{root}/{name}")
            assert report.ok, (name, report.problems)


def model_of(step_dir: str) -> bytes:
    return fs().cat(f"{step_dir}/pretrained_model/{layout.MODEL_SAFETENSORS}".removeprefix("s3://"))


@pytest.mark.slow  # ~15 store round trips and up to 3 verifies per crash point
@pytest.mark.parametrize("replace", [False, True], ids=["new-step", "replace-step"])
def test_crash_at_each_point_of_a_commit_leaves_a_resumable_run(s3_bucket, template, monkeypatch, replace):
    root = lay_out(template, f"{s3_bucket}/dry", replace=replace)
    with store_operations(monkeypatch) as calls:
        run_commit(root)
    expected = (template / "new" / "000004" / "pretrained_model" / layout.MODEL_SAFETENSORS).read_bytes()
    kinds = [(name, path.endswith(layout.TRAINING_STEP), path.endswith(layout.LAST)) for name, path in calls]
    # Each distinct point: the first call of every run of the same kind of operation, and one inside it.
    points = sorted({i for i, kind in enumerate(kinds) if i == 0 or kind != kinds[i - 1]} | {len(calls) // 2})
    assert len(calls) >= 8 and len(points) >= 5, calls

    for point in points:
        root = lay_out(template, f"{s3_bucket}/crash{point}", replace=replace)
        with store_operations(monkeypatch, crash_at=point), pytest.raises(Crash):
            run_commit(root)
        assert_consistent(root)
        # The resumed run saves step 4 again: begin (clears the leftover .tmp), write, commit.
        tmp = commit.begin_step_dir(root, 4)
        fs().put(str(template / "new" / "000004"), tmp, recursive=True)
        final = run_commit(root)
        assert commit.latest_step_dir(root) == final and verify_checkpoint(final).ok
        assert model_of(final) == expected, point
        assert [n for n in storage.list_names(root) if n.startswith(layout.TMP_PREFIX)] == [], point
        assert fs().cat(f"{root}/{layout.LAST}".removeprefix("s3://")) == b"000004\n"


def test_safetensors_to_dcp_on_the_bucket(s3_bucket, template):
    """`ckpt convert --to dcp` of a model in a bucket: the file is streamed to a local temporary copy
    (memory stays bounded), and the DCP directory, written under a temporary name, is moved into place
    object by object (the store has no directory rename)."""
    from ckpt_tools.tensors.tensor_io import read_dcp_full, read_safetensors
    from ckpt_tools.tools.convert import convert_safetensors_to_dcp

    model_dir = f"{s3_bucket}/model"
    source = template / "new" / "000004" / "pretrained_model" / layout.MODEL_SAFETENSORS
    fs().put_file(str(source), f"{model_dir}/{layout.MODEL_SAFETENSORS}".removeprefix("s3://"))
    result = convert_safetensors_to_dcp(model_dir)
    assert result.files == (f"{model_dir}/{layout.MODEL_DCP_DIR}",)
    assert storage.list_names(model_dir) == [layout.MODEL_SAFETENSORS, layout.MODEL_DCP_DIR]
    got = read_dcp_full(result.files[0])
    want = read_safetensors(str(source))[0]
    assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)


def test_verify_on_a_bucket_answers_from_one_listing(s3_bucket, template, monkeypatch):
    """Verifying a step asks whether some twenty files exist and how large they are; on a bucket
    `storage.listed` answers from one listing of the step taken at the start. For this step that is 9
    metadata requests instead of 81 (every exists or size a HEAD or LIST of its own), and a missing
    file is still found missing."""
    import s3fs

    root = lay_out(template, f"{s3_bucket}/count", replace=False)
    calls: Counter[str] = Counter()
    original = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *args, **kwargs):
        calls[method] += 1
        return await original(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    assert verify_checkpoint(f"{root}/000002").ok
    assert calls["head_object"] + calls["list_objects_v2"] <= 12, calls

    rng = f"{root}/000002/{layout.TRAINING_STATE_DIR}/{layout.RNG_STATE}"
    fs().rm_file(rng.removeprefix("s3://"))
    report = verify_checkpoint(f"{root}/000002")
    assert not report.ok and any(layout.RNG_STATE in problem for problem in report.problems), report
