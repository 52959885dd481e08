// autoloop dashboard: polls the read-only JSON views every two seconds and draws the night.
// Every text that comes from the ledger, a log or a diff was written by an agent or a trial:
// it only ever reaches the page through textContent (el() below), never as HTML.
'use strict';

const POLL_MS = 2000;
const SVG_NS = 'http://www.w3.org/2000/svg';
const CRASH_CLASSES = ['trivial', 'fundamental', 'timeout'];
// SVG presentation attributes take plain colours (the same as app.css's variables).
const COLOR = { keep: '#1a9850', discard: '#8c8c8c', baseline: '#2c5aa0', line: '#dde2e7',
                trivial: '#e08214', fundamental: '#c51b1b', timeout: '#7b3294' };
const state = { rows: [], first: null, summary: null, sort: { key: 'index', dir: 1 }, selected: null,
                tableKey: '', plotKey: '', historyKey: null };

// -- small helpers -------------------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null) continue;
    if (key === 'text') node.textContent = String(value);
    else if (key === 'className') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function svg(tag, attrs, title) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (title) { const t = document.createElementNS(SVG_NS, 'title'); t.textContent = title; node.append(t); }
  return node;
}

function fmt(x, digits = 4) { return x === null || x === undefined ? '-' : Number(x).toFixed(digits); }
function signed(x, digits = 4) { return x === null || x === undefined ? '-' : (x > 0 ? '+' : '') + Number(x).toFixed(digits); }
function dur(s) {
  if (s === null || s === undefined) return '-';
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return (h ? h + 'h' : '') + (m ? m + 'm' : '') + (!h && (r || !m) ? r + 's' : '');
}
function short(sha) { return sha ? sha.slice(0, 7) : '-'; }

async function getJSON(url) {
  const response = await fetch(url, { credentials: 'same-origin', cache: 'no-store' });
  if (!response.ok) throw new Error(`${response.status}: ${(await response.text()).trim()}`);
  return response.json();
}

// -- polling -------------------------------------------------------------------------------

async function tick() {
  try {
    const [summary, attempts, live] = await Promise.all([
      getJSON('api/summary'), getJSON(`api/attempts?start=${state.rows.length}`), getJSON('api/live')]);
    if (attempts.first !== state.first || attempts.total < state.rows.length) {
      // Another ledger (a new tag archived the old one): start over.
      state.first = attempts.first;
      state.rows = [];
      const all = await getJSON('api/attempts?start=0');
      state.rows = all.rows;
    } else {
      state.rows = state.rows.concat(attempts.rows);
    }
    state.summary = summary;
    if (state.historyKey !== state.rows.length) {   // the study changes only when the ledger does
      state.historyKey = state.rows.length;
      renderHistory(await getJSON('api/history'));
    }
    renderSummary(summary);
    renderRungs(summary);
    renderLive(live);
    renderPlot();
    renderTradeoffs(summary);
    renderTable();
    banner(null);
  } catch (err) {
    banner(`the dashboard could not update (${err.message}); retrying every ${POLL_MS / 1000} s`);
  } finally {
    setTimeout(tick, POLL_MS);
  }
}

function banner(text) {
  const node = document.getElementById('banner');
  node.hidden = !text;
  node.textContent = text || '';
}

// -- summary cards -------------------------------------------------------------------------

function card(key, value, sub) {
  return el('div', { className: 'card' }, el('div', { className: 'k', text: key }), el('div', { className: 'v', text: value }),
            el('div', { className: 's', text: sub || '', title: sub || '' }));
}

