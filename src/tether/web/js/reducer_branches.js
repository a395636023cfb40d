// The transcript as a tree of branches (docs/api.md §10), folded like the server's
// `tether/projections/branches.py` (BranchTree), whose comments explain the rules: a row
// follows the visible tail when appended; `transcript.truncated` hides the rows from a
// position on (kept, as a branch); `branch.switched` shows a row at its fork, and below it
// what was shown there last time. A row whose fork has several branches carries
// `branch: {index, count}`, written when it is shown (appended or switched to) and for a
// hidden one when the snapshot copies it: never every sibling on each append, which made a
// wide fork quadratic. Pure: no DOM, no import. `null` is the root (JSON's parent of
// the first row); Map keys keep insertion order exactly like Python dicts.

export function createTree(visible) {
  return {
    visible, // the caller's `state.messages`: mutated in place, never replaced
    rows: new Map(), // every row of every branch, in the order made
    parentOf: new Map(),
    children: new Map(),
    shown: new Map(),
    index: new Map(), // each row's place among its siblings, 1-based
  };
}

/** Show `row` after the visible tail (whose other children are all hidden). */
export function append(tree, row) {
  const id = row.id;
  if (tree.rows.has(id)) return; // an id already in the tree (never written by Tether)
  const parent = tree.visible.length ? tree.visible.at(-1).id : null;
  tree.rows.set(id, row);
  tree.parentOf.set(id, parent);
  if (!tree.children.has(parent)) tree.children.set(parent, []);
  const siblings = tree.children.get(parent);
  siblings.push(id);
  tree.index.set(id, siblings.length);
  tree.shown.set(parent, id);
  tree.visible.push(label(tree, row));
}

/** Write `row`'s `branch` as its fork is now (no label while it has one child). */
function label(tree, row) {
  const count = tree.children.get(tree.parentOf.get(row.id)).length;
  if (count > 1) row.branch = { index: tree.index.get(row.id), count };
  return row;
}

/** Hide the visible rows from position `keep` on; returns them. */
export function cut(tree, keep) {
  const n = tree.visible.length;
  keep = keep < 0 ? Math.max(0, n + keep) : keep;
  if (!(keep < n)) return [];
  tree.shown.set(keep ? tree.visible[keep - 1].id : null, null);
  return tree.visible.splice(keep);
}

/** Where the children of `parent` start in the visible path (null: not visible). */
function position(tree, parent) {
  if (parent === null) return 0;
  const index = tree.visible.findIndex((row) => row.id === parent);
  return index < 0 ? null : index + 1;
}

/** Show `rowId` at its fork: [rows hidden, rows shown]. */
export function show(tree, rowId) {
  if (typeof rowId !== "string" || !tree.rows.has(rowId)) return [[], []];
  const parent = tree.parentOf.get(rowId);
  tree.shown.set(parent, rowId);
  const start = position(tree, parent);
  if (start === null) return [[], []];
  const removed = tree.visible.splice(start);
  let node = rowId;
  while (node !== null && node !== undefined) {
    tree.visible.push(label(tree, tree.rows.get(node)));
    node = tree.shown.get(node);
  }
  return [removed, tree.visible.slice(start)];
}

/** The `POST /api/session/branch` bodies (`{row_id, index}`) that show `rowId`, forks from
 *  the root down: each names the row its fork shows now, which the switches before it leave
 *  visible. [] when the row is shown; null when it is unknown or a fork on its way shows
 *  nothing (an undo's end: no row there to name). */
export function switchesToShow(tree, rowId) {
  if (!tree.rows.has(rowId)) return null;
  const path = [];
  for (let node = rowId; node !== null && node !== undefined; node = tree.parentOf.get(node)) {
    path.unshift(node);
  }
  const switches = [];
  for (const node of path) {
    const parent = tree.parentOf.get(node);
    const showing = tree.shown.get(parent) ?? null;
    if (showing === node) continue;
    if (showing === null) return null;
    switches.push({ row_id: showing, index: tree.children.get(parent).indexOf(node) + 1 });
  }
  return switches;
}

/** `GET /api/session`'s `branches` (null while no row is hidden), rows copied by `copy`. */
export function snapshot(tree, copy) {
  if (tree.rows.size === tree.visible.length) return null;
  const shownIds = new Set(tree.visible.map((row) => row.id));
  return {
    order: [...tree.parentOf].map(([id, parent]) => [id, parent]),
    shown: [...tree.shown].map(([parent, child]) => [parent, child]),
    hidden: [...tree.rows.values()]
      .filter((row) => !shownIds.has(row.id))
      .map((row) => label(tree, copy(row))),
  };
}

/** Rebuild the tree after a snapshot: `visible` (already hydrated) and its `branches`,
 *  whose hidden rows `hydrate` copies. */
export function restore(visible, branches, hydrate) {
  const tree = createTree(visible);
  const byId = new Map(visible.map((row) => [row.id, row]));
  if (!branches) {
    let parent = null;
    for (const row of visible) {
      tree.rows.set(row.id, row);
      tree.parentOf.set(row.id, parent);
      tree.children.set(parent, [row.id]);
      tree.index.set(row.id, 1);
      tree.shown.set(parent, row.id);
      parent = row.id;
    }
    return tree;
  }
  for (const row of branches.hidden ?? []) byId.set(row.id, hydrate(row));
  for (const [id, parent] of branches.order ?? []) {
    if (!byId.has(id)) continue;
    tree.rows.set(id, byId.get(id));
    tree.parentOf.set(id, parent);
    if (!tree.children.has(parent)) tree.children.set(parent, []);
    tree.index.set(id, tree.children.get(parent).push(id));
  }
  for (const [parent, child] of branches.shown ?? []) tree.shown.set(parent, child);
  return tree;
}
