// Shared by the queue page and the job page: the API client (actor header, access token),
// live events, time formatting, dialogs and DOM building. Job text only ever reaches the
// page through textContent and properties (see el()), never as HTML.

const TOKEN_KEY = 'gpuq-token';

// -- the clock --------------------------------------------------------------------------------

let skewMs = 0; // server clock minus ours, from the Date header, when they disagree by > 1.5 s

export function now() {
  return Date.now() + skewMs;
}

function noteServerDate(header) {
  const t = header ? Date.parse(header) : NaN;
  if (Number.isNaN(t)) return;
  const skew = t + 500 - Date.now(); // Date has whole seconds
  skewMs = Math.abs(skew) > 1500 ? skew : 0;
}

export function parseTime(iso) {
  if (!iso) return NaN;
  return Date.parse(iso);
}

// -- formatting -------------------------------------------------------------------------------

const pad = (n) => String(n).padStart(2, '0');

export function fmtDur(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return '–';
  let s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

// A duration someone set (a timeout): exactly as given under a minute ('0.5s', '2.25s').
export function fmtSetting(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return '–';
  return seconds < 60 ? `${Number(seconds.toFixed(3))}s` : fmtDur(seconds);
}

// A measured duration: tenths under ten seconds (a job can take 0.8 s).
export function fmtSpan(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return '–';
  return seconds < 10 ? `${Math.max(0, seconds).toFixed(1)}s` : fmtDur(seconds);
}

export function since(iso) {
  const t = parseTime(iso);
  return Number.isNaN(t) ? NaN : (now() - t) / 1000;
}

export function between(a, b) {
  const ta = parseTime(a);
  const tb = parseTime(b);
  return Number.isNaN(ta) || Number.isNaN(tb) ? NaN : (tb - ta) / 1000;
}

export function fmtClock(iso) {
  const t = parseTime(iso);
  if (Number.isNaN(t)) return '–';
  const d = new Date(t);
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const today = new Date(now());
  if (d.toDateString() === today.toDateString()) return time;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

// A rough span for an estimate: '~40s', '~4 min', '~1h 20m'.
export function fmtApprox(seconds) {
  const s = Math.max(0, seconds);
  if (s < 60) return `~${Math.max(1, Math.round(s))}s`;
  const m = Math.round(s / 60);
  return m < 60 ? `~${m} min` : `~${Math.floor(m / 60)}h ${pad(m % 60)}m`;
}

// 'in ~4 min' until an estimated time, 'now' once it is (about) here.
export function fmtEta(iso) {
  const t = parseTime(iso);
  if (Number.isNaN(t)) return '?';
  const s = (t - now()) / 1000;
  return s < 1 ? 'now' : `in ${fmtApprox(s)}`;
}

// The start of today in this browser's time zone, as the API's UTC time.
export function localMidnight() {
  const d = new Date(now());
  d.setHours(0, 0, 0, 0);
  return d.toISOString().replace('Z', '000Z');
}

export function fmtNum(n) {
  return n === null || n === undefined ? '–' : Number(n).toLocaleString('en-US');
}

export function fmtRate(tokens, seconds) {
  if (!tokens || !seconds || seconds <= 0) return '–';
  const r = tokens / seconds;
  return `${r >= 100 ? r.toFixed(0) : r.toFixed(1)} tok/s`;
}

// A finished job's or run's speed: Ollama's eval time, or the wall time when that is missing.
export function jobRate(j) {
  if (!j || !j.eval_count) return '–';
  const evalS = (j.eval_duration_ns || 0) / 1e9;
  if (evalS >= 0.001) return fmtRate(j.eval_count, evalS);
  return fmtRate(j.eval_count, between(j.started_at, j.work_done_at || j.finished_at));
}

export function excerpt(text, max = 180, more = false) {
  const flat = (text || '').replace(/\s+/g, ' ').trim();
  if (flat.length > max) return flat.slice(0, max - 1) + '…';
  return more ? flat + '…' : flat;
}

// Listings carry a prompt's first characters (prompt_excerpt) and its size in UTF-8 bytes
// (prompt_bytes), never the whole prompt: only GET /api/jobs/{id} has that.
const utf8 = new TextEncoder();
export function promptExcerpt(job, max = 180) {
  if (job.private) return privateLabel(job);
  const text = job.prompt_excerpt || '';
  return excerpt(text, max, utf8.encode(text).length < (job.prompt_bytes || 0));
}

// Another user's job on a private router ([router] private) comes without its text: it says whose.
export function privateLabel(job) {
  return job.owner ? `private: ${job.owner}'s job` : 'private: a job of no user';
}

// Ollama streams about one token per piece; for text we did not see arrive, ~4 chars a token.
export function estimateTokens(text) {
  return text ? Math.max(1, Math.round(text.length / 4)) : 0;
}

// A job's prompt as a delete dialog names it: its start on one line, quoted ('“fix the…”').
export function promptStart(text, max = 60) {
  const flat = excerpt(text, max);
  return flat ? `“${flat}”` : '';
}

export function jobHref(id) {
  return `/jobs/${encodeURIComponent(id)}`;
}

// -- a pointer pressed ------------------------------------------------------------------------

// While a pointer is pressed, a page replaces nothing: a button or a link replaced between its
// press and its release gets no click (the browser sends the click to neither element).
let pressed = false;
const held = new Set(); // renders asked for while pressed, run once after the release

export function pressing() {
  return pressed;
}

// True when a pointer is pressed: `render` then runs after the release (once, however often
// it was held), and the caller returns without drawing.
export function heldByPress(render) {
  if (pressed) held.add(render);
  return pressed;
}

function released() {
  if (!pressed) return;
  pressed = false;
  // The click (or a drag that starts now) is dispatched before this runs.
  setTimeout(() => {
    const due = [...held];
    held.clear();
    for (const render of due) render();
  }, 0);
}
window.addEventListener('pointerdown', () => { pressed = true; }, {capture: true});
window.addEventListener('pointerup', released, {capture: true});
window.addEventListener('pointercancel', released, {capture: true});
window.addEventListener('pointermove', (e) => { if (e.buttons === 0) released(); }, {capture: true, passive: true});
window.addEventListener('blur', released); // released outside the window

// -- DOM --------------------------------------------------------------------------------------

// el('a', {className: 'x', href, text, dataset: {id}, onclick}, child, 'text', ...): text is
// always set as text. Attribute names go through setAttribute only for aria-* and role.
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') node.textContent = String(value);
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (key.startsWith('aria-') || key === 'role') node.setAttribute(key, String(value));
    else node[key] = value;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function badge(text, kind, title) {
  return el('span', {className: `badge ${kind || ''}`.trim(), text, title});
}

export function stateBadge(state) {
  return badge(state, `st-${state}`);
}

// Elements with data-since="ISO" show the time since then; ticked once a second.
export function sinceSpan(iso, className = 'since') {
  return el('span', {className, dataset: {since: iso || ''}, text: fmtDur(since(iso)),
    title: iso ? `since ${fmtClock(iso)} (${iso})` : ''});
}

export function tickSince(root = document) {
  for (const node of root.querySelectorAll('[data-since]')) {
    if (node.dataset.since) node.textContent = fmtDur(since(node.dataset.since));
  }
  for (const node of root.querySelectorAll('[data-eta]')) node.textContent = fmtEta(node.dataset.eta);
}

// Why nothing starts on a node, in a word for a card (the router's eta_reason says it whole:
// server.node_blocked's, which the job's own node gives; a held critique's 'waits for parent …'
// keeps the bare '?', its parent's trouble being in the title).
function blockedWord(reason) {
  if (/^\S+ is down: nothing starts there/.test(reason || '')) return 'node down';
  if (/^\S+ has a model stuck in VRAM: nothing starts there/.test(reason || '')) return 'VRAM stuck';
  return null;
}

// An estimated time ('in ~4 min', ticked with the clock), or '?' with the reason as its title
// (and, when its node starts nothing, why in a word: '? (node down)').
export function etaSpan(iso, reason, className = 'eta-time') {
  if (!iso) {
    const word = blockedWord(reason);
    return el('span', {className: `${className} unknown`, text: word ? `? (${word})` : '?', title: reason || 'not known'});
  }
  return el('span', {className, dataset: {eta: iso}, text: fmtEta(iso),
    title: `estimated ${fmtClock(iso)}${reason ? ` (${reason})` : ''}`});
}

// -- utilisation: a node's busy spans over the last hour, as a strip ---------------------------

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

// Inline SVG, one unit per second of the window: idle is the track, each busy span a bar.
export function busyStrip(node, activity) {
  const windowS = activity.window_s;
  const end = parseTime(activity.now);
  const start = end - windowS * 1000;
  const label = `${node.name} over the last hour: ${utilText(node, activity)}`;
  const strip = svg('svg', {class: 'strip', viewBox: `0 0 ${windowS} 10`, preserveAspectRatio: 'none',
    role: 'img', 'aria-label': label});
  strip.dataset.node = node.name;
  const title = svg('title');
  title.textContent = label;
  strip.append(title, svg('rect', {class: 'strip-idle', x: 0, y: 0, width: windowS, height: 10}));
  for (const [a, b] of node.busy) {
    const w = Math.max((parseTime(b) - parseTime(a)) / 1000, windowS / 360); // at least a visible sliver
    const x = Math.min(Math.max(0, (parseTime(a) - start) / 1000), windowS - w); // a sliver stays inside
    const bar = svg('rect', {class: 'strip-busy', x: x.toFixed(1), y: 0, width: w.toFixed(1), height: 10});
    bar.dataset.from = a;
    bar.dataset.to = b;
    strip.append(bar);
  }
  return strip;
}

export function utilText(node, activity) {
  const share = (100 * node.busy_s) / activity.window_s;
  const pct = share > 0 && share < 0.5 ? '<1' : String(Math.round(share));
  return `${fmtNum(node.jobs_per_hour)} job${node.jobs_per_hour === 1 ? '' : 's'}/h · busy ${pct}%`;
}

// -- toasts: refusals and failures, readable, dismissable ---------------------------------

export function toast(message, kind = 'error', ms = 15000) {
  let box = document.getElementById('toasts');
  if (!box) {
    box = el('div', {id: 'toasts', role: 'alert', 'aria-live': 'assertive'});
    document.body.append(box);
  }
  const item = el('div', {className: `toast ${kind}`},
    el('span', {className: 'toast-text', text: message}),
    el('button', {className: 'toast-close', type: 'button', title: 'Dismiss', 'aria-label': 'Dismiss',
      text: '×', onclick: () => item.remove()}));
  box.append(item);
  while (box.children.length > 4) box.firstElementChild.remove();
  if (ms) setTimeout(() => item.remove(), ms);
  return item;
}

// -- dialogs: an in-page confirm and the token form (no window.confirm / prompt) -----------

// `quote`: what the action is about in the person's own words (a job's prompt), on one line.
export function confirmDialog({title, message, quote = '', confirm = 'OK', danger = false, checkbox = null}) {
  return new Promise((resolve) => {
    const previous = document.activeElement;
    const box = checkbox ? el('input', {type: 'checkbox', id: 'confirm-check'}) : null;
    const ok = el('button', {type: 'submit', className: danger ? 'danger' : 'primary', text: confirm});
    const cancel = el('button', {type: 'button', text: 'Cancel'});
    const form = el('form', {className: 'dialog-body'},
      el('h2', {text: title}),
      quote ? el('p', {className: 'dialog-quote', text: quote}) : null,
      message ? el('p', {text: message}) : null,
      box ? el('label', {className: 'check'}, box, ' ', checkbox) : null,
      el('div', {className: 'dialog-buttons'}, cancel, ok));
    const dialog = el('dialog', {className: 'confirm', 'aria-label': title}, form);
    let answer = false;
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      answer = {checked: box ? box.checked : false};
      dialog.close();
    });
    cancel.addEventListener('click', () => dialog.close());
    dialog.addEventListener('close', () => {
      dialog.remove();
      if (previous && previous.isConnected && previous.focus) previous.focus({preventScroll: true});
      resolve(answer);
    });
    document.body.append(dialog);
    dialog.showModal();
    ok.focus();
  });
}

