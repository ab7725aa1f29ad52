"""zb_auto against the zero-bubble paper's own schedules on the paper's 12 settings.

Source: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241): the
settings of Table 3 with the profiled T_F, T_B, T_W and T_comm of its appendix (ms), and the
bubble rates of Table 5 (ZB-1p, ZB-2p; 1F1B, ZB-H1 and ZB-H2 too), transcribed by hand
(docs/benchmarks.md). Under the paper's cost (the longest stage span: a stage's first F start
to its last pass's end, a hand-off a fixed T_comm) and its memory accounting (F adds
M_B = 34h + 5as, I frees M_B - M_W, W frees M_W = 32h, s = 1024), zb_auto is built at ZB-1p's
limit (p M_B) and ZB-2p's (2p M_B) with ``cost="steady"`` and the fixed order's clock as judge.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

SEQ = 1024


@dataclass(frozen=True)
class Setting:
    model: str
    h: int
    a: int
    p: int
    m: int
    t_f: float
    t_b: float
    t_w: float
    t_comm: float
    paper: dict  # schedule -> Table 5's bubble rate

    @property
    def m_b(self) -> float:
        """Bytes per token and layer one F saves: 34h + 5as."""
        return 34 * self.h + 5 * self.a * SEQ

    @property
    def m_w(self) -> float:
        """Bytes per token and layer W frees: 32h."""
        return 32 * self.h


COLUMNS = ("1f1b", "zb_h1", "zb_h2", "zb_1p", "zb_2p")
_ROWS = [  # model, h, a, p, m, T_F, T_B, T_W, T_comm, then COLUMNS
    ("1.5B", 2304, 24, 8, 24, 18.522, 18.086, 9.337, 0.601, 0.2431, 0.1585, 0.1083, 0.1585, 0.0433),
    ("1.5B", 2304, 24, 8, 32, 18.513, 18.086, 9.331, 0.626, 0.1985, 0.1242, 0.0837, 0.1242, 0.0039),
    ("1.5B", 2304, 24, 8, 64, 18.546, 18.097, 9.321, 0.762, 0.1240, 0.0674, 0.0444, 0.0674, 0.0026),
    ("6.2B", 4096, 32, 8, 24, 29.718, 29.444, 19.927, 0.527, 0.2347, 0.1323, 0.0698, 0.1323, 0.0029),
    ("6.2B", 4096, 32, 8, 32, 29.802, 29.428, 19.530, 0.577, 0.1898, 0.1045, 0.0559, 0.1045, 0.0022),
    ("6.2B", 4096, 32, 8, 64, 29.935, 29.621, 19.388, 0.535, 0.1091, 0.0554, 0.0294, 0.0554, 0.0010),
    ("14.6B", 5120, 40, 16, 48, 11.347, 11.248, 8.132, 0.377, 0.2552, 0.1397, 0.0672, 0.1397, 0.0066),
    ("14.6B", 5120, 40, 16, 64, 11.307, 11.254, 8.101, 0.379, 0.2082, 0.1088, 0.0516, 0.1088, 0.0054),
    ("14.6B", 5120, 40, 16, 128, 11.325, 11.308, 8.109, 0.378, 0.1251, 0.0576, 0.0266, 0.0576, 0.0028),
    ("28.3B", 6144, 48, 32, 96, 10.419, 10.207, 7.715, 0.408, 0.2646, 0.1421, 0.0641, 0.1421, 0.0038),
    ("28.3B", 6144, 48, 32, 128, 10.408, 10.204, 7.703, 0.408, 0.2168, 0.1106, 0.0490, 0.1106, 0.0029),
    ("28.3B", 6144, 48, 32, 256, 10.402, 10.248, 7.698, 0.460, 0.1352, 0.0594, 0.0257, 0.0594, 0.0018),
]
SETTINGS = [Setting(*row[:9], dict(zip(COLUMNS, row[9:]))) for row in _ROWS]


def bubble(s: Setting, rows) -> float:
    """The paper's bubble rate of compute order ``rows``: (cost - m (T_F + T_B + T_W)) / cost."""
    from ppx.schedules.auto.auto_zb import stage_times
    from ppx.schedules.auto.order_clock import order_cost
    from ppx.schedules.sim.costs import Costs

    t = stage_times(s.p, Costs(s.t_f, s.t_b, s.t_w, p2p=s.t_comm))
    cost = order_cost(rows, s.m, t, "steady")
    return (cost - s.m * (s.t_f + s.t_b + s.t_w)) / cost


def zb_auto(s: Setting, microbatches_of_memory: float, share: float | None = None):
    """(zb_auto's order at a limit of ``microbatches_of_memory`` M_B per stage, seconds to find
    it); ``share``: what an I frees (default the paper's (M_B - M_W) / M_B; ppx's runtime: 0)."""
    from ppx.schedules.auto.auto_zb import auto_zb
    from ppx.schedules.sim.costs import Costs

    start = time.perf_counter()
    sched = auto_zb(
        s.p,
        s.m,
        Costs(s.t_f, s.t_b, s.t_w, p2p=s.t_comm),
        act_bytes=[s.m_b] * s.p,
        mem_limit=microbatches_of_memory * s.m_b,
        input_share=(s.m_b - s.m_w) / s.m_b if share is None else share,
        cost="steady",
        judge="clock",
    )
    return sched, time.perf_counter() - start


def table() -> list[dict]:
    """One row per setting: zb_auto's bubble and seconds at p and 2p M_B, and the paper's."""
    out = []
    for s in SETTINGS:
        row = {"model": s.model, "p": s.p, "m": s.m, "paper": s.paper}
        for k, name in ((1, "1p"), (2, "2p")):
            sched, took = zb_auto(s, k * s.p)
            row[name] = {"bubble": bubble(s, sched.actions), "seconds": took}
        out.append(row)
    return out


def curve(s: Setting = SETTINGS[0], share: float = 0.0) -> list[dict]:
    """zb_auto's bubble from p to 6p M_B per stage (steps of p) with I freeing ``share`` (ppx's
    runtime: 0, its graph kept until W), under the paper's cost."""
    out = []
    for k in range(1, 7):
        sched, took = zb_auto(s, k * s.p, share)
        out.append({"microbatches": k * s.p, "bubble": bubble(s, sched.actions), "seconds": took})
    return out


def markdown(rows: list[dict]) -> list[str]:
    """The table as markdown lines."""
    lines = [
        "| model | p | m | ZB-1p (paper) | zb_auto at p M_B | s | ZB-2p (paper) | zb_auto at 2p M_B | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['p']} | {r['m']} | {r['paper']['zb_1p']:.4f} | {r['1p']['bubble']:.4f} | "
            f"{r['1p']['seconds']:.1f} | {r['paper']['zb_2p']:.4f} | {r['2p']['bubble']:.4f} | {r['2p']['seconds']:.1f} |"
        )
    return lines


if __name__ == "__main__":
    print("\n".join(markdown(table())))
