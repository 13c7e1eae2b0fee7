"""The cluster probe job's per-node judgement (the Ray side runs in tests/cluster)."""

from __future__ import annotations

from rollout8.node.probe_job import artifact_checksums, judge_node, parse_activation

CFG = "/var/lib/rollout8/runs/x/flashrl.yaml"
PLAN = {"flashrl": True, "accelerator": "cpu", "quantization": "int8",
        "node_paths": {"flashrl": CFG, "profile": "/r/profile.pt"}, "sha256": {"profile": "aa"}}


def report(env=None, sums=None, fields=None, rc=0, vq_max=0):
    return {
        "hostname": "n1",
        "env": {} if env is None else env,
        "checksums": {"profile": "aa"} if sums is None else sums,
        "activation": {"returncode": rc, "fields": {"config": CFG, "vllm_hooked": "no-vllm"} if fields is None
                       else fields, "tail": []},
        "verify_quant": {"returncode": 0 if vq_max <= 1 else 1,
                         "report": {"passed": vq_max <= 1, "summary": {"max_lsb": vq_max}}, "tail": []},
    }


def checks(rep, plan=PLAN, head=None):
    return {name: ok for name, ok, _ in judge_node(rep, plan, {"profile": "aa"} if head is None else head)}


def test_all_green():
    assert checks(report(env={"FLASHRL_CONFIG": CFG})) == {
        "env": True, "artifacts": True, "activation": True, "verify-quant": True}


def test_flashrl_config_missing_in_worker_is_red():
    assert checks(report(env={}))["env"] is False


def test_wrong_config_path_is_red():
    assert checks(report(env={"FLASHRL_CONFIG": "flashrl.yaml"}))["env"] is False


def test_checksum_differs_from_head_or_controller():
    assert checks(report(env={"FLASHRL_CONFIG": CFG}, sums={"profile": "bb"}))["artifacts"] is False
    assert checks(report(env={"FLASHRL_CONFIG": CFG}, sums={"profile": "bb"}), head={"profile": "bb"})[
        "artifacts"] is False  # the head agrees but the controller's checksum does not


def test_no_vllm_is_only_accepted_on_cpu():
    npu = dict(PLAN, accelerator="npu")
    assert checks(report(env={"FLASHRL_CONFIG": CFG}), plan=npu)["activation"] is False
    hooked = {"config": CFG, "vllm_hooked": "yes"}
    assert checks(report(env={"FLASHRL_CONFIG": CFG}, fields=hooked), plan=npu)["activation"] is True


def test_quantization_beyond_one_lsb_is_red():
    assert checks(report(env={"FLASHRL_CONFIG": CFG}, vq_max=2))["verify-quant"] is False


def test_parse_activation_line():
    line = "2026 INFO rollout8: flash_rl activation: config=/a/b.yaml fn=int8 vllm_hooked=no-vllm pid=7"
    assert parse_activation("x\n" + line)["vllm_hooked"] == "no-vllm"
    assert parse_activation("nothing") is None