export function token() {
  try {
    return localStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

let asking = null;
let declined = false;
// The tokens (by value; '' for none) the router refused after the form was shown for them: the
// form is not shown again by itself for one of them (the page says the refusal, with a button).
const askedFor = new Set();

// One form however many requests got a 401 at once; resolves true when a token was saved.
export function askToken(refused = false) {
  if (asking) return asking;
  asking = new Promise((resolve) => {
    const input = el('input', {type: 'password', id: 'token-input', autocomplete: 'current-password',
      required: true, spellcheck: false, placeholder: 'access token'});
    const form = el('form', {className: 'dialog-body'},
      el('h2', {text: 'Access token needed'}),
      el('p', {text: refused
        ? 'The router refused the saved token. Enter your token (gpuq.toml [[user]] or router.token).'
        : 'This router asks for an access token: your token (gpuq.toml [[user]] or router.token). It is kept in this browser.'}),
      el('label', {className: 'field'}, 'Token ', input),
      el('div', {className: 'dialog-buttons'},
        el('button', {type: 'button', text: 'Not now', onclick: () => dialog.close()}),
        el('button', {type: 'submit', className: 'primary', text: 'Save token'})));
    const dialog = el('dialog', {className: 'token', 'aria-label': 'Access token'}, form);
    let saved = false;
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      try {
        localStorage.setItem(TOKEN_KEY, value);
      } catch { /* private mode: the token lives for this page only */ }
      memoryToken = value;
      askedFor.add(value); // entered in the form: if the router refuses it too, the page says so
      saved = true;
      dialog.close();
    });
    dialog.addEventListener('close', () => {
      dialog.remove();
      declined = !saved;
      resolve(saved);
      if (saved) window.dispatchEvent(new Event('gpuq-token'));
    });
    document.body.append(dialog);
    dialog.showModal();
    input.focus();
  }).finally(() => { asking = null; });
  return asking;
}

