"""A run summary's theory-against-measured table as rows of text: what report.html and
TensorBoard's text summary both show."""

from __future__ import annotations

from ppx.measure.metrics import over_ideal


def _ms(s) -> str:
    return "" if s is None else f"{s * 1e3:.3f} ms"


def _pct(f) -> str:
    return "" if f is None else f"{f:.1%}"


def summary_rows(summary: dict) -> list[list[str]]:
    """Theory against measured, as text: [what, measured, predicted, theory]. A prediction
    (from the timeline steps' action costs) sits beside what those steps measured, the theory
    beside the median over all steps."""
    pred = summary.get("predicted") or {}
    err = summary.get("prediction_error") or {}
    left = pred.get("stalled_steps_left_out") or []
    steps = f"timeline steps but {len(left)} stalled, mean" if left else "timeline steps, mean"
    rows = [["step time (median)", _ms(summary.get("step_time_s")), "", _ms(summary.get("ideal_step_time_s"))]]
    if pred:
        measured = _ms(summary.get("measured_step_time_s"))
        rows.append([f"step time ({steps})", measured, f"{_ms(pred.get('step_time_s'))}", ""])
        rows.append(["measured against predicted", f"{err.get('step_time', 0):+.1%}", "", ""])
    b, b_pred = summary.get("bubble_fraction"), pred.get("bubble_fraction")
    timeline = summary.get("measured_bubble_fraction")
    apart = timeline is not None  # (a run without one: the prediction beside the median)
    rows.append(
        [
            "bubble, idle / step time",
            _pct(b),
            "" if apart else _pct(b_pred),
            _pct(summary.get("bubble_fraction_theory")),
        ]
    )
    if apart:
        rows.append([f"bubble, idle / step time ({steps})", _pct(timeline), _pct(b_pred), ""])
    rows.append(
        [
            "bubble, idle / busy time",
            _pct(summary.get("bubble_over_ideal")),
            "" if apart else _pct(over_ideal(b_pred)),
            _pct(summary.get("bubble_over_ideal_theory")),
        ]
    )
    if apart:
        rows.append(
            [
                "bubble, idle / busy time (timeline steps, of the mean)",
                _pct(over_ideal(timeline)),
                _pct(over_ideal(b_pred)),
                "",
            ]
        )
    tput = summary.get("throughput_samples_per_s")
    rows.append(["throughput", "" if tput is None else f"{tput:.1f} samples/s", "", ""])
    loss = next((x for x in reversed(summary.get("losses") or []) if x is not None), None)
    rows.append(["final loss", "" if loss is None else f"{loss:.6f}", "", ""])
    return rows


def setup_words(summary: dict) -> str:
    """What a run's header adds beyond its pipeline: ', 2 replicas (4 processes), bf16,
    recompute selective', each only where it is not the plain default ('' for none)."""
    words = []
    d = summary.get("data_parallel") or 1
    if d > 1:
        words.append(f"{d} replicas ({summary.get('processes')} processes)")
    if summary.get("dtype") not in (None, "fp32"):
        words.append(str(summary["dtype"]))
    if summary.get("recompute") not in (None, "none"):
        words.append(f"recompute {summary['recompute']}")
    return "".join(f", {w}" for w in words)
