"""Seeded mutations of a JSON document (a plan, a runtime report) for the verify fuzz.

A plain `random.Random(seed)` picks a few places in the tree and breaks each: deletes a key,
replaces a value with one of another type or an extreme one (huge integers, huge floats, empty
containers, strings that look like numbers), wraps it in a list, or empties a list. A case is
reproduced by its seed alone.
"""

from __future__ import annotations

import copy
import random
from typing import Any

JUNK: tuple[Any, ...] = (None, True, False, 0, -1, 2**63, 10**30, -(10**30), 0.5, 1e308, -1e308,
                         "", "x", "12", "1/0", "a.b", [], {}, [1, 2], {"k": 1})


def _places(doc: Any) -> list[tuple[Any, Any]]:
    """(container, key) for every value in the tree, found without recursion."""
    found, stack = [], [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            found.append((node, key))
            if isinstance(value, dict | list):
                stack.append(value)
    return found


def mutate(doc: Any, seed: int, steps: int = 3) -> tuple[Any, list[str]]:
    """A broken copy of `doc` and what was done to it."""
    rng = random.Random(seed)
    doc = copy.deepcopy(doc)
    done = []
    for _ in range(rng.randint(1, steps)):
        places = _places(doc)
        if not places:
            break
        # Half the time near the top, where the keys verify reads directly live.
        shallow = [p for p in places if p[0] is doc or (isinstance(doc, dict) and any(
            p[0] is v for v in doc.values()))]
        container, key = rng.choice(shallow if shallow and rng.random() < 0.5 else places)
        action = rng.choice(("delete", "junk", "junk", "wrap", "empty"))
        if action == "delete" and isinstance(container, dict):
            del container[key]
        elif action == "wrap":
            container[key] = [container[key]]
        elif action == "empty" and isinstance(container[key], list | dict):
            container[key] = type(container[key])()
        else:
            action = "junk"
            container[key] = copy.deepcopy(rng.choice(JUNK))
        done.append(f"{action} {key!r}")
    return doc, done
