"""Two answers of one query template (a check's baseline and slow period, or two shared reads
of one period) paired device by device.

A 1,024-node job's checks answer 300,000 devices a period, and pairing them by a key of their
labels (a dict for each answer, then the order) took a fifth of explain's own CPU. Prometheus
answers one template with the same series in the same order whenever the same series exist (a
selector's series come sorted by their labels, an aggregation's groups in the order of their
first series), so :func:`aligned` first asks whether both answers list equal label sets in the
same order, each device once: then the pairs are zipped, which is what the keyed dicts give.
Otherwise (a series in one answer only, another order, a device twice) the dicts decide, as
they always did; both ways give the same rows (tests/explain/test_explain_pairing.py).

Imports only the client's answer type.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from exporter.explain.client import Pair

#: one device: its labels (the slow period's when it has them), its baseline and slow values
#: (None where that answer did not list it)
Row = tuple[Mapping[str, str], float | None, float | None]

_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


def keyer(names: tuple[str, ...]) -> Callable[[Mapping[str, str]], tuple[str, ...]]:
    """A device's key: the values of ``names`` looked up at once, "" for a missing one."""
    if len(names) < 2:
        return lambda labels: tuple([labels.get(n, "") for n in names])
    every = operator.itemgetter(*names)

    def keyof(labels: Mapping[str, str]) -> tuple[str, ...]:
        try:
            return cast("tuple[str, ...]", every(labels))
        except KeyError:
            return tuple([labels.get(n, "") for n in names])

    return keyof


def aligned(a: Sequence[Pair], b: Sequence[Pair], names: tuple[str, ...]) -> bool:
    """Both answers list equal label sets in the same order, and no two of them share the
    values of ``names`` (each carries every one of them): zipping them pairs each device's
    two values, as keying both by ``names`` would."""
    if len(a) != len(b):
        return False
    labels = list(map(_first, a))
    if not all(map(operator.eq, labels, map(_first, b))):
        return False
    if not names:  # every label set empty: one device at most
        return len(labels) <= 1
    get = operator.itemgetter(*names)
    try:
        keys = set(map(get, labels))
    except KeyError:  # a label missing: the keyed way says what "" means
        return False
    return len(keys) == len(labels)


def paired(base: Sequence[Pair], slow: Sequence[Pair], names: tuple[str, ...]) -> list[Row]:
    """One row per device keyed by ``names``: the baseline's devices in its order, then those
    only the slow period has; a device listed twice in one answer takes its last pair there."""
    if aligned(base, slow, names):
        return list(zip(map(_first, slow), map(_second, base), map(_second, slow), strict=True))
    keyof = keyer(names)
    base_by = {keyof(labels): (labels, value) for labels, value in base}
    slow_by = {keyof(labels): (labels, value) for labels, value in slow}
    rows: list[Row] = []
    for k, (labels, value) in base_by.items():
        s = slow_by.get(k)
        rows.append((labels, value, None) if s is None else (s[0], value, s[1]))
    rows += [(labels, None, value) for k, (labels, value) in slow_by.items() if k not in base_by]
    return rows


def matched(a: Sequence[Pair], b: Sequence[Pair]) -> list[tuple[Mapping[str, str], float, float]]:
    """PromQL's one-to-one match on all labels (``a + b``): the label sets both answers
    list, in ``a``'s order, with both values (a label set listed twice in one answer takes
    its last value there). :func:`paired` keyed by every label name either answer uses: a
    label set lacks a name exactly when its value there would be "" (Prometheus keeps no
    empty label)."""
    names = tuple(sorted({n for labels, _ in (*a, *b) for n in labels}))
    return [
        (labels, x, y) for labels, x, y in paired(a, b, names) if x is not None and y is not None
    ]
