"""The automatic zero-bubble schedule (`zb_auto`): `auto_zb` builds it for given per-stage
costs and a memory limit, from the list-scheduling pass (`greedy_fill`), a fixed order's clock
(`order_clock`) and the ZB-shaped orders it also tries (`zb_family`). Imports only the rooms
below it."""
