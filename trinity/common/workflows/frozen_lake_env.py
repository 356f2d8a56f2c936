"""The FrozenLake grid world of ``frozen_lake_workflow``: maps, moves, text and answers.

A lake is a grid of tiles written as strings, one a row: ``S`` the start, ``F`` frozen,
``H`` a hole, ``G`` the goal. The player walks from ``S`` and wins on ``G``; a hole ends the
walk lost. Moves are gymnasium's ``FrozenLakeEnv`` (``is_slippery``: a move goes the way
asked or to either side of it, 1/3 each, drawn from the walk's seed).

gymnasium is an optional dependency (the ``envs`` extra): it is imported only when a map is
drawn or a lake is built, and the checks before start refuse a taskset naming the workflow
where it is not installed (``Workflow.needs_packages``).

The contract with the model is the original Trinity-RFT's: the grid is shown one tile a cell
(``P`` the player, ``_`` frozen, ``O`` a hole, ``G`` the goal) and the model answers with a
direction word or its number (1 left, 2 down, 3 right, 4 up) in its last ```` ``` ```` block.
"""

from __future__ import annotations

import re
import threading
from typing import Any, List, Optional, Sequence, Tuple

# The extra that installs gymnasium, for the messages that ask for it.
INSTALL = 'pip install -e ".[envs]" (or: pip install gymnasium)'

# The answers the model may give: each direction's word and number (gymnasium's action is the
# number less one: 0 left, 1 down, 2 right, 3 up).
ACTIONS = {"left": 1, "down": 2, "right": 3, "up": 4}
TILES = "SFHG"

# How each tile is shown, and the player on it (a player in a hole or on the goal is only
# ever rendered after the last turn: the walk is over then).
_SHOWN = {"S": "_", "F": "_", "H": "O", "G": "G"}
_PLAYER_ON = {"S": "P", "F": "P", "H": "X", "G": "√"}
# Non-greedy, across lines: fences pair up in order, and the last pair holds the answer.
_FENCED = re.compile(r"```(.*?)```", re.DOTALL)
_STEPS = ((1, 0), (0, 1), (-1, 0), (0, -1))  # down, right, up, left: the search's order

Cell = Tuple[int, int]  # (row, column)

# Runner threads build lakes at once, and two threads importing gymnasium together fail: its
# package imports submodules that import the package, so each thread can meet the other's
# half-imported modules (and what failed stays half-imported). One import at a time.
_IMPORT_LOCK = threading.Lock()


def _gymnasium() -> Tuple[Any, Any]:
    """(``gymnasium.utils.seeding``, ``FrozenLakeEnv``), imported on first use: gymnasium is
    an optional dependency. Raises ``ImportError`` with the install command without it."""
    with _IMPORT_LOCK:
        try:
            from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
            from gymnasium.utils import seeding
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != "gymnasium":
                raise
            raise ImportError(
                f"frozen_lake_workflow needs the gymnasium package: {INSTALL}"
            ) from None
    return seeding, FrozenLakeEnv


def find_tile(desc: Sequence[str], tile: str) -> Optional[Cell]:
    """The first cell of ``desc`` holding ``tile``, row by row, or None."""
    for row, line in enumerate(desc):
        col = line.find(tile)
        if col >= 0:
            return row, col
    return None


def goal_within(desc: Sequence[str], max_steps: int) -> bool:
    """Whether a depth-first walk from ``S`` around the holes meets ``G`` within
    ``max_steps + 1`` moves.

    Each cell is entered once, from the first path that reaches it, so a goal that only a
    path shorter than the first one found reaches in time can be missed. That is the
    acceptance rule of the original's map generator, kept as it is: the same seed must give
    the same map.
    """
    start = find_tile(desc, "S")
    if start is None:
        return False
    size_r, size_c = len(desc), len(desc[0])
    stack, seen = [(start, 0)], set()
    while stack:
        (row, col), steps = stack.pop()
        if steps > max_steps or (row, col) in seen:
            continue
        seen.add((row, col))
        for d_row, d_col in _STEPS:
            r, c = row + d_row, col + d_col
            if not (0 <= r < size_r and 0 <= c < size_c):
                continue
            if desc[r][c] == "G":
                return True
            if desc[r][c] != "H":
                stack.append(((r, c), steps + 1))
    return False


