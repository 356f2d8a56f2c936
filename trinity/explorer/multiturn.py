"""``merge_turns`` and ``EpisodeBreak`` under the path earlier versions documented.

They live with the workflows that use them, ``trinity.common.workflows.multiturn`` (a
built-in workflow merges its episodes, and ``common`` imports nothing above it); plugin code
that imports them from here keeps working.
"""

from trinity.common.workflows.multiturn import EpisodeBreak, merge_turns

__all__ = ["EpisodeBreak", "merge_turns"]
