// The wtune dashboard: polls the control server's JSON API (api.md) and
// renders it. Everything that comes from the API is untrusted (trainables
// choose their metric names, print their logs, and configs can be added by
// anyone with the token), so the DOM is built with textContent and
// attributes only, never innerHTML.
'use strict';

const POLL_MS = 1000;
const HIDDEN_POLL_MS = 5000;
const RESULT_LIMIT = 10000;
const RESULT_WORKERS = 4;
const MAX_POINTS = 4000; // per trial; longer curves are thinned
// Names offered to plot, over every trial: the host bounds each trial's
// names, not how many trials bring new ones.
const MAX_METRIC_NAMES = 2048;
// The trials list comes from the state file, written about once a second; for
// this long after a request, its trial is read from the runner instead.
const FRESH_MS = 5000;
const LOG_TAIL = 65536;
const LOG_KEEP = 1 << 20; // characters of a followed log kept on the page
const TOKEN_KEY = 'wtune-token';
const STATUSES = ['PENDING', 'RUNNING', 'PAUSED', 'TERMINATED', 'ERROR'];
const FINAL = new Set(['TERMINATED', 'ERROR']);
// Filled in by the runner for every result: offered after the trainable's own metrics.
const AUTO_FIELDS = new Set([
  'time_this_iter_s', 'time_total_s', 'fuel_this_iter', 'fuel_total',
  'iterations_since_restore', 'time_since_restore', 'fuel_since_restore',
]);
// The x axis, or numbers that make no curve.
const NOT_PLOTTED = new Set(['training_iteration', 'timestamp']);

const $ = (id) => document.getElementById(id);

// A trial's error and stop reason quote the guest. Shown as the terminal
// shows them (report/terminal.rs): control characters and invisible
// characters that reorder or hide text written out, at most 2048 kept.
const INERT_MAX = 2048;
const NEEDS_ESCAPE = /[\u0000-\u001f\u007f-\u009f\u00ad\u034f\u061c\u115f\u1160\u180e\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\u{1bca0}-\u{1bca3}\u{1d173}-\u{1d17a}\u{e0000}-\u{e007f}\u{e0100}-\u{e01ef}]/gu;
const NAMED_ESCAPES = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };
function inert(text) {
  if (typeof text !== 'string') return '';
  const chars = Array.from(text);
  const cut = chars.length > INERT_MAX ? ` [... ${chars.length} characters in all]` : '';
  return chars.slice(0, INERT_MAX).join('').replace(NEEDS_ESCAPE,
    (c) => NAMED_ESCAPES[c] || `\\u{${c.codePointAt(0).toString(16)}}`) + cut;
}

const state = {
  exp: null,
  trials: [],
  series: new Map(), // trial_id -> { next, done, busy, points: [{ x, v: {metric: value} }], ... }
  metrics: new Set(), // numeric result fields, in the order first seen
  metric: null, // the user's choice in #metric-select
  selected: new Set(),
  sort: { key: 'trial_id', dir: 1 },
  columns: [],
  columnSig: '',
  rows: new Map(), // trial_id -> <tr>, kept across polls so clicks and references survive
  busy: new Set(), // "trial_id/action" requests in flight
  fresh: new Map(), // trial_id -> until when to read it from /api/trials/{id}
  bestSig: '',
  logs: null, // { id, start, next, busy } of the log on show
  offline: false, // the last poll could not reach the server
};

const controlOn = () => !!state.exp?.control && !state.offline;

// ---- API -------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function readTokenFromHash() {
  const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (!m) return;
  let token = m[1];
  try {
    token = decodeURIComponent(token);
  } catch {
    // Not percent-encoding: taken as written, and refused by the server if wrong.
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  // Keep the secret out of the address bar, the history and screenshots.
  history.replaceState(null, '', location.pathname + location.search);
}

let tokenRefused = false;

