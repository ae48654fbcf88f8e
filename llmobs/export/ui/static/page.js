// The live page: polls /ui/data once a second and draws its columns with uPlot.
// Model names come from clients: they are only ever set as text, never as HTML.
"use strict";

const CHARTS = {
  ttft: { scope: "model", series: [
    ["ttft_p50", "p50", "#2563eb"], ["ttft_p95", "p95", "#f59e0b"], ["ttft_p99", "p99", "#dc2626"]] },
  itl: { scope: "model", series: [
    ["itl_le_50ms", "≤ 50 ms", "#16a34a"], ["itl_50_100ms", "50-100 ms", "#ca8a04"],
    ["itl_100_250ms", "100-250 ms", "#ea580c"], ["itl_gt_250ms", "> 250 ms", "#dc2626"]] },
  stalls: { scope: "model", series: [
    ["stalls_prefill", "prefill", "#ea580c"], ["stalls_preemption", "preemption", "#7c3aed"],
    ["stalls_engine_pause", "engine pause", "#dc2626"], ["stalls_client", "client", "#0891b2"],
    ["stalls_unknown", "unknown", "#6b7280"]] },
  phases: { scope: "model", series: [
    ["ttft_before_engine", "before engine", "#0891b2"], ["ttft_load", "load", "#6b7280"],
    ["ttft_queue", "queue", "#7c3aed"], ["ttft_prefill", "prefill", "#ea580c"],
    ["ttft_remote_prefill", "remote prefill", "#be185d"],
    ["ttft_kv_transfer", "KV transfer", "#ca8a04"], ["ttft_first_decode", "first decode", "#16a34a"],
    ["ttft_other", "other", "#2563eb"]] },
  queue: { scope: "global", series: [
    ["queue", "prefill queue", "#7c3aed"], ["active", "active", "#0891b2"]] },
  tokens: { scope: "model", series: [
    ["tokens", "output tokens/s", "#2563eb"], ["requests", "requests/s", "#6b7280"]] },
  cost: { scope: "model", when: "values", unit: "currency", series: [["cost", "cost/s", "#16a34a"]] },
  slo: { scope: "model", when: "objectives", series: [
    ["attainment", "good share (0-1)", "#16a34a", "ratio"], ["goodput", "goodput tokens/s", "#2563eb"]] },
  engine: { scope: "global", when: "values", series: [
    ["engine_waiting", "waiting", "#7c3aed"], ["engine_running", "running", "#0891b2"],
    ["engine_kv_cache", "KV cache (0-1)", "#dc2626", "ratio"]] },
  gpu: { scope: "global", when: "values", series: [
    ["gpu_memory_used", "memory used", "#7c3aed", "ratio"], ["gpu_bandwidth", "bandwidth", "#dc2626", "ratio"]] },
};
const POLL_MS = 1000;
let state = null;
let polls = 0;
const plots = {};
const picker = document.getElementById("model");

// An amount with the figures it needs, as llmobs/tools/amounts.py writes one for the CLI: at
// least two decimals and two significant figures, the zeros past the second decimal dropped
// (9e-05 reads 0.00009, not 0); below a millionth, scientific.
function amount(value) {
  if (value === null || !Number.isFinite(value)) return "n/a";
  const size = Math.abs(value);
  if (size === 0) return "0.00";
  if (size < 1e-6) return value.toExponential(1);
  const places = Math.max(2, 1 - Math.floor(Math.log10(size)));
  const text = value.toLocaleString("en-US", { minimumFractionDigits: places, maximumFractionDigits: places });
  if (places === 2) return text;
  const [whole, fraction] = text.split(".");
  return whole + "." + fraction.replace(/0+$/, "").padEnd(2, "0");
}

function status(text) {
  document.getElementById("status").textContent = text;
}

// Columns by name in Maps: a model name is a client's string, and "__proto__" or
// "constructor" must be a name like any other, not a property of every object.
function columnsOf(object) {
  return new Map(Object.entries(object));
}

function merge(fresh) {
  const models = new Map(Object.entries(fresh.models).map(([n, c]) => [n, columnsOf(c)]));
  if (state === null) {
    state = { t: fresh.t, global: columnsOf(fresh.global), models, seconds: fresh.seconds,
              objectives: fresh.objectives, currency: fresh.currency || "" };
    return;
  }
  const before = state.t.length;
  const append = (into, from) => {
    for (const [key, values] of from) {
      if (!into.has(key)) into.set(key, new Array(before).fill(null));
      into.get(key).push(...values);
    }
  };
  state.t.push(...fresh.t);
  append(state.global, columnsOf(fresh.global));
  for (const [name, columns] of models) {
    if (!state.models.has(name)) state.models.set(name, new Map());
    append(state.models.get(name), columns);
  }
  state.objectives = fresh.objectives;
  const extra = state.t.length - state.seconds;
  if (extra > 0) {
    state.t.splice(0, extra);
    const trim = (cols) => { for (const c of cols.values()) c.splice(0, extra); };
    trim(state.global);
    for (const cols of state.models.values()) trim(cols);
  }
}

