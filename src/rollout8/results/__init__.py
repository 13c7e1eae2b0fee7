"""What reads a run's results: the per-rank int8 verdict from Ray/verl/FlashRL logs, verl's metric logs
(console, JSONL, TensorBoard event files) and the bf16-vs-int8 report.

Imports only the base modules; never quant/runspec/node/commands.
"""