// Whether to retry after a 401 that was answered to `failed`.
function askToken(failed) {
  if (sessionStorage.getItem(TOKEN_KEY) !== failed) return true; // already replaced
  if (tokenRefused) return false;
  const token = prompt('This wtune server needs its token (--serve-token or WTUNE_SERVE_TOKEN):');
  if (!token || !token.trim()) {
    tokenRefused = true; // one prompt, not one per poll
    return false;
  }
  sessionStorage.setItem(TOKEN_KEY, token.trim());
  return true;
}

async function api(path, { method = 'GET', body } = {}) {
  for (let attempt = 0; ; attempt++) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = { Accept: 'application/json' };
    if (token) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res;
    try {
      res = await fetch(path, {
        method, headers, cache: 'no-store',
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError(0, `Cannot reach the wtune server (${e.message}); has the experiment ended?`);
    }
    if (res.status === 401 && attempt < 3 && askToken(token)) continue;
    let data = null;
    try {
      data = await res.json();
    } catch {
      // reported below
    }
    if (res.ok && data !== null) return data;
    let why = data && typeof data.error === 'string' ? data.error : `${res.statusText || 'unreadable answer'}`;
    if (res.status === 401) why += ' (open the page as …/#token=TOKEN, or reload to be asked again)';
    throw new ApiError(res.status, `${method} ${path}: ${res.status}: ${why}`);
  }
}

const trialPath = (id, rest) => `/api/trials/${encodeURIComponent(id)}${rest}`;

// ---- small helpers ----------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else if (k.startsWith('data-') || k.startsWith('aria-') || k === 'title' || k === 'type') node.setAttribute(k, v);
    else node[k] = v;
  }
  node.append(...children); // strings become text nodes
  return node;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

let messageFrom = null;

function showMessage(text, from = 'action', kind = 'error') {
  setText($('message-text'), text);
  $('message').className = `message ${kind}`;
  $('message').hidden = false;
  messageFrom = from;
}

function clearMessage(from) {
  if (from !== undefined && messageFrom !== from) return;
  $('message').hidden = true;
  messageFrom = null;
}

function fmtNum(v) {
  if (v === null || v === undefined) return '';
  if (typeof v !== 'number') return typeof v === 'object' ? JSON.stringify(v) : String(v);
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < 1e12) return String(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(3);
  return String(Number(v.toPrecision(5)));
}