function pickerOptions() {
  const names = Array.from(state.models.keys());
  const shown = Array.from(picker.options, (o) => o.value);
  if (names.join("\u0000") === shown.join("\u0000")) return;
  const chosen = picker.value || "all";
  picker.replaceChildren(...names.map((name) => {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name; // text, never HTML: a model name is a client's string
    return option;
  }));
  picker.value = names.includes(chosen) ? chosen : "all";
}

function columns(spec) {
  const source = spec.scope === "global" ? state.global : (state.models.get(picker.value) || new Map());
  return spec.series.map(([key]) => source.get(key) || new Array(state.t.length).fill(null));
}

// A chart of amounts (the cost): its ticks and legend with the figures they need, in the price
// file's currency; the ticks drawn are kept in data-ticks, for a reader of the DOM.
function amountAxis(el) {
  return { scale: "y", size: 80, label: state.currency, values: (u, splits) => {
    const ticks = splits.map(amount);
    el.dataset.ticks = JSON.stringify(ticks);
    return ticks;
  } };
}

function options(id, spec, width) {
  const el = document.getElementById(id);
  const money = spec.unit === "currency";
  const ratio = spec.series.some((s) => s[3] === "ratio");
  const counts = spec.series.some((s) => s[3] !== "ratio");
  const axes = [{}];
  if (counts) axes.push(money ? amountAxis(el) : { scale: "y" });
  if (ratio) axes.push({ scale: "ratio", side: counts ? 1 : 3, grid: { show: !counts } });
  return {
    width, height: 220,
    scales: { x: { time: true }, ratio: { range: [0, 1] } },
    series: [{}, ...spec.series.map(([, label, stroke, scale]) => ({
      label: money ? label + " (" + state.currency + ")" : label, stroke, width: 1.5,
      scale: scale === "ratio" ? "ratio" : "y", spanGaps: false,
      ...(money ? { value: (u, v) => (v === null ? "-" : amount(v) + " " + state.currency) } : {}),
    }))],
    axes,
  };
}

function maxima(spec, cols) {
  const out = {};
  spec.series.forEach(([, label], i) => {
    const values = cols[i].filter((v) => v !== null);
    out[label] = values.length ? Math.max(...values) : null;
  });
  return out;
}

function draw() {
  for (const [id, spec] of Object.entries(CHARTS)) {
    const el = document.getElementById(id);
    const cols = columns(spec);
    const any = cols.some((c) => c.some((v) => v !== null));
    const hidden = (spec.when === "objectives" && !state.objectives) || (spec.when === "values" && !any);
    el.classList.toggle("hidden", hidden);
    if (hidden) continue;
    const data = [state.t, ...cols];
    if (!plots[id]) {
      const title = document.createElement("h2");
      title.textContent = el.dataset.title + (spec.unit === "currency" && state.currency
        ? " (" + state.currency + ")" : "");
      el.append(title);
      plots[id] = new uPlot(options(id, spec, el.clientWidth - 16), data, el);
    } else {
      plots[id].setData(data);
    }
    // what was drawn, for a reader of the page's DOM (the tests read it)
    el.dataset.points = String(state.t.length);
    el.dataset.max = JSON.stringify(maxima(spec, cols));
  }
}

async function poll() {
  try {
    const since = state && state.t.length ? state.t[state.t.length - 1] : 0;
    const response = await fetch("data?since=" + since, { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) {
      status("the sidecar answered " + response.status);
    } else {
      merge(await response.json());
      pickerOptions();
      draw();
      polls += 1;
      document.body.dataset.polls = String(polls);
      status(state.t.length + " s shown, updated " + new Date().toLocaleTimeString());
    }
  } catch (err) {
    status("the sidecar is unreachable (" + err.name + ")");
  }
  setTimeout(poll, POLL_MS);
}

picker.addEventListener("change", () => { if (state) draw(); });
window.addEventListener("resize", () => {
  for (const [id, plot] of Object.entries(plots)) {
    plot.setSize({ width: document.getElementById(id).clientWidth - 16, height: 220 });
  }
});
poll();
