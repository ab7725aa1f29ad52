"""The action language: `Action` and its ops (`action`), the per-rank lists with their stage
placement (`schedule`), the integer codes the compiled forms use (`codes`), and structural
facts read off a schedule (`structure`). Imports nothing else of `ppx.schedules`."""
