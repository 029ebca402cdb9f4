"""Episode videos as lerobot-eval writes them: H.264 in mp4 (PyAV), yuv420p, at the environment's fps."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import numpy as np

from ckpt_tools import layout, storage


def write_video(path: str, frames: Sequence[np.ndarray], fps: int) -> None:
    """Encode RGB uint8 frames (H, W, 3) into an mp4 at `path` (a local path or a URL: written locally
    first, then copied there whole). An odd height or width loses its last row or column, as yuv420p
    needs even sizes."""
    local = storage.local_path(path)
    if local is not None:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        _encode(local, frames, fps)
        return
    with tempfile.TemporaryDirectory(prefix="trainer-video-") as tmp:
        file = os.path.join(tmp, layout.name(path))
        _encode(file, frames, fps)
        with open(file, "rb") as handle:
            storage.write_bytes(path, handle.read())


def _encode(path: str, frames: Sequence[np.ndarray], fps: int) -> None:
    import av

    height, width = (frames[0].shape[0] // 2) * 2, (frames[0].shape[1] // 2) * 2
    with av.open(path, mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            picture = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(frame[:height, :width, :3]), format="rgb24"
            )
            container.mux(stream.encode(picture))
        container.mux(stream.encode())
