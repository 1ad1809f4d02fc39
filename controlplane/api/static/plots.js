"use strict";
// The experiment page's plots on uPlot: time series per variant, the bounds as lines,
// rollout events as vertical marks. Each plot exposes what it shows as data-
// attributes (points, marks) so that tests and scripts can read it off the page.
const Plots = (() => {
  const COLORS = { baseline: "#2f6fde", canary: "#e4572e", bound: "#7a1fa2", weight: "#8a94a6" };
  const MARK_COLORS = {
    tripped: "#c62828", probe_failed: "#c62828", rolled_back: "#c62828", rollback: "#c62828",
    abort: "#c62828", half_open: "#b35900", srm_detected: "#b35900", probe_passed: "#1a7f37",
    step_advanced: "#1a7f37", promoted: "#1a7f37", promote: "#1a7f37",
    overload_hold: "#b35900", overload_cleared: "#8a94a6",
    guardrail_hold: "#b35900", guardrail_released: "#8a94a6",
  };
  const HEIGHT = 260;

  // the ends of an experiment stand out: a solid, wider line
  const FINAL_MARKS = new Set(["rolled_back", "rollback", "abort", "promoted", "promote"]);
  const LABEL_ROWS = 3;

  // The x range that shows the data and every mark: the events that end an experiment
  // come after its last window (nothing is recorded once it ends), and a mark outside
  // the scale would not be drawn at all.
  function withMarks(range, marks) {
    const times = marks.map((m) => new Date(m.at).getTime() / 1000).filter(Number.isFinite);
    let [lo, hi] = range;
    if (!times.length) return [lo, hi];
    const first = Math.min(...times), last = Math.max(...times);
    const extended = lo === null || hi === null || first < lo || last > hi;
    lo = lo === null ? first : Math.min(lo, first);
    hi = hi === null ? last : Math.max(hi, last);
    if (!extended) return [lo, hi];
    const pad = Math.max(1, (hi - lo) * 0.03);  // room for the last mark's label
    return [lo - (first <= range[0] ? pad : 0), hi + pad];
  }

  function marksPlugin(plot) {
    return {
      hooks: {
        draw: [(u) => {
          const { ctx } = u;
          const { top, height } = u.bbox;
          const px = devicePixelRatio;
          ctx.save();
          ctx.font = `${11 * px}px system-ui, sans-serif`;
          // a label goes on the first row where it clears the one before it, so a
          // rollback right after a trip is still named; past the last row, the line only
          const rowEnds = new Array(LABEL_ROWS).fill(-Infinity);
          const drawn = [];
          for (const mark of plot.marks) {
            const t = new Date(mark.at).getTime() / 1000;
            if (!(t >= u.scales.x.min && t <= u.scales.x.max)) continue;
            drawn.push(mark.kind);
            const x = Math.round(u.valToPos(t, "x", true));
            const final = FINAL_MARKS.has(mark.kind);
            ctx.strokeStyle = MARK_COLORS[mark.kind] || "#8a94a6";
            ctx.setLineDash(final ? [] : [4 * px, 3 * px]);
            ctx.lineWidth = (final ? 2 : 1) * px;
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
            const label = mark.kind.replace(/_/g, " ");
            const width = ctx.measureText(label).width + 6 * px;
            const right = x + 3 * px + width > u.bbox.left + u.bbox.width;
            const start = right ? x - 3 * px - width : x + 3 * px;
            const row = rowEnds.findIndex((end) => start > end);
            if (row >= 0) {
              ctx.fillStyle = ctx.strokeStyle;
              ctx.fillText(label, start, top + (12 + 13 * row) * px);
              rowEnds[row] = start + width;
            }
          }
          ctx.restore();
          // what the canvas shows, for tests and scripts (data-marks is what was given)
          plot.container.dataset.drawn = drawn.join(",");
        }],
      },
    };
  }

  const line = (label, stroke, extra = {}) => ({ label, stroke, width: 1.5, spanGaps: false,
                                                 ...extra });
  const fixed = (digits, unit) => (u, v) => (v === null || v === undefined ? "–"
                                             : `${v.toFixed(digits)}${unit}`);

  class Plot {
    constructor(container, series, axes) {
      this.container = container;
      this.marks = [];
      this.uplot = null;
      this.series = series;
      this.axes = axes;
      this.xrange = null;
    }

    options() {
      return {
        width: Math.max(this.container.clientWidth - 12, 300),
        height: HEIGHT,
        // a plot may share another's time axis (a metric's beside the windows')
        scales: { x: { time: true,
                       range: (u, min, max) => withMarks(this.xrange || [min, max], this.marks) } },
        series: [{}, ...this.series],
        axes: [{}, ...this.axes],
        legend: { live: true },
        cursor: { drag: { x: true, y: false } },
        plugins: [marksPlugin(this)],
      };
    }

    update(data, marks, xrange = null) {
      this.marks = marks;
      this.xrange = xrange;
      if (this.uplot === null) {
        this.uplot = new uPlot(this.options(), data, this.container);
      } else {
        this.uplot.setData(data);
      }
      this.container.dataset.points = String(data[0].length);
      this.container.dataset.marks = marks.map((m) => m.kind).join(",");
      this.container.dataset.lastT = data[0].length ? String(data[0][data[0].length - 1]) : "";
      // the series that hold a value somewhere, and how many points each lacks (gaps)
      const shown = this.series.map((s, i) => [s.key || s.label, data[i + 1] || []]);
      this.container.dataset.series = shown
        .filter(([, values]) => values.some((v) => v !== null && v !== undefined))
        .map(([key]) => key).join(",");
      this.container.dataset.gaps = shown
        .map(([key, values]) => `${key}:${values.filter((v) => v === null || v === undefined).length}`)
        .join(",");
    }

    resize() {
      if (this.uplot) this.uplot.setSize({ width: Math.max(this.container.clientWidth - 12, 300),
                                            height: HEIGHT });
    }
  }

  function latency(container) {
    const b = COLORS.baseline, c = COLORS.canary;
    return new Plot(container, [
      line("baseline P50", b, { dash: [2, 3] }), line("baseline P95", b),
      line("baseline P99", b, { dash: [8, 4] }),
      line("canary P50", c, { dash: [2, 3] }), line("canary P95", c, { width: 2 }),
      line("canary P99", c, { dash: [8, 4] }),
      line("threshold", COLORS.bound, { width: 2, dash: [10, 5] }),
    ], [{ label: "ms", values: (u, vals) => vals.map((v) => `${v}`) }]);
  }

  function failures(container) {
    return new Plot(container, [
      line("baseline", COLORS.baseline, { value: fixed(2, " %") }),
      line("canary", COLORS.canary, { width: 2, value: fixed(2, " %") }),
      line("failure bound", COLORS.bound, { width: 2, dash: [10, 5], value: fixed(2, " %") }),
    ], [{ label: "% failed" }]);
  }

  function rate(container) {
    return new Plot(container, [
      line("baseline req/s", COLORS.baseline, { value: fixed(1, "") }),
      line("canary req/s", COLORS.canary, { width: 2, value: fixed(1, "") }),
      // shed requests are not in the rates above (decision 0025): drawn beside them
      line("baseline shed/s", COLORS.baseline, { dash: [2, 3], value: fixed(1, "") }),
      line("canary shed/s", COLORS.canary, { dash: [2, 3], value: fixed(1, "") }),
      line("canary weight %", COLORS.weight, { scale: "pct", dash: [4, 4],
                                               value: fixed(2, " %") }),
    ], [{ label: "req/s" }, { scale: "pct", side: 1, label: "weight %", grid: { show: false } }]);
  }

  function recommendation(container) {
    return new Plot(container, [
      line("baseline per window", COLORS.baseline, { points: { show: true } }),
      line("proposed threshold", COLORS.bound, { width: 2, dash: [10, 5] }),
      line("threshold now", COLORS.weight, { dash: [4, 4] }),
    ], [{ label: "ms" }]);
  }

  // A provider metric (decision 0048): each variant's readings and the bound the canary
  // was held to; a ratio in percent. A reading without data is a gap.
  function metric(container, kind) {
    const unit = kind === "ratio" ? " %" : "";
    const value = (u, v) => (v === null || v === undefined ? "–"
                             : `${Number(v.toPrecision(4))}${unit}`);
    return new Plot(container, [
      line("baseline", COLORS.baseline, { key: "baseline", value }),
      line("canary", COLORS.canary, { key: "canary", width: 2, value }),
      line("bound", COLORS.bound, { key: "bound", width: 2, dash: [10, 5], value }),
    ], [{ label: kind === "ratio" ? "%" : kind }]);
  }

  function metricColumns(series) {
    const scale = series.kind === "ratio"
      ? (values) => values.map((x) => (x === null ? null : x * 100)) : (values) => values;
    return [series.at, scale(series.baseline), scale(series.canary), scale(series.bound)];
  }

  // The API's columns (GET /v1/experiments/{id}/history) as each plot's data.
  function columns(history) {
    const v = history.variants;
    const percent = (values) => values.map((x) => (x === null ? null : x * 100));
    return {
      latency: [history.t, v.baseline.p50_ms, v.baseline.p95_ms, v.baseline.p99_ms,
                v.canary.p50_ms, v.canary.p95_ms, v.canary.p99_ms, history.threshold_ms],
      failures: [history.t, percent(v.baseline.failure_ratio), percent(v.canary.failure_ratio),
                 percent(history.failure_bound)],
      rate: [history.t, v.baseline.rps, v.canary.rps, v.baseline.shed_rps, v.canary.shed_rps,
             history.canary_weight_bp.map((bp) => bp / 100)],
    };
  }

  return { latency, failures, rate, recommendation, metric, columns, metricColumns };
})();
