"""One pure function per schedule family, `(p, m[, v]) -> Schedule` of compute actions only:
`basic` (naive, GPipe, 1F1B), `interleaved`, `looped_bfs`, `zero_bubble` (ZB-H1, ZB-H2),
`interleaved_zb`, `zbv`, `dualpipev`. Imports only `ir`."""
