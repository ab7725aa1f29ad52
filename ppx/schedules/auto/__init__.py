"""The automatic zero-bubble schedule (`zb_auto`): `auto_zb` builds it for given per-stage
costs, a memory accounting (`accounting`) and a limit, from the list-scheduling pass
(`greedy_fill`), a fixed order's clock (`order_clock`), the ZB-shaped orders it also tries
(`zb_family`) and their local search (`refine`). Imports only the rooms below it."""
