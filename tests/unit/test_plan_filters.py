"""The plan role's rules (ansible/plugins/filter/rollout8_plan.py) on plain dicts and files: which specs the head
plans, and the volumes of the training container that plans them there. The wiring: tests/cluster/test_demo_runtime
(a shared-storage spec whose models only the nodes have)."""

from __future__ import annotations

from rollout8_plan import rollout8_head_plan_volumes, rollout8_plan_missing_ok, rollout8_spec_shared_storage

PLAN = {"node_paths": {"bf16": "/m/r/tiny/bf16", "int8": "/m/r/tiny/int8", "profile": "/m/r/tiny/profile.pt",
                       "train": "/m/r/data/train.parquet"},
        "mounts": ["/m/r/data/train.parquet", "/m/r/tiny/bf16", "/m/r/tiny/int8", "/m/r/tiny/profile.pt"]}


def test_only_a_shared_storage_spec_is_planned_on_the_head(tmp_path):
    spec = tmp_path / "run.yaml"
    for text, want in (("deploy:\n  shared_storage: true\n", True), ("deploy:\n  shared_storage: false\n", False),
                       ("deploy:\n  root: /x\n", False), ("name: x\n", False), ("- a list\n", False),
                       ("deploy: {shared_storage: yes please\n", False),
                       ("deploy:\n  shared_storage: 'true'\n", False)):
        spec.write_text(text)
        assert rollout8_spec_shared_storage(str(spec)) is want, text
    assert rollout8_spec_shared_storage(str(tmp_path / "missing.yaml")) is False


def test_the_head_plan_mounts_models_read_only_and_the_profiles_directory_when_it_may_write_it():
    volumes = rollout8_head_plan_volumes(PLAN, "/var/lib/rollout8/plan/r", True)
    pairs = volumes[1::2]
    assert volumes[::2] == ["-v"] * len(pairs)
    assert pairs[0] == "/var/lib/rollout8/plan/r:/var/lib/rollout8/plan/r"
    assert "/m/r/tiny/bf16:/m/r/tiny/bf16:ro" in pairs and "/m/r/data/train.parquet:/m/r/data/train.parquet:ro" in pairs
    # the profile's directory, writable, never a bind of the (missing) profile itself
    assert "/m/r/tiny:/m/r/tiny" in pairs and not any(p.startswith("/m/r/tiny/profile.pt") for p in pairs)
    # nothing written: every model path read-only, the profile too
    pairs = rollout8_head_plan_volumes(PLAN, "/w", False)[1::2]
    assert pairs == ["/w:/w"] + [f"{m}:{m}:ro" for m in PLAN["mounts"]]


def test_preflight_lets_the_profile_be_missing_only_when_the_head_makes_it():
    assert rollout8_plan_missing_ok(PLAN, True) == ["/m/r/tiny/profile.pt"]
    assert rollout8_plan_missing_ok(PLAN, False) == []
    assert rollout8_plan_missing_ok({"node_paths": {}}, True) == []