def generate_map(size: int, p: float, seed: int, max_steps: int) -> List[str]:
    """A ``size`` x ``size`` lake drawn from ``seed``: each tile frozen with probability ``p``
    (a hole otherwise), then a start and a distinct goal; drawn again until the goal is
    within reach (``goal_within(max_steps)``). The same arguments give the same map, the
    original's for the same seed (gymnasium's seeded generator, drawn in the same order)."""
    if size < 2:
        raise ValueError(f"a lake needs a size of at least 2 (start and goal apart), got {size}")
    seeding, _ = _gymnasium()
    rng, _ = seeding.np_random(seed)
    frozen = min(1.0, p)
    while True:
        grid = rng.choice(["F", "H"], (size, size), p=[frozen, 1 - frozen]).tolist()
        start, goal = _start_and_goal(rng, size)
        grid[start[0]][start[1]] = "S"
        grid[goal[0]][goal[1]] = "G"
        desc = ["".join(row) for row in grid]
        if goal_within(desc, max_steps):
            return desc


def _start_and_goal(rng: Any, size: int) -> Tuple[Cell, Cell]:
    """Two distinct cells, drawn as the original draws them (row, column; row, column)."""
    while True:
        start = int(rng.integers(0, size)), int(rng.integers(0, size))
        goal = int(rng.integers(0, size)), int(rng.integers(0, size))
        if start != goal:
            return start, goal


def check_desc(desc: Sequence[str]) -> List[str]:
    """``desc`` itself, if it is a lake: rows of equal length, tiles of ``SFHG``, one start,
    a goal. Raises ``ValueError`` saying what is wrong."""
    rows = list(desc)
    if not rows or not rows[0]:
        raise ValueError("a lake needs at least one row of tiles")
    if any(len(row) != len(rows[0]) for row in rows):
        raise ValueError(f"every row of a lake has the same length, got {rows}")
    strange = sorted({tile for row in rows for tile in row} - set(TILES))
    if strange:
        raise ValueError(f"tiles are S, F, H and G; got {', '.join(map(repr, strange))}")
    if sum(row.count("S") for row in rows) != 1 or find_tile(rows, "G") is None:
        raise ValueError(f"a lake has one start S and a goal G, got {rows}")
    return rows


def render(desc: Sequence[str], player: Cell) -> str:
    """The grid as the model sees it: one `` x \\t`` cell a tile, rows on their own lines."""
    lines = []
    for row, tiles in enumerate(desc):
        cells = [
            (_PLAYER_ON if (row, col) == player else _SHOWN)[tile] for col, tile in enumerate(tiles)
        ]
        lines.append("".join(f" {cell} \t" for cell in cells))
    return "\n".join(lines)


def parse_action(reply: str) -> Optional[int]:
    """The move the reply's last fenced block names (1 left, 2 down, 3 right, 4 up), by word
    in any case or by number; None when there is no block or it names no move."""
    blocks = _FENCED.findall(reply)
    if not blocks:
        return None
    answer = blocks[-1].strip().lower()
    if answer in ACTIONS:
        return ACTIONS[answer]
    if answer.isdigit() and int(answer) in ACTIONS.values():
        return int(answer)
    return None


class FrozenLake:
    """One walk on a lake: ``render()`` the grid, ``step(action)`` per answer.

    Built on gymnasium's ``FrozenLakeEnv`` and reset with ``seed``, so a slippery lake slides
    the same way for the same answers.
    """

    def __init__(self, desc: Sequence[str], is_slippery: bool, seed: int) -> None:
        _, frozen_lake_env = _gymnasium()
        self.desc = check_desc(desc)
        self.env = frozen_lake_env(desc=self.desc, is_slippery=is_slippery)
        self.env.reset(seed=seed)

    @property
    def player(self) -> Cell:
        return divmod(int(self.env.s), self.env.ncol)

    def render(self) -> str:
        return render(self.desc, self.player)

    def step(self, action: Optional[int]) -> Tuple[float, bool]:
        """Move by ``action`` (1-4): (reward, whether the walk is over). The reward is 1 on
        the goal, else 0; the walk ends on the goal or in a hole. An answer that names no
        move (None) leaves the player where it is, and the walk goes on."""
        if action is None:
            return 0.0, False
        _, reward, terminated, _, _ = self.env.step(action - 1)
        return float(reward), bool(terminated)