function renderSummary(s) {
  document.getElementById('branch').textContent = s.tag ? `autoloop/${s.tag}` : '(no run yet)';
  const badge = document.getElementById('run-state');
  const interrupted = !s.running && s.current;
  badge.className = 'badge' + (s.running ? ' running' : interrupted ? ' interrupted' : '');
  badge.textContent = s.running ? 'running' : interrupted ? 'interrupted: resume with autoloop run --resume'
    : s.stop_reason ? `stopped: ${s.stop_reason}` : s.attempts ? 'not running' : 'no trials yet';
  document.getElementById('updated').textContent = `updated ${new Date().toLocaleTimeString()}`;
  document.getElementById('metric-head').textContent = s.metric_name;
  const better = s.direction === 'max' ? 'higher' : 'lower';
  const best = s.best || {}, base = s.baseline || {};
  const counts = s.status_counts || {};
  const crashes = Object.entries(s.crash_counts || {}).map(([k, v]) => `${k} ${v}`).join(', ');
  // The baseline is the mean of its runs (status_data): before any kept change the best is
  // that mean, and the improvement is none rather than a noise sample's "worse".
  let improvement = '-', pct = '';
  if (s.improvement !== null && s.improvement !== undefined && base.metric) {
    if (s.improvement === 0 || !(counts.keep > 0)) {
      improvement = fmt(0, 4);
      pct = 'no change has beaten the baseline yet';
    } else {
      improvement = fmt(Math.abs(s.improvement), 4);
      pct = `${(100 * Math.abs(s.improvement) / base.metric).toFixed(2)}% ${s.improvement >= 0 === (s.direction !== 'max') ? 'better' : 'worse'}`;
    }
  }
  const runs = base.runs > 1 ? `mean of ${base.runs} runs${base.sigma !== null && base.sigma !== undefined ? ', σ ' + fmt(base.sigma, 6) : ''}; ` : '';
  const counted = [['keep', 'keep'], ['noise_sample', 'noise samples'], ['confirm', 're-runs not kept'],
                   ['discard', 'discard'], ['pruned', 'pruned'], ['crash', 'crash'], ['skip', 'skip']]
    .filter(([k]) => k === 'keep' || counts[k]).map(([k, word]) => `${word} ${counts[k] || 0}`).join(', ');
  document.getElementById('cards').replaceChildren(
    card(`best ${s.metric_name}`, fmt(best.metric, 6), best.trial !== null && best.trial !== undefined
      ? `#${best.trial} ${best.description || ''} (${short(best.commit)})` : short(best.commit)),
    card('baseline', fmt(base.metric, 6), `${runs}${better} is better`),
    card('improvement', improvement, pct),
    card('noise', fmt(s.noise, 6), s.noise ? 'σ of the run-to-run spread' : 'no estimate yet'),
    ...(s.machine ? [card('best at median machine speed', s.machine.use ? fmt(s.machine.best_adjusted, 6) : 'not adjusted',
      s.machine.note)] : []),
    card('attempts', String(s.attempts), `${s.trials} trials: ${counted}`),
    card('crashes', String(counts.crash || 0), crashes || 'none'),
    card('pace', s.trials_per_hour ? `${s.trials_per_hour.toFixed(1)}/h` : '-', 'trials per hour'),
    card('time left', s.time_left_s !== null && s.time_left_s !== undefined ? dur(s.time_left_s) : '-',
         s.deadline ? `until ${new Date(s.deadline * 1000).toLocaleTimeString()}` : 'no --hours deadline'),
  );
}

// --scout: one line per rung; --prune: its line (text only: nothing in it is markup)
function renderRungs(s) {
  const el = document.getElementById('rungs');
  const lines = [...(s.rungs || []), ...(s.pruning || [])];
  el.hidden = lines.length === 0;
  el.replaceChildren(...lines.map(line => { const p = document.createElement('div'); p.textContent = line; return p; }));
}

// -- in flight -----------------------------------------------------------------------------

function renderLive(live) {
  const box = document.getElementById('live');
  box.replaceChildren(...live.attempts.map((a) => {
    const elapsed = a.attempt_started_at ? live.now - a.attempt_started_at : null;
    const head = el('div', { className: 'live-head' },
      el('strong', { text: `#${a.label}${a.worker ? ' [' + a.worker + ']' : ''} ${a.kind || ''}` }),
      el('span', { text: a.description || '-' }),
      el('span', { className: 'muted', text: `${a.phase}, ${dur(elapsed)} in${a.loss !== null && a.loss !== undefined ? ', loss ' + fmt(a.loss) : ''}` }));
    const bar = el('div', { className: 'bar' }, el('div'));
    bar.firstChild.style.width = `${Math.min(100, a.percent || 0)}%`;
    const idle = a.lookahead ? 'the proposer prepares the next trial while this one trains'
      : a.phase === 'proposing' ? 'the proposer is at work' : '';
    const log = a.log ? el('pre', { className: 'log live-log', text: a.log.text || a.log.error || '' })
      : el('div', { className: 'muted', text: idle });
    return el('section', { className: 'panel live-card', 'data-label': a.label }, head, bar, log);
  }), ...(live.prepared && live.prepared.length ? [el('div', { className: 'muted live-prepared',
    text: `prepared, waiting to run: ${live.prepared.map((t) => '#' + t).join(', ')}` })] : []));
  for (const pre of box.querySelectorAll('pre')) pre.scrollTop = pre.scrollHeight;
}

