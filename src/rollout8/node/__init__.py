"""What runs on a node: FlashRL activation (imported by the patched verl), the patch applier, doctor,
the cluster probe job and the NPU acceptance suite's judgements.

Imports the base modules, rollout8.quant and rollout8.runspec (the plan model); never results/commands.
"""