let memoryToken = '';

function currentToken() {
  return token() || memoryToken;
}

export function tokenDeclined() {
  return declined;
}

// Whether a 401 for this token opens the form: once per token, whatever the answer.
function askOnce(t) {
  if (askedFor.has(t) || (declined && !t)) return false;
  askedFor.add(t);
  return true;
}

// Is this failure the router refusing access (a missing or wrong token, 401; or 403)?
export function isRefusal(exc) {
  return Boolean(exc) && (exc.status === 401 || exc.status === 403);
}

// A refusal said whole, as soon as the router says it: what it refused, its own message, and
// how to give the right token (a button opens the form; `onToken` runs once one is saved).
export function refusalNotice(exc, onToken, className = 'alert warn refusal') {
  const sent = Boolean(currentToken());
  const head = exc.status === 403 ? `Refused (403)`
    : sent ? 'Access token refused (401)' : 'Access token needed (401)';
  const how = exc.status === 403 ? ''
    : sent ? ' The router knows no such token: enter your token (gpuq.toml [[user]] or router.token, or $GPUQ_TOKEN where the router runs).'
      : ' Enter your token (gpuq.toml [[user]] or router.token, or $GPUQ_TOKEN where the router runs); it is kept in this browser.';
  return el('div', {className, role: 'alert', dataset: {refused: String(exc.status)}},
    el('strong', {text: head}),
    el('span', {text: ` The router says: ${exc.message}.${how}`}),
    exc.status === 401 ? el('button', {type: 'button', text: 'Enter token',
      onclick: async () => { if (await askToken(sent) && onToken) onToken(); }}) : null);
}

