// Shipyard's web UI: the live parts of the pages (HTML fragments morphed into place), the charts
// (uPlot), the log view and the theme toggle. No build step: this file is served as written.
"use strict";
const Shipyard = (() => {
  const POLL_MS = 3000;
  const HIDDEN_MAX_MS = 60000;  // a hidden tab polls ever more slowly, up to once a minute
  const COLORS = ["#1f6feb", "#e5484d", "#30a46c", "#f76b15", "#8e4ec6", "#0091ff", "#d6409f", "#7c6f00", "#12a594", "#6e56cf"];

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
  function poll(ms, fn, { immediate = true } = {}) {
    let delay = ms, timer = null, stopped = false;
    async function tick() {
      timer = null;
      const wasFinal = isFinal();
      try { await fn(); } catch (e) { /* the next tick tries again */ }
      if (wasFinal) { stopped = true; return; }
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
  function morphAttributes(el, next) {
    for (const { name } of [...el.attributes]) if (!next.hasAttribute(name)) el.removeAttribute(name);
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
  function axis(label) {
    return { label, stroke: css("--fg"), grid: { stroke: css("--line"), width: 1 }, ticks: { stroke: css("--line"), width: 1 } };
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

  // A line chart of several series with their own x values, joined on x (uPlot.join).
  class LineChart extends Chart {
    constructor(el, xLabel, { time = false, stepped = false } = {}) {
      super(el, 300); this.xLabel = xLabel; this.time = time; this.stepped = stepped;
    }
    draw(series, opts = {}) {
      this.redraw = () => this.draw(series, opts);
      const { log = false, smoothing = 0 } = opts;
      const usable = series.filter(s => s.x.length);
      if (!usable.length) { this.destroy(); this.el.textContent = "No data yet."; this.el.dataset.points = "0"; return; }
      const tables = usable.map(s => [s.x, log ? s.y.map(v => (v > 0 ? v : null)) : s.y]);
      const data = uPlot.join(tables);
      for (let i = 1; i < data.length; i++) data[i] = smooth(data[i], smoothing);
      const key = usable.map(s => s.label).join("|") + "|" + log;
      if (!this.plot || key !== this.key) {
        this.destroy(); this.el.textContent = ""; this.key = key;
        this.plot = new uPlot({
          width: chartWidth(this.el), height: this.height,
          scales: { x: { time: this.time }, y: log ? { distr: 3 } : {} },
          axes: [axis(this.xLabel), axis("")],
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
  }

  // Hyperparameter value vs the trial's best metric, as points.
  class Scatter extends Chart {
    constructor(el) { super(el, 260); }
    draw(xs, ys, xLabel, yLabel) {
      this.redraw = () => this.draw(xs, ys, xLabel, yLabel);
      const pts = xs.map((x, i) => [x, ys[i]]).filter(p => p[0] != null && p[1] != null).sort((a, b) => a[0] - b[0]);
      this.destroy();
      if (!pts.length) { this.el.textContent = "No validated trials yet."; return; }
      this.el.textContent = "";
      this.plot = new uPlot({
        width: chartWidth(this.el), height: this.height,
        scales: { x: { time: false } }, axes: [axis(xLabel), axis(yLabel)],
        series: [{ label: xLabel }, { label: yLabel, stroke: COLORS[0], paths: () => null, points: { show: true, size: 8, fill: COLORS[0] } }],
      }, [pts.map(p => p[0]), pts.map(p => p[1])], this.el);
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

  document.addEventListener("DOMContentLoaded", () => {
    themeToggle();
    for (const el of document.querySelectorAll("[data-live]")) live(el);
  });

  return { experimentPage, trialPage, clusterPage, LineChart, morphHTML };
})();
window.Shipyard = Shipyard;
