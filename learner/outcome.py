"""How a learner process tells its supervisor it stopped the run on purpose, over a failure a
restart cannot fix (a reward that keeps failing): this exit code, and a last log line that
starts with ``FATAL_MARK``. Imports nothing, so the launcher reads it without torch."""

FATAL_EXIT = 3
FATAL_MARK = "run stopped:"
