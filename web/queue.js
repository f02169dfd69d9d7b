// The queue page: one column per node in rank order, live through server-sent events.
// Reorder and move by drag (handles) or keys; every change goes through the queue-control API
// and the page then shows the server's order again, whether the API agreed or refused.

import {
  api, badge, busyStrip, coalesced, confirmDialog, el, etaSpan, excerpt, fmtClock, fmtDur, fmtNum,
  fmtApprox, fmtRate, fmtSpan, getJSON, jobHref, jobRate, liveEvents, localMidnight, now, parseTime, promptExcerpt,
  setConnection, since, sinceSpan, stateBadge, tickSince, toast, tokenDeclined, between, utilText,
  isRefusal, refusalNotice, promptStart, heldByPress, pressing,
} from './common.js';

const LIMIT_STEP = 200; // waiting jobs fetched per column; the rest is a count
const LIMIT_MAX = 2000;
const FIRST_LIMIT = 40; // the first load asks for a screenful per column, then for LIMIT_STEP at once
// A board with more waiting jobs than this draws, in each column, only the cards in view plus a
// margin (spacers stand for the rest, so the scroll bars are the whole list's); a column out of
// view draws none. Each column keeps its whole order's length: positions, moves and drops count
// in the whole list, whatever is drawn. Such a board is also *paged*: the page reads each
// column's first FIRST_LIMIT jobs, and the part of a column scrolled into view beyond them
// (/api/queue?node=&offset=), on its first load and on every refresh: what is on screen, not
// the whole queue. Each read asks for the waiting jobs of the columns in view only (the first
// of them in one read, `columns=`; one scrolled sideways by its part): the others show their
// running job and count, their cards read when they come into view.
const WINDOW_FROM = 400;
const COLUMN_WIDTH = 312; // a column's least width and the gap after it (style.css, #board)
const MARGIN = 20; // cards drawn beyond the view, above and below
const FIRST_MARGIN = 2; // on a large board's first draw: the view only; the margins after its first paint
const RECENT = 12;
const QUIET_S = 15; // a running job without tokens this long says so
const TAIL = 1000000000; // the API's largest position: the tail of a queue

const S = {
  queue: null, // GET /api/queue
  health: null, // GET /health
  activity: null, // GET /api/activity: today's counts, each node's last hour
  recent: [],
  batches: [], // GET /api/batches?open=1: the batches in progress, their lines per node
  unfolded: new Map(), // 'batch|node' -> that batch's jobs on the node, while its line is unfolded
  limit: LIMIT_STEP,
  error: null, // the last refresh's failure, shown until one succeeds
  dragging: null, // {id, node, kind, card} while a drag is in progress
  pressing: false, // a drag handle is pressed: the drag has not started yet
  pending: 0, // queue-control calls in flight; renders wait for them
  deferred: false, // a render was held back by a drag or a pending call
  gen: 0, // bumped when a call fails: the calls queued after it are dropped
  sig: '', // what the board was last rendered from
  tokens: new Map(), // running job id -> {run, count, last}
  updatedAt: 0,
  renders: 0,
  changes: 0,
  refreshes: 0, // refreshes started
  fetched: 0, // the refresh whose answers S holds
  readAt: -1, // S.changes when the queue shown was read
  full: false, // a first load (a screenful per column) was shown: refreshes ask for the whole limit
  paged: false, // the board is large: each read asks for the first screenful and the parts in view
  sized: false, // an answer came: whether the board is paged is known
  pageReads: 0, // reads of one column's part (for the page tests)
  shown: 0, // the refresh whose answers are on the screen (page tests wait for one started after a change)
};
window.gpuq = S; // for the browser console (and the page tests)

const $ = (id) => document.getElementById(id);
const board = $('board');

// -- loading ----------------------------------------------------------------------------------

async function loadRecent() {
  const lists = await Promise.all(['done', 'failed', 'cancelled'].map(
    (state) => getJSON(`/api/jobs?state=${state}&limit=${RECENT}`)));
  return lists.flatMap((l) => l.jobs)
    .sort((a, b) => (b.finished_at || '').localeCompare(a.finished_at || ''))
    .slice(0, RECENT);
}

// How long a column's list is on the page: its waiting jobs up to the limit.
const shownOf = (n) => Math.min(n.queued_count, S.limit);

// One column's waiting jobs [from, to) (a paged board's part in view).
function readPart(node, from, to) {
  S.pageReads++;
  return getJSON(`/api/queue?node=${encodeURIComponent(node)}&offset=${from}&limit=${to - from}`);
}

// The parts of the columns in view that a read of the first `columns` columns' first FIRST_LIMIT
// jobs leaves out.
function partsInView(columns) {
  if (!S.paged) return [];
  const parts = [];
  let i = 0;
  for (const [name, c] of cols) {
    const from = Math.max(i++ < columns ? FIRST_LIMIT : 0, c.start), to = c.end;
    if (to > from) parts.push([name, from, to]);
  }
  return parts;
}

// How many of the first columns (in rank order) are in view: before the first answer, as many
// as the window's width holds (those rangeOf draws: up to half a window beyond its right edge).
function leadingInView() {
  if (!cols.size) return Math.max(1, Math.floor((window.innerWidth * 1.5 - 16) / COLUMN_WIDTH) + 1);
  let n = 0;
  for (const c of cols.values()) {
    if (!inView(c.list.getBoundingClientRect())) break;
    n++;
  }
  return n;
}

// A paged board's answer: each column as long as it is shown, the jobs read in their places
// and holes for the rest (drawn as "loading" cards until read).
// `before`: the answer shown until now, when no change came between the two (its jobs read
// beyond the first fill the holes of a column whose count is the same).
function placed(queue, parts, before) {
  const old = new Map(before ? before.nodes.map((n) => [n.name, n]) : []);
  for (const n of queue.nodes) {
    const jobs = new Array(shownOf(n));
    const was = old.get(n.name);
    if (was && was.queued_count === n.queued_count) was.queued.forEach((j, i) => { if (i < jobs.length) jobs[i] = j; });
    n.queued.slice(0, jobs.length).forEach((j, i) => { jobs[i] = j; });
    n.queued = jobs;
  }
  const byName = new Map(queue.nodes.map((n) => [n.name, n]));
  for (const part of parts) {
    const n = part && byName.get(part.nodes[0].name);
    if (!n) continue;
    part.nodes[0].queued.forEach((j, i) => { if (part.offset + i < n.queued.length) n.queued[part.offset + i] = j; });
  }
  return queue;
}

async function refresh() {
  const asked = ++S.refreshes;
  const changes = S.changes;
  const limit = S.full && !S.paged ? S.limit : Math.min(S.limit, FIRST_LIMIT);
  // A paged board (and the first read, the board's size not known yet): the columns in view.
  const columns = S.sized && !S.paged ? null : leadingInView();
  const parts = partsInView(columns);
  // Each part apart: /health answers from the router's memory whatever the store does, so its
  // truth (a store that does not answer, a node down) shows even when the other reads fail.
  const [queue, health, recent, activity, batches] = await Promise.allSettled([
    Promise.all([getJSON(`/api/queue?limit=${limit}${columns === null ? '' : `&columns=${columns}`}`), ...parts.map(([n, from, to]) => readPart(n, from, to))]),
    getJSON('/health', [200, 503]),
    loadRecent(),
    getJSON(`/api/activity?since=${encodeURIComponent(localMidnight())}`),
    getJSON('/api/batches?open=1'),
  ]);
  if (batches.status === 'fulfilled') S.batches = batches.value.batches; // (a hint: the board shows without it)
  if (health.status === 'fulfilled') S.health = health.value;
  const failed = [queue, health, recent, activity].find((r) => r.status === 'rejected');
  if (failed) {
    S.error = failed.reason;
    if (isRefusal(S.error)) setConnection('refused', S.error.message);
  } else {
    const [whole, ...read] = queue.value;
    // A board too large to draw whole is paged from its first answer on (never read whole).
    if (!S.full && !S.paged) S.paged = whole.nodes.reduce((sum, n) => sum + shownOf(n), 0) > WINDOW_FROM;
    S.sized = true;
    // A small board read in part (its first read): read whole before it is drawn.
    if (!S.paged && columns !== null && whole.nodes.some((n, i) => i >= columns && n.queued_count)) return refresh();
    const before = S.queue && S.readAt === changes ? S.queue : null;
    Object.assign(S, {queue: S.paged ? placed(whole, read, before) : whole, recent: recent.value, activity: activity.value,
                      error: null, updatedAt: Date.now(), readAt: changes});
  }
  S.fetched = asked;
  if (!S.answeredAt && S.queue) S.answeredAt = performance.now(); // the first answers in (for make bench)
  const first = !S.full && S.queue && !S.error;
  if (first) S.full = true; // the next refresh asks for the whole limit
  render();
  if (first) {
    if (!S.paged && S.queue.nodes.some((n) => n.queued.length < shownOf(n))) refreshSoon();
    else S.fullAt = performance.now();
  } else if (S.full && !S.fullAt && S.queue) {
    S.fullAt = performance.now(); // every column as long as the limit (for make bench)
  }
}

