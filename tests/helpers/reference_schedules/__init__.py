"""The pre-speedup reference: ppx.schedules' simulator, transports, program compiler,
placement, validation and lowering as they were before the event-driven simulator (frozen
copies, commit 1689fe9), for tests/unit/test_simulate_speedup.py to hold the fast code
against. Test-only; never edit to follow ppx: these files are the old answers."""
