"""Imported for its effect by the patched `verl/__init__.py`, right after `import flash_rl` (patches/verl/0001-*).

Runs rollout8's FlashRL activation once per process: transfer_to_npu on NPU machines, FLASHRL_CONFIG refused
unless absolute and present, one `rollout8: flash_rl activation: ...` log line. See rollout8.node.activation;
import that module, not this one, to use the functions without side effects.
"""

from .node.activation import activate

STATE = activate()