// -- the plot ------------------------------------------------------------------------------

function yRange(kept, others, direction) {
  // As plot.y_range: every kept point, the others up to one kept-range beyond; farther: on the edge.
  const sign = direction === 'min' ? 1 : -1;
  const k = kept.map((v) => v * sign), o = others.map((v) => v * sign);
  const best = Math.min(...k), worst = Math.max(...k);
  let spread = worst - best;
  if (spread <= 0) {
    const gaps = o.map((v) => Math.abs(v - worst)).sort((a, b) => a - b);
    spread = gaps.length ? 2 * gaps[Math.floor(gaps.length / 2)] : 0;
    spread = Math.max(spread, Math.abs(worst) * 0.002, 1e-6);
  }
  const shown = o.filter((v) => v >= best - spread && v <= worst + spread);
  let top = Math.max(worst + 0.25 * spread, ...shown);
  const bottom = Math.min(best, ...shown) - 0.25 * spread;
  top += 0.04 * (top - bottom);
  return sign === 1 ? [bottom, top] : [-top, -bottom];
}

function renderPlot() {
  // The chart is the night's search: autoloop verify's re-runs (kind verify) are measurements
  // of the best, not discarded proposals; the table lists them as "verify".
  const rows = state.rows.filter((r) => r.status !== 'skip' && r.kind !== 'verify');
  const key = `${rows.length}:${state.summary && state.summary.direction}`;
  if (key === state.plotKey) return;
  state.plotKey = key;
  const chart = document.getElementById('chart');
  chart.replaceChildren();
  const W = 960, H = 360, L = 96, R = 16, T = 14, plotH = 250, stripT = T + plotH + 24;
  const direction = (state.summary && state.summary.direction) || 'min';
  // Kept: the baseline and the kept changes; noise samples are re-runs of the best, drawn apart.
  const kept = rows.filter((r) => r.status === 'keep' && r.metric !== null && !r.noise_sample);
  const samples = rows.filter((r) => r.status === 'keep' && r.metric !== null && r.noise_sample);
  const others = rows.filter((r) => r.status === 'discard' && r.metric !== null);
  const crashes = rows.filter((r) => r.status === 'crash');
  const n = Math.max(rows.length, 2);
  const x = (i) => L + (W - L - R) * (i / (n - 1));
  document.getElementById('plot-note').textContent =
    `${rows.length} attempts: ${kept.filter((r) => r.kind !== 'baseline').length} kept changes, ${samples.length ? samples.length + ' noise samples, ' : ''}${others.length} discarded, ${crashes.length} crashed`;
  chart.append(svg('rect', { x: 0, y: 0, width: W, height: H, fill: 'white' }));
  if (!kept.length) {
    chart.append(Object.assign(svg('text', { x: W / 2, y: T + plotH / 2, 'text-anchor': 'middle' }),
      { textContent: 'no attempt has a metric yet' }));
    renderLegend();
    return;
  }
  const shownAt = (r) => (r.kind === 'baseline' && r.running_best !== null && r.running_best !== undefined ? r.running_best : r.metric);
  const [y0, y1] = yRange(kept.map(shownAt), others.concat(samples).map((r) => r.metric), direction);
  const y = (v) => T + plotH * (1 - (v - y0) / (y1 - y0));
  const pos = new Map(rows.map((r, i) => [r.index, i]));
  // grid and axes
  const grid = svg('g', { class: 'grid' });
  for (let k = 0; k <= 4; k++) {
    const v = y0 + (y1 - y0) * k / 4;
    grid.append(svg('line', { x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    chart.append(Object.assign(svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end' }), { textContent: v.toFixed(4) }));
  }
  chart.append(grid);
  const step = Math.max(1, Math.ceil(rows.length / 12));
  for (let i = 0; i < rows.length; i += step) {
    chart.append(Object.assign(svg('text', { x: x(i), y: stripT + 14 * CRASH_CLASSES.length + 16, 'text-anchor': 'middle' }),
      { textContent: String(i) }));
  }
  // running best: the best after each attempt (a noise sample does not step it), on to the last attempt
  let d = '', last = null;
  for (const r of rows) {
    if (r.running_best === null || r.running_best === undefined || r.running_best === last) continue;
    const px = x(pos.get(r.index)), py = y(r.running_best);
    d += last === null ? `M${px},${py}` : `H${px}V${py}`;
    last = r.running_best;
  }
  if (d) {
    d += `H${x(rows.length - 1)}`;
    chart.append(svg('path', { d, fill: 'none', stroke: COLOR.keep, 'stroke-width': 2, class: 'running-best' }));
  }
  const tip = (r) => `#${r.label} ${r.status} ${fmt(r.metric)} ${r.description}`;
  for (const r of others) {
    const i = pos.get(r.index);
    if (r.metric >= y0 && r.metric <= y1) {
      chart.append(point(svg('circle', { cx: x(i), cy: y(r.metric), r: 4, fill: COLOR.discard, 'fill-opacity': 0.6 }, tip(r)), r));
    } else {
      const edge = r.metric > y1 ? T + 4 : T + plotH - 4, up = r.metric > y1;
      const px = x(i);
      chart.append(point(svg('path', { d: up ? `M${px},${edge - 4}l4,7h-8z` : `M${px},${edge + 4}l4,-7h-8z`, fill: COLOR.discard },
        tip(r) + ' (off the scale)'), r));
    }
  }
  for (const r of samples) {
    chart.append(point(svg('circle', { cx: x(pos.get(r.index)), cy: y(r.metric), r: 4, fill: 'white', stroke: COLOR.baseline,
      'stroke-width': 1.5 }, tip(r) + ' (a noise sample: a re-run of the best)'), r));
  }
  for (const r of kept) {
    const i = pos.get(r.index), px = x(i), py = y(shownAt(r));
    const shape = r.kind === 'baseline'
      ? svg('path', { d: `M${px},${py - 7}l7,7l-7,7l-7,-7z`, fill: COLOR.baseline, stroke: 'white' }, tip(r))
      : svg('circle', { cx: px, cy: py, r: 6, fill: COLOR.keep, stroke: 'white', 'stroke-width': 1.5 }, tip(r));
    chart.append(point(shape, r));
  }
  // crash strip: one row per class
  CRASH_CLASSES.forEach((cls, row) => {
    const cy = stripT + 14 * row;
    chart.append(Object.assign(svg('text', { x: L - 6, y: cy + 4, 'text-anchor': 'end' }), { textContent: cls }));
    chart.append(svg('line', { x1: L, x2: W - R, y1: cy, y2: cy, stroke: COLOR.line }));
    for (const r of crashes.filter((c) => (c.crash || 'fundamental') === cls)) {
      const px = x(pos.get(r.index));
      const shape = cls === 'timeout' ? svg('rect', { x: px - 4, y: cy - 4, width: 8, height: 8, fill: COLOR[cls] }, tip(r))
        : svg('path', { d: `M${px - 4},${cy - 4}l8,8M${px + 4},${cy - 4}l-8,8`, stroke: COLOR[cls], 'stroke-width': cls === 'trivial' ? 2 : 3 }, tip(r));
      chart.append(point(shape, r));
    }
  });
  renderLegend();
}

function point(node, row) {
  node.classList.add('pt');
  node.dataset.label = row.label;
  node.addEventListener('click', () => openDetail(row));
  return node;
}

function renderLegend() {
  const items = [['baseline', COLOR.baseline], ['noise sample', COLOR.baseline], ['kept', COLOR.keep], ['running best', COLOR.keep],
                 ['discarded', COLOR.discard], ['crash: trivial', COLOR.trivial],
                 ['crash: fundamental', COLOR.fundamental], ['crash: timeout', COLOR.timeout]];
  document.getElementById('legend').replaceChildren(...items.map(([name, color]) => {
    const span = el('span', { text: name });
    span.style.setProperty('--c', color);
    return span;
  }));
}

// -- the table -----------------------------------------------------------------------------

function compare(a, b, key, type) {
  const va = a[key], vb = b[key];
  if (va === vb) return a.index - b.index;
  if (va === null || va === undefined) return 1;     // missing values last, whatever the direction
  if (vb === null || vb === undefined) return -1;
  return type === 'num' ? va - vb : String(va).localeCompare(String(vb));
}

function renderTable() {
  const { key, dir } = state.sort;
  const tableKey = `${state.rows.length}:${key}:${dir}:${state.selected}`;
  if (tableKey === state.tableKey) return;
  state.tableKey = tableKey;
  const head = document.querySelector(`#attempts th[data-key="${key}"]`);
  const type = head ? head.dataset.type : 'num';
  const rows = state.rows.slice().sort((a, b) => {
    const c = compare(a, b, key, type);
    return (a[key] === null || b[key] === null) ? c : dir * c;
  });
  for (const th of document.querySelectorAll('#attempts th')) {
    th.classList.toggle('sorted-asc', th.dataset.key === key && dir === 1);
    th.classList.toggle('sorted-desc', th.dataset.key === key && dir === -1);
  }
  const digits = 4;
  document.querySelector('#attempts tbody').replaceChildren(...rows.map((r) => {
    const cls = [r.status, r.kind === 'baseline' ? 'baseline' : '', state.selected === r.label ? 'selected' : ''].join(' ');
    return el('tr', { className: cls, 'data-label': r.label, onclick: () => openDetail(r) },
      el('td', { text: r.label }),
      el('td', { text: r.kind === 'baseline' || r.kind === 'verify' ? r.kind : r.noise_sample ? 'noise run' : r.status }),
      el('td', { className: 'num', text: fmt(r.metric, 6),
        title: r.adjusted_metric === null || r.adjusted_metric === undefined ? '' : `adjusted to the median machine speed: ${fmt(r.adjusted_metric, 6)}` }),
      el('td', { className: 'num', text: signed(r.delta, digits) }),
      el('td', { className: 'num', text: r.confidence === null ? '-' : r.confidence.toFixed(1) }),
      el('td', { text: r.crash || '-' }),
      el('td', { className: 'desc', text: r.description || '-', title: r.reason || '' }),
      el('td', { className: 'num', text: r.status === 'crash' || r.status === 'skip' || r.seconds === null ? '-' : r.seconds.toFixed(1) }),
      el('td', { className: 'num', text: r.worker === null ? '-' : r.worker }),
      el('td', { text: short(r.commit) }));
  }));
  document.getElementById('table-note').textContent = `${state.rows.length} ledger rows; click a row for its diff and log`;
}

function sortBy(key) {
  state.sort = { key, dir: state.sort.key === key ? -state.sort.dir : 1 };
  renderTable();
}

// -- one attempt ---------------------------------------------------------------------------

async function openDetail(row) {
  state.selected = row.label;
  renderTable();
  const panel = document.getElementById('detail');
  panel.hidden = false;
  document.getElementById('detail-title').textContent = `#${row.label} ${row.status}`;
  document.getElementById('detail-diff').replaceChildren('loading');
  document.getElementById('detail-log').textContent = '';
  let a;
  try {
    a = await getJSON(`api/attempt?trial=${row.trial}&attempt=${row.attempt}`);
  } catch (err) {
    document.getElementById('detail-diff').textContent = `cannot load: ${err.message}`;
    return;
  }
  if (state.selected !== row.label) return;   // another attempt was opened meanwhile
  const fields = [['description', a.description], ['hypothesis', a.hypothesis], ['reason', a.reason],
    [a.metric_name, fmt(a.metric, 6)], ['adjusted to the median machine speed', a.adjusted_metric === null || a.adjusted_metric === undefined ? null : fmt(a.adjusted_metric, 6)],
    ['machine speed', a.machine_speed], ['Δ best before', signed(a.delta, 6)],
    ['confidence', a.confidence === null ? '-' : `${a.confidence.toFixed(1)} σ`], ['crash', a.crash],
    ['kind', a.kind], ['proposer', a.proposer], ['worker', a.worker], ['commit', a.commit], ['parent', a.parent],
    ['seconds', a.seconds === null ? null : a.seconds.toFixed(1)], ['exit code', a.exit_code], ['signal', a.signal],
    ['git events', (a.git_events || []).join('; ')], ['reverted outside the target', (a.outside_changes || []).join(', ')],
    ['tampered', (a.tampered || []).join(', ')]];
  document.getElementById('detail-fields').replaceChildren(...fields
    .filter(([, v]) => v !== null && v !== undefined && v !== '')
    .flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })]));
  const diff = document.getElementById('detail-diff');
  if (a.diff === null) diff.textContent = a.diff_error || 'no diff';
  else if (a.diff === '') diff.textContent = 'no change: this attempt ran its parent as it was';
  else {
    diff.replaceChildren(...a.diff.split('\n').map((line) => {
      const cls = line.startsWith('+++') || line.startsWith('---') || line.startsWith('diff ') || line.startsWith('index ') ? 'meta'
        : line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : line.startsWith('@@') ? 'hunk' : '';
      return el('span', { className: cls, text: line + '\n' });
    }));
  }
  const log = document.getElementById('detail-log');
  log.textContent = a.log.error ? a.log.error : (a.log.truncated ? '[... the start is cut]\n' : '') + a.log.text;
  log.scrollTop = log.scrollHeight;
}

function closeDetail() {
  document.getElementById('detail').hidden = true;
  state.selected = null;
  renderTable();
}

// -- start ---------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  if (new URLSearchParams(location.search).has('token')) {
    // The server set a cookie with it: keep the token out of the address bar and history.
    history.replaceState(null, '', location.pathname);
  }
  for (const th of document.querySelectorAll('#attempts th')) th.addEventListener('click', () => sortBy(th.dataset.key));
  document.getElementById('detail-close').addEventListener('click', closeDetail);
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') closeDetail(); });
  tick();
});

