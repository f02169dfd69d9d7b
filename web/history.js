// The history page (/history): every finished job, newest first, paged and filtered by state,
// node, kind and text (the filters live in the URL, so a view can be linked); today's counts
// per state; each node's busy strip and jobs over the last hour.

import {
  badge, between, busyStrip, coalesced, el, excerpt, fmtClock, fmtNum, fmtSpan, getJSON, jobHref, jobRate,
  liveEvents, localMidnight, setConnection, sinceSpan, stateBadge, tickSince, utilText, isRefusal, refusalNotice,
  heldByPress, privateLabel,
} from './common.js';

const PAGE = 50;
const $ = (id) => document.getElementById(id);
const H = {filters: fromUrl(), page: 1, total: 0, jobs: [], activity: null, nodes: [], loads: 0, error: null};
window.gpuqHistory = H; // for the browser console (and the page tests)

function fromUrl() {
  const q = new URLSearchParams(window.location.search);
  return {state: q.get('state') || '', node: q.get('node') || '', kind: q.get('kind') || '', q: q.get('q') || ''};
}

function toUrl() {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(H.filters)) if (v) q.set(k, v);
  if (H.page > 1) q.set('page', String(H.page));
  const search = q.toString();
  window.history.replaceState(null, '', search ? `?${search}` : window.location.pathname);
}

// -- loading ----------------------------------------------------------------------------------

async function load() {
  const q = new URLSearchParams({limit: String(PAGE), offset: String((H.page - 1) * PAGE)});
  for (const [k, v] of Object.entries(H.filters)) if (v) q.set(k, v);
  try {
    const [list, activity, nodes] = await Promise.all([
      getJSON(`/api/history?${q}`),
      getJSON(`/api/activity?since=${encodeURIComponent(localMidnight())}`),
      H.nodes.length ? null : getJSON('/api/nodes'),
    ]);
    Object.assign(H, {jobs: list.jobs, total: list.total, activity, error: null});
    if (nodes) H.nodes = nodes.nodes.map((n) => n.name);
  } catch (exc) {
    H.error = exc;
  }
  H.loads++;
  render();
}

const loadSoon = coalesced(load, 300);

// -- rendering --------------------------------------------------------------------------------

function render() {
  if (heldByPress(render)) return; // its buttons and links stay under a pressed pointer
  if (H.error) setConnection(isRefusal(H.error) ? 'refused' : 'down', H.error.message);
  renderToday();
  renderUtil();
  renderFilters();
  renderJobs();
}

function renderToday() {
  if (!H.activity) return;
  const f = H.activity.finished;
  $('today').replaceChildren(...['done', 'failed', 'cancelled'].map((state) => el('button', {
    type: 'button', className: `st-${state}${H.filters.state === state ? ' on' : ''}`,
    dataset: {state}, title: `show only ${state} jobs`,
    onclick: () => setFilter('state', H.filters.state === state ? '' : state)},
  el('b', {text: fmtNum(f[state])}), ` ${state}`)));
}

function renderUtil() {
  const a = H.activity;
  if (!a) return;
  $('util').replaceChildren(
    ...a.nodes.flatMap((n) => [
      el('b', {text: n.name}),
      busyStrip(n, a),
      el('span', {className: 'util-text', dataset: {node: n.name}, text: utilText(n, a)})]),
    el('div', {className: 'axis'}, el('span', {text: fmtClock(new Date(Date.parse(a.now) - a.window_s * 1000).toISOString())}),
      el('span', {}, el('i', {className: 'swatch busy'}), ' busy ', el('i', {className: 'swatch idle'}), ' idle'),
      el('span', {text: 'now'})));
}

function renderFilters() {
  const node = $('f-node');
  if (node.options.length !== H.nodes.length + 1) {
    node.replaceChildren(el('option', {value: '', text: 'any'}), ...H.nodes.map((n) => el('option', {value: n, text: n})));
  }
  for (const key of ['state', 'node', 'kind']) $(`f-${key}`).value = H.filters[key];
  if (document.activeElement !== $('f-q')) $('f-q').value = H.filters.q;
}

