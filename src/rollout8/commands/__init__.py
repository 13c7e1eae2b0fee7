"""The command line's edge: one module per `rollout8 <command>` (dashes become underscores), each with
`add_arguments(parser)` and `run(args) -> int`: argument parsing, printing and exit codes only; the work is in
the library layers. No library module imports from here.
"""
