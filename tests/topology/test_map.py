"""The map's pure parts: the parsers against hostile Prometheus answers, the tiers of
fabrics the simulator cannot cheaply build (many rails, separate rail planes), the label
keys, and the Kubernetes client against hostile API answers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from exporter.topology import files, model, parse, render
from exporter.topology.kubeapi import KubeError, KubeSettings, NodesApi
from tests.kubeapi import clear_proxies, status
from tests.topology.checks import check_all
from tests.topology.domains import GB200_UUID, nvml_exposition


def g(i: int) -> str:
    return f"0x{i:016x}"


def peer(node: str, leaf: str, device: str = "mlx5_0", **extra: str) -> dict[str, str]:
    return {
        "instance": node,
        "device": device,
        "port": "1",
        "peer_guid": leaf,
        "node_type": "switch",
        **extra,
    }


def test_hostile_samples_are_left_out_and_counted() -> None:
    rejects = parse.Rejects()
    samples = [
        (peer("n1", g(1)), 1.0),
        (peer("N2_bad", g(1)), 1.0),  # not a node name
        (peer("x" * 300, g(1)), 1.0),  # too long
        (peer("n3", "0x12"), 1.0),  # not a GUID
        (peer("n4", g(1) + "\n"), 1.0),
        (peer("n5", g(1)), 0.0),  # not 1
        (peer("n6", g(1), node_type="CA"), 1.0),
        (peer("n7", g(1), peer_description="d" * 10_000), 1.0),
    ]
    got = parse.attachments(samples, None, rejects)
    assert [a.node for a in got] == ["n1", "n7"]
    assert len(got[1].leaf_description) == 64
    assert rejects.counts == {"node_name": 2, "guid": 2, "value": 2}


def test_a_port_that_is_down_does_not_place_its_node() -> None:
    rejects = parse.Rejects()
    up = [({"instance": "n1", "device": "mlx5_0", "port": "1"}, 0.0)]
    assert parse.attachments([(peer("n1", g(1)), 1.0)], up, rejects) == []
    assert rejects.counts == {"port_down": 1}


def test_too_many_edges_is_one_error_not_a_memory_blowup() -> None:
    samples = ((peer(f"n{i}", g(1)), 1.0) for i in range(100))
    with pytest.raises(parse.MapError, match="more than 50"):
        parse.attachments(samples, None, parse.Rejects(), max_edges=50)
    links = (({"switch_guid": g(i), "peer_guid": g(10**6)}, 1.0) for i in range(1, 100))
    with pytest.raises(parse.MapError, match="more than 50"):
        parse.switch_links(links, parse.Rejects(), max_edges=50)


def test_switch_links_dedupe_and_refuse_loops() -> None:
    rejects = parse.Rejects()
    one = {"switch_guid": g(1), "peer_guid": g(9), "switch_description": "lf1"}
    got = parse.switch_links(
        [(one, 1.0), (one, 1.0), ({"switch_guid": g(1), "peer_guid": g(1)}, 1.0)], rejects
    )
    assert got == [parse.SwitchLink(g(1), g(9), "lf1", "")]
    assert rejects.counts == {"guid": 1}


def _rails(hosts: int, rails: int, planes: bool) -> model.FabricMap:
    """A rail-optimised fabric: ``hosts`` per scalable unit, 2 units, one leaf per rail per
    unit; spines shared by every rail, or one spine per rail (``planes``)."""
    atts, links = [], []
    for unit in range(2):
        for r in range(rails):
            leaf = g(100 + unit * rails + r)
            for h in range(hosts):
                atts.append(parse.Attachment(f"u{unit}-h{h}", f"mlx5_{r}", "1", leaf))
            spines = [g(900 + r)] if planes else [g(900), g(901)]
            links += [parse.SwitchLink(leaf, s) for s in spines]
    return model.build(atts, links)


def test_a_rail_optimised_fabric_groups_by_scalable_unit() -> None:
    fmap = _rails(hosts=4, rails=8, planes=False)
    groups = fmap.groups(model.LEAF)
    assert sorted(len(v) for v in groups.values()) == [4, 4]
    assert all(k.startswith("rails-") for k in groups)
    assert list(fmap.groups(model.BLOCK)) == [g(900)]
    check_all(fmap, render.LabelKeys())


def test_separate_rail_planes_are_named_as_a_set_and_nest() -> None:
    fmap = _rails(hosts=2, rails=4, planes=True)
    (block,) = fmap.groups(model.BLOCK)
    assert block.startswith("planes-")
    check_all(fmap, render.LabelKeys())


def test_a_node_that_lost_a_rail_leaves_its_group() -> None:
    fmap = _rails(hosts=3, rails=2, planes=False)
    atts = [a for a in fmap.attachments if not (a.node == "u0-h0" and a.device == "mlx5_1")]
    fewer = model.build(atts, fmap.links)
    place = fewer.place("u0-h0")
    assert place is not None and place.tiers[0] == g(100)
    assert fewer.groups(model.LEAF)[fmap.place("u0-h1").tiers[0]] == ("u0-h1", "u0-h2")  # type: ignore[union-attr]


def test_names_do_not_depend_on_order() -> None:
    a = _rails(hosts=3, rails=4, planes=False)
    b = model.build(reversed(a.attachments), reversed(a.links))
    assert render.node_labels(a, render.LabelKeys()) == render.node_labels(b, render.LabelKeys())


@pytest.mark.parametrize(
    "prefix", ["", "fabric", "Fabric.Example.com/", "a/b/", "-x.com/", "x" * 250 + "/"]
)
def test_a_bad_label_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="not a DNS subdomain"):
        render.LabelKeys(prefix)


def test_an_own_prefix_names_every_output() -> None:
    keys = render.LabelKeys("fabric.example.com/")
    topo = render.kueue_topology(keys)
    assert topo["spec"] == {
        "levels": [
            {"nodeLabel": "fabric.example.com/tier-1"},
            {"nodeLabel": "fabric.example.com/tier-0"},
            {"nodeLabel": "kubernetes.io/hostname"},
        ]
    }
    check_all(_rails(2, 2, False), keys)


# --- the Kubernetes client against hostile answers --------------------------------------


@pytest.fixture
def api(httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> NodesApi:
    clear_proxies(monkeypatch)
    return NodesApi(KubeSettings(httpserver.url_for("").rstrip("/"), timeout=1.0))


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("not json", "not JSON"),
        (json.dumps({"kind": "PodList", "items": []}), "not a NodeList"),
        (json.dumps({"kind": "NodeList"}), "without items"),
        (json.dumps({"kind": "NodeList", "items": [{"metadata": {}}]}), "without a name"),
        (
            json.dumps({"kind": "NodeList", "items": [{"metadata": {"name": "a", "labels": []}}]}),
            "not a map",
        ),
    ],
)
def test_a_malformed_node_list_is_one_error(
    api: NodesApi, httpserver: HTTPServer, body: str, match: str
) -> None:
    httpserver.expect_request("/api/v1/nodes").respond_with_data(body)
    with pytest.raises(KubeError, match=match):
        api.list_labels()


def test_a_refusal_says_what_the_api_server_said(api: NodesApi, httpserver: HTTPServer) -> None:
    forbidden = status(403, "Forbidden", 'nodes is forbidden: User "x" cannot list resource')
    httpserver.expect_request("/api/v1/nodes").respond_with_json(forbidden, status=403)
    with pytest.raises(KubeError, match="HTTP 403 nodes is forbidden"):
        api.list_labels()


def test_a_huge_answer_is_refused(
    api: NodesApi, httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("exporter.topology.kubeapi.MAX_BODY_BYTES", 1000)
    httpserver.expect_request("/api/v1/nodes").respond_with_data("[" + "0," * 5000 + "0]")
    with pytest.raises(KubeError, match="larger than 1000 bytes"):
        api.list_labels()


def test_a_slow_api_server_times_out(api: NodesApi, httpserver: HTTPServer) -> None:
    def slow(_: Request) -> Response:
        time.sleep(3)
        return Response("{}")

    httpserver.expect_request("/api/v1/nodes").respond_with_handler(slow)
    t0 = time.monotonic()
    with pytest.raises(KubeError, match="timed out"):
        api.list_labels()
    assert time.monotonic() - t0 < 2.5


def test_hostile_files_are_skipped_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    good = (
        'fabricscope_infiniband_peer_info{device="mlx5_0",port="1",peer_guid="'
        + g(7)
        + '",peer_port="3",node_type="switch",lid="2",peer_description="lf1"} 1\n'
    )
    (tmp_path / "n1.prom").write_text(good)
    (tmp_path / "Bad_Name.prom").write_text(good)
    (tmp_path / "n2.prom").write_text("fabricscope_infiniband_peer_info{device=\n")  # cut
    (tmp_path / "n3.prom").write_text(good + "x" * 2000)
    (tmp_path / "n4.prom").symlink_to(tmp_path / "n1.prom")
    (tmp_path / "n5.prom").mkdir()
    (tmp_path / "notes.txt").write_text("ignored")
    monkeypatch.setattr("exporter.topology.files.MAX_FILE_BYTES", 1000)
    fmap, rejects = files.read_dir(str(tmp_path))
    assert [p.node for p in fmap.places] == ["n1"]
    assert rejects == {"file_name": 1, "file": 4}
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 5 and all("\n" not in m for m in skipped)


def test_a_fifo_never_blocks_the_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "n1.prom")
    t0 = time.monotonic()
    fmap, rejects = files.read_dir(str(tmp_path))
    assert rejects == {"file": 1} and not fmap.places
    assert time.monotonic() - t0 < 5


def test_the_core_tier_comes_only_from_spines_cables_to_switches_above_them() -> None:
    """Leaves 1 and 2 under spine 10, leaf 3 under spine 11; spine 10 cabled to core 20 and
    back down to its leaves (the agents cannot tell which is which), spine 11 to core 20 too
    in one map and to nothing in the other; a cable from a switch no leaf reaches (a core's
    own) is ignored."""
    atts = [
        parse.Attachment("a", "mlx5_0", "1", g(1)),
        parse.Attachment("b", "mlx5_0", "1", g(2)),
        parse.Attachment("c", "mlx5_0", "1", g(3)),
    ]
    up = [parse.SwitchLink(g(1), g(10)), parse.SwitchLink(g(2), g(10))]
    up.append(parse.SwitchLink(g(3), g(11)))
    down = [parse.SwitchLink(g(10), g(1)), parse.SwitchLink(g(10), g(2))]
    above = [parse.SwitchLink(g(10), g(20)), parse.SwitchLink(g(20), g(30))]
    two = model.build(atts, up, down)
    assert two.depth == 2 and two.core_links == ()  # cables down to leaves: no core
    three = model.build(atts, up, [*down, *above, parse.SwitchLink(g(11), g(20))])
    assert three.depth == 3
    assert {p.node: p.tiers[2] for p in three.places} == {"a": g(20), "b": g(20), "c": g(20)}
    assert g(30) not in three.switches  # above the core: not a tier
    cut = model.build(atts, up, [*down, *above])
    tiers = {p.node: p.tiers for p in cut.places}
    assert tiers["a"][2] == tiers["b"][2] == g(20)
    assert tiers["c"][2] == f"isolated-{g(11)}"  # spine 11's block, no core seen above it
    check_all(three, render.LabelKeys())
    check_all(cut, render.LabelKeys())


def test_a_node_in_two_planes_with_different_cores_gets_a_set_name() -> None:
    atts = [
        parse.Attachment("r", "mlx5_0", "1", g(1)),
        parse.Attachment("r", "mlx5_1", "1", g(2)),
    ]
    up = [parse.SwitchLink(g(1), g(10)), parse.SwitchLink(g(2), g(11))]
    fmap = model.build(atts, up, [parse.SwitchLink(g(10), g(20)), parse.SwitchLink(g(11), g(21))])
    (place,) = fmap.places
    assert place.tiers[1].startswith("planes-") and place.tiers[2].startswith("planes-")
    check_all(fmap, render.LabelKeys())


# -- NVLink domains ------------------------------------------------------------------------


def fabric(node: str, gpu: str, uuid: str = GB200_UUID, clique: str = "4026") -> dict[str, str]:
    return {"instance": node, "gpu": gpu, "cluster_uuid": uuid, "clique_id": clique}


def test_hostile_domain_samples_are_left_out_and_counted() -> None:
    rejects = parse.Rejects()
    samples = [
        (fabric("n1", "0"), 1.0),
        (fabric("n1", "1"), 1.0),  # the same domain twice: one
        (fabric("n2", "0"), 1.0),
        (fabric("n2", "1", clique="2"), 1.0),  # split across partitions: none, counted
        (fabric("n3", "0", uuid="not-a-uuid"), 1.0),
        (fabric("n4", "0", uuid=GB200_UUID + "0" * 10_000), 1.0),
        (fabric("n5", "0", clique="-1"), 1.0),
        (fabric("n6", "0", clique="99999999999999999999"), 1.0),
        (fabric("n7", "0", clique="4294967296"), 1.0),  # 2**32
        (fabric("N8", "0"), 1.0),
        (fabric("n9", "0"), 0.0),
        (fabric("n10", "0", uuid=GB200_UUID.upper()), 1.0),  # case: the same domain
    ]
    got = parse.domains(samples, rejects)
    assert got == {"n1": f"{GB200_UUID}.4026", "n10": f"{GB200_UUID}.4026"}
    assert rejects.counts == {"domain_conflict": 1, "domain": 5, "node_name": 1, "value": 1}


def test_domains_are_labels_a_kueue_level_and_slurm_blocks() -> None:
    atts = [parse.Attachment(n, "mlx5_0", "1", g(1)) for n in ("a", "b", "c")]
    atts.append(parse.Attachment("d", "mlx5_0", "1", g(2)))
    domains = {"a": f"{GB200_UUID}.4026", "b": f"{GB200_UUID}.4026", "c": f"{GB200_UUID}.7"}
    domains["x"] = f"{GB200_UUID}.7"  # a GPU node without InfiniBand: its domain only
    fmap = model.build(
        atts, [parse.SwitchLink(g(1), g(10)), parse.SwitchLink(g(2), g(10))], (), domains
    )
    keys = render.LabelKeys()
    labels = render.node_labels(fmap, keys)
    assert labels["a"][render.TOPOGRAPH_ACCELERATOR] == f"{GB200_UUID}.4026"
    assert render.TOPOGRAPH_ACCELERATOR not in labels["d"]
    assert labels["x"] == {render.TOPOGRAPH_ACCELERATOR: f"{GB200_UUID}.7"}
    assert (
        render.TOPOGRAPH_ACCELERATOR
        not in render.node_labels(fmap, render.LabelKeys(accelerator=""))["a"]
    )
    topo = render.kueue_topology(keys, depth=fmap.depth, domains=True)
    levels = [lv["nodeLabel"] for lv in topo["spec"]["levels"]]  # type: ignore[index]
    assert levels == [keys.key(1), keys.key(0), render.TOPOGRAPH_ACCELERATOR, render.HOSTNAME]
    assert render.slurm_block(fmap).splitlines()[1:] == [
        f"# NVLink domain {GB200_UUID}.4026",
        "BlockName=nvl1 Nodes=a,b",
        f"# NVLink domain {GB200_UUID}.7",
        "BlockName=nvl2 Nodes=c,x",
    ]
    check_all(fmap, keys)


def test_the_agents_nvml_series_give_the_domain(tmp_path: Path) -> None:
    """The exposition the real exporter renders from a replayed NVML pass (the 2x H200
    recording, its fabric answers edited to the GB200 node's), read as a node's file."""
    leaf = (
        'fabricscope_infiniband_peer_info{device="mlx5_0",port="1",peer_guid='
        '"0x0000000000000001",peer_port="3",node_type="switch",peer_lid="5",'
        'peer_description="lf"} 1\n'
    )
    text = nvml_exposition(4026).decode()
    (tmp_path / "gb1.prom").write_text(
        text + "# TYPE fabricscope_infiniband_peer_info gauge\n" + leaf
    )
    fmap, rejects = files.read_dir(str(tmp_path))
    assert rejects == {}
    assert fmap.domains == {"gb1": f"{GB200_UUID}.4026"}


def test_slurm_block_output_from_the_agents_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from exporter.cli.main import main

    leaf = (
        'fabricscope_infiniband_peer_info{device="mlx5_0",port="1",peer_guid='
        '"0x0000000000000001",peer_port="3",node_type="switch",peer_lid="5",'
        'peer_description="lf"} 1\n'
    )
    info = (
        f'fabricscope_gpu_fabric_info{{gpu="0",cluster_uuid="{GB200_UUID}",clique_id="4026"}} 1\n'
    )
    for node in ("gb1", "gb2"):
        (tmp_path / f"{node}.prom").write_text(leaf + info)
    (tmp_path / "h1.prom").write_text(leaf)
    assert main(["topology", "--exposition.dir", str(tmp_path), "--output", "slurm-block"]) == 0
    out = capsys.readouterr().out
    assert "BlockName=nvl1 Nodes=gb1,gb2\n" in out and "h1" not in out
    for node in ("gb1", "gb2"):
        (tmp_path / f"{node}.prom").write_text(leaf)
    assert main(["topology", "--exposition.dir", str(tmp_path), "--output", "slurm-block"]) == 1
    err = capsys.readouterr().err
    assert "no NVLink domain" in err and len(err.strip().splitlines()) == 1
