"""The time budget of a one-shot run on an accelerator machine (engine/training/device.py,
bench/device.py): seconds left since the run began. Torch-free, so that bench/device.py
can import it before it has set torch up."""

from __future__ import annotations

import time


class Budget:
    """Seconds left of the run's budget; a part asks `allows` with its estimate before it starts."""

    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def allows(self, estimate: float) -> bool:
        return self.left() >= estimate