function renderJobs() {
  const box = $('jobs');
  if (isRefusal(H.error) && !H.jobs.length) { // the router's refusal and how to give the right token, at once
    box.replaceChildren(refusalNotice(H.error, loadSoon));
    setTimeout(loadSoon, 10000);
    return;
  }
  if (H.error && !H.jobs.length) {
    box.replaceChildren(el('p', {className: 'err', text: `Cannot load the history: ${H.error.message}. Retrying…`}));
    setTimeout(loadSoon, 2000);
    return;
  }
  const filtered = Object.values(H.filters).some(Boolean);
  if (!H.jobs.length) {
    box.replaceChildren(el('p', {className: 'muted', id: 'no-jobs',
      text: filtered ? 'No finished job matches these filters.' : 'No job has finished yet.'}));
  } else {
    box.replaceChildren(el('div', {className: 'table-scroll'}, el('table', {className: 'recent', id: 'history-table'},
      el('thead', {}, el('tr', {}, ...['state', 'finished', 'job', 'owner', 'kind', 'node', 'model', 'ran', 'tokens',
        'speed', 'prompt / error'].map((t) => el('th', {text: t})))),
      el('tbody', {}, ...H.jobs.map(row)))));
  }
  for (const id of ['pager-top', 'pager']) $(id).replaceChildren(...pager());
}

function row(j) {
  const text = j.private ? privateLabel(j) : j.error || j.prompt_excerpt || '';
  return el('tr', {dataset: {id: j.id, state: j.state, node: j.node, kind: j.kind}},
    el('td', {}, stateBadge(j.state)),
    el('td', {className: 'num', title: j.finished_at}, fmtClock(j.finished_at),
      el('span', {className: 'muted'}, ' · ', sinceSpan(j.finished_at), ' ago')),
    el('td', {}, el('a', {className: 'mono', href: jobHref(j.id), text: j.id}),
      j.batch ? badge(`batch ${j.batch.name || j.batch.id}`, 'batch-of', `line ${j.batch.custom_id} of batch ${j.batch.id}`) : null),
    el('td', {className: 'owner', text: j.owner || '–'}),
    el('td', {text: j.kind}),
    el('td', {text: j.node}),
    el('td', {className: 'mono', text: j.model}),
    el('td', {className: 'num', text: j.started_at ? fmtSpan(between(j.started_at, j.finished_at)) : '–'}),
    el('td', {className: 'num tokens', text: fmtNum(j.eval_count)}),
    el('td', {className: 'num speed', text: jobRate(j)}),
    el('td', {className: `what${j.error ? ' err' : ''}`, text: excerpt(text, 120), title: excerpt(text, 300)}));
}

function pager() {
  const pages = Math.max(1, Math.ceil(H.total / PAGE));
  const first = H.total ? (H.page - 1) * PAGE + 1 : 0;
  return [
    el('span', {className: 'range', text: `${fmtNum(first)}–${fmtNum(first ? first + H.jobs.length - 1 : 0)} of ${fmtNum(H.total)}`
      + ` · page ${fmtNum(H.page)} of ${fmtNum(pages)}`}),
    el('span', {className: 'spacer'}),
    el('button', {type: 'button', className: 'newer', text: '← Newer', disabled: H.page <= 1, onclick: () => go(H.page - 1)}),
    el('button', {type: 'button', className: 'older', text: 'Older →', disabled: H.page >= pages, onclick: () => go(H.page + 1)}),
  ];
}

// -- filters and paging ------------------------------------------------------------------------

function go(page) {
  H.page = page;
  toUrl();
  loadSoon();
}

function setFilter(key, value) {
  if (H.filters[key] === value) return;
  H.filters[key] = value;
  go(1);
}

for (const key of ['state', 'node', 'kind']) $(`f-${key}`).addEventListener('change', (e) => setFilter(key, e.target.value));
let typing = null;
$('f-q').addEventListener('input', (e) => {
  clearTimeout(typing);
  typing = setTimeout(() => setFilter('q', e.target.value.trim()), 250);
});
$('filters').addEventListener('submit', (e) => {
  e.preventDefault();
  setFilter('q', $('f-q').value.trim());
});
$('f-clear').addEventListener('click', () => {
  H.filters = {state: '', node: '', kind: '', q: ''};
  $('f-q').value = '';
  go(1);
});

// -- start ------------------------------------------------------------------------------------

H.page = Math.max(1, parseInt(new URLSearchParams(window.location.search).get('page') || '1', 10) || 1);
liveEvents({onConnect: loadSoon, onChange: loadSoon, onStatus: (status) => setConnection(status)});
setInterval(() => tickSince(document), 1000);
setInterval(loadSoon, 30000); // the busy strips move with the clock
loadSoon();
