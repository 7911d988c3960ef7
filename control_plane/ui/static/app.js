// Shipyard's web UI: the charts (uPlot) and the log view. Tables refresh through htmx; these poll JSON.
"use strict";
const Shipyard = (() => {
  const POLL_MS = 3000;
  const COLORS = ["#1f6feb", "#e5484d", "#30a46c", "#f76b15", "#8e4ec6", "#0091ff", "#d6409f", "#7c6f00", "#12a594", "#6e56cf"];

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401) { window.location = r.headers.get("X-Login") || "/login?expired=1"; throw new Error("logged out"); }
    if (!r.ok) { let m = r.statusText; try { m = (await r.json()).message; } catch (e) { /* not JSON */ } throw new Error(m); }
    return r.json();
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

  // A line chart of several series with their own x values, joined on x (uPlot.join).
  class LineChart {
    constructor(el, xLabel, { time = false, stepped = false } = {}) {
      this.el = el; this.xLabel = xLabel; this.time = time; this.stepped = stepped; this.plot = null; this.key = "";
    }
    draw(series, { log = false, smoothing = 0 } = {}) {
      const usable = series.filter(s => s.x.length);
      if (!usable.length) { this.destroy(); this.el.textContent = "No data yet."; this.el.dataset.points = "0"; return; }
      const tables = usable.map(s => [s.x, log ? s.y.map(v => (v > 0 ? v : null)) : s.y]);
      const data = uPlot.join(tables);
      for (let i = 1; i < data.length; i++) data[i] = smooth(data[i], smoothing);
      const key = usable.map(s => s.label).join("|") + "|" + log;
      const width = Math.max(300, this.el.clientWidth || 800);
      if (!this.plot || key !== this.key) {
        this.destroy(); this.el.textContent = ""; this.key = key;
        this.plot = new uPlot({
          width, height: 300,
          scales: { x: { time: this.time }, y: log ? { distr: 3 } : {} },
          axes: [{ label: this.xLabel }, {}],
          series: [{ label: this.xLabel }, ...usable.map((s, i) => ({
            label: s.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, points: { show: false },
            ...(this.stepped ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}) }))],
          legend: { live: true },
        }, data, this.el);
      } else {
        this.plot.setData(data);
      }
      this.el.dataset.points = String(usable.reduce((n, s) => n + s.x.length, 0));
      this.el.dataset.drawn = String(Date.now());
    }
    destroy() { if (this.plot) { this.plot.destroy(); this.plot = null; } }
  }

  // Hyperparameter value vs the trial's best metric, as points.
  class Scatter {
    constructor(el) { this.el = el; this.plot = null; }
    draw(xs, ys, xLabel, yLabel) {
      const pts = xs.map((x, i) => [x, ys[i]]).filter(p => p[0] != null && p[1] != null).sort((a, b) => a[0] - b[0]);
      if (this.plot) { this.plot.destroy(); this.plot = null; }
      if (!pts.length) { this.el.textContent = "No validated trials yet."; return; }
      this.el.textContent = "";
      this.plot = new uPlot({
        width: Math.max(300, this.el.clientWidth || 800), height: 260,
        scales: { x: { time: false } }, axes: [{ label: xLabel }, { label: yLabel }],
        series: [{ label: xLabel }, { label: yLabel, stroke: COLORS[0], paths: () => null, points: { show: true, size: 8, fill: COLORS[0] } }],
      }, [pts.map(p => p[0]), pts.map(p => p[1])], this.el);
    }
  }

  function every(ms, fn) { fn(); return setInterval(() => { if (!document.hidden) fn(); }, ms); }

  async function experimentPage(expId) {
    const select = document.getElementById("curve-metric");
    const logBox = document.getElementById("curve-log");
    const smoothBox = document.getElementById("curve-smooth");
    const info = document.getElementById("curve-info");
    const chart = new LineChart(document.getElementById("curves"), "steps");
    const scatter = new Scatter(document.getElementById("hparams"));
    const hpSelect = document.getElementById("hp-name");
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
    function render() {
      if (!last) return;
      const metric = last.metric;
      chart.draw(last.series.map(s => ({ label: `trial ${s.trialId}`, x: s.x, y: s.y })),
                 { log: logBox.checked, smoothing: Number(smoothBox.value) });
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
      const hp = hpSelect.value;
      if (hp) {
        const values = last.trials.map(t => t.hparams[hp]);
        const cats = [...new Set(values.filter(v => typeof v !== "number"))];
        const xs = values.map(v => (typeof v === "number" ? v : cats.indexOf(v)));
        scatter.draw(xs, last.trials.map(t => t.best), hp + (cats.length ? ` (${cats.join(", ")})` : ""), metric);
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
        chart.draw(list.map(s => ({ label: s.metric, x: s.x, y: s.y })), { log: logBox.checked, smoothing: Number(smoothBox.value) });
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
    followLogs(trialId);
  }

  function followLogs(trialId) {
    const pre = document.getElementById("logs");
    const follow = document.getElementById("log-follow");
    const search = document.getElementById("log-search");
    const info = document.getElementById("log-info");
    let cursor = "", query = "", busy = false, count = 0;
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
      if (busy) return; busy = true;
      try {
        for (let round = 0; round < 20; round++) {
          const params = new URLSearchParams({ after: cursor }); if (query) params.set("search", query);
          const page = await getJSON(`/ui/data/trials/${trialId}/logs?` + params);
          const frag = document.createDocumentFragment();
          for (const l of page.lines) { frag.append(mark(`${l.t} ${l.level.padEnd(7)} ${l.log}`), "\n"); }
          pre.append(frag); count += page.lines.length;
          if (page.cursor != null) cursor = String(page.cursor);
          info.textContent = `${count} lines${query ? ` matching "${query}"` : ""}${page.over ? " · trial ended" : ""}`;
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
    every(2000, poll);
  }

  function clusterPage() {
    const charts = [...document.querySelectorAll(".pool-history")].map(el => ({ el, chart: new LineChart(el, "time", { time: true, stepped: true }) }));
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

  return { experimentPage, trialPage, clusterPage, LineChart };
})();
window.Shipyard = Shipyard;
