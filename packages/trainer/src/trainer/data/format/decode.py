"""Camera frames out of a LeRobotDataset's files: video frames by timestamp, images from parquet bytes.

A video frame is chosen as LeRobot's `pyav` backend chooses it, so a policy trained here sees the pixels
it would see under `lerobot-train`: seek to the keyframe at or before the timestamp, decode forward,
convert with PyAV's `to_ndarray(format="rgb24")` and keep the decoded frame nearest the timestamp; one
farther than `tolerance` (just under one frame period) is an error. A file is never decoded from its
start per sample: the seek costs at most one group of pictures.

Open containers are kept in a small per-process LRU (`VideoReader`). It is opened lazily by the process
that decodes (a DataLoader worker), and a reader copied into another process (fork, or pickled for a
spawned worker) starts empty: a demuxer's file position shared across processes would corrupt both.
The containers a forked child inherits are kept referenced and never closed there: closing one joins
decoder threads that exist only in the parent, which hangs the child. Decoders run single-threaded
(the parallelism is the DataLoader's worker processes), so a fork never copies a decoder mid-frame.
A streamed video is opened as a `remote.RemoteFile`: PyAV reads only the ranges it seeks to.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from trainer.data.format.files import DatasetPath, source
from trainer.data.format.remote import StreamError
from trainer.errors import ConfigError

VIDEO_BACKENDS = ("pyav", "torchcodec")
OPEN_FILES = 8  # containers kept open per process: one per camera file a batch usually touches
_INHERITED: list[Any] = []  # a forked child's copies of its parent's containers: never closed here


class DecodeError(ConfigError):
    """A camera file cannot give the frame a sample needs (missing, damaged, too short, wrong size)."""


def tolerance(fps: float, tolerance_s: float | None = None) -> float:
    """How far the nearest decoded frame may lie from the timestamp asked for: LeRobot's `tolerance_s`
    when given (--tolerance_s, LeRobot's default 1e-4 s), else just under one frame period."""
    return 1.0 / fps - 1e-4 if tolerance_s is None else tolerance_s


class VideoReader:
    """Frames of video files by timestamp, through `backend`, with a bounded LRU of open files."""

    def __init__(self, backend: str = "pyav", capacity: int = OPEN_FILES) -> None:
        """`backend` is one of VIDEO_BACKENDS (LeRobotConfig checks the flag)."""
        self.backend = backend
        self.capacity = capacity
        self._open: OrderedDict[DatasetPath, Any] = OrderedDict()
        self._pid = os.getpid()
        if backend == "torchcodec":
            _import_torchcodec()

    def __del__(self) -> None:
        if self._pid == os.getpid() and self.backend == "pyav":
            for container in self._open.values():
                container.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"backend": self.backend, "capacity": self.capacity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.backend, self.capacity = state["backend"], state["capacity"]
        self._open, self._pid = OrderedDict(), os.getpid()

    def frame(self, path: DatasetPath, timestamp: float, tol: float, where: str) -> np.ndarray:
        """The (H, W, 3) uint8 frame of `path` nearest `timestamp` (seconds from the file's start).
        `where` (the sample's episode and index) goes into the error line."""
        try:
            if self.backend == "torchcodec":
                found, image = self._torchcodec_frame(path, timestamp)
            else:
                found, image = self._pyav_frame(path, timestamp)
        except (DecodeError, StreamError):
            raise
        except Exception as exc:  # PyAV/FFmpeg errors of a damaged file: one line, the file named
            self._forget(path)
            raise DecodeError(
                f"{path}: cannot decode the frame at {timestamp:.4f} s for {where} "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); re-download or re-encode the video"
            ) from None
        if found is None or abs(found - timestamp) >= tol:
            nearest = "no frame" if found is None else f"the nearest frame is at {found:.4f} s"
            raise DecodeError(
                f"{path}: no frame within {tol:.4f} s of {timestamp:.4f} s for {where} ({nearest}); the video "
                "is shorter than its episodes metadata says: re-encode it or fix meta/episodes"
            )
        return image

    def _forget(self, path: DatasetPath) -> None:
        """Drop a container left in an unknown state by a failed decode (reopened on the next use)."""
        handle = self._open.pop(path, None)
        if handle is not None and self.backend == "pyav":
            with contextlib.suppress(Exception):
                handle.close()

    def _container(self, path: DatasetPath) -> Any:
        if self._pid != os.getpid():  # copied into a forked child: never touch the parent's files
            _INHERITED.append(self._open)
            self._open, self._pid = OrderedDict(), os.getpid()
        if path in self._open:
            self._open.move_to_end(path)
            return self._open[path]
        handle = self._open_file(path)
        self._open[path] = handle
        while len(self._open) > self.capacity:
            _, oldest = self._open.popitem(last=False)
            if self.backend == "pyav":
                oldest.close()
        return handle

    def _open_file(self, path: DatasetPath) -> Any:
        if not path.is_file():
            raise DecodeError(f"{path}: the video file is missing; re-download the dataset")
        if self.backend == "torchcodec":
            from torchcodec.decoders import VideoDecoder

            return VideoDecoder(source(path))
        return open_video(path)

    def _pyav_frame(self, path: DatasetPath, timestamp: float) -> tuple[float | None, np.ndarray]:
        container = self._container(path)
        stream = container.streams.video[0]
        container.seek(max(0, math.floor(timestamp / stream.time_base)), stream=stream, backward=True)
        best_time, best = None, None
        for frame in container.decode(stream):
            if frame.time is None:
                continue
            if best_time is None or abs(frame.time - timestamp) < abs(best_time - timestamp):
                best_time, best = frame.time, frame
            if frame.time >= timestamp:
                break
        if best is None:
            return None, np.zeros(0, dtype=np.uint8)
        return best_time, best.to_ndarray(format="rgb24")

    def _torchcodec_frame(self, path: DatasetPath, timestamp: float) -> tuple[float | None, np.ndarray]:
        decoder = self._container(path)
        batch = decoder.get_frames_played_at(seconds=[timestamp])
        return float(batch.pts_seconds[0]), batch.data[0].permute(1, 2, 0).numpy()


