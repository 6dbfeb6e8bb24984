"""The PromQL joins shown in docs/throughput.md, evaluated by a real Prometheus engine
(``promtool test rules``) on series shaped as fabricscope exports them: each query must
parse and return the joined series the doc promises (a job's NCCL transport mix: one pod's
run over NET/IB with GPUDirect RDMA, another's over sockets; a rank NCCL's RAS names, joined
to the node whose address is its host)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "throughput.md"
POD = 'job="fabricscope", instance="node-00", namespace="training", pod="llm-0"'
GPU = 'container="trainer", gpu="{g}", uuid="GPU-{g}", pci_bus_id="0000:{b}:00.0"'
PR = 'method="podresources"'
TOK = "fabricscope_throughput_tokens_per_second"
INFO = "fabricscope_pod_gpu_info"
WAIT = "fabricscope_infiniband_port_transmit_wait_total"
PORT = 'job="fabricscope", instance="node-00", device="mlx5_2", port="1"'
NCCL = "fabricscope_nccl_channels"
RANK = (
    'job="fabricscope", instance="node-00", namespace="training", job_name="llm", '
    'ras_endpoint="10.0.0.7:28028", rank="5", state="dead", host="10.0.0.8", pid="4242", '
    'gpu="3", pci_bus_id="", pod=""'
)


def test_doc_queries_join_throughput_to_pod_attribution(tmp_path: Path) -> None:
    queries = re.findall(r"```promql\n(.*?)```", DOC.read_text(), re.S)
    assert len(queries) == 6
    rules = {
        "groups": [
            {
                "name": "doc",
                "rules": [{"record": f"doc:q{i}", "expr": q} for i, q in enumerate(queries)],
            }
        ]
    }
    (tmp_path / "doc.rules.yaml").write_text(yaml.safe_dump(rules))
    gpu0, gpu1 = GPU.format(g=0, b="19"), GPU.format(g=1, b="3b")
    rdma = (
        'container="trainer", resource="rdma/ib", device_id="0000:1a:00.2", '
        'device="mlx5_2", pci_bus_id="0000:1a:00.2"'
    )
    tests = {
        "rule_files": ["doc.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'{TOK}{{{POD}, container="trainer",'
                        ' job_name="llm", format="composer"}',
                        "values": "55803.1245x30",
                    },
                    {
                        "series": f"{INFO}{{{POD}, {gpu0}, {PR}}}",
                        "values": "1x30",
                    },
                    {
                        "series": f"{INFO}{{{POD}, {gpu1}, {PR}}}",
                        "values": "1x30",
                    },
                    {"series": f"fabricscope_pod_rdma_info{{{POD}, {rdma}}}", "values": "1x30"},
                    {
                        "series": "fabricscope_throughput_last_parsed_timestamp_seconds{"
                        f'{POD}, container="trainer", job_name="llm"}}',
                        "values": "60x30",
                    },
                    {
                        "series": f"{WAIT}{{{PORT}}}",
                        "values": "0+600x30",
                    },
                    {
                        "series": f'{NCCL}{{{POD}, container="trainer", job_name="llm", '
                        'transport="NET/IB", gdr="1"}',
                        "values": "64x30",
                    },
                    {
                        "series": f'{NCCL}{{job="fabricscope", instance="node-01", '
                        'namespace="training", pod="llm-1", container="trainer", '
                        'job_name="llm", transport="NET/Socket", gdr="0"}',
                        "values": "64x30",
                    },
                    {"series": f"fabricscope_nccl_ras_rank_info{{{RANK}}}", "values": "1x30"},
                    {
                        "series": 'fabricscope_nccl_ras_node_address_info{job="fabricscope", '
                        'instance="node-01", host="10.0.0.8", netdev="eth0"}',
                        "values": "1x30",
                    },
                    {
                        "series": 'fabricscope_nccl_ras_node_address_info{job="fabricscope", '
                        'instance="node-01", host="10.0.0.9", netdev="eth1"}',
                        "values": "1x30",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": "doc:q0",
                        "eval_time": "10m",
                        "exp_samples": [
                            {
                                "labels": f'doc:q0{{{POD}, {gpu0}, {PR}, job_name="llm"}}',
                                "value": 55803.1245,
                            },
                            {
                                "labels": f'doc:q0{{{POD}, {gpu1}, {PR}, job_name="llm"}}',
                                "value": 55803.1245,
                            },
                        ],
                    },
                    {
                        "expr": "doc:q1",
                        "eval_time": "10m",
                        "exp_samples": [
                            {
                                "labels": f'doc:q1{{{POD}, {rdma}, job_name="llm"}}',
                                "value": 55803.1245,
                            },
                        ],
                    },
                    {
                        "expr": "doc:q2",
                        "eval_time": "10m",
                        "exp_samples": [
                            {
                                "labels": f'doc:q2{{{PORT}, namespace="training", pod="llm-0"}}',
                                "value": 10,
                            },
                        ],
                    },
                    {
                        "expr": "doc:q3",
                        "eval_time": "20m",
                        "exp_samples": [
                            {
                                "labels": f'doc:q3{{{POD}, container="trainer", job_name="llm"}}',
                                "value": 1140,
                            },
                        ],
                    },
                    {
                        "expr": "doc:q4",
                        "eval_time": "10m",
                        "exp_samples": [
                            {
                                "labels": 'doc:q4{namespace="training", job_name="llm", '
                                'transport="NET/IB", gdr="1"}',
                                "value": 64,
                            },
                            {
                                "labels": 'doc:q4{namespace="training", job_name="llm", '
                                'transport="NET/Socket", gdr="0"}',
                                "value": 64,
                            },
                        ],
                    },
                    {
                        "expr": "doc:q5",
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": f'doc:q5{{{RANK}, node="node-01"}}', "value": 1},
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "doc.test.yaml").write_text(yaml.safe_dump(tests))
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    result = subprocess.run(
        [promtool, "test", "rules", "doc.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