// -- guards and trade-offs -----------------------------------------------------------------
// The summary's `guards` (one line each, with their breaches) and `front`: per axis (peak
// memory, tokens/s) the non-crash attempts, each marked kept and/or on the Pareto front.

function renderTradeoffs(s) {
  const guards = s.guards || [], axes = s.front || [];
  document.getElementById('tradeoffs-panel').hidden = !guards.length && !axes.length;
  document.getElementById('guards').replaceChildren(...guards.map((line) => el('li', { text: line.replace(/^- /, '') })));
  document.getElementById('tradeoffs').replaceChildren(...axes.map((axis) => frontChart(axis, s.metric_name)));
}

function frontChart(axis, metric) {
  const W = 460, H = 300, L = 64, R = 12, T = 12, B = 40;
  const pts = axis.points;
  const xs = pts.map((p) => p.x), ys = pts.map((p) => p.metric);
  const span = (lo, hi) => (hi > lo ? [lo, hi] : [lo - 1, hi + 1]);
  const [x0, x1] = span(Math.min(...xs), Math.max(...xs)), [y0, y1] = span(Math.min(...ys), Math.max(...ys));
  const px = (x) => L + (W - L - R) * (x - x0) / (x1 - x0), py = (y) => T + (H - T - B) * (1 - (y - y0) / (y1 - y0));
  const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'front', 'data-axis': axis.name, role: 'img',
                             'aria-label': `${metric} against ${axis.label}` });
  chart.append(svg('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: COLOR.line }),
               svg('line', { x1: L, y1: T, x2: L, y2: H - B, stroke: COLOR.line }));
  const label = (x, y, text, anchor) => { const t = svg('text', { x, y, 'text-anchor': anchor, 'font-size': 11 }); t.textContent = text; return t; };
  chart.append(label((L + W - R) / 2, H - 8, axis.label, 'middle'), label(4, T + 10, metric, 'start'),
               label(L, H - B + 14, x0.toPrecision(4), 'start'), label(W - R, H - B + 14, x1.toPrecision(4), 'end'),
               label(L - 4, H - B, y0.toPrecision(5), 'end'), label(L - 4, T + 10, y1.toPrecision(5), 'end'));
  const kept = pts.filter((p) => p.kept).sort((a, b) => a.x - b.x);
  if (kept.length > 1) {
    chart.append(svg('polyline', { points: kept.map((p) => `${px(p.x)},${py(p.metric)}`).join(' '), fill: 'none',
                                   stroke: COLOR.keep, 'stroke-dasharray': '4 3', class: 'kept-line' }));
  }
  for (const p of pts) {
    chart.append(svg('circle', { cx: px(p.x), cy: py(p.metric), r: p.front ? 5 : 3.5,
                                 fill: p.kept ? COLOR.keep : COLOR.discard, stroke: p.front ? '#222' : 'none',
                                 class: `pt${p.kept ? ' kept' : ''}${p.front ? ' front' : ''}` },
                     `${p.label}: ${metric} ${fmt(p.metric, 6)}, ${axis.label} ${Number(p.x).toPrecision(5)}`
                     + (p.kept ? ' (kept)' : '') + (p.front ? ' (on the front)' : '')));
  }
  return chart;
}