def open_video(path: DatasetPath) -> Any:
    """A PyAV container of `path` with one video stream; anything else is a DecodeError naming it."""
    import av

    try:
        container = av.open(source(path))
    except StreamError:
        raise
    except (av.FFmpegError, OSError) as exc:
        raise DecodeError(
            f"{path}: not a readable video ({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); "
            "re-download or re-encode it"
        ) from None
    if not container.streams.video:
        container.close()
        raise DecodeError(f"{path}: holds no video stream; re-encode the camera's video")
    container.streams.video[0].thread_count = 1
    return container


def video_duration(container: Any) -> float:
    """Seconds the container's video stream covers (its duration, else the container's)."""
    stream = container.streams.video[0]
    if stream.duration is not None:
        return float(stream.duration * stream.time_base)
    return float(container.duration or 0) / 1e6


def decode_image(data: bytes | None, where: str, size: tuple[int, int], reading: str) -> np.ndarray:
    """An (H, W, 3) uint8 array of PNG/JPEG bytes from an `image` column, whose header must declare
    `size` (height, width, info.json's, read as `reading` says): the header is read and checked before
    a pixel is decoded, so a few KB declaring 40000x40000 (a decompression bomb) allocate nothing. Bad
    bytes: one DecodeError."""
    with _opened_image(data, where, size, reading) as image:
        try:
            return np.array(image.convert("RGB"))  # writable: torch.from_numpy shares it
        except (OSError, ValueError, SyntaxError) as exc:  # truncated or damaged pixel data
            raise DecodeError(_undecodable(where, exc)) from None


def check_image_header(data: bytes | None, where: str, size: tuple[int, int], reading: str) -> None:
    """The cheap half of `decode_image`, for the checks at open: the header parses and declares `size`."""
    with _opened_image(data, where, size, reading):
        pass


@contextlib.contextmanager
def _opened_image(data: bytes | None, where: str, size: tuple[int, int], reading: str) -> Iterator[Any]:
    """The PIL image of `data`, its header read and its size checked, its pixels not yet decoded."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise DecodeError(
            f"{where}: the image column holds no bytes; re-write the dataset with embedded images"
        )
    try:
        with warnings.catch_warnings():  # the size is checked below, against info.json's
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise DecodeError(
            f"{where}: {str(exc).rstrip('.')}; the image is not the camera's, re-write the dataset"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DecodeError(_undecodable(where, exc)) from None
    with image:
        width, height = image.size
        if (height, width) != size:
            raise DecodeError(
                f"{where}: the image declares {height}x{width} pixels, meta/info.json says {size[0]}x{size[1]}, "
                f"{reading}; nothing was decoded: re-write the dataset or fix meta/info.json's shape or names"
            )
        yield image


def _undecodable(where: str, exc: Exception) -> str:
    return (
        f"{where}: the image bytes do not decode ({' '.join(str(exc).split())[:120]}); re-write the dataset"
    )


def _import_torchcodec() -> None:
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception:  # not installed, or its FFmpeg libraries do not load
        raise ConfigError(
            "--dataset.video_backend=torchcodec needs torchcodec: pip install 'ckpt-trainer[torchcodec]', "
            "or use --dataset.video_backend=pyav"
        ) from None