// -- the API ----------------------------------------------------------------------------------

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function messageOf(status, data, fallback) {
  if (data && data.error && data.error.message) return data.error.message;
  return fallback || `HTTP ${status}`;
}

// Returns {ok, status, data}; throws ApiError(0, ...) when the router cannot be reached.
// A 401 asks for the token once (a form), then repeats the request with it.
export async function api(method, path, body) {
  for (let attempt = 0; ; attempt++) {
    const headers = {Accept: 'application/json'};
    const t = currentToken();
    if (t) headers.Authorization = `Bearer ${t}`;
    if (method !== 'GET') headers['X-Gpuq-Actor'] = 'page';
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let resp;
    try {
      resp = await fetch(path, {method, headers, cache: 'no-store',
        body: body === undefined ? undefined : JSON.stringify(body)});
    } catch (exc) {
      throw new ApiError(0, `the router does not answer (${exc.message})`);
    }
    noteServerDate(resp.headers.get('Date'));
    if (resp.status === 401 && attempt === 0) {
      // Requests refused together wait for the one form; a token refused after it was asked
      // for is not asked again by itself (the page says the refusal).
      const form = asking || (askOnce(t) ? askToken(Boolean(t)) : null);
      if (form && await form) continue;
    }
    let data = null;
    try {
      data = await resp.json();
    } catch { /* not JSON: the message says so below */ }
    return {ok: resp.ok, status: resp.status, data,
      message: messageOf(resp.status, data, resp.statusText)};
  }
}