// -- the study across nights ---------------------------------------------------------------

function renderHistory(h) {
  const panel = document.getElementById('history-panel');
  const nights = h.nights || [];
  panel.hidden = nights.length < 2;   // one night: the page above is the whole study
  if (panel.hidden) return;
  const comparable = nights.filter((n) => n.comparable);
  document.getElementById('history-note').textContent =
    `${nights.length} nights; the running best counts the ${comparable.length} comparable with ${h.reference} (same budget, corpus, metric and machine)`;
  const body = document.querySelector('#history tbody');
  body.replaceChildren(...nights.map((n) => el('tr', { 'data-tag': n.tag, className: n.comparable ? '' : 'muted' },
    el('td', { text: n.tag }), el('td', { text: n.started_at ? new Date(n.started_at * 1000).toLocaleString() : '-' }),
    el('td', { text: n.attempts }), el('td', { text: fmt(n.baseline) }), el('td', { text: fmt(n.best) }),
    el('td', { text: signed(n.gain) }), el('td', { text: n.kept }), el('td', { text: fmt(n.device_hours, 2) }),
    el('td', { text: fmt(n.running_best) }),
    el('td', { text: n.comparable ? 'yes' : 'no: ' + n.not_comparable.join('; ') }))));
  // The running best, one step per comparable night; each night's own best as a point.
  const chart = document.getElementById('history-chart');
  chart.replaceChildren();
  const W = 960, H = 220, L = 96, R = 16, T = 12, B = 40;
  chart.append(svg('rect', { x: 0, y: 0, width: W, height: H, fill: 'white' }));
  const values = comparable.flatMap((n) => [n.best, n.running_best]).filter((v) => v !== null && v !== undefined);
  if (!values.length) return;
  let lo = Math.min(...values), hi = Math.max(...values);
  if (hi - lo < 1e-9) { lo -= 0.5; hi += 0.5; }
  const pad = (hi - lo) * 0.08;
  lo -= pad; hi += pad;
  const x = (i) => L + (W - L - R) * (comparable.length > 1 ? i / (comparable.length - 1) : 0.5);
  const y = (v) => T + (H - T - B) * (hi - v) / (hi - lo);   // higher values up, whichever is better
  for (let k = 0; k <= 3; k++) {
    const v = lo + (hi - lo) * k / 3;
    chart.append(svg('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: COLOR.line }));
    chart.append(Object.assign(svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end' }), { textContent: v.toFixed(4) }));
  }
  let d = '';
  comparable.forEach((n, i) => {
    if (n.running_best === null || n.running_best === undefined) return;
    d += d ? `H${x(i)}V${y(n.running_best)}` : `M${x(i)},${y(n.running_best)}`;
  });
  if (d) chart.append(svg('path', { d, fill: 'none', stroke: COLOR.keep, 'stroke-width': 2, class: 'history-line' }));
  comparable.forEach((n, i) => {
    chart.append(Object.assign(svg('text', { x: x(i), y: H - 14, 'text-anchor': 'middle' }), { textContent: n.tag }));
    if (n.best === null || n.best === undefined) return;
    chart.append(svg('circle', { cx: x(i), cy: y(n.best), r: 5, fill: COLOR.baseline, class: 'history-pt',
                                 'data-tag': n.tag }, `${n.tag}: best ${fmt(n.best)}, study best ${fmt(n.running_best)}`));
  });
}
