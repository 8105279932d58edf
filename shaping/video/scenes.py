"""Shot changes from FFmpeg's own scene detector (``scdet``), run through PyAV's filter graph.

``scdet`` scores each frame against the one before it (the mean absolute difference of their pixels, less
the previous frame's, 0..100) and sets ``lavfi.scd.score`` on the frame; no frame differencing is written
here. The graph is rebuilt when the decoded frames change size or pixel format mid-stream, and the first
frame after such a change scores 1: a new picture size is a new shot (spliced streams change size).
Scores are answered on a 0..1 scale (``scdet``'s divided by 100), as ``scene_threshold`` is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import av
    import av.filter


class SceneScores:
    """Feeds decoded frames to ``scdet`` and answers each one's scene score (0..1)."""

    def __init__(self) -> None:
        self._graph: av.filter.Graph | None = None
        self._shape: tuple[int, int, str] | None = None

    def _build(self, frame: av.VideoFrame) -> av.filter.Graph:
        import av.filter

        graph = av.filter.Graph()
        source = graph.add_buffer(
            width=frame.width, height=frame.height, format=frame.format, time_base=frame.time_base,
        )
        # scdet reads every pixel it is given: on full 1080p frames that costs about what the decode does,
        # so it scores a 160-pixel-wide copy (the score is a mean: it hardly moves at that scale; see
        # docs/engineering.md for the cuts and fades it was measured on).
        scale = graph.add("scale", "160:-2:flags=area")
        detector = graph.add("scdet", "threshold=100:sc_pass=0")
        sink = graph.add("buffersink")
        source.link_to(scale)
        scale.link_to(detector)
        detector.link_to(sink)
        graph.configure()
        return graph

    def score(self, frame: av.VideoFrame) -> float:
        """``frame``'s scene score against the frame fed before it (0 for the first, 1 at a size change)."""
        shape = (frame.width, frame.height, frame.format.name)
        changed = self._shape is not None and shape != self._shape
        if self._graph is None or changed:
            self._graph, self._shape = self._build(frame), shape
        self._graph.push(frame)
        scored = self._graph.pull()
        if changed:
            return 1.0
        try:
            return float(scored.metadata.get("lavfi.scd.score", "0")) / 100
        except ValueError:
            return 0.0
