"""Rank 0's report of a run: metrics.jsonl as steps come in, progress lines, TensorBoard and
W&B scalars, then summary.json, timeline.json and (``logging.report``) timeline.png,
breakdown.png and report.html."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ppx.config.paired import entry_config, entry_units, floors
from ppx.config.resolve import sum_order_note
from ppx.errors import UserError
from ppx.files import write_json, write_whole
from ppx.measure.metrics import SLOW_STEP, noisy_note, over_ideal, run_summary, stalled_steps, step_breakdown
from ppx.measure.paired import add_kept, kept_fields, paired_lines, paired_step, paired_summary
from ppx.measure.spans import first_timeline_step
from ppx.measure.theory import run_theory
from ppx.report.scalars import step_scalars
from ppx.report.split_ways import split_line
from ppx.report.units_line import flops_shares, units_line
from ppx.schedules.ir.schedule import Schedule
from ppx.units import byte_unit, count

FAILED_CLOSE_S = 5.0  # a run that failed after its summary: how long its sinks are awaited


class RunReport:
    def __init__(
        self, cfg, schedule: Schedule, run_dir: Path, world: int, backend="gloo", device="cpu", cpus: list | None = None
    ):
        """``cpus``: the CPUs W&B's writer may use (the job's, not rank 0's own; None: rank 0's)."""
        self.cfg, self.schedule, self.run_dir, self.world = cfg, schedule, run_dir, world
        self.backend, self.device = backend, device
        self.held_against = run_theory(cfg, schedule, backend)
        self.theory = self.held_against.bubble_fraction
        self.steps: list[dict] = []
        self.losses: list = []
        self.skipped = 0  # optimizer steps skipped on an fp16 overflow
        self.timeline: list[dict] = []
        self.paired: list[list] = []  # per step, run.paired's entries' (step time, loss)
        self.paired_kept: list[dict] = []  # per entry, its actions' seconds and split ways (`add_kept`)
        self.metrics = open(run_dir / "metrics.jsonl", "a")
        self.page: Path | None = None  # report.html, once drawn
        self.sinks = []
        if cfg.logging.tensorboard:
            from ppx.report.tensorboard import TensorBoardSink

            self.sinks.append(TensorBoardSink(run_dir))
        if cfg.logging.wandb.mode != "disabled":
            from ppx.report.wandb_sink import WandbSink

            self.sinks.append(WandbSink(cfg, run_dir, OmegaConf.to_container(OmegaConf.structured(cfg)), cpus))

    def add_step(self, step: int, records: list[dict]) -> None:
        loss = next((r["loss"] for r in records if r["loss"] is not None), None)
        m = step_breakdown(records, self.schedule.stage_to_rank)
        skipped = any(r.get("optimizer_stepped") is False for r in records)  # fp16: an overflow on any rank
        self.skipped += skipped
        line = {
            "step": step,
            "loss": loss,
            **({"optimizer_skipped": skipped} if self.cfg.train.dtype == "fp16" else {}),
            **m,
            "bubble_fraction_theory": self.theory,
            "bubble_over_ideal_theory": over_ideal(self.theory),
        }
        if "paired" in records[0]:  # run.paired: each entry's step beside this one
            self.paired.append(paired_step(records))
            skips = add_kept(records, self.paired_kept)
            line["paired"] = [
                {"step_time_s": t, "loss": x, **({"optimizer_skipped": s} if s is not None else {})}
                for (t, x), s in zip(self.paired[-1], skips)
            ]
        self.metrics.write(json.dumps(line) + "\n")
        self.metrics.flush()
        self.steps.append(m)
        self.losses.append(loss)
        if step >= first_timeline_step(self.cfg) and any("spans" in r for r in records):
            # {"step", "step_time_s", "ranks": {rank: [Span, ...]}}, Spans on rank 0's clock
            self.timeline.append(
                {
                    "step": step,
                    "step_time_s": m["step_time_s"],
                    "ranks": {r["rank"]: r["spans"] for r in records if "spans" in r},
                }
            )
        scalars = step_scalars(line, self.cfg.train.batch_size)
        for sink in self.sinks:
            sink.step(step, scalars)
        every = self.cfg.logging.progress_every
        if every and ((step + 1) % every == 0 or step + 1 == self.cfg.train.steps):
            msg = f"[{self.cfg.run.name}] step {step} ({step + 1}/{self.cfg.train.steps})"  # step: as in the files and traces
            if loss is not None:
                msg += f"  loss {loss:.6f}"
            msg += f"  step {m['step_time_s']:.4f} s"
            if "bubble_fraction" in m:
                msg += f"  bubble {m['bubble_fraction']:.1%}"
                if self.theory is not None:
                    msg += f" (theory {self.theory:.1%})"
                msg += " of the step"
            if skipped:
                msg += "  (fp16 overflow: optimizer step skipped, loss scale halved)"
            print(msg, flush=True)

    def finish(self) -> None:
        self.metrics.close()
        for sink in self.sinks:  # (an offline W&B starts now, beside the report's drawing)
            sink.start()
        cfg, sched = self.cfg, self.schedule
        summary = {
            "status": "completed",
            "experiment": cfg.run.name,
            "schedule": cfg.pipeline.schedule,
            "stages": sched.num_stages,
            "microbatches": sched.num_microbatches,
            "world_size": self.world,
            "data_parallel": cfg.parallel.data,
            "processes": self.world * cfg.parallel.data,
            "device": self.device,
            "backend": self.backend,
            "steps": cfg.train.steps,
            "batch_size": cfg.train.batch_size,
            "model": cfg.model.kind,
            "dtype": cfg.train.dtype,
            "recompute": cfg.train.recompute,  # full: each B (or I) re-runs its stage's forward first
            "virtual_stages": sched.stages_per_rank,  # a CSV's own, which the config does not say
            "units_per_stage": self._units(),  # the split the run ran (pipeline.balance's, or the explicit one)
            "losses": self.losses,
            "step_times_s": [s["step_time_s"] for s in self.steps],
            **run_summary(self.steps),
            "bubble_fraction_theory": self.theory,
            "bubble_over_ideal_theory": over_ideal(self.theory),
            "bubble_theory_basis": self.held_against.basis,
            "idle_fraction_theory_by_rank": self.held_against.idle_fraction_by_rank,
            "ideal_step_time_s": self.held_against.ideal_step_time_s,
            "bubble_normalisation": "bubble_fraction = idle / step time; bubble_over_ideal = idle / busy time",
        }
        summary["throughput_samples_per_s"] = cfg.train.batch_size / summary["step_time_s"]
        if cfg.train.dtype == "fp16":
            summary["optimizer_steps_skipped"] = self.skipped
        if summary["ideal_step_time_s"]:
            summary["step_time_over_ideal"] = summary["step_time_s"] / summary["ideal_step_time_s"]
        split = {
            k: v for r in (self.steps[0]["ranks"] if self.steps else []) for k, v in r.get("split_backward", {}).items()
        }
        if split:  # stage -> how its split backward got its weight gradients (train.split_backward)
            summary["split_backward"] = dict(sorted(split.items(), key=lambda kv: int(kv[0])))
        if self.timeline:
            summary.update(self._prediction(summary))
        summary.update(self._memory_prediction(summary))
        unordered = _said_of_order(sum_order_note, cfg)
        if unordered:  # a CSV of one's own: its losses may differ from every family's by rounding
            summary["sums_out_of_order"] = unordered
        if self.paired:  # run.paired: each entry's steps against the run's beside them
            times = [s["step_time_s"] for s in self.steps]
            entries = list(cfg.run.paired)
            summary["paired"] = paired_summary(entries, times, self.losses, self.paired, floors(cfg))
            for k, (entry, row) in enumerate(summary["paired"].items()):  # the split each ran (an entry may change it)
                row["units_per_stage"] = entry_units(cfg, entry)
                who = ["run"] if summary.get("sums_out_of_order") else []
                who += ["entry"] if _said_of_order(sum_order_note, entry_config(cfg, entry)) else []
                if who:  # (their losses may differ by rounding: said beside a difference)
                    row["sums_out_of_order"] = who
                row.update(kept_fields(self.paired_kept[k] if k < len(self.paired_kept) else {}))
            for line in paired_lines(summary["paired"]):
                print(line, flush=True)
        shares = flops_shares(cfg, summary["units_per_stage"])
        if shares is not None:  # the split the run ran, and why (llama, hf, module: their units weigh apart)
            summary["flops_share_per_stage"] = shares
            print(units_line(cfg, summary["units_per_stage"], shares), flush=True)
        ways = split_line(summary)
        if ways:
            print(ways, flush=True)
        noisy = noisy_note("this run", summary.get("step_times_s") or [])
        if noisy:  # (a busy machine: its steps and bubble hold its stalls)
            print(f"ppx: {noisy}", flush=True)
        write_json(self.run_dir / "summary.json", summary)
        pictures = cfg.logging.report
        if self.timeline:
            self._write_timeline(pictures)
        self.page = self._draw(summary) if pictures else None
        for sink in self.sinks:
            sink.finish(summary, self.run_dir)

    def close(self, completed: bool = True) -> None:
        """The sinks' ends awaited (W&B's writer: once the other ranks are released, so that
        none waits on it), then the run's last lines; a run that failed after `finish`
        (``completed=False``): the sinks given a few seconds, and no lines (the failure's say it)."""
        cfg = self.cfg
        for sink in self.sinks:
            sink.close(None if completed else FAILED_CLOSE_S)
        if not completed:
            return
        if self.page is not None:
            print(f"ppx: report: {self.page}", flush=True)
        if not cfg.instrument.timers:  # say why the bubble, timeline and prediction are missing
            print("ppx: instrument.timers=false: no per-action times, so no bubble, timeline or prediction", flush=True)
        elif not cfg.instrument.timeline:
            print("ppx: instrument.timeline=false: no timeline, so no measured costs or prediction", flush=True)
        print(f"ppx: run directory: {self.run_dir}", flush=True)

    def _units(self) -> list[int]:
        """The model units (blocks; llama's embedding and head too) each stage ran (the split
        the config's checks made: it cannot fail here)."""
        from ppx import models

        return [len(r) for r in models.split_of(self.cfg, self.schedule.num_stages)]

    def _draw(self, summary: dict) -> Path | None:
        """breakdown.png (the timers were on) and report.html; the page's path, or None."""
        from ppx.report.breakdown import draw_breakdown, has_breakdown, title_of

        median = None
        if has_breakdown(summary):
            median = self._median_step(summary)
            title = f"{title_of(summary)}: step {median[0]}, the median step"
            if len(summary.get("step_times_s") or []) % 2 == 0:  # (no step's then: as report.html says)
                title += ", the slower middle one"
            draw_breakdown(median[1], self.run_dir / "breakdown.png", title)
        return self._write_html(summary, median)

    def _memory_prediction(self, summary: dict) -> dict:
        """Each rank's peak saved activations predicted from the measured bytes per microbatch
        and stage, next to the measured peak (summary ranks' ``predicted_peak_activation_bytes``)."""
        from ppx.measure.prediction import memory_prediction

        out = memory_prediction(self.steps, self.schedule, summary["ranks"])
        if not out:
            return {}
        for r in summary["ranks"]:
            r["predicted_peak_activation_bytes"] = out["predicted_peak_activation_bytes"][r["rank"]]
        # one unit for the line, the largest figure's; a rank that would read 0.00 in it (a fully
        # recomputing rank's 2 KiB beside another's MiB) says its own
        unit, size = byte_unit(
            max(max(r["predicted_peak_activation_bytes"], r["peak_activation_bytes"]) for r in summary["ranks"])
        )
        pairs = ", ".join(_memory_pair(r, size) for r in summary["ranks"])
        err = out["memory_prediction_error"]
        print(
            f"ppx: peak saved activations, predicted/measured {unit}: {pairs}"
            + ("" if err is None else f" (worst {err:+.1%})"),
            flush=True,
        )
        return out

    def _median_step(self, summary: dict) -> tuple[int, dict]:
        """One real step, the median one, whose parts add up to its step time (per-field
        medians over steps need not), as a summary-like dict; peaks are the run's."""
        k = sorted(range(len(self.steps)), key=lambda i: self.steps[i]["step_time_s"])[len(self.steps) // 2]
        peaks = {r["rank"]: r.get("peak_activation_bytes") for r in summary["ranks"]}
        ranks = [{**r, "peak_activation_bytes": peaks.get(r["rank"])} for r in self.steps[k]["ranks"]]
        return k, {**summary, "step_time_s": self.steps[k]["step_time_s"], "ranks": ranks}

    def _write_html(self, summary: dict, median: tuple[int, dict] | None) -> Path | None:
        """report.html (`ppx.report.html_report`); a failure is a warning, never a failed run."""
        from ppx.report.html_report import write_run_html

        config = self.run_dir / "config.yaml"
        yaml = config.read_text() if config.exists() else OmegaConf.to_yaml(OmegaConf.structured(self.cfg))
        try:
            return write_run_html(self.run_dir, summary, self.timeline, self.schedule.stage_to_rank, yaml, median)
        except Exception as e:  # the run's numbers are written; a page that fails to draw must not lose them
            print(f"ppx: warning: report.html not written ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
            return None

    def _prediction(self, summary: dict) -> dict:
        """The simulator's step time and bubble from this run's measured action costs."""
        from ppx.measure.prediction import cost_samples, costs_from, mean_costs, predict, predict_expected, transport_of
        from ppx.measure.stalls import calm

        # a stalled step (over twice the median: another process, a pause of the machine) is no
        # cost of the schedule: its samples, drawn into every simulated step, made a zbv run
        # predict 66.7 ms against a 13.3 ms median; it is left out of the costs and of the steps
        # they are held against, and the line says so
        stalled = set(stalled_steps(summary.get("step_times_s") or []))
        timeline = [t for t in self.timeline if t["step"] not in stalled] or self.timeline
        # walked once: means and draws both come from it; every sample rounded to 0.1 us, as
        # summary.json keeps them for `ppx plan --from-run` (which then draws what the run drew)
        samples = {
            k: {a: [round(x, 7) for x in xs] for a, xs in v.items()}
            if isinstance(v, dict)
            else [round(x, 7) for x in v]
            for k, v in cost_samples(timeline, self.schedule).items()
        }
        measured = mean_costs(samples)
        if not measured["action_s"]:
            return {}
        transport = transport_of(self.cfg, self.backend)
        # the expected step with every action's cost drawn from its measured samples, and the
        # step of the mean costs (what `ppx simulate --from-run` computes)
        reduce = self.cfg.parallel.data > 1  # the replicas' gradient reductions, as measured
        # both without the machine's stalls, as `ppx plan --from-run` and `ppx simulate --from-run` take them
        stalls: dict[str, int] = {}
        calmed = {**samples, "action_s": calm(samples["action_s"], len(timeline), stalls)}
        pred = predict_expected(self.schedule, calmed, *transport, reduce=reduce)
        if stalls:
            pred["stalls_left_out"] = sum(stalls.values())
        left = sorted({t["step"] for t in self.timeline} - {t["step"] for t in timeline})
        if left:
            pred["stalled_steps_left_out"] = left
        calmed_means = mean_costs(calmed) if stalls else measured
        of_means = predict(self.schedule, costs_from(calmed_means, self.schedule.num_stages), *transport, reduce)
        pred["step_time_of_mean_costs_s"] = of_means["step_time_s"]
        # held against the steps the costs come from (the timeline's): on a busy machine whole
        # steps drift, and costs from some steps say nothing about the others
        same_steps = statistics.fmean(t["step_time_s"] for t in timeline)
        out = {
            "measured_costs": measured,
            # every sample, rounded to 0.1 us: what `ppx plan --from-run` draws its candidates' costs from
            "cost_samples": samples,
            "predicted": pred,
            "measured_step_time_s": same_steps,
            "prediction_error": {
                "step_time": same_steps / pred["step_time_s"] - 1,
                "step_time_of_mean_costs": same_steps / of_means["step_time_s"] - 1,
            },
        }
        bubbles = [self.steps[t["step"]].get("bubble_fraction") for t in timeline]
        if None not in bubbles:  # the same steps again, and the simulator splits idle as they were split
            out["measured_bubble_fraction"] = statistics.fmean(bubbles)
            out["prediction_error"]["bubble_fraction"] = out["measured_bubble_fraction"] - pred["bubble_fraction"]
        bubble = f", bubble {out['measured_bubble_fraction']:.1%}" if "measured_bubble_fraction" in out else ""
        # (the measured step holds the stalls left out: the error says what they cost)
        left_out = f"; {sum(stalls.values())} stalled action sample(s) left out of the prediction" if stalls else ""
        if left:  # (the first five named)
            names = ", ".join(map(str, left[:5])) + (", ..." if len(left) > 5 else "")
            word = "step" if len(left) == 1 else "steps"
            left_out = f" (stalled, over {SLOW_STEP:g}x the median step, left out: {word} {names})" + left_out
        print(
            f"ppx: predicted from measured costs: step {pred['step_time_s']:.4f} s (mean costs: "
            f"{of_means['step_time_s']:.4f} s), bubble {pred['bubble_fraction']:.1%}; measured, the mean of the same "
            f"{count(len(timeline), 'step')} (not the run's median step), {same_steps:.4f} s "
            f"({out['prediction_error']['step_time']:+.1%}){bubble}{left_out}",
            flush=True,
        )
        return out

    def _write_timeline(self, picture: bool) -> None:
        """timeline.json, and (``picture``) timeline.png of the last timed step."""
        from ppx.report.timeline import chrome_trace

        cfg, sched = self.cfg, self.schedule
        title = f"{cfg.run.name}: {cfg.pipeline.schedule}, p={sched.num_ranks}, m={sched.num_microbatches}"
        title += "" if cfg.train.dtype == "fp32" else f", {cfg.train.dtype}"
        title += f", {cfg.parallel.data} replicas (replica 0's ranks)" if cfg.parallel.data > 1 else ""
        trace = chrome_trace(self.timeline, sched.stage_to_rank, title)
        write_whole(self.run_dir / "timeline.json", json.dumps(trace))
        if not picture:
            return
        from ppx.report.gantt import draw_step

        last = self.timeline[-1]
        m = self.steps[last["step"]]
        sub = f"{title}, step {last['step']}: {m['step_time_s'] * 1e3:.2f} ms"
        if "bubble_fraction" in m:
            sub += f", bubble {m['bubble_fraction']:.1%} measured"
            if self.theory is not None:
                sub += f" vs {self.theory:.1%} theory (idle / step time)"
        draw_step(last["ranks"], self.run_dir / "timeline.png", sub, sched.stage_to_rank)


def _said_of_order(read, *args):
    """``read(*args)`` (whether lists sum out of microbatch order: they read the CSVs again), or
    None where a CSV the run ran from was changed or removed since it started (the run's own
    copies are under schedules/): the summary is written whatever became of the files."""
    try:
        return read(*args)
    except UserError:
        return None


def _memory_pair(rank: dict, size: int) -> str:
    """``rank r predicted/measured`` in the line's unit (``size`` bytes), or in the rank's own
    unit, named, where the line's would read 0.00."""
    pred, meas = rank["predicted_peak_activation_bytes"], rank["peak_activation_bytes"]
    if max(pred, meas) / size >= 0.005:
        return f"rank {rank['rank']} {pred / size:.2f}/{meas / size:.2f}"
    own, own_size = byte_unit(max(pred, meas))
    return f"rank {rank['rank']} {pred / own_size:.2f}/{meas / own_size:.2f} {own}"
