"""The simulated site's registry (virtual/sim_registry.py): its config binds the address the nodes reach and serves
TLS only, its server certificate is for that IP and signed by the site's CA, and the demo's distribution path is
chosen as docs/benchmarks.md says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import sim_registry  # virtual/, on pytest's pythonpath
import yaml


def test_config_binds_the_given_address_with_tls_and_filesystem_storage(tmp_path):
    text = sim_registry.config_yaml("172.18.0.1", 5000, tmp_path / "storage", tmp_path / "s.crt", tmp_path / "s.key")
    config = yaml.safe_load(text)  # what docker-registry reads (JSON is YAML)
    assert config["version"] == 0.1
    assert config["http"]["addr"] == "172.18.0.1:5000"  # never every interface
    assert config["http"]["tls"] == {"certificate": str(tmp_path / "s.crt"), "key": str(tmp_path / "s.key")}
    assert config["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "storage")
    assert config["storage"]["delete"]["enabled"] is True
    assert "debug" not in config["http"]


def test_server_certificate_extension_names_the_ip_for_serving_only():
    ext = sim_registry.server_cert_ext("10.1.2.1")
    assert "subjectAltName=IP:10.1.2.1" in ext
    assert "CA:FALSE" in ext and "extendedKeyUsage=serverAuth" in ext


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_certificates_verify_against_the_site_ca_and_follow_the_address(tmp_path):
    ca, crt, key = sim_registry.certificates("10.1.2.1", tmp_path)
    check = subprocess.run(["openssl", "verify", "-CAfile", str(ca), "-verify_ip", "10.1.2.1", str(crt)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    ca_bytes = ca.read_bytes()
    sim_registry.certificates("10.1.3.1", tmp_path)  # another gateway: a new server certificate, the same CA
    assert ca.read_bytes() == ca_bytes
    moved = subprocess.run(["openssl", "verify", "-CAfile", str(ca), "-verify_ip", "10.1.3.1", str(crt)],
                           capture_output=True, text=True, check=False)
    assert moved.returncode == 0, moved.stderr
    old = subprocess.run(["openssl", "verify", "-CAfile", str(ca), "-verify_ip", "10.1.2.1", str(crt)],
                         capture_output=True, text=True, check=False)
    assert old.returncode != 0


def test_choose_path_auto_takes_the_registry_only_for_an_update():
    assert sim_registry.choose_path("auto", nodes_hold_earlier=False) == "tarball"
    assert sim_registry.choose_path("auto", nodes_hold_earlier=True) == "registry"
    assert sim_registry.choose_path("tarball", nodes_hold_earlier=True) == "tarball"
    assert sim_registry.choose_path("registry", nodes_hold_earlier=False) == "registry"
    with pytest.raises(ValueError, match="ROLLOUT8_SIM_IMAGE_PATH='ftp'"):
        sim_registry.choose_path("ftp", nodes_hold_earlier=False)


def test_stop_without_a_registry_is_a_no_op(tmp_path: Path):
    (tmp_path / "registry.pid").write_text("1")  # pid 1 is not the registry: never signalled
    sim_registry.stop(tmp_path)
    assert not (tmp_path / "registry.pid").exists()


def test_push_mode_stages_a_first_push_and_sends_an_update_straight():
    layers = [("sha256:base", 6_500_000_000), ("sha256:stack", 40_000_000), ("sha256:bundle", 3_000_000)]
    assert sim_registry.push_mode(layers, set()) == "staged"  # GBs: uncompressed, no gzip on 2 cores
    assert sim_registry.push_mode(layers, {"sha256:base", "sha256:stack"}) == "direct"  # a few MB to gzip
    assert sim_registry.push_mode(layers, {"sha256:stack", "sha256:bundle"}) == "staged"  # the big one is missing
    assert sim_registry.push_mode(layers, {d for d, _ in layers}) == "direct"  # nothing to send


def test_an_earlier_version_is_another_key_of_the_repository_loaded_or_pulled():
    import sim_demo

    image = "rollout8/sim-train:new"
    assert sim_demo.is_earlier("rollout8/sim-train:old", image)
    assert sim_demo.is_earlier("172.23.0.1:5443/rollout8/sim-train:old", image)
    assert not sim_demo.is_earlier("rollout8/sim-train:new", image)
    assert not sim_demo.is_earlier("172.23.0.1:5443/rollout8/sim-train:new", image)
    assert not sim_demo.is_earlier("rollout8/sim-node:old", image)
    assert not sim_demo.is_earlier("other/rollout8/sim-trainer:old", image)


def test_pulls_of_every_layer_are_bounded_by_the_disk_as_loads(monkeypatch):
    import sim_demo

    monkeypatch.setattr(sim_demo, "free_gb", lambda path: 30.0)
    assert sim_demo.throttle_for(7.0, 3) == 2  # 28 GB of room: two pulls of a 7 GB layer at once (14 GB each)
    monkeypatch.setattr(sim_demo, "free_gb", lambda path: 60.0)
    assert sim_demo.throttle_for(7.0, 3) == 3
    monkeypatch.setattr(sim_demo, "free_gb", lambda path: 10.0)
    with pytest.raises(SystemExit, match="only 10.0 GB are"):
        sim_demo.throttle_for(7.0, 3, name="host:5443/rollout8/sim-train:k")
