"""At the default detail every error, discard, retry and timeout counter is exported whenever
it is non-zero: a distinct non-zero value planted in each of them on ports of the DGX dgx_sys_copy
(its counters/ and hw_counters/ files are real ConnectX captures; see its PROVENANCE.md) comes
out of `fabricscope agent --once`, on a RoCE port as captured and on one set to InfiniBand.
Folding drops zeros only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agentrun import fabricscope

#: the port's error, discard, retry and timeout counters, with their PMA widths (None: a
#: driver's hw_counter), listed here by hand so that the test does not trust the catalog
PMA_ERRORS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
HW_ERRORS = (
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "implied_nak_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
)
#: RoCE's retransmission counters: RoCE events only, left out on InfiniBand ports below full
ROCE_ERRORS = ("roce_adp_retrans", "roce_adp_retrans_to")
#: what a name says when it counts an error, a discard, a retry or a timeout
ERRORISH = re.compile(r"err|discard|drop|retrans|timeout|overrun|integrity|downed|recovery|out_of")


def plant(port: Path) -> dict[tuple[str, str], int]:
    """A distinct non-zero value in every error counter of ``port``, below its maximum and
    far from any other counter's value on the port: (directory, file) -> value."""
    start = {4: 13, 8: 201, 16: 40_001, None: 70_001}
    planted: dict[tuple[str, str], int] = {}
    for directory, names in (
        ("counters", list(PMA_ERRORS)),
        ("hw_counters", [*HW_ERRORS, *ROCE_ERRORS]),
    ):
        for name in names:
            width = PMA_ERRORS.get(name) if directory == "counters" else None
            value = start[width]
            start[width] += 1
            assert width is None or value < (1 << width) - 1
            (port / directory / name).write_text(f"{value}\n")
            planted[(directory, name)] = value
    return planted


def test_the_list_is_every_error_counter_the_captured_port_has(dgx_sys_root: Path) -> None:
    port = dgx_sys_root / "class/infiniband/mlx5_0/ports/1"
    files = {f.name for d in ("counters", "hw_counters") for f in (port / d).iterdir()}
    errorish = {f for f in files if ERRORISH.search(f)}
    listed = set(PMA_ERRORS) | set(HW_ERRORS) | set(ROCE_ERRORS)
    assert errorish <= listed, errorish - listed
    assert listed <= files


@pytest.mark.parametrize("link_layer", ["Ethernet", "InfiniBand"])
def test_every_planted_error_counter_is_exported_at_the_default_detail(
    dgx_sys_copy: Path, link_layer: str
) -> None:
    port = dgx_sys_copy / "class/infiniband/mlx5_0/ports/1"
    (port / "link_layer").write_text(f"{link_layer}\n")
    planted = plant(port)
    proc = fabricscope(
        [
            "agent",
            "--once",
            "--no-sampler.netdev",
            "--no-sampler.workload",
            "--no-sampler.nvml",
            f"--path.sysfs={dgx_sys_copy}",
            "--collector.detail=default",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    exported: dict[float, list[str]] = {}
    for family in text_string_to_metric_families(proc.stdout):
        for s in family.samples:
            if s.labels.get("device") == "mlx5_0" and s.name.startswith(
                "fabricscope_infiniband_port_"
            ):
                exported.setdefault(s.value, []).append(s.name)
    missing = {
        name
        for (_, name), value in planted.items()
        if not any(n.endswith("_total") for n in exported.get(float(value), []))
    }
    if link_layer == "InfiniBand":
        assert missing == set(ROCE_ERRORS)  # an InfiniBand port counts no RoCE event
    else:
        assert missing == set()
    # the ten that the default level used to drop, by their metric names
    for metric in (
        "requester_cqe_errors",
        "requester_cqe_flush_errors",
        "requester_remote_access_errors",
        "responder_cqe_errors",
        "responder_cqe_flush_errors",
        "responder_local_length_errors",
        "responder_remote_access_errors",
        "receive_constraint_errors",
        "transmit_constraint_errors",
        "receive_switch_relay_errors",
    ):
        assert (
            f'fabricscope_infiniband_port_{metric}_total{{device="mlx5_0",port="1"}}' in proc.stdout
        )
    # and folding still drops their zeros elsewhere
    assert (
        'fabricscope_infiniband_port_responder_local_length_errors_total{device="mlx5_2"'
        not in proc.stdout
    )
