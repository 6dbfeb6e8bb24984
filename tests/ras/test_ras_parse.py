"""RAS JSON answers (agent/ras/parse.py): the shape NCCL writes parses to records; anything
out of shape is refused with a one-line reason, never a crash. The answers here are built in
NCCL's layout with synthetic values (tests/ras_standin.py); recorded answers of a real job are
replayed in tests/ras/test_ras_recorded.py."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from agent.ras.parse import (
    DECODED_PER_ANSWER_BYTE,
    MalformedAnswer,
    OversizedAnswer,
    decoded_bytes_bound,
    error_kind,
    parse_status,
)
from tests.ras_standin import communicator, missing_entry, rank_entry, status_json


def doc(data: bytes) -> dict[str, object]:
    out = json.loads(data)
    assert isinstance(out, dict)
    return out


def test_a_status_parses_to_records() -> None:
    data = status_json(
        [
            communicator(
                [rank_entry(0, allreduce=7), rank_entry(1, host="fd00::1", allreduce=6)],
                [missing_entry(2, dead=True), missing_entry(3, unresponsive=False)],
            )
        ],
        timeouts=2,
    )
    a = parse_status(data)
    assert a.nccl_version == "2.28.9" and a.timeouts == 2 and a.collection_seconds == 0.004
    (c,) = a.communicators
    assert c.key == "0xae94423cfbb2ef4a/0xb7e7187447156001:0xb8242ed28a71381e"
    assert c.size == 4
    assert [(r.rank, r.host, r.pid, r.nvml_dev, r.total) for r in c.ranks] == [
        (0, "10.0.0.1", 1000, 0, 7),
        (1, "fd00::1", 1001, 1, 6),
    ]
    assert c.ranks[0].counts[-1] == ("AllReduce", 7)
    assert [(m.rank, m.unresponsive, m.considered_dead) for m in c.missing] == [
        (2, True, True),
        (3, False, False),
    ]


def test_no_communicator_and_unknown_keys() -> None:
    d = doc(status_json([]))
    d["added_in_a_later_nccl"] = {"x": [1, 2]}
    a = parse_status(json.dumps(d).encode())
    assert a.communicators == ()


def test_an_unknown_host_keeps_its_pid_minus_one() -> None:
    r = rank_entry(0, host="unknown", pid=-1)
    a = parse_status(status_json([communicator([r])]))
    assert (a.communicators[0].ranks[0].host, a.communicators[0].ranks[0].pid) == ("unknown", -1)


def _mutate(path: tuple[object, ...], value: object) -> bytes:
    d = doc(status_json([communicator([rank_entry(0)], [missing_entry(1)])]))
    node: object = d
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    return json.dumps(d).encode()


C0 = ("communicators", 0)
R0 = (*C0, "ranks", 0)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "answer is not an object"),
        (b'{"nccl_version": NaN}', "JSON does not allow"),
        (b"[" * 100_000 + b"]" * 100_000, "could decode into"),
        (b'{"nccl_version": "2.28.9", "communicators": {}}', "communicators is not a list"),
        (_mutate(("nccl_version",), "x" * 100), "nccl_version"),
        (_mutate(("ras",), None), "answer.ras is not an object"),
        (_mutate(("ras", "collection_time_sec"), "1"), "collection_time_sec"),
        (_mutate(("ras", "collection_time_sec"), float("inf")), "JSON does not allow"),
        (_mutate((*C0, "hash"), "ae94"), "hash is not of the expected form"),
        (_mutate((*C0, "size"), -1), "size = -1 is out of range"),
        (_mutate((*C0, "size"), 1), "more ranks than its size"),
        (_mutate((*R0, "rank"), True), "rank is not an integer"),
        (_mutate((*R0, "rank"), 1.5), "rank is not an integer"),
        (_mutate((*R0, "pid"), 1 << 40), "pid = 1099511627776 is out of range"),
        (_mutate((*R0, "host"), "node-a.example"), "host is not an address"),
        (_mutate((*R0, "host"), "1" * 10_000), "host is not an address"),
        (_mutate((*R0, "status", "abort_flag"), 0), "abort_flag is not a boolean"),
        (_mutate((*R0, "collective_counts", "AllReduce"), -1), "out of range"),
        (_mutate((*R0, "collective_counts", "a b"), 1), "key of unexpected form"),
        (
            _mutate((*R0, "collective_counts"), {f"F{i}": 0 for i in range(17)}),
            "17 types",
        ),
        (_mutate((*C0, "missing_ranks", 0, "status"), []), "status is not an object"),
    ],
)
def test_out_of_shape_is_refused_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(MalformedAnswer, match=why) as info:
        parse_status(data)
    assert "\n" not in str(info.value)
    assert len(str(info.value)) < 200


def test_error_kinds() -> None:
    assert error_kind(0) is None and error_kind(7) is None
    assert error_kind(6) == "remote_error"
    assert error_kind(2) == "system_error"
    assert error_kind(12) == "other" and error_kind(-3) == "other"


def test_nesting_too_deep_is_refused_even_when_the_budget_allows_it() -> None:
    with pytest.raises(MalformedAnswer, match="nests too deep"):
        parse_status(b"[" * 100_000 + b"]" * 100_000, max_decoded_bytes=1 << 30)


# -- the decoded-memory bound ------------------------------------------------------------------

_HEAD = (
    b'{"nccl_version": "2.28.9", "communicators": [], '
    b'"ras": {"collection_time_sec": 0.1, "timeouts_count": 0}, "x": ['
)


def _filled(item: bytes, size: int = 1 << 18) -> bytes:
    """A valid status with one extra key holding ``item`` repeated to about ``size`` bytes."""
    return _HEAD + item * ((size - len(_HEAD)) // len(item)) + b"0]}"


#: the shapes that decode into the most memory per byte (measured: CPython 3.11, 64-bit),
#: and the same padded with spaces until they price just under the default budget
AMPLIFYING = {
    "empty objects": b"{},",
    "empty lists": b"[],",
    "nested lists": b"[[]],",
    "objects of a list": b'{"a":[]},',
    "objects of a float": b'{"a":1.5},',
    "floats": b"1.5,",
    "exponents": b"1e5,",
    "small ints": b"7,",
    "big ints": b"123456789012,",
    "short strings": b'"ab",',
    "unique strings": None,  # built below: every string distinct, none cached
    "unique keys": None,
    "astral escape": None,  # one escape widens the whole string to 4 bytes a character
}
#: the shapes above that stay within the budget (3 to 4 times their size) and are decoded
WITHIN_BUDGET = ("astral escape", "big ints")


def _shape(name: str, size: int = 1 << 18) -> bytes:
    if name == "unique strings":
        n = size // 9
        return _filled(b",".join(b'"%d"' % i for i in range(n)) + b",", size)
    if name == "unique keys":
        n = size // 12
        body = b"{" + b",".join(b'"%d":0' % i for i in range(n)) + b"},"
        return _filled(body, size)
    if name == "astral escape":
        return _filled(b'"' + b"a" * (size - 200) + b'\\ud83d\\ude00",', size)
    item = AMPLIFYING[name]
    assert item is not None
    return _filled(item, size)


def _decoded_bytes(data: bytes) -> int:
    """What ``json.loads`` keeps, measured: traced memory held once it returns."""
    tracemalloc.start()
    try:
        out = json.loads(data)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del out
    return held


def _padded(name: str) -> bytes:
    """``name``'s shape with spaces after each item until it prices under the budget."""
    item = AMPLIFYING[name]
    assert item is not None
    pad = 0
    while True:
        data = _filled(item + b" " * pad)
        if decoded_bytes_bound(data) < DECODED_PER_ANSWER_BYTE * len(data):
            return data
        pad += 1


