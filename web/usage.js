// The usage page (/usage): usage over time from /api/usage. Each node's busy share per step as a
// timeline, GPU time by person and by model as bars, each lane's waits (p50 and p95) per step.
// Plain SVG, as wide as the screen; a member sees their own jobs only (the API decides).

import {el, fmtDur, fmtNum, fmtSpan, getJSON, isRefusal, refusalNotice, setConnection} from './common.js';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const WINDOWS = {'1d': '1h', '7d': '1h', '30d': '1d', '365d': '1d'}; // the window and its step
const U = {window: new URLSearchParams(window.location.search).get('window') || '7d', data: null, error: null, loads: 0};
window.gpuqUsage = U; // for the browser console (and the page tests)

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

function keyName(by, key) {
  if (key !== null) return String(key);
  return by === 'user' ? '(no user)' : '(unknown)';
}

// -- loading ----------------------------------------------------------------------------------

async function load() {
  if (!(U.window in WINDOWS)) U.window = '7d';
  const q = (by) => `/api/usage?by=${by}&since=${U.window}&step=${WINDOWS[U.window]}`;
  try {
    const [node, user, model, lane] = await Promise.all(['node', 'user', 'model', 'lane'].map((by) => getJSON(q(by))));
    Object.assign(U, {data: {node, user, model, lane}, error: null});
    setConnection('live', 'usage as of the last load; it loads again every minute');
  } catch (exc) {
    U.error = exc;
    setConnection(isRefusal(exc) ? 'refused' : 'down', exc.message);
  }
  U.loads++;
  render();
}

// -- rendering --------------------------------------------------------------------------------

function render() {
  $('f-window').value = U.window;
  if (U.error && !U.data) {
    $('nodes').replaceChildren(isRefusal(U.error) ? refusalNotice(U.error, load)
      : el('p', {className: 'alert', text: `Usage could not be read: ${U.error.message}`}));
    return;
  }
  if (!U.data) return;
  const d = U.data;
  $('scope').textContent = d.node.scope === 'own' ? 'your own jobs only' : 'everyone\'s jobs';
  $('nodes').replaceChildren(...timelines(d.node, (p) => Math.min(1, p.busy_s / d.node.step_s), busyText));
  $('people').replaceChildren(...bars(d.user));
  $('models').replaceChildren(...bars(d.model));
  $('lanes').replaceChildren(...waits(d.lane));
}

function empty(body) {
  return el('p', {className: 'muted', text: `No job ran in this window (since ${body.since.slice(0, 16).replace('T', ' ')} UTC).`});
}

function busyText(row, body) {
  const share = (100 * row.busy_s) / (body.steps * body.step_s);
  return `${fmtSpan(row.busy_s)} busy · ${share > 0 && share < 0.5 ? '<1' : Math.round(share)}% · ${fmtNum(row.jobs)} jobs`;
}

// One row per key: a cell per step, as dark as `share(point)` (0 to 1).
function timelines(body, share, text) {
  if (!body.rows.length) return [empty(body)];
  const rows = [...body.rows].sort((a, b) => String(a.key).localeCompare(String(b.key)));
  return rows.map((row) => {
    const name = keyName(body.by, row.key);
    const strip = svg('svg', {viewBox: `0 0 ${body.steps} 10`, preserveAspectRatio: 'none', role: 'img',
      'aria-label': `${name}: ${text(row, body)}`});
    strip.append(svg('rect', {class: 'track', x: 0, y: 0, width: body.steps, height: 10}));
    for (const p of row.series) {
      const cell = svg('rect', {class: 'busy', x: p.step, y: 0, width: 1, height: 10,
        'fill-opacity': Math.max(0.15, share(p)).toFixed(3)});
      cell.dataset.step = p.step;
      cell.dataset.share = share(p).toFixed(4);
      const title = svg('title');
      title.textContent = `${p.at.slice(0, 16).replace('T', ' ')} UTC: ${fmtSpan(p.busy_s)} busy, ${p.jobs} jobs`;
      cell.append(title);
      strip.append(cell);
    }
    return el('div', {className: 'timeline', dataset: {key: name}}, el('b', {text: name, title: name}), strip,
      el('span', {className: 'figure', text: text(row, body)}));
  });
}

// GPU time per key, the busiest first, each bar against the busiest.
function bars(body) {
  if (!body.rows.length) return [empty(body)];
  const most = Math.max(...body.rows.map((r) => r.busy_s), 1e-9);
  return body.rows.map((row) => {
    const name = keyName(body.by, row.key);
    const bar = svg('svg', {viewBox: '0 0 100 10', preserveAspectRatio: 'none', role: 'img',
      'aria-label': `${name}: ${fmtDur(row.busy_s)} of GPU time`});
    bar.append(svg('rect', {class: 'track', x: 0, y: 0, width: 100, height: 10}),
      svg('rect', {class: 'fill', x: 0, y: 0, width: Math.max(0.5, (100 * row.busy_s) / most).toFixed(2), height: 10}));
    const figure = `${fmtSpan(row.busy_s)} · ${fmtNum(row.jobs)} jobs · ${fmtNum(row.tokens_out)} tokens out`;
    return el('div', {className: 'bar', dataset: {key: name, busy: row.busy_s.toFixed(3)}},
      el('b', {text: name, title: name}), bar, el('span', {className: 'figure', text: figure}));
  });
}

// Each lane's waits per step: p95 (amber) behind p50 (blue), against the longest p95 shown.
function waits(body) {
  if (!body.rows.length) return [empty(body)];
  const longest = Math.max(...body.rows.flatMap((r) => r.series.map((p) => p.wait_p95_s || 0)), 1e-9);
  const note = el('p', {className: 'axis-note', text: `bar height: the step's wait, up to ${fmtSpan(longest)}`});
  return [...body.rows.map((row) => {
    const name = keyName(body.by, row.key);
    const text = `p50 ${fmtSpan(row.wait_p50_s)} · p95 ${fmtSpan(row.wait_p95_s)} · ${fmtNum(row.jobs)} jobs`;
    const chart = svg('svg', {viewBox: `0 0 ${body.steps} 10`, preserveAspectRatio: 'none', role: 'img',
      'aria-label': `${name} lane's waits: ${text}`});
    for (const p of row.series) {
      if (p.wait_p95_s === null) continue;
      for (const [cls, value] of [['p95', p.wait_p95_s], ['p50', p.wait_p50_s]]) {
        const h = Math.max(0.5, (10 * value) / longest);
        const bar = svg('rect', {class: cls, x: p.step, y: (10 - h).toFixed(3), width: 1, height: h.toFixed(3)});
        bar.dataset.step = p.step;
        chart.append(bar);
      }
    }
    return el('div', {className: 'timeline', dataset: {key: name}}, el('b', {text: name}), chart,
      el('span', {className: 'figure', text}));
  }), note];
}

$('f-window').addEventListener('change', (e) => {
  U.window = e.target.value;
  const q = new URLSearchParams(window.location.search);
  q.set('window', U.window);
  window.history.replaceState(null, '', `?${q}`);
  load();
});
load();
setInterval(load, 60_000);