const refreshSoon = coalesced(refresh, 250);

// -- rendering --------------------------------------------------------------------------------

function render() {
  // Never replace the board under a pressed pointer: a handle replaced before the drag starts
  // loses it, a button replaced between its press and its release gets no click.
  const picking = document.activeElement && document.activeElement.matches('select.move-to, .alert select');
  if (S.dragging || S.pending || picking || heldByPress(render)) {
    S.deferred = true;
    return;
  }
  S.deferred = false;
  S.renders++;
  document.body.classList.toggle('offline', Boolean(S.error)); // what is shown may be out of date
  renderTop();
  renderAwake();
  renderUpkeep();
  renderAlerts();
  renderBoard();
  if (!S.drawnAt && S.queue) S.drawnAt = performance.now(); // the first board drawn (for make bench)
  renderUtil();
  renderRecent();
  paintProgress();
  S.shown = S.fetched;
}

function staleHeads() {
  return (S.health && S.health.stale) || [];
}

function renderTop() {
  const q = S.queue;
  if (!q) return;
  const running = q.nodes.filter((n) => n.running).length;
  const up = q.nodes.filter((n) => n.up && !n.vram_stuck).length;
  $('stat-depth').textContent = fmtNum(q.queue_depth);
  $('stat-running').textContent = fmtNum(running);
  $('stat-up').textContent = `${up}/${q.nodes.length}`;
  $('stat-up').parentElement.classList.toggle('bad', up < q.nodes.length);
  if (S.activity) {
    const {done, failed} = S.activity.finished;
    $('stat-done').textContent = fmtNum(done);
    $('stat-failed').textContent = fmtNum(failed);
    $('stat-failed').parentElement.classList.toggle('bad', failed > 0);
  }
  const trouble = S.health && !S.health.ok;
  document.title = `${trouble ? '⚠ ' : ''}${fmtNum(q.queue_depth)} queued · gpuq`;
}

// The router's sleep inhibitor, held while jobs run: a quiet line in the top bar; a warning when
// it could not be held while jobs run; a quiet note of that while the lab is idle (a machine
// without the tool, e.g. no systemd, has nothing to keep awake then); nothing otherwise.
function renderAwake() {
  const box = $('awake');
  if (!box || !S.health) return;
  const a = S.health.awake;
  const machine = a && a.by === 'caffeinate' ? 'this Mac' : 'this machine';
  box.hidden = !a;
  box.classList.toggle('warn', Boolean(a && !a.held && a.running));
  if (!a) {
    box.textContent = '';
  } else if (a.held) {
    box.textContent = `keeping ${machine} awake (${a.by}) since ${fmtClock(a.since)}`;
    box.title = `jobs are running: the router holds a sleep inhibitor${a.pid ? ` (pid ${a.pid})` : ''}, let go when the lab is idle`;
  } else if (a.running) {
    box.textContent = `cannot keep this machine awake: ${a.error}`;
    box.title = 'jobs are running but the sleep inhibitor could not be held: the machine may sleep and break them';
  } else {
    box.textContent = `no sleep inhibitor here (${a.error})`;
    box.title = 'the router could not hold a sleep inhibitor when jobs last ran: while jobs run, the machine may sleep and break them';
  }
}

// The footer: when the last backup succeeded and where, the last retention sweep (what it did, or
// why it failed), and the storage budget (the database's size, its growth per day and the window
// it was measured over, the free space on its disk and the days until it is full at that growth).
// Their warnings are alerts above.
function fmtBytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  let v = Math.abs(n);
  while (Number(v.toFixed(i ? 1 : 0)) >= 1000 && i < units.length - 1) { v /= 1000; i++; }  // as rounded
  return `${n < 0 ? '-' : ''}${i ? v.toFixed(1) : v.toFixed(0)} ${units[i]}`;
}

function renderUpkeep() {
  const h = S.health;
  if (!h || !h.backup) return;
  const b = h.backup;
  const backup = $('upkeep-backup');
  const parts = [];
  if (b.last) {
    parts.push('Last backup ', sinceSpan(b.last.at), ' ago: ', el('span', {className: 'mono', text: b.last.path}),
      ` (${fmtBytes(b.last.bytes)})`);
  } else {
    parts.push('No backup yet');
  }
  if (b.scheduled) parts.push(b.next_at ? ` · next ${fmtClock(b.next_at)}` : '');
  else parts.push(` · scheduled backups ${b.off.startsWith('off') ? 'off' : 'not gpuq\'s (PostgreSQL: pg_dump)'}`);
  backup.replaceChildren(...parts);
  backup.classList.toggle('warn', Boolean(b.last_failure || b.overdue));
  backup.title = b.last_failure ? `the last scheduled backup failed: ${b.last_failure.error}` : (b.dir ? `scheduled backups go to ${b.dir}, ${b.keep} kept` : '');
  renderSweep(h.retention);
  const st = h.storage;
  const storage = $('upkeep-storage');
  if (!st) { storage.replaceChildren(); return; }
  const window = st.growth_window_s === null ? '' : ` over the last ${fmtDur(st.growth_window_s)}`;
  const growth = st.growth_bytes_per_day === null ? 'growth not known yet'
    : `${st.growth_bytes_per_day >= 0 ? '+' : ''}${fmtBytes(st.growth_bytes_per_day)}/day${window}`;
  const free = st.free_bytes === null ? '' : ` · ${fmtBytes(st.free_bytes)} free on its disk`;
  const full = st.days_until_full === null || st.days_until_full === undefined ? ''
    : `, full in about ${st.days_until_full} days at that growth`;
  storage.textContent = `Database ${fmtBytes(st.database_bytes)} (${growth})${free}${full}`;
  storage.classList.toggle('warn', st.warnings.length > 0);
  storage.title = st.wal_bytes === undefined || st.free_bytes === null ? ''
    : `its pages; on disk the file is ${fmtBytes(st.file_bytes)} and its WAL ${fmtBytes(st.wal_bytes)}`;
}

function renderSweep(r) {
  const sweep = $('upkeep-retention');
  if (!r) { sweep.replaceChildren(); return; }
  const last = r.last;
  const next = r.next_at ? ` · next ${fmtClock(r.next_at)}` : '';
  if (!last) {
    sweep.replaceChildren(`No retention sweep yet${next}`);
  } else if (last.ok) {
    const d = last.swept;
    sweep.replaceChildren('Last sweep ', sinceSpan(last.finished_at), ` ago: pruned ${d.pruned.jobs}, deleted `
      + `${d.deleted.jobs}, archived ${fmtBytes(d.archived.bytes)}${next}`);
  } else {
    sweep.replaceChildren('Last sweep FAILED ', sinceSpan(last.finished_at), ` ago${next}`);
  }
  sweep.classList.toggle('warn', Boolean(r.failing || r.overdue));
  sweep.title = !last ? '' : last.ok
    ? `longest hold of the database's writer ${last.swept.longest_hold_ms} ms over ${last.swept.batches} batches; every ${fmtDur(r.every_s)}`
    : `the last retention sweep failed: ${last.error}`;
}

let alertsSig = '';