function fmtDuration(s) {
  if (typeof s !== 'number' || !Number.isFinite(s)) return '';
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.floor(s % 60)).padStart(2, '0')}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, '0')}m`;
}

// Nested config tables become "outer/inner" keys, as in progress.csv.
// Prototype-less, so that a key such as `__proto__` or `map` is a key.
function flatten(obj, prefix = '', out = Object.create(null)) {
  for (const [k, v] of Object.entries(obj || {})) {
    if (v && typeof v === 'object' && !Array.isArray(v)) flatten(v, `${prefix}${k}/`, out);
    else out[prefix + k] = v;
  }
  return out;
}

const flatConfigs = new WeakMap(); // per trial object, so per poll
function flatConfig(t) {
  let flat = flatConfigs.get(t);
  if (!flat) flatConfigs.set(t, (flat = flatten(t.config)));
  return flat;
}

const badgeClass = (status) => `badge ${STATUSES.includes(status) ? status.toLowerCase() : 'unknown'}`;
const statusLabel = (t) => (t.held ? `${t.status} (held)` : String(t.status));
const lastMetric = (t) => (state.exp?.metric && t.last_result ? t.last_result[state.exp.metric] : undefined);

function allowed(t) {
  const live = ['PENDING', 'RUNNING', 'PAUSED'].includes(t.status);
  return { stop: live, pause: live && !t.held, resume: !!t.held };
}

// ---- trials table -----------------------------------------------------------

function buildColumns() {
  const cols = [
    { key: 'trial_id', label: 'trial', value: (t) => t.trial_id, render: renderId },
    { key: 'status', label: 'status', cls: 'status', value: statusLabel, render: renderStatus },
    { key: 'iterations', label: 'iter', cls: 'num', value: (t) => t.iterations },
  ];
  const metric = state.exp?.metric;
  if (metric) cols.push({ key: 'metric', label: metric, cls: 'num', value: lastMetric });
  cols.push({ key: 'time', label: 'time', cls: 'num', value: (t) => t.time_total_s, format: fmtDuration });
  const keys = new Set();
  for (const t of state.trials) for (const k of Object.keys(flatConfig(t))) keys.add(k);
  for (const k of keys) cols.push({ key: `config/${k}`, label: k, cls: 'config', value: (t) => flatConfig(t)[k] });
  return cols;
}

function renderId(td, t) {
  if (td.firstChild) return;
  td.append(el('button', { type: 'button', class: 'link', 'data-logs': t.trial_id, title: 'show its logs', text: t.trial_id }));
}

function renderStatus(td, t) {
  const label = statusLabel(t);
  if (td.dataset.status !== t.status || td.textContent !== label) {
    td.dataset.status = t.status;
    td.dataset.held = String(!!t.held);
    td.replaceChildren(el('span', { class: badgeClass(t.status), text: label }));
  }
  const why = [t.error, t.stop_reason].filter(Boolean).map(inert).join('\n');
  if (td.title !== why) td.title = why;
}

function renderCell(td, t, col) {
  const v = col.value(t);
  setText(td, (col.format || fmtNum)(v));
  const full = v === undefined || v === null ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v);
  if (td.title !== full) td.title = full;
}

function renderHead() {
  const head = $('trials-head');
  head.replaceChildren(
    el('th', { class: 'select', title: 'plot only the ticked trials' }, '✓'),
    ...state.columns.map((c) => el('th', { 'data-sort': c.key, class: c.cls || '', title: 'sort', text: c.label })),
    el('th', { text: 'actions' }),
  );
}

function makeRow(id) {
  const tr = el('tr', { 'data-trial': id });
  tr.append(el('td', { class: 'select' }, el('input', { type: 'checkbox', 'data-select': id, 'aria-label': `plot ${id}` })));
  for (const c of state.columns) tr.append(el('td', { class: c.cls || '' }));
  const actions = el('td', { class: 'actions' });
  for (const a of ['stop', 'pause', 'resume']) {
    actions.append(el('button', { type: 'button', 'data-action': a, text: a[0].toUpperCase() + a.slice(1) }));
  }
  tr.append(actions);
  return tr;
}

function updateRow(tr, t) {
  const cells = tr.children;
  cells[0].firstChild.checked = state.selected.has(t.trial_id);
  state.columns.forEach((c, i) => (c.render || renderCell)(cells[i + 1], t, c));
  const ok = allowed(t);
  for (const b of cells[cells.length - 1].children) {
    const action = b.dataset.action;
    b.disabled = !controlOn() || !ok[action] || state.busy.has(`${t.trial_id}/${action}`);
  }
}

function compareValues(a, b) {
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  const text = (v) => (typeof v === 'object' ? JSON.stringify(v) : String(v));
  return text(a).localeCompare(text(b), undefined, { numeric: true });
}

function sortedTrials() {
  const col = state.columns.find((c) => c.key === state.sort.key) || state.columns[0];
  const blank = (v) => (v === undefined || v === null || v === '' ? 1 : 0);
  return state.trials
    .map((t, i) => ({ t, i, v: col.value(t) }))
    .sort((a, b) => blank(a.v) - blank(b.v) // blanks last either way
      || (blank(a.v) ? 0 : compareValues(a.v, b.v) * state.sort.dir)
      || a.i - b.i)
    .map((x) => x.t);
}

function renderTable() {
  state.columns = buildColumns();
  const sig = state.columns.map((c) => `${c.key}\u0000${c.label}`).join('\u0001');
  const body = $('trials-body');
  if (sig !== state.columnSig) {
    state.columnSig = sig;
    renderHead();
    body.replaceChildren();
    state.rows.clear();
  }
  for (const th of $('trials-head').children) {
    const sorted = th.dataset.sort === state.sort.key;
    th.classList.toggle('asc', sorted && state.sort.dir > 0);
    th.classList.toggle('desc', sorted && state.sort.dir < 0);
  }
  const seen = new Set();
  sortedTrials().forEach((t, i) => {
    let tr = state.rows.get(t.trial_id);
    if (!tr) state.rows.set(t.trial_id, (tr = makeRow(t.trial_id)));
    updateRow(tr, t);
    if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    seen.add(t.trial_id);
  });
  for (const [id, tr] of state.rows) {
    if (!seen.has(id)) {
      tr.remove();
      state.rows.delete(id);
    }
  }
}

// ---- header and best trial --------------------------------------------------

function renderExperiment() {
  const e = state.exp;
  setText($('exp-name'), String(e.name));
  document.title = `${e.name} · wtune`;
  // Once the server is gone (the experiment ended) the last status seen is stale.
  const status = state.offline ? 'unreachable' : String(e.status);
  setText($('exp-status'), status);
  $('exp-status').className = `exp-status ${['running', 'finished', 'stopped', 'unreachable'].includes(status) ? status : ''}`;
  setText($('exp-metric'), e.metric ? `${e.metric} (${e.mode})` : 'no metric');
  const written = new Date(e.written);
  setText($('exp-written'), Number.isNaN(written.getTime()) ? '' : `as of ${written.toLocaleTimeString()}`);
  const counts = e.counts || {};
  const sig = JSON.stringify(counts);
  if ($('counts').dataset.sig !== sig) {
    $('counts').dataset.sig = sig;
    $('counts').replaceChildren(...STATUSES.map((s) => el('span', {
      class: `${badgeClass(s)}${counts[s] ? '' : ' zero'}`, 'data-count': s, text: `${counts[s] || 0} ${s}`,
    })));
  }
  $('stop-experiment').disabled = !controlOn() || e.status !== 'running';
  $('add-trial').disabled = !controlOn();
  const note = $('control-note');
  note.hidden = !!e.control; // when offline, the message says why
  if (!e.control) {
    setText(note, `Controls are disabled: this server accepts no control requests now (the experiment is ${e.status}`
      + `${e.status === 'running' ? ' and this server only shows it, as `wtune serve` does' : ''}).`);
  }
  renderBest(e.best);
}

function renderBest(best) {
  const sig = JSON.stringify([best, state.exp.metric]);
  if (sig === state.bestSig) return;
  state.bestSig = sig;
  if (!best) {
    $('best').replaceChildren('No results yet.');
    return;
  }
  const metric = state.exp.metric;
  const head = el('div', { class: 'best-head' },
    el('button', { type: 'button', class: 'link', 'data-logs': best.trial_id, text: best.trial_id }), ' ',
    el('span', { class: badgeClass(best.status), text: statusLabel(best) }));
  if (metric && best.last_result) {
    head.append(` ${metric} = `, el('strong', { text: fmtNum(best.last_result[metric]) }));
  }
  head.append(` after ${best.iterations} iterations, ${fmtDuration(best.time_total_s)}`);
  const list = el('dl', { class: 'config' });
  for (const [k, v] of Object.entries(flatten(best.config))) {
    list.append(el('dt', { text: k }), el('dd', { text: typeof v === 'object' ? JSON.stringify(v) : String(v) }));
  }
  $('best').replaceChildren(head, list);
}

// ---- results and curves -----------------------------------------------------

function seriesOf(id) {
  let s = state.series.get(id);
  if (!s) {
    s = { next: 0, done: false, busy: false, points: [], count: 0, stride: 1, loose: false };
    state.series.set(id, s);
  }
  return s;
}

function addResults(s, records) {
  for (const r of records) {
    if (!r || typeof r !== 'object' || typeof r.training_iteration !== 'number') continue;
    const p = { x: r.training_iteration, v: Object.create(null) };
    for (const [k, v] of Object.entries(r)) {
      if (typeof v !== 'number' || !Number.isFinite(v) || NOT_PLOTTED.has(k)) continue;
      if (!state.metrics.has(k)) {
        // The experiment's own metric is always offered.
        if (state.metrics.size >= MAX_METRIC_NAMES && k !== state.exp?.metric) continue;
        state.metrics.add(k);
      }
      p.v[k] = v;
    }
    addPoint(s, p);
  }
}

// Memory stays bounded on long runs: past MAX_POINTS every other point goes
// and from then on only every `stride`-th new one is kept, plus the newest.
function addPoint(s, p) {
  const pts = s.points;
  if (s.loose) pts.pop();
  // A trial continued from a checkpoint redoes iterations: the redone ones replace the old.
  while (pts.length && pts[pts.length - 1].x >= p.x) pts.pop();
  pts.push(p);
  s.count += 1;
  s.loose = s.count % s.stride !== 0;
  if (pts.length > MAX_POINTS) {
    s.points = pts.filter((_, i) => i % 2 === 0 || i === pts.length - 1);
    s.stride *= 2;
  }
}

async function pollResults() {
  const queue = [];
  for (const t of state.trials) {
    const s = seriesOf(t.trial_id);
    if (s.done && !FINAL.has(t.status)) s.done = false;
    if (!s.done && !s.busy) queue.push({ id: t.trial_id, s, ended: FINAL.has(t.status) });
  }
  const worker = async () => {
    for (let job; (job = queue.shift());) {
      const { id, s, ended } = job;
      s.busy = true;
      try {
        // The offset is in the file an earlier answer named: one cut back
        // since (a resume) is another file, and the answer starts over.
        const file = s.file ? `&file=${s.file}` : '';
        const d = await api(trialPath(id, `/results?offset=${s.next}${file}&limit=${RESULT_LIMIT}`));
        // The trial's files were started over: what we had is gone.
        if (d.reset) Object.assign(s, { points: [], count: 0, stride: 1, loose: false });
        addResults(s, Array.isArray(d.results) ? d.results : []);
        if (typeof d.next_offset === 'number' && (d.reset || d.next_offset >= s.next)) s.next = d.next_offset;
        if (typeof d.file === 'string' && /^[0-9]+$/.test(d.file)) s.file = d.file;
        // It had ended before this read began, so a short read reached its last result.
        if (ended && !(d.results?.length >= RESULT_LIMIT)) s.done = true;
      } finally {
        s.busy = false;
      }
    }
  };
  const outcomes = await Promise.allSettled(Array.from({ length: RESULT_WORKERS }, worker));
  const failed = outcomes.find((o) => o.status === 'rejected');
  if (failed) throw failed.reason;
}

function currentMetric() {
  const m = state.metrics;
  if (state.metric && m.has(state.metric)) return state.metric;
  if (state.exp?.metric && m.has(state.exp.metric)) return state.exp.metric;
  return [...m].find((k) => !AUTO_FIELDS.has(k)) ?? [...m][0] ?? null;
}

function renderMetricSelect() {
  const exp = state.exp?.metric;
  const names = [...state.metrics].sort((a, b) => (b === exp) - (a === exp)
    || AUTO_FIELDS.has(a) - AUTO_FIELDS.has(b));
  const select = $('metric-select');
  const sig = names.join('\u0000');
  if (select.dataset.sig !== sig) {
    select.dataset.sig = sig;
    select.replaceChildren(...names.map((n) => el('option', { value: n, text: n })));
  }
  const current = currentMetric();
  if (current !== null && select.value !== current) select.value = current;
}

// Tableau's ten, then golden-angle hues: neighbours in trial order never look alike.
const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#b07aa1', '#76b7b2', '#edc948', '#9c755f', '#ff9da7', '#bab0ac'];
const colorOf = (index) => PALETTE[index] ?? `hsl(${Math.round((index * 137.508) % 360)}, 65%, 45%)`;

function ticks(lo, hi, count, integer) {
  const rough = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(rough));
  let step = [1, 2, 5, 10].map((f) => f * mag).find((s) => s >= rough);
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let i = Math.ceil(lo / step); i * step <= hi && out.length < 50; i++) out.push(Number((i * step).toPrecision(12)));
  return out;
}

function padRange(lo, hi, frac) {
  if (hi > lo) return [lo - (hi - lo) * frac, hi + (hi - lo) * frac];
  const d = Math.abs(lo) * 0.05 || 1;
  return [lo - d, hi + d];
}

function drawPlot() {
  const canvas = $('curves');
  const metric = currentMetric();
  const scope = state.selected.size ? state.trials.filter((t) => state.selected.has(t.trial_id)) : state.trials;
  setText($('plot-scope'), state.selected.size ? `${state.selected.size} ticked trial(s)` : 'all trials');
  $('clear-selection').hidden = state.selected.size === 0;

  const index = new Map(state.trials.map((t, i) => [t.trial_id, i]));
  const lines = [];
  for (const t of scope) {
    const pts = (state.series.get(t.trial_id)?.points || []).filter((p) => p.v[metric] !== undefined);
    if (pts.length) lines.push({ id: t.trial_id, color: colorOf(index.get(t.trial_id)), pts });
  }

  const w = Math.max(300, $('plot-box').clientWidth);
  const h = 340;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    canvas.style.width = `${w}px`;
    canvas.style.height = `${h}px`;
  }
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = '12px system-ui, sans-serif';
  ctx.fillStyle = '#666';
  const total = lines.reduce((n, l) => n + l.pts.length, 0);
  canvas.dataset.points = String(total);
  renderLegend(lines, metric);
  if (!total) {
    ctx.textAlign = 'center';
    ctx.fillText(metric ? `no results for ${metric} yet` : 'no results yet', w / 2, h / 2);
    return;
  }

  let [x0, x1, y0, y1] = [Infinity, -Infinity, Infinity, -Infinity];
  for (const l of lines) {
    for (const p of l.pts) {
      const y = p.v[metric];
      if (p.x < x0) x0 = p.x;
      if (p.x > x1) x1 = p.x;
      if (y < y0) y0 = y;
      if (y > y1) y1 = y;
    }
  }
  [x0, x1] = x1 > x0 ? [x0, x1] : [x0 - 1, x1 + 1];
  [y0, y1] = padRange(y0, y1, 0.05);
  const pad = { l: 72, r: 16, t: 14, b: 44 };
  const pw = w - pad.l - pad.r;
  const ph = h - pad.t - pad.b;
  const sx = (x) => pad.l + ((x - x0) / (x1 - x0)) * pw;
  const sy = (y) => pad.t + ph - ((y - y0) / (y1 - y0)) * ph;

  ctx.strokeStyle = '#e3e3e3';
  ctx.lineWidth = 1;
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  for (const x of ticks(x0, x1, Math.max(2, Math.floor(pw / 90)), true)) {
    ctx.beginPath();
    ctx.moveTo(Math.round(sx(x)) + 0.5, pad.t);
    ctx.lineTo(Math.round(sx(x)) + 0.5, pad.t + ph);
    ctx.stroke();
    ctx.fillText(fmtNum(x), sx(x), pad.t + ph + 6);
  }
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (const y of ticks(y0, y1, 6, false)) {
    ctx.beginPath();
    ctx.moveTo(pad.l, Math.round(sy(y)) + 0.5);
    ctx.lineTo(pad.l + pw, Math.round(sy(y)) + 0.5);
    ctx.stroke();
    ctx.fillText(fmtNum(y), pad.l - 6, sy(y));
  }
  ctx.strokeStyle = '#888';
  ctx.strokeRect(pad.l + 0.5, pad.t + 0.5, pw, ph);
  ctx.fillStyle = '#333';
  ctx.textAlign = 'center';
  ctx.textBaseline = 'bottom';
  ctx.fillText('training_iteration', pad.l + pw / 2, h - 4);
  ctx.save();
  ctx.translate(14, pad.t + ph / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = 'middle';
  ctx.fillText(metric, 0, 0);
  ctx.restore();

  ctx.save();
  ctx.beginPath();
  ctx.rect(pad.l, pad.t, pw, ph);
  ctx.clip();
  ctx.lineWidth = 1.5;
  for (const l of lines) {
    ctx.strokeStyle = ctx.fillStyle = l.color;
    ctx.beginPath();
    l.pts.forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, sx(p.x), sy(p.v[metric])));
    ctx.stroke();
    const last = l.pts[l.pts.length - 1];
    ctx.beginPath();
    ctx.arc(sx(last.x), sy(last.v[metric]), 2.5, 0, 2 * Math.PI);
    ctx.fill();
  }
  ctx.restore();
}

function renderLegend(lines, metric) {
  $('legend').replaceChildren(...lines.map((l) => {
    const swatch = el('span', { class: 'swatch' });
    swatch.style.backgroundColor = l.color;
    const last = l.pts[l.pts.length - 1];
    return el('span', { class: 'legend-item', 'data-trial': l.id }, swatch, `${l.id} `,
      el('span', { class: 'muted', text: `${metric} ${fmtNum(last.v[metric])} @ ${last.x}` }));
  }));
}

// ---- logs -------------------------------------------------------------------

async function openLogs(id) {
  const view = { id, start: 0, next: null, busy: true };
  state.logs = view;
  $('logs-section').hidden = false;
  setText($('logs-trial'), id);
  setText($('logs-range'), 'loading…');
  $('logs').textContent = '';
  $('logs-section').scrollIntoView({ block: 'nearest' });
  try {
    const d = await api(trialPath(id, `/logs?tail=${LOG_TAIL}`));
    if (state.logs !== view) return;
    $('logs').textContent = d.text;
    Object.assign(view, { start: d.offset, next: d.next_offset });
    showLogRange(view);
  } catch (e) {
    if (state.logs === view) setText($('logs-range'), '');
    showMessage(e.message);
  } finally {
    view.busy = false;
  }
}

// Appends what the trial logged since; the <pre> follows the end only if it was there.
async function followLogs() {
  const view = state.logs;
  if (!view || view.next === null || view.busy) return;
  view.busy = true;
  try {
    const d = await api(trialPath(view.id, `/logs?offset=${view.next}`));
    if (state.logs !== view || !d.text) return;
    const pre = $('logs');
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    let text = pre.textContent + d.text;
    if (text.length > LOG_KEEP) text = text.slice(text.length - LOG_KEEP);
    pre.textContent = text;
    view.next = d.next_offset;
    showLogRange(view);
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  } finally {
    view.busy = false;
  }
}

function showLogRange(view) {
  const t = state.trials.find((x) => x.trial_id === view.id);
  const why = t ? [t.error, t.stop_reason].filter(Boolean).map(inert).join('; ') : '';
  setText($('logs-range'), `guest.log bytes ${view.start}–${view.next}${why ? ` · ${why}` : ''}`);
}

// ---- actions ----------------------------------------------------------------

function mergeTrial(trial) {
  if (!trial || typeof trial.trial_id !== 'string') return;
  const i = state.trials.findIndex((t) => t.trial_id === trial.trial_id);
  if (i >= 0) state.trials[i] = trial;
  else state.trials.push(trial);
  state.fresh.set(trial.trial_id, Date.now() + FRESH_MS);
}

// Replaces the (possibly stale) list entries of recently steered trials.
async function refreshSteered() {
  const now = Date.now();
  const ids = [...state.fresh].filter(([, until]) => until > now).map(([id]) => id);
  for (const [id, until] of state.fresh) if (until <= now) state.fresh.delete(id);
  const fresh = await Promise.all(ids.map((id) => api(trialPath(id, '')).catch(() => null)));
  for (const trial of fresh) {
    if (!trial) continue;
    const i = state.trials.findIndex((t) => t.trial_id === trial.trial_id);
    if (i >= 0) state.trials[i] = trial;
    else state.trials.push(trial); // added since the state file was written
  }
}

async function trialAction(id, action) {
  const key = `${id}/${action}`;
  state.busy.add(key);
  render();
  try {
    const d = await api(trialPath(id, `/${action}`), { method: 'POST' });
    mergeTrial(d.trial);
    showMessage(d.message || `${action}: requested for ${id}`, 'action', 'info');
  } catch (e) {
    showMessage(e.message);
  } finally {
    state.busy.delete(key);
    render();
  }
}

async function stopExperiment() {
  const dir = state.exp?.dir ? ` ${state.exp.dir}` : ' DIR';
  if (!confirm(`Stop the experiment? No new trials start; running trials are checkpointed and paused. Continue later with: wtune resume${dir}`)) return;
  try {
    const d = await api('/api/experiment/stop', { method: 'POST' });
    showMessage(d.message || 'Stop requested.', 'action', 'info');
  } catch (e) {
    showMessage(e.message);
  }
}

async function addTrial(ev) {
  ev.preventDefault();
  let config;
  try {
    config = JSON.parse($('add-config').value);
  } catch (e) {
    showMessage(`The config is not valid JSON: ${e.message}`);
    return;
  }
  $('add-trial').disabled = true;
  try {
    const d = await api('/api/trials', { method: 'POST', body: { config } });
    mergeTrial(d.trial);
    setText($('add-result'), `added ${d.trial?.trial_id ?? ''}`);
    showMessage(d.message || 'Trial added.', 'action', 'info');
  } catch (e) {
    setText($('add-result'), '');
    showMessage(e.message);
  } finally {
    $('add-trial').disabled = !controlOn();
    render();
  }
}

// ---- wiring -----------------------------------------------------------------

function render() {
  if (!state.exp) return;
  renderExperiment();
  renderTable();
  renderMetricSelect();
  drawPlot();
}

async function tick() {
  try {
    const [exp, list] = await Promise.all([api('/api/experiment'), api('/api/trials')]);
    state.exp = exp;
    state.trials = Array.isArray(list.trials) ? list.trials : [];
    state.offline = false;
    await refreshSteered();
    clearMessage('poll');
    render();
    await Promise.all([pollResults(), followLogs()]);
    render();
  } catch (e) {
    showMessage(e.message, 'poll');
    if (e.status === 0 && !state.offline) {
      state.offline = true;
      render();
    }
  }
  setTimeout(tick, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
}

function init() {
  readTokenFromHash();
  $('message-close').addEventListener('click', () => clearMessage());
  $('stop-experiment').addEventListener('click', stopExperiment);
  $('add-form').addEventListener('submit', addTrial);
  $('logs-close').addEventListener('click', () => {
    state.logs = null;
    $('logs-section').hidden = true;
  });
  $('metric-select').addEventListener('change', (e) => {
    state.metric = e.target.value;
    drawPlot();
  });
  $('clear-selection').addEventListener('click', () => {
    state.selected.clear();
    render();
  });
  $('trials-head').addEventListener('click', (e) => {
    const th = e.target.closest('th[data-sort]');
    if (!th) return;
    const key = th.dataset.sort;
    state.sort = { key, dir: state.sort.key === key ? -state.sort.dir : 1 };
    renderTable();
  });
  $('trials-body').addEventListener('change', (e) => {
    const id = e.target.dataset?.select;
    if (id === undefined) return;
    if (e.target.checked) state.selected.add(id);
    else state.selected.delete(id);
    drawPlot();
  });
  document.addEventListener('click', (e) => {
    const logs = e.target.closest('[data-logs]');
    if (logs) openLogs(logs.dataset.logs);
    const button = e.target.closest('button[data-action]');
    const row = button?.closest('tr[data-trial]');
    if (row) trialAction(row.dataset.trial, button.dataset.action);
  });
  let resizing = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizing);
    resizing = setTimeout(drawPlot, 100);
  });
  tick();
}

init();