def test_artifact_checksums(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.bin").write_bytes(b"x")
    sums = artifact_checksums({"bf16": str(tmp_path / "m"), "gone": str(tmp_path / "nope")})
    assert sums["gone"] == "missing" and len(sums["bf16/a.bin"]) == 64


def test_cann_environment_judged_where_cann_is_installed():
    from rollout8.node.cann_env import cann_env, judge_cann_env

    def exists(path):
        return path == "/usr/local/Ascend/ascend-toolkit/set_env.sh"

    loaded = {"ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/ascend-toolkit/latest",
              "ASCEND_OPP_PATH": "/usr/local/Ascend/ascend-toolkit/latest/opp",
              "LD_LIBRARY_PATH": "/usr/local/Ascend/ascend-toolkit/latest/lib64"}
    ok, line = judge_cann_env(cann_env(loaded, exists), "npu")
    assert ok and line.startswith("CANN environment loaded: ASCEND_TOOLKIT_HOME=")
    ok, line = judge_cann_env(cann_env({}, exists), "npu")  # a bare `docker exec`: set_env.sh never sourced
    assert not ok and "ASCEND_TOOLKIT_HOME, ASCEND_OPP_PATH unset" in line and "rollout8-entrypoint" in line
    ok, line = judge_cann_env(cann_env({**loaded, "LD_LIBRARY_PATH": ""}, exists), "npu")
    assert not ok and "LD_LIBRARY_PATH without the toolkit" in line
    assert judge_cann_env(cann_env({}, lambda p: False), "cpu")[0] is True  # the simulated CPU nodes
    assert judge_cann_env(cann_env({}, lambda p: False), "npu")[0] is False
    rep = dict(report(env={"FLASHRL_CONFIG": CFG}), cann=cann_env({}, exists))
    assert checks(rep)["cann"] is False


# ---------------------------------------------------------------------------------------------- NPU visibility
NOSET = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
NO_TORCH_NPU = {"npu_available": None, "npu_count": None}


def seen(environ, ask=NO_TORCH_NPU):
    from rollout8.node.npu_visibility import npu_visibility

    return npu_visibility(environ, ask=lambda: dict(ask))


def test_npu_visibility_green_when_ray_was_started_with_the_noset_flag():
    from rollout8.node.npu_visibility import judge_npu_visibility

    ok, line = judge_npu_visibility(seen({NOSET: "1"}), "the driver", "cpu")
    assert ok and "judged from the environment" in line
    rep = dict(report(env={"FLASHRL_CONFIG": CFG}), npu_visibility=seen({NOSET: "1"}))
    assert checks(rep)["npu-visible"] is True


def test_npu_visibility_red_where_ray_hid_or_renumbered_the_npus():
    """ray #59063: without the flag the job supervisor's child (the entrypoint) gets ASCEND_RT_VISIBLE_DEVICES=''
    and a worker holding NPUs gets its ids; both are red, naming the variable to export before `ray start`."""
    from rollout8.node.npu_visibility import judge_npu_visibility

    hidden_ok, hidden = judge_npu_visibility(seen({"ASCEND_RT_VISIBLE_DEVICES": ""}), "the driver", "cpu")
    assert not hidden_ok and "hid every NPU" in hidden and f"export {NOSET}=1" in hidden
    renumbered_ok, renumbered = judge_npu_visibility(seen({"ASCEND_RT_VISIBLE_DEVICES": "0"}), "a worker", "npu")
    assert not renumbered_ok and "ASCEND_RT_VISIBLE_DEVICES=0 (set by Ray)" in renumbered
    # the flag alone is not enough where the empty value is still there (exported after Ray hid them)
    assert not judge_npu_visibility(seen({NOSET: "1", "ASCEND_RT_VISIBLE_DEVICES": ""}), "x", "cpu")[0]
    rep = dict(report(env={"FLASHRL_CONFIG": CFG}), npu_visibility=seen({"ASCEND_RT_VISIBLE_DEVICES": "0"}))
    assert checks(rep)["npu-visible"] is False


def test_npu_visibility_asks_torch_npu_where_it_is_installed():
    from rollout8.node.npu_visibility import judge_npu_visibility

    assert judge_npu_visibility(seen({NOSET: "1"}, {"npu_available": True, "npu_count": 8}), "w", "npu") == (
        True, f"torch.npu.is_available() in w: 8 NPU(s), {NOSET}=1")
    ok, line = judge_npu_visibility(seen({NOSET: "1"}, {"npu_available": False, "npu_count": 0}), "w", "npu")
    assert not ok and "torch.npu.is_available() is False" in line
    # an NPU run needs torch_npu; its absence is red there, not a pass judged from the environment
    assert not judge_npu_visibility(seen({NOSET: "1"}), "w", "npu")[0]


# ---------------------------------------------------------------------------------------------- the one parser
def _verdict_line(ok=True, nodes=("n1", "n2"), red=()):
    import json

    from rollout8.node.probe_job import VERDICT_PREFIX

    body = {"ok": ok and not red, "nodes": {f"10.0.0.{i}": {"hostname": h, "ok": h not in red,
                                                            "checks": [{"check": "env", "ok": h not in red,
                                                                        "detail": ""}]}
                                           for i, h in enumerate(nodes)}}
    return VERDICT_PREFIX + json.dumps(body)


def test_read_verdict_takes_the_last_verdict_and_skips_a_cut_line():
    from rollout8.node.probe_job import VERDICT_PREFIX, read_verdict

    log = "\n".join(["noise", _verdict_line(red=("n2",)), _verdict_line(), VERDICT_PREFIX + '{"ok": true, "no'])
    verdict = read_verdict(log)
    assert verdict is not None and verdict["ok"] is True
    assert read_verdict("probe-job: 3 nodes\nno verdict here\n") is None


def test_judge_verdict_is_green_only_with_every_node_green_and_present():
    from rollout8.node.probe_job import judge_verdict, read_verdict

    assert judge_verdict(read_verdict(_verdict_line()), 2) == (True, "probe job GREEN on all 2 nodes")
    ok, line = judge_verdict(read_verdict(_verdict_line(red=("n2",))), 2)
    assert not ok and "RED on n2" in line
    ok, line = judge_verdict(read_verdict(_verdict_line()), 3)
    assert not ok and "2 of 3 nodes reported" in line
    ok, line = judge_verdict(None, 3)
    assert not ok and "no verdict" in line


def test_probe_job_judge_cli_prints_one_json_object_and_exits_by_the_verdict(tmp_path, capsys):
    import json

    from rollout8.cli import main

    log = tmp_path / "driver.log"
    log.write_text(_verdict_line(red=("n1",)) + "\n")
    assert main(["probe-job", "--judge", str(log), "--nodes", "2"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "RED on n1" in out["line"] and len(out["nodes"]) == 2
    log.write_text(_verdict_line() + "\n")
    assert main(["probe-job", "--judge", str(log), "--nodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["line"] == "probe job GREEN on all 2 nodes"