function renderAlerts() {
  const box = $('alerts');
  const h = S.health;
  const sig = JSON.stringify([S.error && [S.error.status, S.error.message], h && h.warnings, h && !h.ok && [h.stale, h.nodes_down, h.loops_down, h.store && h.store.problem, h.unclaimed],
    h && !h.ok && S.queue && S.queue.nodes.map((n) => n.queued_count)]);
  if (sig === alertsSig) return; // rebuilding would restart the pulse and drop focus
  alertsSig = sig;
  box.replaceChildren();
  if (isRefusal(S.error)) {
    box.append(refusalNotice(S.error, refreshSoon));
  } else if (S.error) {
    box.append(el('div', {className: 'alert warn'},
      el('strong', {text: 'Router unreachable'}),
      el('span', {text: ` ${S.error.message}. Showing what was last seen${S.updatedAt ? ` ${fmtClock(new Date(S.updatedAt).toISOString())}` : ''}; retrying.`})));
  }
  for (const w of (h && h.warnings) || []) {  // a backup, the retention sweep or the storage budget: /health stays ok
    box.append(el('div', {className: 'alert warn', dataset: {warning: 'upkeep'}},
      el('span', {className: 'alert-tag', text: /backup/.test(w) ? 'BACKUP' : /retention sweep/.test(w) ? 'RETENTION' : 'STORAGE'}),
      el('span', {className: 'alert-text', text: w})));
  }
  if (!h || h.ok) return;
  const nodes = new Map((S.queue ? S.queue.nodes : []).map((n) => [n.name, n]));
  if (h.store) {  // the store refuses writes or does not answer: what is shown may lag behind
    box.append(el('div', {className: 'alert stale', dataset: {store: 'trouble'}},
      el('span', {className: 'alert-tag', text: 'DATABASE'}),
      el('span', {className: 'alert-text'}, `${h.store.problem} (since `, sinceSpan(h.store.since),
        ' ago). Nothing new is recorded until it answers; node health below is the router\'s own.')));
  }
  for (const u of h.unclaimed || []) {
    box.append(el('div', {className: 'alert stale', dataset: {node: u.node}},
      el('span', {className: 'alert-tag', text: 'NOT CLAIMED'}),
      el('span', {className: 'alert-text'}, el('b', {text: u.node}), ' is up and idle but cannot claim ',
        u.job ? el('a', {href: jobHref(u.job), className: 'mono', text: u.job}) : 'its next job',
        ' (for ', sinceSpan(u.since), '): ', el('span', {className: 'mono', text: u.error}))));
  }
  for (const s of h.stale) box.append(staleAlert(s, nodes.get(s.node)));
  for (const d of h.nodes_down) {
    if (d.waiting) box.append(downAlert(d));
  }
  for (const l of h.loops_down || []) {
    box.append(el('div', {className: 'alert stale', dataset: {loop: l.loop, node: l.node || ''}},
      el('span', {className: 'alert-tag', text: 'LOOP CRASHED'}),
      el('span', {className: 'alert-text'},
        `The router's ${l.loop}${l.node ? ` for ${l.node}` : ''} crashed (${l.crashes}× since `,
        sinceSpan(l.since), ' ago): ', el('span', {className: 'mono', text: l.error}),
        '. It restarts by itself; the router log has the traceback.')));
  }
}

const STALE_WHY = {
  'no progress': 'no tokens since',
  'ran past max_runtime': 'running past max_runtime, started',
  'ollama finished but the job was not closed': 'Ollama finished but the job was never closed, at',
};

function staleAlert(s, node) {
  const waiting = node ? node.queued_count : 0;
  return el('div', {className: 'alert stale', dataset: {id: s.id, node: s.node}},
    el('span', {className: 'alert-tag', text: 'STALE HEAD'}),
    el('span', {className: 'alert-text'},
      el('b', {text: s.node}), ' is blocked: job ',
      el('a', {href: jobHref(s.id), className: 'mono', text: s.id}),
      ' stuck for ', el('b', {className: 'big'}, sinceSpan(s.since)),
      ` (${STALE_WHY[s.reason] || `${s.reason} since`} ${fmtClock(s.since)}).`,
      waiting ? ` ${fmtNum(waiting)} ${waiting === 1 ? 'job waits' : 'jobs wait'} behind it.` : ''),
    el('button', {type: 'button', className: 'danger', text: 'Delete stuck job',
      onclick: () => deleteJob({id: s.id, node: s.node, state: 'running'})}));
}

function downAlert(d) {
  const others = (S.queue ? S.queue.nodes : []).filter((n) => n.name !== d.name);
  // Up nodes first, in rank order (the API's); a down one is still a choice, marked so.
  others.sort((a, b) => Number(!a.up) - Number(!b.up));
  const select = el('select', {className: 'move-target', 'aria-label': `Node to move ${d.name}'s waiting jobs to`},
    ...others.map((n) => el('option', {value: n.name, text: `${n.name}${n.up ? '' : ' (down)'}`})));
  select.addEventListener('blur', () => { if (S.deferred) setTimeout(render, 0); });
  const go = el('button', {type: 'button', className: 'move-all', text: 'Move these jobs',
    title: `Move the jobs waiting on ${d.name} to the end of the chosen node's queue`,
    onclick: () => moveAll(d.name, select.value, go)});
  return el('div', {className: 'alert down', dataset: {node: d.name}},
    el('span', {className: 'alert-tag', text: 'NODE DOWN'}),
    el('span', {className: 'alert-text'},
      el('b', {text: d.name}), ' down for ', el('b', {}, sinceSpan(d.since)),
      d.error ? ` (${d.error})` : '', ` — ${fmtNum(d.waiting)} job${d.waiting === 1 ? '' : 's'} waiting on it.`),
    others.length ? el('span', {className: 'move-all-box'}, select, go) : null);
}

// Moves every job waiting on `from` to the tail of `to`, one call each in queue order (there is
// no bulk call); a refusal (a critique on its parent's node, a node without the role) does not
// stop the others, and every refusal is named by job id.
async function moveAll(from, to, button) {
  if (!to) return;
  button.disabled = true;
  S.pending++;
  const refused = [];
  let moved = 0;
  try {
    const q = await getJSON(`/api/queue?limit=100000`);
    const node = q.nodes.find((n) => n.name === from);
    for (const job of node ? node.queued : []) {
      let r;
      try {
        r = await api('POST', `${idPath(job.id)}/move`, {node: to, position: TAIL});
      } catch (exc) {
        r = {ok: false, status: exc.status || 0, message: exc.message};
      }
      if (r.ok) moved++;
      else refused.push(`${job.id}: ${r.message}${r.status ? ` (${r.status})` : ''}`);
    }
  } catch (exc) {
    refused.push(`the queue could not be read: ${exc.message}`);
  } finally {
    S.pending--;
    S.sig = '';
    alertsSig = '';
    refreshSoon();
  }
  const summary = `Moved ${fmtNum(moved)} job${moved === 1 ? '' : 's'} from ${from} to ${to}`;
  if (refused.length) toast(`${summary}; could not move ${refused.join('; ')}`);
  else toast(`${summary}.`, 'info', 5000);
  announce(refused.length ? `${summary}; ${refused.length} refused` : summary);
}

function renderBoard() {
  const q = S.queue;
  if (!q) {
    if (S.error) board.replaceChildren(el('p', {className: 'loading', text: `The queue is not loaded: ${S.error.message}.`}));
    return;
  }
  const sig = JSON.stringify([q, staleHeads().map((s) => s.id), S.limit, S.batches, [...S.unfolded.entries()]]);
  if (sig === S.sig) return;
  S.sig = sig;
  const active = document.activeElement;
  const focusCard = board.contains(active) ? active.closest('[data-id]') : null;
  const scroll = new Map([...board.querySelectorAll('.queue')].map((l) => [l.dataset.node, l.scrollTop]));
  const stale = new Set(staleHeads().map((s) => s.id));
  if (!q.nodes.length) {
    board.replaceChildren(el('p', {className: 'empty', text: 'No nodes are configured: add [[node]] tables to gpuq.toml.'}));
    return;
  }
  cols.clear();
  windowed = q.nodes.reduce((sum, n) => sum + n.queued.length, 0) > WINDOW_FROM;
  board.replaceChildren(...q.nodes.map((n) => column(n, stale)));
  tight = windowed && marginsDue;
  drawAll(true, scroll);
  if (tight) {
    tight = marginsDue = false;
    requestAnimationFrame(() => setTimeout(() => { // after the first paint
      if (!S.dragging && !S.pressing) drawAll();
      S.marginsAt = performance.now(); // (for make bench)
    }, 0));
  }
  if (focusCard) {
    const again = cardById(focusCard.dataset.id);
    if (again) again.focus({preventScroll: true});
  }
  const running = new Set(q.nodes.filter((n) => n.running).map((n) => n.running.id));
  for (const id of S.tokens.keys()) if (!running.has(id)) S.tokens.delete(id);
  for (const n of q.nodes) if (n.running) baseline(n.running, false);
  paintProgress(); // once for every running card, not once per card
}

// -- the columns' cards: all of them, or (a large board) the ones in view ---------------------

const cols = new Map(); // node -> {list, jobs (the whole order), model, cards (id -> element), start, end}
let windowed = false;
// A large board's first draw: only the cards in the window (the browser lays out and styles
// every card drawn, most of that first frame's cost); its margins are drawn once it is painted.
let tight = false, marginsDue = true;
let cardHeight = 0; // a drawn card's height and the gap under it, measured once

function spacer(px) {
  const li = el('li', {className: 'vspace', 'aria-hidden': 'true'});
  li.style.height = `${Math.max(0, px - 4)}px`; // the list's gap (4 px) follows it
  return li;
}

// The cards [start, end) of a column to draw: every card, or those in the viewport plus MARGIN.
function rangeOf(c, scrollTop) {
  const n = c.jobs.length;
  if (!windowed || !n) return [0, n];
  if (!cardHeight) return [0, Math.min(n, placeOf(shownBefore(c), 3))]; // to measure one (folded ones take no room)
  const r = c.list.getBoundingClientRect();
  const vh = window.innerHeight;
  if (!inView(r, tight)) return [0, 0];
  const margin = tight ? FIRST_MARGIN : MARGIN;
  // As if the list reached the viewport's bottom: an empty list is short until it is drawn.
  const top = scrollTop + Math.max(0, -r.top);
  const bottom = scrollTop + vh - r.top;
  // In cards shown (a folded batch's cards take no room), then back to places in the order.
  const vis = shownBefore(c);
  const start = placeOf(vis, Math.max(0, Math.floor(top / cardHeight) - margin));
  const end = Math.min(n, Math.max(start, placeOf(vis, Math.ceil(bottom / cardHeight) + margin)));
  return [start, end];
}

