"""Choosing and checking a placement of sends and receives: `validate` (a schedule runs on
its transport, without deadlock) and `placement` (the placement that runs: Megatron's or the
lockstep dry run). Imports only the rooms below it."""
