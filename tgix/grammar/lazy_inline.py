"""Which `atomic` nodes a lazily built automaton inlines instead of calling.

json_common.atomic wraps every object (and any-value grammar) in a one-part intersection: a
minimisation hint for the eager build, and, for lazy_dfa, a call into the node's own
automaton, so that `x (, x)*` and counted repeats do not copy x into the NFA. A call costs
states, though: while the callee runs, the caller holds one state per callee state (its set
is {(entry, done, q)}), so an object nested d deep is counted d times, and a schema whose
one root object holds a hundred strings ran out of states at three levels of mirrors. A node
that the machine builds once (one path from the machine's root, no repeat copying it) gains
nothing from being called; it is built inline.
"""

from __future__ import annotations

from tgix.grammar import regex_tree as rt

MAX_COPIES = 2  # a repeat whose body would be copied more often builds it once and counts


def repeat_copies(lo: int, hi: int | None) -> int:
    """Copies of its body a repeat {lo,hi} puts in the NFA when built by copying."""
    return lo + (1 if hi is None else max(hi - lo, 0))


def inlined_atomics(root: rt.Node) -> set[int]:
    """ids of the one-part `Both` nodes under `root` that the root's NFA builds exactly once
    (counting copies the way lazy_dfa._CallingNfa makes them); the walk stops at what is
    built as a machine of its own (products, differences, called atomics)."""
    order: list[rt.Node] = []  # reverse post-order: parents before children
    seen: set[int] = set()
    stack: list[tuple[rt.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child, _ in _children(node))
    order.reverse()
    paths = {id(root): 1}
    inline: set[int] = set()
    for node in order:
        count = paths.get(id(node), 0)
        if _is_atomic(node):
            if count != 1:
                continue  # called: its body belongs to its own automaton
            inline.add(id(node))
        for child, copies in _children(node):
            paths[id(child)] = paths.get(id(child), 0) + count * copies
    return inline


def _is_atomic(node: rt.Node) -> bool:
    return isinstance(node, rt.Both) and len(node.parts) == 1


def _children(node: rt.Node) -> list[tuple[rt.Node, int]]:
    if isinstance(node, rt.Seq):
        return [(p, 1) for p in node.parts]
    if isinstance(node, rt.Alt):
        return [(p, 1) for p in node.options]
    if isinstance(node, rt.Repeat):
        copies = repeat_copies(node.lo, node.hi)
        return [(node.node, copies if copies <= MAX_COPIES else 1)]  # more: one body, counted
    if _is_atomic(node):
        return [(node.parts[0], 1)]
    return []
