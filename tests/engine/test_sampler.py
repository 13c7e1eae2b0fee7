"""FlashRL 1.0.3's replacement of vLLM V1's Sampler.forward (stack-facts trap 11), measured in a real engine.

FlashRL's head skips the replacement for vLLM >= 0.10.1 (FlashRL commit 4d84681: "upstreamed" as vLLM's
`logprobs_mode`). verl at our pin sets no `logprobs_mode`, so vLLM returns the sampled tokens' log-probs *before*
temperature ("raw_logprobs"), while verl's actor recomputes them from logits divided by the rollout temperature
(dp_actor.py: `logits.div_(temperature)`); TIS (`algorithm.rollout_correction`) compares the two. This test puts
numbers on both: the int8 engine's rollout log-probs against the bf16 actor's recompute at temperature 0.7 and 1.0,
with the replacement (what our int8 rollouts run) and with vLLM's own sampler (what FlashRL's head would leave).

The decision it supports: keep FlashRL 1.0.3's replacement at our pins (4d84681 is not backported), and refuse in
`rollout8 check` the sampling options the replacement drops (shown here for repetition_penalty).
"""

from __future__ import annotations

import pytest
from engine_runs import SAMPLES

# int8 rollout vs bf16 actor on the tiny-engine model: quantization noise only (measured 1e-2 scale; see the note)
MATCH = 0.1


@pytest.fixture(scope="module")
def actor(pair):
    """verl's actor side: the bf16 checkpoint in float32, log-probs of given tokens at a temperature."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(pair.bf16), torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()

    def logprobs(prompt: list[int], response: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        logits = logits / temperature  # verl's dp_actor: logits.div_(temperature), then log_softmax
        return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()

    return logprobs


def worst_gap(step: dict, actor) -> float:
    temperature = step["params"]["temperature"]
    samples = zip(step["prompts"], step["tokens"], step["logprobs"], strict=True)
    gaps = [abs(a - b) for prompt, tokens, rollout in samples
            for a, b in zip(rollout, actor(prompt, tokens, temperature), strict=True)]
    return max(gaps)


def test_rollout_logprobs_match_the_actor_only_with_flashrls_sampler(int8_run, actor):
    gaps = {name: worst_gap(int8_run.ok(name), actor) for name in ("t0.7-flashrl", "t1.0-flashrl", "t0.7-stock",
                                                                    "t1.0-stock")}
    for name in gaps:
        expected = "flashrl" if name.endswith("-flashrl") else "stock"
        assert int8_run.ok(name)["sampler"] == expected, name
    print("rollout log-prob vs bf16 actor recompute, max |diff|: "
          + ", ".join(f"{name} {gap:.4f}" for name, gap in gaps.items()))
    # at temperature 1.0 both samplers return what the actor recomputes (int8 noise only)
    assert gaps["t1.0-flashrl"] < MATCH and gaps["t1.0-stock"] < MATCH, gaps
    # at 0.7 FlashRL's replacement still does (temperature applied before the log-probs) ...
    assert gaps["t0.7-flashrl"] < MATCH, gaps
    # ... vLLM's own sampler at the pin does not: its log-probs are taken before temperature
    assert gaps["t0.7-stock"] > 5 * max(gaps["t0.7-flashrl"], MATCH / 5), gaps


def test_flashrls_sampler_drops_the_repetition_penalty(int8_run):
    """Why `rollout8 check` refuses [sampler] options for int8/hybrid runs: verl hands them to vLLM, FlashRL's
    replacement ignores them."""
    tokens = {name: int8_run.ok(name)["tokens"] for name in SAMPLES if name.startswith("greedy")}
    assert tokens["greedy-stock"] == tokens["greedy-flashrl"], "greedy decoding differs between the samplers"
    assert tokens["greedy-penalty-stock"] != tokens["greedy-stock"], "vLLM's own sampler applied no penalty"
    assert tokens["greedy-penalty-flashrl"] == tokens["greedy-flashrl"], "FlashRL's sampler applied the penalty"


def test_checks_table_of_sampling_params_is_vllms():
    """rollout8 check knows which rollout keys verl hands to SamplingParams: the table equals vLLM's fields here."""
    from vllm import SamplingParams

    from rollout8.runspec.check import SAMPLER_DROPPED
    from rollout8.runspec.verl_keys import VLLM_SAMPLING_PARAMS

    fields = {f for f in SamplingParams.__struct_fields__ if not f.startswith("_")}
    assert VLLM_SAMPLING_PARAMS == fields
    assert set(SAMPLER_DROPPED) <= fields
    for field, neutral in SAMPLER_DROPPED.items():  # each neutral value is vLLM's own default
        assert getattr(SamplingParams(), field) in (neutral, None, []), field
