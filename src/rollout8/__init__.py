"""rollout8: GRPO with int8 FlashRL rollouts on Ascend NPU clusters, deployed in two commands."""

__version__ = "0.1.0"
