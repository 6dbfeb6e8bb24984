"""The pairing of two answers device by device (exporter/explain/pairing.py): zipped when both
list the same label sets in the same order, keyed otherwise, the same rows either way; and the
vector reader's fast way over a whole answer gives what the careful one does, element by
element, refusing the same malformed answers."""

from __future__ import annotations

import random

import pytest

from exporter.explain.client import (
    Pair,
    PrometheusError,
    _pairs,
    _pairs_one_by_one,
)
from exporter.explain.pairing import Row, aligned, keyer, matched, paired

PORT = ("instance", "device", "port")


def keyed(base: list[Pair], slow: list[Pair], names: tuple[str, ...]) -> list[Row]:
    """What the pairing always did, written out: a dict per answer keyed by ``names``, the
    baseline's devices in order, then the slow period's new ones."""
    keyof = keyer(names)
    base_by = {keyof(labels): (labels, v) for labels, v in base}
    slow_by = {keyof(labels): (labels, v) for labels, v in slow}
    order = [*base_by, *(k for k in slow_by if k not in base_by)]
    rows: list[Row] = []
    for k in order:
        b, s = base_by.get(k), slow_by.get(k)
        labels = s[0] if s is not None else b[0] if b is not None else {}
        rows.append((labels, b[1] if b else None, s[1] if s else None))
    return rows


def port(node: int, dev: int, **extra: str) -> dict[str, str]:
    return {"device": f"mlx5_{dev}", "instance": f"node-{node:02d}", "port": "1", **extra}


def answer(ports: list[dict[str, str]], rng: random.Random) -> list[Pair]:
    return [(dict(p), rng.choice([0.0, 0.0, 0.25, 3.0])) for p in ports]


def test_answers_listing_the_same_ports_in_order_are_zipped() -> None:
    rng = random.Random(1)
    ports = [port(n, d) for n in range(4) for d in range(12)]
    base, slow = answer(ports, rng), answer(ports, rng)
    assert aligned(base, slow, PORT)
    assert paired(base, slow, PORT) == keyed(base, slow, PORT)
    # the rows carry the slow period's label sets (as the keyed way does)
    assert all(r[0] is s[0] for r, s in zip(paired(base, slow, PORT), slow, strict=True))


@pytest.mark.parametrize(
    "case",
    ["reordered", "one_new_in_slow", "one_gone_in_slow", "key_twice", "label_missing", "extra"],
)
def test_answers_that_do_not_line_up_are_keyed_as_before(case: str) -> None:
    """Every way two answers can differ: each one not aligned, and its rows the keyed way's."""
    rng = random.Random(case)
    ports = [port(n, d) for n in range(3) for d in range(4)]
    base, slow = answer(ports, rng), answer(ports, rng)
    if case == "reordered":
        slow = slow[::-1]
    elif case == "one_new_in_slow":
        slow.insert(5, (port(7, 0), 2.0))
        base.append((port(8, 0), 1.0))
    elif case == "one_gone_in_slow":
        del slow[3]
        slow.append((port(9, 9), 1.0))
    elif case == "key_twice":  # a device twice in each (labels besides its identity differ)
        base[4] = (port(0, 0, job="b"), 5.0)
        slow[4] = (port(0, 0, job="b"), 6.0)
    elif case == "label_missing":
        base[2] = slow[2] = ({"instance": "node-00", "device": "mlx5_9"}, 1.0)
    elif case == "extra":
        slow = slow[:-1]
    assert not aligned(base, slow, PORT)
    assert paired(base, slow, PORT) == keyed(base, slow, PORT)


def test_a_single_name_key_and_empty_answers() -> None:
    gpus = [({"instance": f"node-{i}"}, float(i)) for i in range(5)]
    assert paired(gpus, gpus[::-1], ("instance",)) == keyed(gpus, gpus[::-1], ("instance",))
    assert paired(gpus, gpus, ("instance",)) == keyed(gpus, gpus, ("instance",))
    assert paired([], [], PORT) == [] == paired([], [], ("instance",))
    assert paired([], gpus, ("instance",)) == keyed([], gpus, ("instance",))