@pytest.mark.parametrize("name", sorted(AMPLIFYING))
def test_the_bound_holds_what_decoding_builds_and_refuses_amplifying_shapes(name: str) -> None:
    data = _shape(name)
    # an upper bound: what decoding actually holds never passes it
    assert _decoded_bytes(data) <= decoded_bytes_bound(data), name
    if name in WITHIN_BUDGET:  # bounded at a few times their size: decoded
        assert parse_status(data).communicators == ()
        return
    # refused before decoding, counted as oversized, with a one-line reason
    with pytest.raises(OversizedAnswer, match=r"could decode into \d+ MiB") as info:
        parse_status(data)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", sorted(n for n, v in AMPLIFYING.items() if v is not None))
def test_an_amplifying_shape_padded_under_the_budget_decodes_within_it(name: str) -> None:
    data = _padded(name)
    held = _decoded_bytes(data)
    assert held <= decoded_bytes_bound(data) < DECODED_PER_ANSWER_BYTE * len(data), name


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ras" / "answers.jsonl"


def test_nccls_own_answers_price_well_under_the_budget() -> None:
    """Every JSON answer a real NCCL 2.28.9 job wrote (tests/fixtures/ras), and synthetic
    jobs of 1 to 4,000 ranks in NCCL's layout, pass the budget with room."""
    answers = []
    for line in FIXTURE.read_text().splitlines():
        answer = json.loads(line)["answer"].encode()
        if answer.lstrip().startswith(b"{"):
            answers.append(answer)
    assert len(answers) >= 5
    for n in (1, 4, 64, 4000):
        answers.append(
            status_json(
                [communicator([rank_entry(r, gpu=r % 8, allreduce=10**12 + r) for r in range(n)])]
            )
        )
    for data in answers:
        assert decoded_bytes_bound(data) <= 6 * len(data)
        parse_status(data)  # within the budget (2.28's missing comma repaired where needed)
        if not data.rstrip().endswith(b"}") or b'"missing_ranks": [\n' in data:
            continue
        assert _decoded_bytes(data) <= decoded_bytes_bound(data)
