"""The transcript as a tree of branches (docs/api.md §10), folded from the log.

Every row has a parent: the row shown before it when it was appended (none for the first).
A parent may have several children, its branches; `shown` names the one the transcript
follows from there, so the visible transcript is the path from the root along `shown`.

- Appending a row (a submitted turn, a settled run, an imported turn) makes it the newest
  child of the visible tail and shows it.
- `transcript.truncated{keep_count}` (the base of edit, regenerate, retry and undo) hides
  the rows from `keep_count` on: the tail's parent shows nothing, so the next row appended
  there starts a new branch beside them. Nothing is removed: the rows are kept and can be
  shown again (`branch.switched`).
- `branch.switched{row_id}` shows that row at its fork, and below it whatever was shown
  last time it was visible.

A row whose parent has several children carries `branch: {index, count}` (1-based, in the
order the branches were made): the page's "‹ 2/3 ›" switcher. A row is labelled when it is
shown (appended or switched to) and a hidden one when the snapshot copies it: a fork's count
grows only while its rows are hidden, so relabelling every sibling on each append (quadratic
in a fork's width, a hostile import's denial of service) is never needed. Pure: no I/O, no
clock.
"""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]


class BranchTree:
    """The rows of every branch, and `visible`: the path shown (a list the caller reads)."""

    def __init__(self, visible: list[Row]) -> None:
        self.visible = visible
        self.rows: dict[str, Row] = {}  # every row of every branch, in the order made
        self.parent_of: dict[str, str | None] = {}
        self.children: dict[str | None, list[str]] = {}
        self.shown: dict[str | None, str | None] = {}
        self.index: dict[str, int] = {}  # each row's place among its siblings, 1-based

    # -- folds ------------------------------------------------------------------------------
    def append(self, row: Row) -> None:
        """Show `row` after the visible tail (whose other children are all hidden)."""
        row_id = row["id"]
        if row_id in self.rows:  # an id already in the tree (never written by Tether)
            return
        parent = self.visible[-1]["id"] if self.visible else None
        self.rows[row_id] = row
        self.parent_of[row_id] = parent
        siblings = self.children.setdefault(parent, [])
        siblings.append(row_id)
        self.index[row_id] = len(siblings)
        self.shown[parent] = row_id
        self.visible.append(row)
        self._label(row)

    def cut(self, keep: int) -> list[Row]:
        """Hide the visible rows from position `keep` on; returns them."""
        keep = max(0, len(self.visible) + keep) if keep < 0 else keep
        if keep >= len(self.visible):
            return []
        self.shown[self.visible[keep - 1]["id"] if keep else None] = None
        removed = self.visible[keep:]
        del self.visible[keep:]
        return removed

    def show(self, row_id: str) -> tuple[list[Row], list[Row]]:
        """Show `row_id` at its fork: (rows hidden, rows shown). A row whose fork is not on
        the visible path changes only what that fork shows once it is."""
        if row_id not in self.rows:
            return [], []
        parent = self.parent_of[row_id]
        self.shown[parent] = row_id
        start = self.position(parent)
        if start is None:
            return [], []
        removed = self.visible[start:]
        del self.visible[start:]
        node: str | None = row_id
        while node is not None:
            self.visible.append(self._label(self.rows[node]))
            node = self.shown.get(node)
        return removed, self.visible[start:]

    def _label(self, row: Row) -> Row:
        """Write `row`'s `branch` as its fork is now (no label while it has one child)."""
        count = len(self.children[self.parent_of[row["id"]]])
        if count > 1:
            row["branch"] = {"index": self.index[row["id"]], "count": count}
        return row

    # -- reads ------------------------------------------------------------------------------
    def position(self, parent: str | None) -> int | None:
        """Where the children of `parent` start in the visible path (None: not visible)."""
        if parent is None:
            return 0
        for index, row in enumerate(self.visible):
            if row["id"] == parent:
                return index + 1
        return None

    def siblings(self, row_id: str) -> list[str]:
        if row_id not in self.rows:
            return []
        return list(self.children.get(self.parent_of[row_id], []))

    def path_if_shown(self, row_id: str) -> list[Row]:
        """The visible transcript as it would be with `row_id` shown at its fork."""
        start = self.position(self.parent_of[row_id]) or 0
        path = self.visible[:start]
        node: str | None = row_id
        while node is not None:
            path.append(self.rows[node])
            node = self.shown.get(node)
        return path

    def snapshot(self, copy: Any) -> dict[str, Any] | None:
        """What a reader needs to fold later events after a snapshot (`GET /api/session`'s
        `branches`): None while no row is hidden (the tree is the visible path), else every
        row's parent in the order made, what each fork shows, and the hidden rows."""
        if len(self.rows) == len(self.visible):
            return None
        shown_ids = {row["id"] for row in self.visible}
        return {
            "order": [[row_id, parent] for row_id, parent in self.parent_of.items()],
            "shown": [[parent, child] for parent, child in self.shown.items()],
            "hidden": [
                self._label(copy(row)) for key, row in self.rows.items() if key not in shown_ids
            ],
        }
