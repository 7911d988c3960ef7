// Shipyard's web UI: the live parts of the pages (HTML fragments morphed into place), the charts
// (uPlot), the log view and the theme toggle. No build step: this file is served as written.
"use strict";
const Shipyard = (() => {
  const POLL_MS = 3000;
  const HIDDEN_MAX_MS = 60000;  // a hidden tab polls ever more slowly, up to once a minute
  // Trials apart: ten categorical colours (Tableau 10, no two blues), then hues a golden angle apart.
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#7f7f7f"];
  const color = i => (i < PALETTE.length ? PALETTE[i] : `hsl(${Math.round((i * 137.508) % 360)}, 65%, 50%)`);
  const fmt = v => (typeof v === "number" ? String(Number(v.toPrecision(4))) : String(v));

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401) { window.location = r.headers.get("X-Login") || "/login?expired=1"; throw new Error("logged out"); }
    if (!r.ok) { let m = r.statusText; try { m = (await r.json()).message; } catch (e) { /* not JSON */ } throw new Error(m); }
    return r.json();
  }

  // -- polling -----------------------------------------------------------------------------------
  // The page's object (experiment, trial) is over: the server says so in <body data-final> and in
  // each live part's X-Shipyard-Final header. A poller then looks once more and stops.
  const isFinal = () => document.body.dataset.final === "true";

  // `fn` every `ms` (after the previous run ended); doubling the wait while the tab is hidden, back
  // to `ms` (and at once) when it is shown again; one last run after the page became final.
  // `more()`: whether to go on after the end all the same (log lines still arriving).
  function poll(ms, fn, { immediate = true, more = () => false } = {}) {
    let delay = ms, timer = null, stopped = false;
    async function tick() {
      timer = null;
      const wasFinal = isFinal();
      try { await fn(); } catch (e) { /* the next tick tries again */ }
      if (wasFinal && !more()) { stopped = true; return; }
      delay = document.hidden ? Math.min(delay * 2, HIDDEN_MAX_MS) : ms;
      timer = setTimeout(tick, delay);
    }
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && !stopped && timer !== null && delay > ms) { clearTimeout(timer); delay = ms; timer = setTimeout(tick, 0); }
    });
    if (immediate) tick();
    else if (!isFinal()) timer = setTimeout(tick, ms);
  }
  const every = poll;

  // -- morphing -----------------------------------------------------------------------------------
  // Updates an element's children to a new copy's in place: nodes that stay keep their identity, so
  // keyboard focus, a text selection, scroll positions and what is typed in an input survive.
  function sameKind(a, b) {
    if (a.nodeType !== b.nodeType) return false;
    if (a.nodeType !== Node.ELEMENT_NODE) return true;
    return a.tagName === b.tagName && a.id === b.id;
  }
  // What the user set stays: an opened <details> stays open.
  const userOwned = (el, name) => name === "open" && el.tagName === "DETAILS";
  function morphAttributes(el, next) {
    for (const { name } of [...el.attributes]) if (!next.hasAttribute(name) && !userOwned(el, name)) el.removeAttribute(name);
    for (const { name, value } of [...next.attributes]) if (el.getAttribute(name) !== value) el.setAttribute(name, value);
  }
  function morphChildren(el, next) {
    const byId = new Map();
    for (const c of el.children) if (c.id) byId.set(c.id, c);
    let cur = el.firstChild;
    for (const n of [...next.childNodes]) {
      let match = null;
      if (n.nodeType === Node.ELEMENT_NODE && n.id && byId.has(n.id)) { match = byId.get(n.id); byId.delete(n.id); }
      else if (cur && sameKind(cur, n)) match = cur;
      if (!match) { el.insertBefore(document.importNode(n, true), cur); continue; }
      if (match === cur) cur = cur.nextSibling; else el.insertBefore(match, cur);
      morphNode(match, n);
    }
    while (cur) { const after = cur.nextSibling; el.removeChild(cur); cur = after; }
  }
  function morphNode(el, next) {
    if (el.nodeType !== Node.ELEMENT_NODE) { if (el.nodeValue !== next.nodeValue) el.nodeValue = next.nodeValue; return; }
    morphAttributes(el, next);
    morphChildren(el, next);
  }
  function morphHTML(el, html, select) {
    let next;
    if (select) next = new DOMParser().parseFromString(html, "text/html").querySelector(select);
    else { next = document.createElement("template"); next.innerHTML = html; next = next.content; }
    if (next) morphChildren(el, next);
  }

  // An element with data-live="URL" is refreshed from that URL (an HTML fragment, or a page whose
  // data-live-select part is taken) every data-every ms, until the page is final.
  function live(el) {
    const url = el.dataset.live, select = el.dataset.liveSelect, ms = Number(el.dataset.every || POLL_MS);
    el.dataset.refreshes = "0";
    poll(ms, async () => {
      const r = await fetch(url, { credentials: "same-origin", headers: { "HX-Request": "true", "HX-Current-URL": location.href } });
      if (r.status === 401) { window.location = r.headers.get("HX-Redirect") || "/login?expired=1"; return; }
      if (!r.ok) return;  // keep what is shown; the next tick tries again
      morphHTML(el, await r.text(), select);
      if (r.headers.get("X-Shipyard-Final") === "1") document.body.dataset.final = "true";
      el.dataset.refreshes = String(Number(el.dataset.refreshes) + 1);
    }, { immediate: false });
  }

  // -- theme ----------------------------------------------------------------------------------------
  const css = name => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  function themeToggle() {
    const button = document.getElementById("theme-toggle");
    if (!button) return;
    const show = () => { button.setAttribute("aria-pressed", String(document.documentElement.dataset.theme === "dark")); };
    show();
    button.addEventListener("click", () => {
      const t = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
      document.documentElement.dataset.theme = t;
      try { localStorage.setItem("shipyard-theme", t); } catch (e) { /* storage off: this page only */ }
      show();
      window.dispatchEvent(new Event("shipyard:theme"));
    });
  }

  // Exponential smoothing with the start-up bias corrected (as core/downsample.moving_average).
  function smooth(ys, w) {
    if (!w) return ys;
    let last = 0, debias = 1;
    return ys.map(v => {
      if (v == null) return v;
      last = last * w + (1 - w) * v; debias *= w; return last / (1 - debias);
    });
  }

  // Chart sizes follow their box: the width of the element, redrawn when it changes.
  const chartWidth = el => Math.max(200, Math.floor(el.clientWidth || 800));
  function axis(label, extra = {}) {
    return { label, stroke: css("--fg"), grid: { stroke: css("--line"), width: 1 }, ticks: { stroke: css("--line"), width: 1 }, ...extra };
  }
  // The hover note: the series nearest the cursor at its x, described by the chart's `tip(series, idx)`.
  function tipPlugin(el, tip) {
    const box = document.createElement("div");
    box.className = "chart-tip"; box.hidden = true; box.setAttribute("role", "status");
    return { hooks: {
      init: u => { u.over.append(box); },
      setCursor: u => {
        const { left, top, idx } = u.cursor;
        if (idx == null || left == null || left < 0) { box.hidden = true; return; }
        let best = 0, dist = Infinity;
        for (let i = 1; i < u.series.length; i++) {
          const v = u.data[i][idx];
          if (v == null || !u.series[i].show) continue;
          const d = Math.abs(u.valToPos(v, u.series[i].scale) - top);
          if (d < dist) { dist = d; best = i; }
        }
        if (!best) { box.hidden = true; return; }
        box.textContent = tip(best, idx, u.data[0][idx], u.data[best][idx]);
        box.hidden = false;
        box.style.left = Math.min(left + 12, Math.max(0, u.over.clientWidth - box.offsetWidth)) + "px";
        box.style.top = Math.max(0, top - box.offsetHeight - 8) + "px";
        el.dataset.tip = box.textContent;
      },
    } };
  }
  class Chart {
    constructor(el, height) {
      this.el = el; this.height = height; this.plot = null; this.key = "";
      if (window.ResizeObserver) {
        new ResizeObserver(() => {
          if (this.plot && Math.abs(this.plot.width - chartWidth(this.el)) > 1) this.plot.setSize({ width: chartWidth(this.el), height: this.height });
        }).observe(el);
      }
      window.addEventListener("shipyard:theme", () => { this.key = ""; if (this.redraw) this.redraw(); });
    }
    destroy() { if (this.plot) { this.plot.destroy(); this.plot = null; } }
  }

  // A line chart of several series with their own x values, joined on x (uPlot.join). A series
  // with one point is drawn as a dot. `axes: "each"`: every series on its own y axis, labelled
  // with its name (metrics of different units); else one y axis labelled `yLabel`.
  class LineChart extends Chart {
    constructor(el, xLabel, { time = false, stepped = false, yLabel = "" } = {}) {
      super(el, 300); this.xLabel = xLabel; this.time = time; this.stepped = stepped; this.yLabel = yLabel;
    }
    draw(series, opts = {}) {
      this.redraw = () => this.draw(series, opts);
      const { log = false, smoothing = 0, axes = "one", yLabel = this.yLabel, tip = null } = opts;
      const usable = series.filter(s => s.x.length);
      if (!usable.length) { this.destroy(); this.el.textContent = "No data yet."; this.el.dataset.points = "0"; return; }
      const tables = usable.map(s => [s.x, log ? s.y.map(v => (v > 0 ? v : null)) : s.y]);
      const data = uPlot.join(tables);
      for (let i = 1; i < data.length; i++) data[i] = smooth(data[i], smoothing);
      const each = axes === "each";
      const key = usable.map(s => `${s.label}/${s.x.length === 1}/${s.width || 1.5}/${s.color || ""}`).join("|") + `|${log}|${each}|${yLabel}`;
      if (!this.plot || key !== this.key) {
        this.destroy(); this.el.textContent = ""; this.key = key;
        const scales = { x: { time: this.time } };
        const yAxes = [];
        if (each) {
          usable.forEach((s, i) => {
            scales[s.label] = log ? { distr: 3 } : {};
            yAxes.push(axis(s.label, { scale: s.label, side: i % 2 ? 1 : 3, stroke: s.color || color(i) }));
          });
        } else {
          scales.y = log ? { distr: 3 } : {};
          yAxes.push(axis(yLabel));
        }
        const describe = tip || ((si, idx, x, y) => `${usable[si - 1].label} · ${this.xLabel} ${fmt(x)} · ${fmt(y)}`);
        this.plot = new uPlot({
          width: chartWidth(this.el), height: this.height, scales,
          axes: [axis(this.xLabel), ...yAxes],
          series: [{ label: this.xLabel }, ...usable.map((s, i) => {
            const c = s.color || color(i);
            return { label: s.label, stroke: c, width: s.width || 1.5, spanGaps: true, ...(each ? { scale: s.label } : {}),
                     points: { show: s.x.length === 1, size: 8, fill: c, stroke: c },
                     ...(this.stepped ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}) };
          })],
          legend: { live: true },
          plugins: [tipPlugin(this.el, describe)],
        }, data, this.el);
      } else {
        this.plot.setData(data);
      }
      this.el.dataset.points = String(usable.reduce((n, s) => n + s.x.length, 0));
      this.el.dataset.drawn = String(Date.now());
    }
  }

  // A hyperparameter's value vs each trial's best metric: one dot per trial, in its curve's colour,
  // on a log axis when the hyperparameter is sampled on one.
  class Scatter extends Chart {
    constructor(el) { super(el, 260); }
    draw(points, xLabel, yLabel, { log = false, tip = null } = {}) {
      this.redraw = () => this.draw(points, xLabel, yLabel, { log, tip });
      const usable = points.filter(p => p.x != null && p.y != null && (!log || p.x > 0));
      this.destroy();
      if (!usable.length) { this.el.textContent = "No validated trials yet."; this.el.dataset.points = "0"; return; }
      this.el.textContent = "";
      const data = uPlot.join(usable.map(p => [[p.x], [p.y]]));
      this.plot = new uPlot({
        width: chartWidth(this.el), height: this.height,
        scales: { x: { time: false, ...(log ? { distr: 3 } : {}) } }, axes: [axis(xLabel + (log ? " (log)" : "")), axis(yLabel)],
        series: [{ label: xLabel }, ...usable.map(p => ({ label: p.label, stroke: p.color, paths: () => null,
                                                          points: { show: true, size: p.size || 9, fill: p.color, stroke: p.color } }))],
        legend: { show: false },
        plugins: [tipPlugin(this.el, (si, idx, x, y) => (tip ? tip(usable[si - 1], x, y) : `${usable[si - 1].label}: ${fmt(x)}, ${fmt(y)}`))],
      }, data, this.el);
      this.el.dataset.points = String(usable.length);
      this.el.dataset.logX = String(log);
    }
  }

  // Parallel coordinates (SVG): one vertical axis per hyperparameter (log for log-sampled ones,
  // evenly spaced categories for categorical ones), the searcher metric last; one line per trial
  // that reported the metric, coloured by that metric (low blue → high orange), the best thicker.
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs = {}, text = null) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text != null) e.textContent = text;
    return e;
  }
  // A value's place on its axis, 0 (bottom) to 1 (top), and the axis' end labels.
  function pcAxis(values, log) {
    if (values.some(v => typeof v !== "number")) {
      const cats = [...new Set(values.map(v => (typeof v === "string" ? v : JSON.stringify(v))))].sort();
      const at = v => (cats.length < 2 ? 0.5 : cats.indexOf(typeof v === "string" ? v : JSON.stringify(v)) / (cats.length - 1));
      return { at, ticks: cats.map(c => [c, at(c)]), kind: "categorical" };
    }
    const useLog = log && values.every(v => v > 0);
    const f = useLog ? Math.log10 : v => v;
    const lo = Math.min(...values.map(f)), hi = Math.max(...values.map(f));
    const at = v => (hi === lo ? 0.5 : (f(v) - lo) / (hi - lo));
    const ends = hi === lo ? [[fmt(values[0]), 0.5]] : [[fmt(Math.min(...values)), 0], [fmt(Math.max(...values)), 1]];
    return { at, ticks: ends, kind: useLog ? "log" : "linear" };
  }
  const heat = t => `hsl(${Math.round(215 - 185 * t)}, 75%, 48%)`;
  class ParallelCoords {
    constructor(el) {
      this.el = el; this.height = 280; this.redraw = null;
      if (window.ResizeObserver) new ResizeObserver(() => { if (this.redraw && Math.abs((this.width || 0) - chartWidth(el)) > 1) this.redraw(); }).observe(el);
      window.addEventListener("shipyard:theme", () => { if (this.redraw) this.redraw(); });
    }
    draw(trials, names, metric, { logNames = [], bestId = null, describe = t => `trial ${t.trialId}` } = {}) {
      this.redraw = () => this.draw(trials, names, metric, { logNames, bestId, describe });
      const rows = trials.filter(t => t.best != null);
      const el = this.el;
      el.textContent = "";
      el.dataset.lines = String(rows.length);
      if (!rows.length || !names.length) { el.textContent = "No validated trials yet."; return; }
      const dims = names.map(n => ({ name: n, get: t => t.hparams[n], log: logNames.includes(n) }))
        .filter(d => rows.every(t => d.get(t) !== undefined && d.get(t) !== null));
      dims.push({ name: metric, get: t => t.best, log: false, metric: true });
      for (const d of dims) Object.assign(d, pcAxis(rows.map(d.get), d.log));
      const width = this.width = chartWidth(el), height = this.height;
      const left = 60, right = 60, top = 30, bottom = 30;
      const x = i => (dims.length < 2 ? width / 2 : left + (i * (width - left - right)) / (dims.length - 1));
      const y = p => top + (1 - p) * (height - top - bottom);
      const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "pc",
                                 "aria-label": `Parallel coordinates: ${dims.map(d => d.name).join(", ")}; ${rows.length} trials` });
      const metricAxis = dims[dims.length - 1];
      const lines = svg("g", { class: "pc-lines" });
      for (const t of [...rows].sort((a, b) => (a.trialId === bestId) - (b.trialId === bestId))) {
        const pts = dims.map((d, i) => `${x(i).toFixed(1)},${y(d.at(d.get(t))).toFixed(1)}`).join(" ");
        const best = t.trialId === bestId;
        const line = svg("polyline", { points: pts, fill: "none", stroke: heat(metricAxis.at(t.best)), "stroke-width": best ? 3.5 : 1.6,
                                       "stroke-opacity": 0.85, "data-trial": t.trialId });
        const note = describe(t);
        line.append(svg("title", {}, note));
        line.addEventListener("mouseenter", () => { el.dataset.tip = note; line.setAttribute("stroke-width", 4.5); });
        line.addEventListener("mouseleave", () => line.setAttribute("stroke-width", best ? 3.5 : 1.6));
        lines.append(line);
      }
      root.append(lines);
      dims.forEach((d, i) => {
        const g = svg("g", { class: "pc-axis", "data-axis": d.name, "data-kind": d.kind });
        g.append(svg("line", { x1: x(i), x2: x(i), y1: y(0), y2: y(1), stroke: css("--fg"), "stroke-width": 1 }));
        g.append(svg("text", { x: x(i), y: top - 12, "text-anchor": "middle", fill: css("--fg"), "font-weight": d.metric ? 700 : 600, "font-size": 12 },
                     d.name + (d.kind === "log" ? " (log)" : "")));
        for (const [label, p] of d.ticks) {
          g.append(svg("text", { x: x(i) + 5, y: y(p) + 4, fill: css("--muted"), "font-size": 11, "paint-order": "stroke",
                                 stroke: css("--card"), "stroke-width": 3 }, label));
        }
        root.append(g);
      });
      el.append(root);
    }
  }

  async function experimentPage(expId) {
    const select = document.getElementById("curve-metric");
    const logBox = document.getElementById("curve-log");
    const smoothBox = document.getElementById("curve-smooth");
    const info = document.getElementById("curve-info");
    const chart = new LineChart(document.getElementById("curves"), "steps");
    const scatter = new Scatter(document.getElementById("hparams"));
    const hpSelect = document.getElementById("hp-name");
    const parallel = new ParallelCoords(document.getElementById("parallel"));
    const hpNames = [...hpSelect.options].map(o => o.value);
    let last = null, chosen = false, hpChosen = false;

    async function refreshNames() {
      const names = await getJSON(`/ui/data/experiments/${expId}/metrics`);
      // The searcher metric until the user picks another (it may be reported after the training loss).
      const current = chosen ? select.value : select.dataset.default;
      const options = [];
      for (const [group, metrics] of Object.entries(names.groups)) for (const m of metrics) options.push(`${group}:${m}`);
      if (options.join() !== [...select.options].map(o => o.value).join()) {
        select.innerHTML = "";
        for (const o of options) select.add(new Option(o.replace(":", " · "), o));
      }
      if (options.includes(current)) select.value = current;
    }
    const hpText = hp => Object.entries(hp || {}).map(([k, v]) => `${k}=${fmt(v)}`).join(", ");
    function render() {
      if (!last) return;
      const metric = last.metric;
      // Each trial keeps its colour (by its place among the experiment's trials); the best is drawn thicker.
      const place = new Map(last.trials.map((t, i) => [t.trialId, i]));
      const byId = new Map(last.trials.map(t => [t.trialId, t]));
      const shown = last.series.filter(s => s.x.length);
      chart.draw(last.series.map(s => ({ label: `trial ${s.trialId}`, x: s.x, y: s.y, color: color(place.get(s.trialId) || 0),
                                        width: s.trialId === last.bestTrialId ? 3.5 : 1.5 })),
                 { log: logBox.checked, smoothing: Number(smoothBox.value), yLabel: metric,
                   tip: (si, idx, x, y) => { const id = shown[si - 1].trialId;
                     return `trial ${id}${id === last.bestTrialId ? " (best)" : ""} · ${hpText((byId.get(id) || {}).hparams)} · step ${fmt(x)} · ${metric} ${fmt(y)}`; } });
      const total = last.series.reduce((n, s) => n + s.total, 0);
      info.textContent = `${last.series.length} trials, ${total} points stored`;
      if (!hpChosen && last.trials.length) {
        // The hyperparameter that varies most across trials, until the user picks one.
        let best = hpSelect.value, most = 0;
        for (const o of hpSelect.options) {
          const n = new Set(last.trials.map(t => JSON.stringify(t.hparams[o.value]))).size;
          if (n > most) { most = n; best = o.value; }
        }
        hpSelect.value = best;
      }
      const searcherMetric = parallel.el.dataset.metric || metric;  // trials' best is of the searcher metric
      parallel.draw(last.trials, hpNames, searcherMetric, {
        logNames: last.logHparams || [], bestId: last.bestTrialId,
        describe: t => `trial ${t.trialId}${t.trialId === last.bestTrialId ? " (best)" : ""} · ${hpText(t.hparams)} · ${searcherMetric} ${fmt(t.best)}` });
      const hp = hpSelect.value;
      if (hp) {
        const values = last.trials.map(t => t.hparams[hp]);
        const cats = [...new Set(values.filter(v => typeof v !== "number"))];
        const points = last.trials.map((t, i) => ({
          label: `trial ${t.trialId}`, trial: t, color: color(i), size: t.trialId === last.bestTrialId ? 13 : 9,
          x: typeof values[i] === "number" ? values[i] : cats.indexOf(values[i]), y: t.best }));
        scatter.draw(points, hp + (cats.length ? ` (${cats.join(", ")})` : ""), `best ${metric}`, {
          log: !cats.length && (last.logHparams || []).includes(hp),
          tip: (p, x, y) => `trial ${p.trial.trialId}${p.trial.trialId === last.bestTrialId ? " (best)" : ""} · ${hpText(p.trial.hparams)} · best ${metric} ${fmt(y)}` });
      }
    }
    async function refresh() {
      try {
        await refreshNames();
        const [group, ...rest] = (select.value || "validation:").split(":");
        const metric = rest.join(":");
        if (!metric) { chart.draw([]); return; }
        last = await getJSON(`/ui/data/experiments/${expId}/curves?` + new URLSearchParams({ group, metric }));
        render();
      } catch (e) { info.textContent = String(e.message || e); }
    }
    select.addEventListener("change", () => { chosen = true; refresh(); });
    logBox.addEventListener("change", render);
    smoothBox.addEventListener("input", render);
    hpSelect.addEventListener("change", () => { hpChosen = true; render(); });
    every(POLL_MS, refresh);
  }

  async function trialPage(trialId) {
    const logBox = document.getElementById("trial-log");
    const smoothBox = document.getElementById("trial-smooth");
    const info = document.getElementById("trial-info");
    const charts = { training: new LineChart(document.getElementById("chart-training"), "steps"),
                     validation: new LineChart(document.getElementById("chart-validation"), "steps") };
    let last = null;
    function render() {
      if (!last) return;
      let total = 0;
      for (const [group, chart] of Object.entries(charts)) {
        const list = last.groups[group] || [];
        total += list.reduce((n, s) => n + s.total, 0);
        chart.draw(list.map(s => ({ label: s.metric, x: s.x, y: s.y })), { log: logBox.checked, smoothing: Number(smoothBox.value), axes: "each" });
      }
      info.textContent = `${total} points stored`;
    }
    async function refresh() {
      try { last = await getJSON(`/ui/data/trials/${trialId}/metrics`); render(); }
      catch (e) { info.textContent = String(e.message || e); }
    }
    logBox.addEventListener("change", render);
    smoothBox.addEventListener("input", render);
    every(POLL_MS, refresh);
    followLogs(`/ui/data/trials/${trialId}/logs`);
  }

  function followLogs(url) {
    const pre = document.getElementById("logs");
    const follow = document.getElementById("log-follow");
    const search = document.getElementById("log-search");
    const info = document.getElementById("log-info");
    let cursor = "", query = "", busy = false, count = 0, fresh = 0;
    function mark(text) {
      const span = document.createElement("span");
      if (!query) { span.textContent = text; return span; }
      const lower = text.toLowerCase(), q = query.toLowerCase();
      let i = 0, j;
      while ((j = lower.indexOf(q, i)) >= 0) {
        span.append(text.slice(i, j));
        const m = document.createElement("mark"); m.textContent = text.slice(j, j + q.length); span.append(m);
        i = j + q.length;
      }
      span.append(text.slice(i));
      return span;
    }
    async function poll() {
      if (busy) return; busy = true; fresh = 0;
      try {
        for (let round = 0; round < 20; round++) {
          const params = new URLSearchParams({ after: cursor }); if (query) params.set("search", query);
          const page = await getJSON(`${url}?` + params);
          const frag = document.createDocumentFragment();
          for (const l of page.lines) { frag.append(mark(`${l.t} ${l.level.padEnd(7)} ${l.log}`), "\n"); }
          pre.append(frag); count += page.lines.length; fresh += page.lines.length;
          if (page.cursor != null) cursor = String(page.cursor);
          info.textContent = `${count} lines${query ? ` matching "${query}"` : ""}${page.over ? " · ended" : ""}`;
          if (!page.more) break;
        }
        if (follow.checked) pre.scrollTop = pre.scrollHeight;
      } catch (e) { info.textContent = String(e.message || e); }
      finally { busy = false; }
    }
    let timer = null;
    search.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => { query = search.value.trim(); cursor = ""; count = 0; pre.textContent = ""; poll(); }, 300);
    });
    follow.addEventListener("change", () => { if (follow.checked) pre.scrollTop = pre.scrollHeight; });
    // After the trial's end, on until a look finds no new line (the last ones may come late).
    every(2000, poll, { more: () => fresh > 0 });
  }

  function clusterPage() {
    const charts = [...document.querySelectorAll(".pool-history")].map(el => ({ el, chart: new LineChart(el, "time", { time: true, stepped: true, yLabel: "slots" }) }));
    every(5000, async () => {
      for (const { el, chart } of charts) {
        try {
          const h = await getJSON(`/ui/data/pools/${encodeURIComponent(el.dataset.pool)}/history`);
          chart.draw([{ label: "provisioned", x: h.provisioned.x, y: h.provisioned.y },
                      { label: "used", x: h.used.x, y: h.used.y }]);
        } catch (e) { el.textContent = String(e.message || e); }
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    themeToggle();
    for (const el of document.querySelectorAll("[data-live]")) live(el);
  });

  return { experimentPage, trialPage, followLogs, clusterPage, LineChart, ParallelCoords, morphHTML, poll };
})();
window.Shipyard = Shipyard;
