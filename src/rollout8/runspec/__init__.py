"""The run spec and everything derived from it: the spec model, verl's keys, the FlashRL config, render,
check and the deployment plan Ansible reads (plus the tiny test data set a spec can point at).

Imports the base modules and rollout8.quant (model layout and checkpoint checks); never node/results/commands.
"""