// A waiting line of a batch whose line on this node is folded: its card is drawn hidden (kept
// in its place, so positions, moves and drops count it), and takes no room.
function foldedHere(job, node) {
  return Boolean(job && job.batch && !S.unfolded.has(`${job.batch.id}|${node}`));
}

// vis[i]: how many of a column's first i jobs are shown (not folded); vis[n] all of them.
function shownBefore(c) {
  const node = c.list.dataset.node;
  const vis = new Array(c.jobs.length + 1);
  vis[0] = 0;
  for (let i = 0; i < c.jobs.length; i++) vis[i + 1] = vis[i] + (foldedHere(c.jobs[i], node) ? 0 : 1);
  return vis;
}

// The first place whose shown cards before it reach `k`.
function placeOf(vis, k) {
  let lo = 0, hi = vis.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (vis[mid] < k) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// A list in view, or within half a window of it (`strict`: in the window itself).
function inView(r, strict = false) {
  const vw = window.innerWidth, vh = window.innerHeight, m = strict ? 0 : 0.5;
  return !(r.right < -vw * m || r.left > vw * (1 + m) || r.bottom < -vh * m || r.top > vh * (1 + m));
}

// A card drawn at position `i` of `count`: its number, its label, its ↑ / ↓ buttons.
function cardAt(c, i) {
  const job = c.jobs[i];
  if (!job) return loadingCard(c);
  let card = c.cards.get(job.id);
  if (!card) {
    card = queuedCard(job, i, c.model, c.jobs.length);
    c.cards.set(job.id, card);
  }
  card.querySelector('.pos').textContent = String(i + 1);
  card.classList.toggle('batch-folded', foldedHere(job, c.list.dataset.node));
  card.setAttribute('aria-label', `${job.kind} ${job.id}, position ${i + 1} on ${card.dataset.node}: ${promptExcerpt(job, 80)}`);
  const [up, down] = card.querySelectorAll('.step');
  up.disabled = i === 0;
  down.disabled = i === c.jobs.length - 1;
  return card;
}

// A card not read yet (a paged board's hole), as tall as the others; its part is read now.
function loadingCard(c) {
  const li = el('li', {className: 'card loading', 'aria-hidden': 'true', text: 'loading…'});
  if (cardHeight) li.style.height = `${cardHeight - 4}px`;
  readSoon(c);
  return li;
}

// Read the part of a column in view that is not read yet: one read per column at a time, and
// once it is in, the part then in view if it still has holes (a scroll or a redraw meanwhile).
// An answer read across a change of the queue is not used (the change's refresh reads the parts
// in view again); a failed read is not repeated (the next refresh is).
const reading = new Set(); // nodes whose part is being read

function holesInView(c) {
  let from = c.start, to = c.end;
  while (from < to && c.jobs[from]) from++;
  while (to > from && c.jobs[to - 1]) to--;
  return [from, to];
}

function readSoon(c) {
  const node = c.list.dataset.node;
  if (reading.has(node) || S.pending || S.dragging) return;
  const [from, to] = holesInView(c);
  if (from >= to) return;
  reading.add(node);
  const changes = S.changes, limit = S.limit;
  readPart(node, from, to).then((part) => {
    reading.delete(node);
    const now = cols.get(node), n = S.queue && S.queue.nodes.find((x) => x.name === node);
    const got = part.nodes[0];
    if (!now || !n || S.pending || S.dragging) return;
    if (pressing() || changes !== S.changes || changes !== S.readAt || limit !== S.limit || got.queued_count !== n.queued_count) {
      refreshSoon(); // it changed under the read (or a press holds the board: drawn after it)
      return;
    }
    got.queued.forEach((j, i) => {
      if (from + i < now.jobs.length) n.queued[from + i] = now.jobs[from + i] = j;
    });
    S.sig = JSON.stringify([S.queue, staleHeads().map((x) => x.id), S.limit]);
    drawList(now, true); // draws the rest of the view's holes, and reads them
  }, () => reading.delete(node));
}

// `scrolls`: where drawAll collects the lists' scroll positions to restore once every list is
// replaced (reading a list's scrollTop right after replacing its children lays out the whole
// board: once per column, it was most of a large board's first draw).
function drawList(c, force = false, scrollTop = c.list.scrollTop, range = rangeOf(c, scrollTop), scrolls = null) {
  const [start, end] = range;
  if (!force && start === c.start && end === c.end) return;
  c.start = start;
  c.end = end;
  const active = document.activeElement;
  const had = active && c.list.contains(active) ? active : null;
  const items = [];
  const vis = windowed ? shownBefore(c) : null; // (the spacers: as tall as the cards shown)
  if (start > 0) items.push(spacer(vis[start] * cardHeight));
  for (let i = start; i < end; i++) items.push(cardAt(c, i));
  if (end < c.jobs.length) items.push(spacer((vis[c.jobs.length] - vis[end]) * cardHeight));
  if (!c.jobs.length) items.push(el('li', {className: 'empty-queue', text: 'nothing waiting'}));
  c.list.replaceChildren(...items);
  if (scrolls) scrolls.push([c.list, scrollTop, had]);
  else restoreScroll(c.list, scrollTop, had);
}

function restoreScroll(list, scrollTop, had) {
  if (list.scrollTop !== scrollTop) list.scrollTop = scrollTop;
  if (had && had.isConnected) had.focus({preventScroll: true});
}

function drawAll(force = false, scroll = new Map()) {
  if (windowed && !cardHeight) {
    const c = [...cols.values()].find((x) => shownBefore(x)[x.jobs.length] > 0);
    if (c) {
      drawList(c, true, 0);
      const drawn = [...c.list.querySelectorAll(':scope > .card:not(.batch-folded)')];
      const h = drawn.reduce((sum, d) => sum + d.offsetHeight, 0) / drawn.length;
      if (h > 0) cardHeight = h + 4; // the list's gap
    }
  }
  // Every range first (one layout), then the lists drawn.
  const plan = [...cols].map(([name, c]) => {
    const top = scroll.has(name) ? scroll.get(name) : c.list.scrollTop;
    return [c, top, rangeOf(c, top)];
  });
  const scrolls = [];
  for (const [c, top, range] of plan) drawList(c, force, top, range, scrolls);
  for (const [list, top, had] of scrolls) restoreScroll(list, top, had);
}

let drawQueued = false;
function drawSoon() {
  if (!windowed || drawQueued || S.dragging || S.pressing) return;
  drawQueued = true;
  requestAnimationFrame(() => { drawQueued = false; drawAll(); });
}
board.addEventListener('scroll', drawSoon, {capture: true, passive: true}); // a column's list, or the board sideways
window.addEventListener('scroll', drawSoon, {passive: true}); // a phone: the columns stacked
window.addEventListener('resize', drawSoon);

// Draw the window around card `index` of a column (scrolled to it if it was not drawn).
function reveal(c, index) {
  if (windowed && cardHeight && (index < c.start + 2 || index >= c.end - 2)) {
    drawList(c, true, Math.max(0, shownBefore(c)[index] * cardHeight - c.list.clientHeight / 2));
  } else {
    drawList(c, true);
  }
}

// Each column's busy strip and jobs per hour, redrawn on every refresh without rebuilding the board.
function renderUtil() {
  if (!S.activity) return;
  const byName = new Map(S.activity.nodes.map((n) => [n.name, n]));
  for (const box of board.querySelectorAll('.col-util')) {
    const n = byName.get(box.dataset.node);
    box.replaceChildren(...(n ? [busyStrip(n, S.activity), el('span', {className: 'util-text', text: utilText(n, S.activity)})] : []));
  }
}

function nodeStatus(node) {
  if (!node.checked) return ['checking', 'checking…', 'waiting for the first health check'];
  if (node.vram_stuck) return ['stuck', 'VRAM stuck', node.vram_stuck];
  if (!node.up) return ['down', 'down', (node.last_error || 'does not answer')
    + (node.health_recorded === false ? ' (not recorded: the database refuses writes)' : '')];
  return ['up', 'up', `answering since ${fmtClock(node.since)}`];
}

function idleText(node, cls) {
  if (cls === 'down') return 'nothing runs while the node is down';
  if (cls === 'stuck') return 'nothing runs until the model leaves VRAM';
  if (cls === 'checking') return 'waiting for the first health check';
  if (!node.queued_count) return 'idle';
  const held = node.queued.length === node.queued_count && node.queued.every((j) => j && j.waiting_for);
  return held ? 'idle — every waiting job waits for its parent' : 'idle — starting the head';
}

// A model kept loaded between jobs (a front-door call's keep_alive, or "when-idle"), and until when.
function warmLine(warm) {
  const until = warm.until ? fmtClock(warm.until) : 'the node is idle';
  return el('div', {className: 'col-warm mono', text: `warm: ${warm.model} until ${until}`,
    title: 'kept loaded for the next call of this model; a job of another model unloads it first'});
}

// The last kept model a client asked to leave (`ollama stop`, Open WebUI's unload), once it left.
function unloadedLine(u) {
  const how = u.verified ? `gone from /api/ps in ${u.took_s} s` : 'still listed by /api/ps: the node is flagged';
  return el('div', {className: 'col-unloaded mono', text: `unloaded ${u.model} at ${fmtClock(u.at)}: ${how}`,
    title: `${u.by} asked this model to leave VRAM (keep_alive 0 with no prompt)`});
}

// The node's speed on its model, measured over its last 20 done runs (gpuq/speed.py).
function speedLine(speed) {
  const num = (v, unit) => (v === null ? '-' : `${v} ${unit}`);
  const text = `speed: prompt ${num(speed.prompt_tokens_per_s, 'tok/s')} · output ${num(speed.output_tokens_per_s, 'tok/s')} · load ${num(speed.load_s, 's')}`;
  return el('div', {className: 'col-speed mono', text,
    title: `measured on this node over its last ${speed.runs} done run${speed.runs === 1 ? '' : 's'} of its model; load: the longest (a cold load)`});
}

function column(node, stale) {
  const [cls, label, why] = nodeStatus(node);
  const runningStale = node.running && stale.has(node.running.id);
  const downWaiting = cls === 'down' && node.queued_count > 0; // first when the columns stack
  const col = el('section', {className: `col node-${cls}${runningStale ? ' col-stale' : ''}${downWaiting ? ' down-waiting' : ''}`,
    dataset: {node: node.name}, 'aria-label': `node ${node.name}`});
  const clear = el('button', {type: 'button', className: 'small ghost', text: 'Clear',
    title: `Cancel the jobs waiting on ${node.name}`, disabled: !node.queued_count && !node.running,
    onclick: () => clearNode(node)});
  const head = el('header', {className: 'col-head'},
    el('div', {className: 'col-title'},
      el('span', {className: `dot dot-${cls}`, title: why}),
      el('h2', {text: node.name}),
      el('span', {className: 'rank', text: `#${node.rank}`, title: 'rank: lower is tried first'}),
      el('span', {className: `pill pill-${cls}`, text: label, title: why}),
      el('span', {className: 'spacer'}),
      clear),
    el('div', {className: 'col-sub'},
      el('span', {className: 'model mono', text: node.model, title: node.url}),
      ...node.roles.map((r) => badge(r, `role role-${r}`, `takes ${r} jobs`))),
    el('div', {className: 'col-util', dataset: {node: node.name}, title: 'the last hour: busy (bars) and idle'}));
  if (cls === 'down') {
    head.append(el('div', {className: 'col-warn'}, 'down for ', sinceSpan(node.since), `: ${node.last_error || 'no answer'}`));
  } else if (cls === 'stuck') {
    head.append(el('div', {className: 'col-warn', text: node.vram_stuck}));
  }
  if (node.speed && node.speed.runs) head.append(speedLine(node.speed));
  if (node.warm) head.append(warmLine(node.warm));
  if (node.asked_unload && !node.warm) head.append(unloadedLine(node.asked_unload));
  if (node.model_installed === false) {
    head.append(el('div', {className: 'col-warn amber', text: `${node.model} is not installed on this node (ollama pull ${node.model})`}));
  }
  const slot = el('div', {className: 'running-slot'},
    node.running ? runningCard(node.running, runningStale, node.model)
      : el('div', {className: 'idle', text: idleText(node, cls)}));
  const shown = node.queued.length;
  const list = el('ol', {className: 'queue', dataset: {node: node.name},
    'aria-label': `jobs waiting on ${node.name}`});
  cols.set(node.name, {list, jobs: node.queued.slice(), model: node.model, cards: new Map(), start: 0, end: 0});
  const waiting = el('div', {className: 'queue-head'},
    el('span', {text: 'Waiting'}), el('span', {className: 'count', text: fmtNum(node.queued_count)}));
  col.append(head, slot, waiting, ...batchLines(node.name), list);
  if (node.queued_count > shown) {
    const more = node.queued_count - shown;
    col.append(el('div', {className: 'more'},
      el('span', {text: `+${fmtNum(more)} more waiting`}),
      S.limit < LIMIT_MAX ? el('button', {type: 'button', className: 'small ghost',
        text: `Show ${fmtNum(Math.min(LIMIT_STEP, more))} more`,
        onclick: () => { S.limit = Math.min(LIMIT_MAX, S.limit + LIMIT_STEP); refreshSoon(); }}) : null));
  }
  return col;
}

// -- sweeps: each open batch folded to one line per node's queue -----------------------------

// "eval-sweep: 412 of 2,000 done, ETA ~1h 20m" for each batch with lines on the node; unfolded
// (its summary clicked), the batch's jobs there, each a link to its page; Cancel ends the batch.
function batchLines(nodeName) {
  return S.batches.filter((b) => b.nodes[nodeName]).map((b) => {
    const here = b.nodes[nodeName];
    const waiting = (here.queued || 0) + (here.running || 0);
    const key = `${b.id}|${nodeName}`;
    const done = b.request_counts.completed;
    const eta = b.eta && b.eta.finish_s ? `, ETA ${fmtApprox(b.eta.finish_s - now() / 1000)}` : '';
    const failed = b.request_counts.failed ? `, ${fmtNum(b.request_counts.failed)} failed` : '';
    const summary = el('summary', {className: 'batch-summary', title: `batch ${b.id} (${b.endpoint}), ${b.owner || 'no user'}`,
      text: `${b.name || b.id}: ${fmtNum(done)} of ${fmtNum(b.request_counts.total)} done${failed}${eta}`});
    const details = el('details', {className: 'batch-fold', dataset: {batch: b.id}}, summary,
      el('span', {className: 'batch-here', text: `${fmtNum(waiting)} of its lines here (${fmtNum(here.running || 0)} running)`}));
    const jobs = S.unfolded.get(key);
    if (jobs) {
      details.open = true;
      details.append(el('ol', {className: 'batch-jobs', 'aria-label': `jobs of batch ${b.name || b.id} on ${nodeName}`},
        ...jobs.map((j) => el('li', {}, el('a', {href: jobHref(j.job_id), className: 'mono', text: j.job_id}),
          ` ${j.custom_id} `, stateBadge(j.state)))));
    }
    details.addEventListener('toggle', () => {
      if (details.open && !S.unfolded.has(key)) unfoldBatch(b.id, nodeName, key);
      else if (!details.open && S.unfolded.has(key)) { S.unfolded.delete(key); render(); }
    });
    const cancel = el('button', {type: 'button', className: 'small ghost', text: 'Cancel',
      title: `Cancel batch ${b.name || b.id}: its waiting lines now, every node`, disabled: b.status !== 'in_progress',
      onclick: () => cancelBatch(b)});
    return el('div', {className: 'batch-line', dataset: {batch: b.id}}, details, cancel);
  });
}

async function unfoldBatch(batchId, nodeName, key) {
  try {
    const {batch} = await getJSON(`/api/batches/${encodeURIComponent(batchId)}`);
    S.unfolded.set(key, batch.jobs.filter((j) => j.node === nodeName && (j.state === 'queued' || j.state === 'running')));
  } catch (exc) {
    toast(`Could not read batch ${batchId}: ${exc.message}`);
  }
  render();
}

async function cancelBatch(b) {
  const ok = await confirmDialog({title: `Cancel ${b.name || b.id}?`, confirm: 'Cancel batch', danger: true,
    message: `Cancels its ${fmtNum(b.counts.queued)} waiting line${b.counts.queued === 1 ? '' : 's'} on every node; a running one ends as it would.`});
  if (!ok) return;
  runOp(`cancel batch ${b.id}`, () => api('POST', `/api/batches/${encodeURIComponent(b.id)}/cancel`));
}

// One small line under the prompt: the id, badges, how long it has waited or run, its start
// estimate, the model only where it is not the column's own, and a critique's parent in full.
function jobMeta(job, nodeModel) {
  const queued = job.state === 'queued';
  const parts = [
    job.owner ? el('span', {className: 'owner', text: job.owner, title: `sent by ${job.owner}${job.client ? ` with ${job.client}` : ''}`}) : null,
    el('span', {className: `state-${job.state}`},
      queued ? 'queued ' : 'running for ',
      sinceSpan(queued ? job.created_at : job.started_at), queued ? ' ago' : ''),
    queued ? el('span', {className: 'eta'}, 'starts ', etaSpan(job.eta_start, job.eta_reason)) : null,
    job.model !== nodeModel ? el('span', {className: 'mono model', text: job.model,
      title: `model (this node's own is ${nodeModel})`}) : null,
    job.kind === 'critique' && job.parent ? el('span', {className: 'parent'}, 'critique of ',
      el('a', {href: jobHref(job.parent), className: 'mono', text: job.parent})) : null,
  ].filter(Boolean);
  const id = el('a', {className: 'jid mono', href: jobHref(job.id), text: job.id,
    title: queued ? 'open the preview' : 'open the preview (live output)'});
  return el('div', {className: 'card-meta'}, id, ' ', ...badges(job), ' ',
    ...parts.flatMap((p, i) => (i ? [' · ', p] : [p])));
}

function badges(job) {
  const out = [badge(job.kind, `kind kind-${job.kind}`, job.placement ? `placed: ${job.placement}` : '')];
  if (job.preempted_runs) {
    out.push(badge(job.preempted_runs > 1 ? `preempted ×${job.preempted_runs}` : 'preempted', 'preempted',
      `this job was interrupted ${job.preempted_runs} time${job.preempted_runs > 1 ? 's' : ''} by a preemption and runs again from the start`));
  }
  if (job.lane === 'interactive') {  // it waits ahead of every batch job on its node
    out.push(badge('interactive', 'lane-interactive',
      'interactive: it waits ahead of every batch job on its node (behind the running job and earlier interactive jobs)'));
  }
  if (job.held_by_quota) out.push(badge('max running', 'held', job.held_by_quota));
  if (job.endpoint) {  // a call through the front door; its client waits for it
    out.push(badge(job.api || 'ollama', 'via',
      `a client's ${job.endpoint} call through the front door; it waits for this job (deleting it ends the call)`));
  }
  if (job.waiting_for) {
    out.push(badge(`waiting for parent ${job.waiting_for}`, 'held',
      'held: this critique reviews its parent task\'s result, so it runs once the parent is done; the jobs behind it do not wait for it'));
  }
  return out;
}

function queuedCard(job, i, nodeModel, count) {
  const card = el('li', {className: 'card queued', tabIndex: 0,
    dataset: {id: job.id, node: job.node, kind: job.kind, state: 'queued', held: job.waiting_for ? 'yes' : 'no'},
    'aria-label': `${job.kind} ${job.id}, position ${i + 1} on ${job.node}: ${promptExcerpt(job, 80)}`},
  el('span', {className: 'handle', draggable: true, text: '⠿', 'aria-hidden': 'true',
    title: 'Drag to reorder, or into another node\'s column to move it'}),
  el('span', {className: 'pos', text: String(i + 1), title: 'position in the queue'}),
  el('div', {className: 'card-body'},
    el('div', {className: 'prompt', text: promptExcerpt(job), title: promptExcerpt(job, 2000)}),
    jobMeta(job, nodeModel)),
  cardActions(
    el('button', {type: 'button', className: 'small ghost touch step', text: '↑', 'aria-label': `Move ${job.id} up`,
      title: 'Move up one place (Alt+↑)', disabled: i === 0, onclick: () => stepMove(card, -1)}),
    el('button', {type: 'button', className: 'small ghost touch step', text: '↓', 'aria-label': `Move ${job.id} down`,
      title: 'Move down one place (Alt+↓)', disabled: i === count - 1, onclick: () => stepMove(card, 1)}),
    moveSelect(job),
    el('button', {type: 'button', className: 'small ghost', text: 'Preempt',
      title: 'Run this job next: it goes to the head, and the running job goes back behind it',
      onclick: () => preemptJob(cardInfo(card))}),
    el('button', {type: 'button', className: 'small ghost danger', text: 'Delete',
      title: 'Cancel this job (asks first)', onclick: () => deleteJob(cardInfo(card))})));
  return card;
}

// "Move to…": the other nodes that take this kind of job (a down one says so); choosing one
// moves the job to the tail of that node's queue, as a drag to the end of its column would.
function moveSelect(job) {
  const [count, options] = moveOptions(job.node, roleOf(job.kind));
  const select = el('select', {className: 'move-to touch', 'aria-label': `Move ${job.id} to another node`,
    title: 'Move it to the end of another node\'s queue', disabled: !count});
  select.append(options.cloneNode(true));
  select.addEventListener('change', () => {
    const target = select.value;
    if (!target) return;
    const card = select.closest('.card');
    select.blur();
    moveTo(card, target, queuedIn(target, card.dataset.id).length, {tail: true});
  });
  select.addEventListener('blur', () => { if (S.deferred) setTimeout(render, 0); });
  return select;
}

// The options of "Move to…" for the jobs of one node and role, built once per answer of the
// queue and cloned into each card (49 options a card on a board of 50 nodes).
const moveLists = {queue: null, lists: new Map()};
function moveOptions(node, role) {
  if (moveLists.queue !== S.queue) {
    moveLists.queue = S.queue;
    moveLists.lists.clear();
  }
  const key = `${node}\n${role}`;
  let got = moveLists.lists.get(key);
  if (!got) {
    const targets = (S.queue ? S.queue.nodes : []).filter((n) => n.name !== node && n.roles.includes(role));
    const options = document.createDocumentFragment();
    options.append(el('option', {value: '', text: targets.length ? 'Move to…' : 'no other node'}),
      ...targets.map((n) => el('option', {value: n.name, text: `${n.name}${n.up ? '' : ' (down)'}`})));
    got = [targets.length, options];
    moveLists.lists.set(key, got);
  }
  return got;
}

// A card's buttons: over its top right corner while it is hovered or focused (always shown
// where nothing hovers), so they take no line of their own.
function cardActions(...buttons) {
  return el('div', {className: 'card-actions'}, ...buttons);
}

function runningCard(job, stale, nodeModel) {
  return el('div', {className: `card running${stale ? ' stale' : ''}`, tabIndex: 0,
    dataset: {id: job.id, node: job.node, kind: job.kind, state: 'running', started: job.started_at || '',
      progress: job.progress_at || ''},
    'aria-label': `running ${job.kind} ${job.id} on ${job.node}`},
  el('span', {className: 'live-dot', title: 'running'}),
  el('div', {className: 'card-body'},
    el('div', {className: 'prompt', text: promptExcerpt(job), title: promptExcerpt(job, 2000)}),
    jobMeta(job, nodeModel),
    el('div', {className: 'progress'},
      el('span', {className: 'tok', text: '0 tokens'}),
      el('span', {className: 'rate'}),
      el('span', {className: 'eta'}, 'ends ', etaSpan(job.eta_finish, job.eta_reason)),
      el('span', {className: 'quiet'})),
    stale ? el('div', {className: 'stale-note', text: 'STALE — see the banner above'}) : null),
  cardActions(
    el('button', {type: 'button', className: 'small ghost danger', text: 'Delete',
      title: 'Stop and cancel the running job (asks first)',
      onclick: () => deleteJob({id: job.id, node: job.node, state: 'running'})})));
}

function renderRecent() {
  const body = $('recent-body');
  if (!S.updatedAt) { // nothing loaded yet: say why, never 'No job has finished yet.'
    body.replaceChildren(S.error ? el('p', {className: 'muted', text: `Not loaded: ${S.error.message}.`}) : '');
    return;
  }
  if (!S.recent.length) {
    body.replaceChildren(el('p', {className: 'muted', text: 'No job has finished yet.'}));
    return;
  }
  const rows = S.recent.map((j) => el('tr', {dataset: {id: j.id, state: j.state}},
    el('td', {}, stateBadge(j.state)),
    el('td', {className: 'num', title: fmtClock(j.finished_at)}, sinceSpan(j.finished_at), ' ago'),
    el('td', {}, el('a', {className: 'mono', href: jobHref(j.id), text: j.id})),
    el('td', {text: j.kind}),
    el('td', {text: j.node}),
    el('td', {className: 'mono', text: j.model}),
    el('td', {className: 'num', text: j.started_at ? fmtSpan(between(j.started_at, j.finished_at)) : '–'}),
    el('td', {className: 'num', text: fmtNum(j.eval_count)}),
    el('td', {className: 'num', text: jobRate(j)}),
    el('td', {className: `what${j.error ? ' err' : ''}`,
      text: j.error ? excerpt(j.error, 120) : promptExcerpt(j, 120),
      title: j.error ? excerpt(j.error, 2000) : promptExcerpt(j, 2000)}),
    el('td', {}, (j.state === 'failed' || j.state === 'cancelled') && !j.private // another's: not theirs to retry
      ? el('button', {type: 'button', className: 'small ghost', text: 'Retry',
        title: 'Queue it again at the tail of its node', onclick: () => retryJob(j)}) : null)));
  body.replaceChildren(el('div', {className: 'table-scroll'}, el('table', {className: 'recent'},
    el('thead', {}, el('tr', {}, ...['state', 'finished', 'job', 'kind', 'node', 'model', 'ran', 'tokens',
      'speed', 'prompt / error', ''].map((t) => el('th', {text: t})))),
    el('tbody', {}, ...rows))));
}

// -- running jobs: elapsed time and tokens so far ---------------------------------------------

function tokenRecord(id, run) {
  let rec = S.tokens.get(id);
  if (!rec || rec.run !== run) {
    rec = {run, thinking: 0, answer: 0, last: 0};
    S.tokens.set(id, rec);
  }
  return rec;
}

// Each token event carries one piece of either the reasoning or the answer.
function onTokens(d) {
  if (!d || !d.id) return;
  const rec = tokenRecord(d.id, d.run_id);
  if (typeof d.thinking === 'string') rec.thinking++;
  else rec.answer++;
  rec.last = now();
  paintSoon();
}

let paintQueued = false;
function paintSoon() {
  if (paintQueued) return;
  paintQueued = true;
  requestAnimationFrame(() => { paintQueued = false; paintProgress(); });
}

// The router's own counts for a running job (they include tokens made before the page
// connected); the live token events then count on from there.
function baseline(job, paint = true) {
  if (job.tokens_so_far == null) return;
  const rec = tokenRecord(job.id, job.run_id);
  const thinking = job.thinking_tokens_so_far || 0;
  rec.thinking = Math.max(rec.thinking, thinking);
  rec.answer = Math.max(rec.answer, job.tokens_so_far - thinking);
  if (paint) paintProgress();
}

// A thinking model (and every critique, which reasons before its findings) shows its reasoning
// and its answer apart: "thinking 312 tok · answer 40 tok"; any other job its tokens and speed.
function tokenText(kind, rec) {
  if (rec.thinking || kind === 'critique') {
    return `thinking ${fmtNum(rec.thinking)} tok · answer ${fmtNum(rec.answer)} tok`;
  }
  return `${fmtNum(rec.answer)} token${rec.answer === 1 ? '' : 's'}`;
}

function paintProgress() {
  for (const card of board.querySelectorAll('.card.running')) {
    const rec = S.tokens.get(card.dataset.id) || {thinking: 0, answer: 0, last: 0};
    const count = rec.thinking + rec.answer;
    const elapsed = since(card.dataset.started);
    card.querySelector('.tok').textContent = tokenText(card.dataset.kind, rec);
    card.querySelector('.rate').textContent = count > 1 ? fmtRate(count, elapsed) : '';
    const last = Math.max(rec.last, parseTime(card.dataset.progress) || 0, parseTime(card.dataset.started) || 0);
    const quiet = last ? (now() - last) / 1000 : 0;
    const q = card.querySelector('.quiet');
    q.textContent = quiet >= QUIET_S ? `no tokens for ${fmtDur(quiet)}` : '';
    q.classList.toggle('warn', quiet >= QUIET_S);
  }
}

// -- queue-control calls ----------------------------------------------------------------------

let chain = Promise.resolve();

// Calls run one after another; while any is in flight the board keeps the page's own
// (optimistic) order, then shows the server's. A refusal drops the calls queued after it.
function runOp(what, call) {
  const gen = S.gen;
  S.pending++;
  chain = chain.then(async () => {
    if (gen !== S.gen) return;
    let r;
    try {
      r = await call();
    } catch (exc) {
      r = {ok: false, status: exc.status || 0, message: exc.message};
    }
    if (!r.ok) {
      S.gen++;
      toast(`Could not ${what}: ${r.message}${r.status ? ` (${r.status})` : ''}`);
      announce(`Refused: ${r.message}`);
    }
  }).finally(() => {
    S.pending--;
    if (!S.pending) {
      S.sig = ''; // the board may show an order the server did not take: redraw from the server
      refreshSoon();
    }
  });
  return chain;
}

const idPath = (id) => `/api/jobs/${encodeURIComponent(id)}`;

function cardInfo(card) {
  return {id: card.dataset.id, node: card.dataset.node, kind: card.dataset.kind, state: card.dataset.state};
}

function cardById(id) {
  return board.querySelector(`.card[data-id="${CSS.escape(id)}"]`);
}

function listOf(node) {
  return board.querySelector(`.queue[data-node="${CSS.escape(node)}"]`);
}

// The cards drawn in a column's list (all of them unless the board is windowed).
function drawnIn(node, except) {
  const list = listOf(node);
  return list ? [...list.querySelectorAll(':scope > .card')].filter((c) => c !== except) : [];
}

// The ids waiting in a column, in its whole order (drawn or not).
function queuedIn(node, exceptId) {
  const c = cols.get(node);
  return c ? Array.from(c.jobs, (j) => j && j.id).filter((id) => id !== exceptId || !id) : [];
}

// Put a queued card at `index` among the other waiting cards of `target` (0 = head), on the
// page at once, and ask the router to do the same.
function moveTo(card, target, index, {tail = false} = {}) {
  const {id, node: from} = cardInfo(card);
  const src = cols.get(from), dst = cols.get(target);
  if (!src || !dst) return;
  const others = queuedIn(target, id);
  index = Math.max(0, Math.min(index, others.length));
  const at = src.jobs.findIndex((j) => j && j.id === id);
  if (at < 0 || (from === target && at === index && !tail)) return;
  // After the job before it; by place where that job is not read yet (a paged board).
  const body = tail ? {position: TAIL} : index === 0 ? {position: 1}
    : others[index - 1] ? {after: others[index - 1]} : {position: index + 1};
  if (target !== from) body.node = target;
  const hadFocus = card.contains(document.activeElement);
  const [job] = src.jobs.splice(at, 1);
  dst.jobs.splice(index, 0, job);
  card.dataset.node = target;
  if (target !== from) {
    src.cards.delete(id);
    dst.cards.set(id, card);
    drawList(src, true);
  }
  reveal(dst, index);
  if (hadFocus) card.focus({preventScroll: true});
  card.scrollIntoView({block: 'nearest'});
  announce(`${id} moved to position ${index + 1} on ${target}`);
  runOp(`move ${id}${target !== from ? ` to ${target}` : ''}`,
    () => api('POST', `${idPath(id)}/move`, body));
}

async function preemptJob(job) {
  const node = S.queue && S.queue.nodes.find((n) => n.name === job.node);
  if (node && node.running) {
    const ok = await confirmDialog({title: `Preempt ${node.name}?`, confirm: 'Preempt',
      message: `${job.id} runs next. The running job ${node.running.id} is stopped and goes back to the queue behind it; it will start again from the beginning.`});
    if (!ok) return;
  }
  const card = cardById(job.id);
  if (card) card.classList.add('busy');
  runOp(`preempt ${job.id}`, () => api('POST', `${idPath(job.id)}/preempt`));
}

// A job on the board, by id (its prompt's start names it in a dialog).
function boardJob(id) {
  for (const n of (S.queue ? S.queue.nodes : [])) {
    const job = n.running && n.running.id === id ? n.running : n.queued.find((j) => j && j.id === id);
    if (job) return job;
  }
  return null;
}

async function deleteJob(job) {
  const running = job.state === 'running';
  const shown = boardJob(job.id);
  const ok = await confirmDialog({title: `Delete ${job.id}?`, confirm: 'Delete', danger: true,
    quote: shown ? promptStart(shown.prompt_excerpt) : '',
    message: running
      ? `It is running on ${job.node}: generation stops, the model is unloaded and the job is cancelled.`
      : `It is waiting on ${job.node}. It will be cancelled; its record stays in the history.`});
  if (!ok) return;
  const card = cardById(job.id);
  if (card) card.classList.add('busy');
  runOp(`delete ${job.id}`, () => api('DELETE', idPath(job.id)));
}

async function clearNode(node) {
  const ok = await confirmDialog({title: `Clear ${node.name}?`, confirm: 'Clear', danger: true,
    message: `Cancels the ${fmtNum(node.queued_count)} job${node.queued_count === 1 ? '' : 's'} waiting on ${node.name}.`,
    checkbox: node.running ? `Also stop the running job ${node.running.id} ${promptStart(node.running.prompt_excerpt)}` : null});
  if (!ok) return;
  runOp(`clear ${node.name}`, () => api('POST', `/api/nodes/${encodeURIComponent(node.name)}/clear`,
    {running: Boolean(ok.checked)}));
}

function retryJob(job) {
  runOp(`retry ${job.id}`, () => api('POST', `${idPath(job.id)}/retry`));
}

function announce(text) {
  $('announce').textContent = text;
}

// -- drag and drop ----------------------------------------------------------------------------

let marker = null;

// The drop's index in the column's whole order (the cards drawn start at its window's start).
function dropIndex(col, y) {
  const list = col.querySelector('.queue');
  const c = cols.get(col.dataset.node);
  if (!list || !c) return 0;
  if (y < list.getBoundingClientRect().top) return 0; // over the header or the running job: the head
  const cards = drawnIn(col.dataset.node, S.dragging && S.dragging.card);
  for (let i = 0; i < cards.length; i++) {
    const r = cards[i].getBoundingClientRect();
    if (y < r.top + r.height / 2) return c.start + i;
  }
  return c.start + cards.length;
}

function showMarker(col, index) {
  if (!marker) marker = el('li', {className: 'drop-marker', 'aria-hidden': 'true'});
  const c = cols.get(col.dataset.node);
  const cards = drawnIn(col.dataset.node, S.dragging.card);
  const list = col.querySelector('.queue');
  const below = c && c.end < c.jobs.length ? list.querySelector(':scope > .vspace:last-child') : null;
  list.insertBefore(marker, cards[index - (c ? c.start : 0)] || below);
  for (const c of board.querySelectorAll('.col.drop-target')) if (c !== col) c.classList.remove('drop-target');
  col.classList.add('drop-target');
}

function clearMarker() {
  if (marker) marker.remove();
  for (const c of board.querySelectorAll('.col.drop-target')) c.classList.remove('drop-target');
}

function endDrag() {
  if (!S.dragging) return;
  S.dragging.card.classList.remove('dragging');
  S.dragging = null;
  clearMarker();
  document.body.classList.remove('is-dragging');
  for (const c of board.querySelectorAll('.col.no-drop')) c.classList.remove('no-drop');
  if (S.deferred) render();
}

board.addEventListener('dragstart', (e) => {
  const handle = e.target.closest && e.target.closest('.handle');
  const card = handle && handle.closest('.card.queued');
  if (!card) return;
  S.dragging = {...cardInfo(card), card};
  e.dataTransfer.effectAllowed = 'move';
  e.dataTransfer.setData('text/plain', card.dataset.id);
  e.dataTransfer.setDragImage(card, 12, 12);
  requestAnimationFrame(() => { if (S.dragging && S.dragging.card === card) card.classList.add('dragging'); });
  document.body.classList.add('is-dragging');
  for (const n of (S.queue ? S.queue.nodes : [])) {
    if (!n.roles.includes(roleOf(card.dataset.kind))) {
      const col = board.querySelector(`.col[data-node="${CSS.escape(n.name)}"]`);
      if (col) col.classList.add('no-drop');
    }
  }
});

// dragenter must be cancelled too, or the browser does not make the column the drop target.
function dragOver(e) {
  if (!S.dragging) return;
  const col = e.target.closest && e.target.closest('.col');
  if (!col) return;
  e.preventDefault();
  e.dataTransfer.dropEffect = 'move';
  showMarker(col, dropIndex(col, e.clientY));
}
board.addEventListener('dragenter', dragOver);
board.addEventListener('dragover', dragOver);

board.addEventListener('dragleave', (e) => {
  if (S.dragging && (!e.relatedTarget || !board.contains(e.relatedTarget))) clearMarker();
});

board.addEventListener('drop', (e) => {
  if (!S.dragging) return;
  const col = e.target.closest && e.target.closest('.col');
  if (!col) return;
  e.preventDefault();
  const {card} = S.dragging;
  const index = dropIndex(col, e.clientY);
  moveTo(card, col.dataset.node, index); // before endDrag: the deferred render must wait for the call
  endDrag();
});

board.addEventListener('dragend', endDrag);

board.addEventListener('pointerdown', (e) => {
  if (e.target.closest && e.target.closest('.handle')) S.pressing = true;
});
// (The render held meanwhile runs after the release: common.js heldByPress.)
function released() {
  S.pressing = false;
}
window.addEventListener('pointerup', released);
window.addEventListener('pointercancel', released);

// -- keys -------------------------------------------------------------------------------------

// The node role that takes a kind of job: an embedding (from the front door) runs as a task.
function roleOf(kind) {
  return kind === 'critique' ? 'critique' : 'task';
}

function neighbourNode(name, step, kind) {
  const nodes = S.queue ? S.queue.nodes : [];
  for (let i = nodes.findIndex((n) => n.name === name) + step; i >= 0 && i < nodes.length; i += step) {
    if (nodes[i].roles.includes(roleOf(kind))) return nodes[i].name;
  }
  return null;
}

// The ↑ / ↓ buttons: one place up or down the card's own queue (what Alt+↑ / Alt+↓ do).
function stepMove(card, step) {
  const {id, node} = cardInfo(card);
  const cards = queuedIn(node);
  const i = cards.indexOf(id);
  if (i < 0 || i + step < 0 || i + step >= cards.length) return;
  moveTo(card, node, i + step);
}

function keyMove(card, key) {
  const {id, node, kind} = cardInfo(card);
  const cards = queuedIn(node);
  const i = cards.indexOf(id);
  if (key === 'ArrowUp' && i > 0) moveTo(card, node, i - 1);
  else if (key === 'ArrowDown' && i < cards.length - 1) moveTo(card, node, i + 1);
  else if (key === 'Home' && i > 0) moveTo(card, node, 0);
  else if (key === 'End') moveTo(card, node, cards.length - 1, {tail: true});
  else if (key === 'ArrowLeft' || key === 'ArrowRight') {
    const step = key === 'ArrowLeft' ? -1 : 1;
    const target = neighbourNode(node, step, kind);
    if (!target) {
      toast(`No node to the ${step < 0 ? 'left' : 'right'} of ${node} takes ${kind} jobs.`, 'info', 5000);
      return;
    }
    moveTo(card, target, i);
  }
}

function focusStep(card, step) {
  const col = card.closest('.col');
  const cards = [...col.querySelectorAll('.card')];
  const next = cards[cards.indexOf(card) + step];
  if (next) {
    next.focus();
    next.scrollIntoView({block: 'nearest'});
  }
}

function focusColumn(card, step) {
  const cols = [...board.querySelectorAll('.col')];
  const col = card.closest('.col');
  const i = [...col.querySelectorAll('.card')].indexOf(card);
  for (let c = cols.indexOf(col) + step; c >= 0 && c < cols.length; c += step) {
    const cards = [...cols[c].querySelectorAll('.card')];
    if (cards.length) {
      const next = cards[Math.min(i, cards.length - 1)];
      next.focus();
      next.scrollIntoView({block: 'nearest', inline: 'nearest'});
      return;
    }
  }
}

board.addEventListener('keydown', (e) => {
  const card = e.target.classList && e.target.classList.contains('card') ? e.target : null;
  if (!card) return;
  const queued = card.dataset.state === 'queued';
  const moves = ['ArrowUp', 'ArrowDown', 'ArrowLeft', 'ArrowRight', 'Home', 'End'];
  if (e.altKey && !e.ctrlKey && !e.metaKey && moves.includes(e.key)) {
    e.preventDefault(); // Alt+← is the browser's Back otherwise
    if (queued) keyMove(card, e.key);
    return;
  }
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  const handlers = {
    ArrowUp: () => focusStep(card, -1),
    ArrowDown: () => focusStep(card, 1),
    ArrowLeft: () => focusColumn(card, -1),
    ArrowRight: () => focusColumn(card, 1),
    Enter: () => { window.location.href = jobHref(card.dataset.id); },
    p: () => queued && preemptJob(cardInfo(card)),
    P: () => queued && preemptJob(cardInfo(card)),
    Delete: () => deleteJob(cardInfo(card)),
    Backspace: () => deleteJob(cardInfo(card)),
  };
  if (handlers[e.key]) {
    e.preventDefault();
    handlers[e.key]();
  }
});

document.addEventListener('keydown', (e) => {
  const t = e.target;
  const typing = t && (t.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(t.tagName));
  if (typing || e.altKey || e.ctrlKey || e.metaKey || document.querySelector('dialog[open]')) return;
  if (e.key === 'r' || e.key === 'R') {
    e.preventDefault();
    S.sig = '';
    refreshSoon();
  } else if (e.key === '?') {
    $('keys').open = !$('keys').open;
  }
});

// -- start ------------------------------------------------------------------------------------

$('refresh').addEventListener('click', () => {
  S.sig = '';
  refreshSoon();
});

liveEvents({
  onConnect: () => {
    S.readAt = -1; // changes may have been missed while away: read every part again
    refreshSoon();
  },
  onChange: () => {
    S.changes++;
    refreshSoon();
  },
  onTokens,
  onStatus: (status) => setConnection(status),
});

setInterval(() => {
  tickSince(document);
  paintProgress();
}, 1000);

// A slow poll behind the live events, for anything they cannot say (a clock passing a threshold).
setInterval(() => { if (!tokenDeclined() || !S.error) refreshSoon(); }, 10000);

refreshSoon();
