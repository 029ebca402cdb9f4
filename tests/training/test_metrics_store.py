"""metrics.jsonl on a bucket (moto's S3 server): the object is rewritten a bounded number of times, not at
every record, and a resumed run still continues it; on local disk every record is on disk at once."""

from __future__ import annotations

import json

import fsspec
import pytest

from trainer.reporting import metrics
from trainer.reporting.metrics import METRICS_FILE, MetricsLogger


def train_steps(text: str) -> list[int]:
    return [r["step"] for r in map(json.loads, text.splitlines()) if r.get("event") == "train"]


@pytest.fixture
def metrics_writes(monkeypatch) -> list[str]:
    """The whole-object writes of metrics.jsonl (storage.write_bytes), in order."""
    writes: list[str] = []
    write = metrics.storage.write_bytes

    def counted(path: str, data: bytes) -> None:
        if path.endswith(METRICS_FILE):
            writes.append(path)
        write(path, data)

    monkeypatch.setattr(metrics.storage, "write_bytes", counted)
    return writes


def test_metrics_on_a_bucket_are_written_in_batches_and_continued_by_a_resume(
    s3_bucket, metrics_writes, monkeypatch
):
    store = fsspec.filesystem("s3", use_listings_cache=False)
    out = f"{s3_bucket}/run"
    logger = MetricsLogger(out, total_steps=300, start_step=0)
    for step in range(1, 101):
        logger.log({"step": step, "loss": 1.0 / step})
    assert metrics_writes == []  # 100 records inside one interval: nothing rewritten yet
    logger.note(f"checkpoint {out}/checkpoints/000100")  # the loop's line after each save
    assert len(metrics_writes) == 1
    assert train_steps(store.cat(f"{out}/{METRICS_FILE}").decode()) == list(range(1, 101))

    monkeypatch.setattr(metrics, "STORE_FLUSH_S", 0.0)  # the interval has passed at every record
    logger.log({"step": 101, "loss": 0.01})
    assert len(metrics_writes) == 2
    assert train_steps(store.cat(f"{out}/{METRICS_FILE}").decode())[-1] == 101
    monkeypatch.setattr(metrics, "STORE_FLUSH_S", 3600.0)
    logger.log({"step": 102, "loss": 0.01})  # logged after the last write; close writes it
    logger.close()
    assert train_steps(store.cat(f"{out}/{METRICS_FILE}").decode()) == list(range(1, 103))

    resumed = MetricsLogger(out, total_steps=300, start_step=102)  # the next segment of the run
    resumed.note("resumed from step 102", event="resume", step=102)
    for step in range(103, 201):
        resumed.log({"step": step, "loss": 0.01})
    assert resumed.first_loss(float("nan")) == 1.0  # read back from the bucket: the whole run's first
    resumed.close()
    text = store.cat(f"{out}/{METRICS_FILE}").decode()
    assert train_steps(text) == list(range(1, 201))
    assert len(metrics_writes) <= 6  # 200 records, a handful of writes (one per record before)


def test_metrics_on_local_disk_are_appended_at_every_record(tmp_path):
    logger = MetricsLogger(str(tmp_path), total_steps=2, start_step=0)
    logger.log({"step": 1, "loss": 0.5})
    assert train_steps((tmp_path / METRICS_FILE).read_text()) == [1]  # on disk before any flush/close
    logger.log({"step": 2, "loss": 0.25})
    assert train_steps((tmp_path / METRICS_FILE).read_text()) == [1, 2]
    logger.close()


def test_a_full_disk_under_metrics_jsonl_stops_the_run_in_one_line_after_a_save(
    tmp_path, dataset_cache, clean_accelerate, monkeypatch, capsys
) -> None:
    """ENOSPC while appending to metrics.jsonl (simulated): one warning, training goes on to its next
    checkpoint, which is saved and verifies, then one `error:` line naming the file and the resume."""
    import builtins
    import errno

    import ckpt_tools
    from helpers.train_flags import tiny_args
    from trainer.cli import main
    from trainer.reporting import metrics

    real_open, appends = builtins.open, []

    def full_disk(file, mode="r", *args, **kwargs):
        if str(file).endswith("metrics.jsonl") and "a" in mode:
            appends.append(file)
            if len(appends) > 2:  # the banner and the first note get in, then the disk is full
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(metrics, "open", full_disk, raising=False)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        main(["train", *tiny_args(str(out), dataset_cache, "--policy.type=mlp", "--steps=6", "--log_freq=1")])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("warning: writing ") == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: writing {out}/metrics.jsonl failed (No space left on device): ")
    assert f"the run stopped after saving {out}/checkpoints/000002" in last and "--resume=true" in last
    assert ckpt_tools.verify_checkpoint(str(out / "checkpoints" / "000002")).ok
    assert not (out / "checkpoints" / "000004").exists()
