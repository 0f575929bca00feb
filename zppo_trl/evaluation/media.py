"""Reading the suite's media: images in any form `datasets` hands them over, video frames, subtitles.

Every failure is a `MediaError` (a ValueError) whose message names the field or path, so the
runner can skip the item, count it and log why; an unreadable image is never sent as a blank.
Decoding is forced in full here (``Image.load``), because PIL opens lazily and a truncated file
would otherwise pass and fail later inside a request.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from PIL import Image

__all__ = ["DEFAULT_MAX_FRAMES", "MediaError", "load_image", "read_subtitles", "video_frames"]

DEFAULT_MAX_FRAMES = 32
"""Frames sampled per video unless the run says otherwise (see `video_frames`)."""


class MediaError(ValueError):
    """An image, video or subtitle file that is missing or cannot be decoded; the message names it."""


# ------------------------------------------------------------------ images


def _decoded(opened: Image.Image, where: str) -> Image.Image:
    """Force a full decode (PIL is lazy), so truncated data fails here, not in the request."""
    try:
        opened.load()
    except Exception as err:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, ...
        raise MediaError(f"{where}: image cannot be decoded ({err})") from None
    return opened


def _from_bytes(data: bytes, where: str) -> Image.Image:
    if not data:
        raise MediaError(f"{where}: image bytes are empty")
    try:
        opened = Image.open(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001
        raise MediaError(f"{where}: bytes are not a readable image ({err})") from None
    return _decoded(opened, where)


def _from_path(path: str | Path, where: str) -> Image.Image:
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"{where}: image file {str(path)!r} does not exist")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise MediaError(f"{where}: image file {str(path)!r} cannot be read ({err})") from None
    return _from_bytes(data, f"{where} ({path})")


_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,(.*)", re.DOTALL)


def load_image(value: Any, where: str) -> Image.Image:
    """One image as a fully decoded PIL image.

    Accepts a PIL image, a ``{"bytes", "path"}`` dict (as `datasets` stores an undecoded Image
    feature; bytes win when both are set), encoded bytes, a local file path, or a base64
    ``data:image/...`` URL (HLE stores its images that way). ``where`` names the row and field
    for the error message. Raises `MediaError` for anything else, for a missing file, and for
    data that does not decode in full (a truncated file included).
    """
    if isinstance(value, Image.Image):
        return _decoded(value, where)
    if isinstance(value, Mapping):
        data, path = value.get("bytes"), value.get("path")
        if data:
            return _from_bytes(bytes(data), where)
        if path:
            return _from_path(path, where)
        raise MediaError(f"{where}: image dict has neither 'bytes' nor 'path'")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _from_bytes(bytes(value), where)
    if isinstance(value, Path):
        return _from_path(value, where)
    if isinstance(value, str):
        if not value.strip():
            raise MediaError(f"{where}: image is an empty string")
        match = _DATA_URL.fullmatch(value.strip())
        if match:
            try:
                data = base64.b64decode(match.group(1), validate=False)
            except (binascii.Error, ValueError) as err:
                raise MediaError(f"{where}: image data URL is not valid base64 ({err})") from None
            return _from_bytes(data, where)
        if re.match(r"[a-z][a-z0-9+.-]*://", value, re.IGNORECASE):
            raise MediaError(f"{where}: image {value[:80]!r} is a remote URL; only local files are read")
        return _from_path(value, where)
    raise MediaError(f"{where}: {type(value).__name__} is not an image (PIL image, bytes, dict or path)")


# ------------------------------------------------------------------ video


def _open_video(path: Any):
    import av

    if path is None:
        raise MediaError("video path is None (the video file was not found)")
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"video file {str(path)!r} does not exist")
    try:
        container = av.open(str(path))
    except Exception as err:  # noqa: BLE001 - av raises its own FFmpegError family
        raise MediaError(f"video file {str(path)!r} cannot be opened ({err})") from None
    if not container.streams.video:
        container.close()
        raise MediaError(f"video file {str(path)!r} has no video stream")
    return container


def _frame_time(frame, time_base: Fraction) -> float | None:
    if frame.pts is None:
        return None
    return float(frame.pts * time_base)


def _decode_all(container, stream, path: Path) -> list:
    try:
        return list(container.decode(stream))
    except Exception as err:  # noqa: BLE001
        raise MediaError(f"video file {str(path)!r} cannot be decoded ({err})") from None


def _frame_at(container, stream, target: float, path: Path):
    """The frame shown at time ``target`` (seconds): the last one starting at or before it."""
    time_base = stream.time_base
    try:
        container.seek(max(0, int(target / time_base)), stream=stream, backward=True, any_frame=False)
        chosen = None
        for frame in container.decode(stream):
            start = _frame_time(frame, time_base)
            if start is not None and start > target + 1e-6 and chosen is not None:
                break
            chosen = frame
            if start is not None and start > target + 1e-6:
                break  # the seek landed after the target (no earlier keyframe): take the first frame
    except Exception as err:  # noqa: BLE001
        raise MediaError(f"video file {str(path)!r} cannot be decoded near {target:.3f}s ({err})") from None
    if chosen is None:
        raise MediaError(f"video file {str(path)!r} has no frame near {target:.3f}s")
    return chosen


def video_frames(path: Any, max_frames: int = DEFAULT_MAX_FRAMES) -> list[Image.Image]:
    """Up to ``max_frames`` RGB frames of a video, sampled uniformly over its duration, in time order.

    Frame policy (the paper states none; this is the package's choice): the video's duration is
    cut into ``max_frames`` equal segments and the frame on screen at each segment's centre is
    taken (the last frame whose timestamp is at or before the centre), so the samples cover the
    whole video, never bunch at its ends, and do not depend on the frame rate. A video with
    ``max_frames`` frames or fewer gives every frame. The default of 32 is the frame budget
    Qwen-VL-family models are commonly evaluated with on Video-MME/MVBench-length videos, and 32
    images at the suite's ``max_pixels`` stay well inside the 262,144-token context.

    Frames are found by seeking, so an hour-long video costs ``max_frames`` short decodes rather
    than a full pass. Raises `MediaError` for a missing, unreadable or frameless file.
    """
    if isinstance(max_frames, bool) or not isinstance(max_frames, int) or max_frames < 1:
        raise ValueError(f"max_frames must be a positive integer, got {max_frames!r}")
    container = _open_video(path)
    path = Path(path)
    try:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        time_base = stream.time_base
        start = float(stream.start_time * time_base) if stream.start_time is not None and time_base else 0.0
        duration = None
        if stream.duration and time_base:
            duration = float(stream.duration * time_base)
        elif container.duration:
            duration = container.duration / 1_000_000  # container.duration is in AV_TIME_BASE (microseconds)
        count = stream.frames or (
            round(duration * float(stream.average_rate)) if duration and stream.average_rate else 0
        )
        if not duration or not time_base or count <= max_frames:
            # Short (or duration-less) video: decode it once and sample by index.
            frames = _decode_all(container, stream, path)
            if not frames:
                raise MediaError(f"video file {str(path)!r} has no decodable frames")
            if len(frames) > max_frames:
                frames = [frames[int((i + 0.5) * len(frames) / max_frames)] for i in range(max_frames)]
        else:
            targets = [start + duration * (i + 0.5) / max_frames for i in range(max_frames)]
            frames = [_frame_at(container, stream, target, path) for target in targets]
        return [frame.to_image() for frame in frames]
    finally:
        container.close()


# ------------------------------------------------------------------ subtitles

_SRT_TIMESTAMP = re.compile(r"^\s*\d{1,2}:\d{2}:\d{2}[,.]\d{1,3}\s*-->\s*\d{1,2}:\d{2}:\d{2}[,.]\d{1,3}")


def read_subtitles(path: Any) -> str:
    """The text of an SRT subtitle file: its caption lines in order, one per line.

    Cue numbers and timestamp lines are dropped, as are blank lines; the caption text is kept
    verbatim (a leading BOM and Windows line ends are handled). Raises `MediaError` for a
    missing or unreadable file.
    """
    if path is None:
        raise MediaError("subtitle path is None (the subtitle file was not found)")
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"subtitle file {str(path)!r} does not exist")
    try:
        raw = path.read_bytes().decode("utf-8-sig", errors="replace")
    except OSError as err:
        raise MediaError(f"subtitle file {str(path)!r} cannot be read ({err})") from None
    lines = raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    text = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or _SRT_TIMESTAMP.match(stripped):
            continue
        # A cue number is a bare integer line directly followed by the cue's timestamp line.
        if stripped.isdigit() and i + 1 < len(lines) and _SRT_TIMESTAMP.match(lines[i + 1]):
            continue
        text.append(stripped)
    return "\n".join(text)