// GET that must succeed (503 from /health is data, not failure, so pass okStatuses).
export async function getJSON(path, okStatuses = [200]) {
  const r = await api('GET', path);
  if (!okStatuses.includes(r.status)) throw new ApiError(r.status, r.message);
  return r.data;
}

// Streams NDJSON lines to onLine; resolves when the stream ends. signal aborts it.
export async function streamLines(path, onLine, signal) {
  const headers = {Accept: 'application/x-ndjson'};
  const t = currentToken();
  if (t) headers.Authorization = `Bearer ${t}`;
  const resp = await fetch(path, {headers, signal, cache: 'no-store'});
  if (resp.status === 401) {
    const form = asking || (askOnce(t) ? askToken(Boolean(t)) : null);
    if (form) await form;
    throw new ApiError(401, 'access token needed');
  }
  if (!resp.ok || !resp.body) {
    let data = null;
    try { data = await resp.json(); } catch { /* ignore */ }
    throw new ApiError(resp.status, messageOf(resp.status, data, resp.statusText));
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let nl;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, nl).trim();
      buffer = buffer.slice(nl + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
}

// -- live events ------------------------------------------------------------------------------

// Server-sent events from /api/events. EventSource reconnects by itself (the router sends
// `retry: 1000`); if it gives up (an HTTP error such as 401), we open a new one.
// onStatus('live' | 'reconnecting'); every (re)connect calls onConnect, to catch up.
export function liveEvents({onConnect, onChange, onTokens, onStatus}) {
  let source = null;
  let timer = null;
  function open() {
    clearTimeout(timer);
    if (source) source.close();
    const t = currentToken();
    source = new EventSource('/api/events' + (t ? `?token=${encodeURIComponent(t)}` : ''));
    source.addEventListener('hello', () => {
      onStatus && onStatus('live');
      onConnect && onConnect();
    });
    source.addEventListener('change', (e) => onChange && onChange(safeParse(e.data)));
    if (onTokens) source.addEventListener('tokens', (e) => onTokens(safeParse(e.data)));
    source.addEventListener('error', () => {
      onStatus && onStatus('reconnecting');
      if (source.readyState === EventSource.CLOSED) timer = setTimeout(open, 2000);
    });
  }
  window.addEventListener('gpuq-token', open);
  open();
  return {reopen: open};
}

function safeParse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}

// Coalesces calls: at most one run in flight, and one more after it if asked meanwhile.
export function coalesced(fn, minGapMs = 150) {
  let running = false;
  let again = false;
  let timer = null;
  async function run() {
    timer = null;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await fn();
    } finally {
      running = false;
      if (again) {
        again = false;
        schedule(minGapMs);
      }
    }
  }
  function schedule(delay = 0) {
    if (timer === null) timer = setTimeout(run, delay);
  }
  return schedule;
}

// A refusal (a wrong token) stays the connection's word until the live events connect: the
// EventSource, refused too, only ever says it is reconnecting.
let refusedWith = null;

export function setConnection(status, detail) {
  const node = document.getElementById('conn');
  if (!node) return;
  if (status === 'refused') refusedWith = detail || '';
  else if (status === 'live') refusedWith = null;
  else if (status === 'reconnecting' && refusedWith !== null) [status, detail] = ['refused', refusedWith];
  node.className = `conn conn-${status}`;
  node.textContent = {live: 'live', reconnecting: 'reconnecting…', down: 'router unreachable',
    connecting: 'connecting…', refused: 'access refused'}[status] || status;
  node.title = detail || (status === 'live' ? 'updates arrive as they happen (server-sent events)' : '');
}