def test_the_fast_vector_reader_reads_what_the_careful_one_reads() -> None:
    result: list[object] = [
        {"metric": {"instance": "node-00", "device": "mlx5_0"}, "value": [1.5, "0.25"]},
        {"metric": {}, "value": [1.5, "NaN"]},
        {"metric": {"instance": "node-01"}, "value": [1.5, "+Inf"]},
    ]
    fast = _pairs(result, "q")
    assert fast[0] == ({"instance": "node-00", "device": "mlx5_0"}, 0.25)
    assert str(fast[1][1]) == "nan" and fast[2][1] == float("inf")
    assert [(lab, str(v)) for lab, v in fast] == [
        (lab, str(v)) for lab, v in _pairs_one_by_one(result, "q")
    ]


@pytest.mark.parametrize(
    ("element", "error"),
    [
        ("not an object", "malformed vector element"),
        ({"value": [1, "2"]}, "malformed label set"),
        ({"metric": [], "value": [1, "2"]}, "malformed label set"),
        ({"metric": {}, "value": [1, "two"]}, "is not a number"),
        ({"metric": {}, "value": [1, "2", 3]}, "malformed sample"),
        ({"metric": {}, "value": "2"}, "malformed sample"),
        ({"metric": {}}, "malformed sample"),
    ],
)
def test_the_fast_vector_reader_refuses_what_the_careful_one_refuses(
    element: object, error: str
) -> None:
    good = {"metric": {"instance": "node-00"}, "value": [1, "1"]}
    with pytest.raises(PrometheusError, match=error):
        _pairs([good, element, good], "q")


def test_labels_that_are_not_strings_are_read_as_the_careful_reader_reads_them() -> None:
    result: list[object] = [{"metric": {"gpu": 3}, "value": [1, "1"]}]
    assert _pairs(result, "q") == _pairs_one_by_one(result, "q") == [({"gpu": "3"}, 1.0)]
    # a number where Prometheus writes a string is taken as the careful reader takes it
    numeric: list[object] = [{"metric": {}, "value": [1, 2]}]
    assert _pairs(numeric, "q") == _pairs_one_by_one(numeric, "q") == [({}, 2.0)]


def test_matched_is_promqls_one_to_one_match_on_all_labels() -> None:
    """``a + b`` in PromQL: label sets in both answers, matched on every label (a port read
    by two scrape jobs is two devices there, not one), in ``a``'s order, a set listed twice
    taking its last value; zipped or keyed alike."""
    a: list[Pair] = [
        ({"instance": "n1", "device": "mlx5_0", "port": "1", "job": "x"}, 1.0),
        ({"instance": "n1", "device": "mlx5_0", "port": "1", "job": "y"}, 2.0),
        ({"instance": "n2", "device": "mlx5_0", "port": "1"}, 3.0),
        ({"instance": "n3", "device": "mlx5_0", "port": "1"}, 4.0),
    ]
    b: list[Pair] = [(a[1][0], 20.0), (a[0][0], 10.0), (a[2][0], 30.0), (a[2][0], 31.0)]
    got = [(dict(labels), x, y) for labels, x, y in matched(a, b)]
    assert got == [
        (dict(a[0][0]), 1.0, 10.0),
        (dict(a[1][0]), 2.0, 20.0),
        (dict(a[2][0]), 3.0, 31.0),
    ]
    zipped = matched(a, [(labels, 2 * v) for labels, v in a])
    assert [(x, y) for _, x, y in zipped] == [(1.0, 2.0), (2.0, 4.0), (3.0, 6.0), (4.0, 8.0)]
    assert matched([], b) == [] and matched([({}, 1.0)], [({}, 2.0)]) == [({}, 1.0, 2.0)]
