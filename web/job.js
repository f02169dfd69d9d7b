// The job preview page (/jobs/{id}): what the job is, where and how it ran, its output
// streaming live while it runs, its runs, events, critiques and findings.

import {
  api, badge, privateLabel, between, coalesced, confirmDialog, el, estimateTokens, etaSpan, fmtClock, fmtDur, fmtNum,
  fmtRate, fmtSetting, fmtSpan, jobRate, jobHref, liveEvents, setConnection, since, sinceSpan, stateBadge, streamLines,
  tickSince, toast, promptStart, isRefusal, refusalNotice, heldByPress,
} from './common.js';

const jobId = decodeURIComponent(window.location.pathname.replace(/\/+$/, '').split('/').pop());
const main = document.getElementById('job');
const actions = document.getElementById('actions');

const J = {
  job: null,
  sig: '',
  missing: null, // the API's message when there is no such job
  error: null, // the last load's failure
  stream: null, // AbortController of the open output stream
  streamedRun: null, // the run whose output the stream shows
  pieces: 0, // pieces streamed after the catch-up text
  caughtUp: 0, // estimated tokens in the catch-up text
  counted: null, // {thinking, answer}: the router's counts when the stream opened, plus each piece since
  streamStart: 0,
  since: 0, // another's private job: token events since its last load (they carry no text)
};
window.gpuqJob = J; // for the browser console (and the page tests)

// The output text node is kept across renders, so streaming appends to it cheaply.
const outText = document.createTextNode('');
const outPre = el('pre', {className: 'text', id: 'output'}, outText);
// The reasoning of a thinking model, apart from the answer: collapsed above the output.
const thinkText = document.createTextNode('');
const thinkPre = el('pre', {className: 'text thinking', id: 'thinking'}, thinkText);

// -- loading ----------------------------------------------------------------------------------

async function load() {
  let r;
  try {
    r = await api('GET', `/api/jobs/${encodeURIComponent(jobId)}`);
  } catch (exc) {
    J.error = exc;
    renderProblem();
    return;
  }
  J.error = null;
  if (r.status === 404 || r.status === 400) {
    J.missing = r.message;
    renderProblem();
    return;
  }
  if (!r.ok) {
    J.error = r;
    renderProblem();
    return;
  }
  const job = r.data;
  const running = job.state === 'running';
  const runId = job.runs && job.runs.length ? job.runs[job.runs.length - 1].id : null;
  if (J.stream && (!running || runId !== J.streamedRun)) stopStream(); // preempted, deleted, done
  if (!J.stream) {
    // A job whose text retention dropped says so, never shows an empty output.
    outText.data = job.output_pruned ? `(${job.output_pruned})` : job.output || '';
    thinkText.data = job.thinking || '';
  }
  J.job = job;
  J.since = 0;
  render();
  if (running && !J.stream && !job.private) startStream(runId); // another's private job: no text to follow
}

const loadSoon = coalesced(load, 300);

function stopStream() {
  if (J.stream) J.stream.abort();
  J.stream = null;
}

// GET /api/jobs/{id}/stream: the reasoning and the answer so far (lines marked catch_up), then
// each new piece of either.
async function startStream(runId) {
  const ctl = new AbortController();
  const job = J.job;
  const counted = job.tokens_so_far == null ? null
    : {thinking: job.thinking_tokens_so_far || 0, answer: job.tokens_so_far - (job.thinking_tokens_so_far || 0)};
  Object.assign(J, {stream: ctl, streamedRun: runId, pieces: 0, caughtUp: 0, streamStart: Date.now(), counted});
  let failed = false;
  try {
    await streamLines(`/api/jobs/${encodeURIComponent(jobId)}/stream`, (line) => {
      if (ctl.signal.aborted) return;
      const kind = typeof line.thinking === 'string' ? 'thinking' : typeof line.text === 'string' ? 'text' : null;
      if (!kind) return;
      const node = kind === 'thinking' ? thinkText : outText;
      if (line.catch_up) {
        node.data = line[kind];
        J.caughtUp += estimateTokens(line[kind]);
        if (typeof line.tokens === 'number') { // the router's count at the catch-up: count on from it
          J.counted = J.counted || {thinking: 0, answer: 0};
          J.counted[kind === 'thinking' ? 'thinking' : 'answer'] = line.tokens;
        }
      } else {
        if (kind === 'thinking') thinkText.appendData(line.thinking);
        else appendOutput(line.text);
        J.pieces++;
        if (J.counted) J.counted[kind === 'thinking' ? 'thinking' : 'answer']++;
      }
      if (kind === 'thinking' && !document.getElementById('thinking-box')) render();
      paintLive();
    }, ctl.signal);
  } catch (exc) {
    if (ctl.signal.aborted) return;
    failed = true;
    setConnection('reconnecting', `output stream: ${exc.message}`);
  }
  if (J.stream === ctl) J.stream = null;
  if (!ctl.signal.aborted) setTimeout(loadSoon, failed ? 1000 : 0);
}

function appendOutput(piece) {
  const atBottom = outPre.scrollHeight - outPre.scrollTop - outPre.clientHeight < 24;
  outText.appendData(piece);
  if (atBottom) outPre.scrollTop = outPre.scrollHeight;
}

// -- rendering --------------------------------------------------------------------------------

function renderProblem() {
  if (J.missing) {
    document.title = 'no such job · gpuq';
    actions.replaceChildren();
    main.replaceChildren(el('div', {className: 'notice warn'},
      el('strong', {text: 'No such job. '}), el('span', {text: J.missing}), ' ',
      el('a', {href: '/', text: 'Back to the queue'})));
    return;
  }
  const refused = isRefusal(J.error);
  if (refused) { // the router's refusal and how to give the right token, at once
    const notice = refusalNotice(J.error, loadSoon, 'notice warn refusal');
    document.getElementById('problem')?.remove();
    notice.id = 'problem';
    if (J.job) {
      main.prepend(notice);
      J.sig = ''; // the next answer redraws the page (and the notice goes)
    }
    else main.replaceChildren(notice);
  } else if (!J.job) {
    main.replaceChildren(el('div', {className: 'notice warn', id: 'problem',
      text: `Cannot load job ${jobId}: ${J.error.message}. Retrying…`}));
  }
  if (J.job || refused) setConnection(refused ? 'refused' : 'down', J.error.message);
  setTimeout(loadSoon, refused ? 10000 : 2000);
}

function fact(label, value, extra = {}) {
  const dd = el('dd', extra, value instanceof Node ? value : String(value ?? '–'));
  return el('div', {className: 'fact'}, el('dl', {}, el('dt', {text: label}), dd));
}

// A fact whose value is said whole (a route, 'thinking 1,234 · answer 56'): two cells wide, and
// it wraps rather than being cut.
function wide(node) {
  node.classList.add('wide');
  return node;
}

function when(iso) {
  if (!iso) return el('span', {className: 'muted', text: '–'});
  return el('span', {title: iso}, fmtClock(iso), el('span', {className: 'muted'}, ' · ', sinceSpan(iso), ' ago'));
}

// Running: the router's counts when the stream opened, plus each piece since (a thinking model's
// reasoning and answer apart). Ended: Ollama's count, or the pieces the router counted before
// the reply broke off; with neither (the router restarted under it), estimated from its text: '~42'.
function tokensText(job) {
  if (job.private) { // no text here to count: the router's counts (while it runs, then Ollama's)
    if (job.state === 'running') return job.tokens_so_far == null ? '–' : fmtNum(job.tokens_so_far + J.since);
    return job.eval_count == null ? '–' : fmtNum(job.eval_count);
  }
  if (job.state === 'running' && J.stream && J.counted) {
    const {thinking, answer} = J.counted;
    if (thinking || job.kind === 'critique') return `thinking ${fmtNum(thinking)} · answer ${fmtNum(answer)}`;
    return fmtNum(answer);
  }
  if (job.state === 'running') {
    const tokens = J.stream ? J.caughtUp + J.pieces : estimateTokens(outText.data + thinkText.data);
    return tokens ? `~${fmtNum(tokens)}` : '–';
  }
  return runTokens(job, outText.data + thinkText.data);
}

function runTokens(run, text) {
  if (run.eval_count != null) return fmtNum(run.eval_count);
  const guess = estimateTokens(text);
  return guess ? `~${fmtNum(guess)}` : '–';
}

function durationOf(job) {
  if (!job.started_at) return NaN;
  return job.finished_at ? between(job.started_at, job.finished_at) : since(job.started_at);
}

function rateOf(job) {
  if (job.state === 'running') {
    const secs = J.stream ? (Date.now() - J.streamStart) / 1000 : 0;
    return J.pieces > 2 && secs > 0 ? fmtRate(J.pieces, secs) : '–';
  }
  return jobRate(job);
}

function paintLive() {
  const job = J.job;
  if (!job) return;
  const set = (id, text) => { const n = document.getElementById(id); if (n) n.textContent = text; };
  set('f-tokens', tokensText(job));
  set('f-rate', rateOf(job));
  set('f-duration', fmtSpan(durationOf(job)));
  set('thinking-chars', fmtNum(thinkText.data.length));
  if (job.state === 'queued') set('f-waited', fmtDur(since(job.created_at)));
}

function render() {
  if (heldByPress(render)) return; // its buttons and links stay under a pressed pointer
  const job = J.job;
  const streaming = job.state === 'running';
  const runsSig = (job.runs || []).map((r) => ({...r, output: r.state === 'running' ? '' : r.output}));
  // While it streams, the text nodes hold its output and reasoning: the sig notes only whether
  // there is reasoning to show (its first piece adds the Thinking box; later ones only append).
  const sig = JSON.stringify({...job, output: streaming ? '' : job.output,
    thinking: streaming ? Boolean(thinkText.data) : job.thinking, runs: runsSig});
  document.title = `${job.state} · ${job.id} · gpuq`;
  if (sig === J.sig) {
    paintLive();
    return;
  }
  J.sig = sig;
  const scroll = outPre.scrollTop;
  const atBottom = !outPre.isConnected || outPre.scrollHeight - scroll - outPre.clientHeight < 24;
  const thinkingOpen = Boolean(document.getElementById('thinking-box')?.open);
  const opened = new Set([...main.querySelectorAll('details.run-output[open]')].map((d) => d.dataset.run));
  renderActions(job);
  const runs = job.runs || [];
  const children = job.children || [];
  main.replaceChildren(...[
    el('div', {className: 'job-title'},
      el('h1', {text: job.id}),
      stateBadge(job.state),
      badge(job.kind, `kind kind-${job.kind}`),
      job.preempted_runs ? badge(job.preempted_runs > 1 ? `preempted ×${job.preempted_runs}` : 'preempted', 'preempted') : null),
    el('div', {className: 'job-sub'},
      `${job.kind} on `, el('b', {text: job.node}), ' · ', el('span', {className: 'mono', text: job.model}),
      job.placement ? ` · placed: ${job.placement}` : '',
      job.kind === 'critique' && job.parent ? el('span', {}, ' · critique of task ',
        el('a', {className: 'mono', href: jobHref(job.parent), text: job.parent})) : null),
    stateNotice(job),
    facts(job),
    ...(job.private ? [privateNotice(job)] : content(job, streaming, thinkingOpen, runs, children))].filter(Boolean));
  for (const d of main.querySelectorAll('details.run-output')) d.open = opened.has(d.dataset.run);
  outPre.scrollTop = streaming && atBottom ? outPre.scrollHeight : scroll;
  paintLive();
}

// Another user's job on a private router ([router] private): where and when, never what it says.
function privateNotice(job) {
  return el('div', {className: 'notice private', id: 'private-notice'},
    el('strong', {text: `${privateLabel(job)}. `}),
    'The router is private: its prompt, output, runs and events are for its owner and admins.');
}

// What the job says and did: its error, findings, prompt, reasoning, output, critiques, runs, events.
function content(job, streaming, thinkingOpen, runs, children) {
  return [
    job.error ? el('section', {className: 'box error-box', id: 'error'},
      el('div', {className: 'box-head'}, el('h2', {text: job.state === 'cancelled' ? 'Why it was cancelled' : 'Error'})),
      el('pre', {className: 'text short', text: job.error})) : null,
    job.findings ? findings(job.findings) : null,
    el('section', {className: 'box', id: 'prompt-box'},
      el('div', {className: 'box-head'}, el('h2', {text: 'Prompt'}),
        el('span', {id: 'prompt-note', text: job.prompt_pruned || `${fmtNum(job.prompt.length)} characters`})),
      el('pre', {className: 'text short', id: 'prompt', text: job.prompt})),
    thinkText.data ? el('details', {className: 'box thinking-box', id: 'thinking-box', open: thinkingOpen},
      el('summary', {className: 'box-head'}, el('h2', {text: 'Thinking'}),
        el('span', {}, "the model's reasoning, apart from its answer · ",
          el('span', {id: 'thinking-chars', text: fmtNum(thinkText.data.length)}), ' characters')),
      thinkPre) : null,
    el('section', {className: `box${streaming ? ' streaming' : ''}`, id: 'output-box'},
      el('div', {className: 'box-head'}, el('h2', {text: 'Output'}), el('span', {text: outputNote(job, runs)})),
      outPre),
    job.kind === 'task' ? critiques(children) : null,
    runsTable(runs),
    timeline(job.events || [])];
}

function outputNote(job, runs) {
  if (job.output_pruned) return 'its text was dropped by retention; the job, its runs and events stay';
  if (job.state === 'running') return 'streaming live…';
  if (job.state === 'queued' && runs.length) return 'from its last (interrupted) run; it starts again from the beginning';
  if (job.state === 'queued') return 'appears here as soon as the job starts';
  if (job.kind === 'critique' && job.findings) return 'the raw reply (the findings above are parsed from it)';
  return job.done_reason ? `done reason: ${job.done_reason}` : '';
}

function stateNotice(job) {
  if (job.state === 'queued' && job.waiting_for) {
    return el('div', {className: 'notice held', id: 'notice'},
      'Waiting for parent ', el('a', {className: 'mono', href: jobHref(job.parent), text: job.waiting_for}),
      ` to finish: this critique reviews its result, then runs on ${job.node}. The jobs behind it do not wait. `,
      'This page updates by itself.');
  }
  if (job.state === 'queued') {
    return el('div', {className: 'notice', id: 'notice'},
      `Waiting on ${job.node} at position ${job.queue_position ?? '?'}`,
      job.queue_position > 1 ? ` (${job.queue_position - 1} ahead of it, plus the running job)` : '',
      '. This page updates by itself.');
  }
  return null;
}

function facts(job) {
  const runs = job.runs || [];
  const items = [
    fact('Kind', job.kind),
    fact('Owner', job.owner || 'anyone (no users)', {id: 'f-owner'}),
    fact('Lane', job.lane, {id: 'f-lane'}),
    job.client ? wide(fact('Client', el('span', {className: 'mono', text: job.client, title: job.client}), {id: 'f-client'})) : null,
    fact('Node', job.node),
    fact('Model', el('span', {className: 'mono', text: job.model, title: job.model})),
    fact('Queued', when(job.created_at)),
    fact(job.state === 'queued' ? 'Waiting' : 'Waited',
      fmtSpan(job.started_at ? between(job.created_at, firstStart(runs) || job.started_at) : since(job.created_at)),
      {id: job.state === 'queued' ? 'f-waited' : undefined}),
    fact('Started', when(job.started_at)),
    job.state === 'queued' ? fact('Est. start', estimated(job.eta_start, job.eta_reason), {id: 'f-eta-start'}) : null,
    fact('Finished', when(job.finished_at)),
    job.state === 'queued' || job.state === 'running'
      ? fact('Est. finish', estimated(job.eta_finish, job.eta_reason), {id: 'f-eta-finish'}) : null,
    fact('Duration', fmtSpan(durationOf(job)), {id: 'f-duration'}),
    wide(fact(job.state === 'running' ? 'Tokens so far' : 'Tokens', '–', {id: 'f-tokens'})),
    fact('Tokens/s', '–', {id: 'f-rate'}),
    fact('Runs', `${runs.length}${job.preempted_runs ? ` (${job.preempted_runs} preempted)` : ''}`),
  ].filter(Boolean);
  if (job.endpoint) {  // a call through the front door: its route and client
    const agent = job.request && job.request.user_agent;
    items.push(wide(fact('Via', el('span', {className: 'mono', text: job.endpoint, title: agent || ''}), {id: 'f-via'})));
  }
  if (job.timeout_s) items.push(fact('Timeout', fmtSetting(job.timeout_s), {id: 'f-timeout'}));
  if (job.parent) items.push(fact('Parent task', el('a', {className: 'mono', href: jobHref(job.parent), text: job.parent})));
  if (job.group) items.push(fact('Fan-out group', el('span', {className: 'mono', text: job.group})));
  return el('div', {className: 'facts'}, ...items);
}

// An estimate: 'in ~4 min' and its clock time, or 'not known' with the reason beside it.
function estimated(iso, reason) {
  if (!iso) return el('span', {className: 'muted', title: reason || ''}, 'not known', reason ? `: ${reason}` : '');
  return el('span', {title: iso}, etaSpan(iso, null), el('span', {className: 'muted', text: ` · ${fmtClock(iso)}`}));
}

function firstStart(runs) {
  return runs.length ? runs[0].started_at : null;
}

const SEVERITY = {high: 0, medium: 1, low: 2};

function findings(list) {
  const sorted = [...list].sort((a, b) => (SEVERITY[a.severity] ?? 3) - (SEVERITY[b.severity] ?? 3));
  return el('section', {className: 'box', id: 'findings'},
    el('div', {className: 'box-head'}, el('h2', {text: 'Findings'}),
      el('span', {text: `${list.length} finding${list.length === 1 ? '' : 's'}`})),
    list.length ? el('ul', {className: 'findings'}, ...sorted.map((f) => el('li', {},
      el('div', {className: 'finding-title'},
        badge(String(f.severity || '?'), `sev-${f.severity}`),
        el('span', {text: String(f.title ?? '')}),
        f.where ? el('span', {className: 'finding-where', text: `— ${f.where}`}) : null),
      el('div', {className: 'finding-detail', text: String(f.detail ?? '')}))))
      : el('p', {className: 'muted', text: 'The reviewer found nothing to report.'}));
}

function critiques(children) {
  return el('section', {id: 'children'},
    el('h2', {text: `Critiques of this task (${children.length})`}),
    children.length ? el('div', {className: 'table-scroll'}, el('table', {className: 'grid'},
      el('thead', {}, el('tr', {}, ...['critique', 'state', 'findings', 'highest', 'node', 'model']
        .map((t) => el('th', {text: t})))),
      el('tbody', {}, ...children.map((c) => el('tr', {dataset: {id: c.id}},
        el('td', {}, el('a', {className: 'mono', href: jobHref(c.id), text: c.id})),
        el('td', {}, stateBadge(c.state)),
        el('td', {className: 'num findings-count', text: c.finding_count == null ? '–' : fmtNum(c.finding_count)}),
        el('td', {className: 'top-severity'}, c.top_severity ? badge(c.top_severity, `sev-${c.top_severity}`)
          : el('span', {className: 'muted', text: c.finding_count === 0 ? 'none' : '–'})),
        el('td', {text: c.node}),
        el('td', {className: 'mono', text: c.model}))))))
      : el('p', {className: 'muted', text: J.job.state === 'done'
        ? `None yet. Ask for them with: gpuq critique --parent ${J.job.id}` : 'None.'}));
}

function runsTable(runs) {
  return el('section', {id: 'runs'},
    el('h2', {text: `Runs (${runs.length})`}),
    runs.length ? el('div', {className: 'table-scroll'}, el('table', {className: 'grid'},
      el('thead', {}, el('tr', {}, ...['run', 'state', 'node', 'model', 'started', 'ran', 'tokens', 'speed', 'error / output']
        .map((t) => el('th', {text: t})))),
      el('tbody', {}, ...runs.map((r) => el('tr', {dataset: {run: r.id}},
        el('td', {className: 'num', text: `#${r.id}`}),
        el('td', {}, stateBadge(r.state)),
        el('td', {text: r.node}),
        el('td', {className: 'mono', text: r.model}),
        el('td', {className: 'num', title: r.started_at, text: fmtClock(r.started_at)}),
        r.finished_at ? el('td', {className: 'num', text: fmtSpan(between(r.started_at, r.finished_at))})
          : el('td', {className: 'num'}, sinceSpan(r.started_at)),
        el('td', {className: 'num', text: r.state === 'running' ? '–' : runTokens(r, (r.output || '') + (r.thinking || '')),
          title: r.eval_count == null ? 'estimated from the text it streamed (Ollama did not count them)' : ''}),
        el('td', {className: 'num', text: jobRate(r)}),
        el('td', {},
          r.error ? el('div', {className: 'err', text: r.error}) : null,
          r.output && r.state !== 'running' ? el('details', {className: 'run-output', dataset: {run: String(r.id)}},
            el('summary', {text: `output (${fmtNum(r.output.length)} chars)`}),
            el('pre', {className: 'text', text: r.output})) : null))))))
      : el('p', {className: 'muted', text: 'Not started yet.'}));
}

function timeline(events) {
  return el('section', {id: 'events'},
    el('h2', {text: `Events (${events.length})`}),
    el('div', {className: 'box'}, el('ol', {className: 'timeline'}, ...events.map((e) => el('li', {},
      el('span', {className: 'when', title: e.at, text: fmtClock(e.at)}),
      el('span', {}, e.from_state ? `${e.from_state} → ` : 'created → ', stateBadge(e.to_state)),
      el('span', {className: 'reason'}, e.reason || '', ' ', el('span', {className: 'actor', text: `by ${e.actor}`})))))));
}

// -- actions ----------------------------------------------------------------------------------

function renderActions(job) {
  const buttons = [];
  if (job.private) { // another's job: a member acts only on their own
    actions.replaceChildren();
    return;
  }
  if (job.state === 'queued') {
    buttons.push(el('button', {type: 'button', text: 'Preempt', title: 'Run it next; the running job goes back behind it',
      onclick: () => act('preempt', 'POST', 'preempt', {title: `Preempt ${job.node}?`, confirm: 'Preempt',
        message: `${job.id} runs next. A job running on ${job.node} is stopped and goes back to the queue behind it.`})}));
  }
  if (job.state === 'queued' || job.state === 'running') {
    buttons.push(el('button', {type: 'button', className: 'danger', text: 'Delete',
      onclick: () => act('delete', 'DELETE', '', {title: `Delete ${job.id}?`, confirm: 'Delete', danger: true,
        quote: promptStart(job.prompt),
        message: job.state === 'running'
          ? `It is running on ${job.node}: generation stops and the job is cancelled.`
          : 'It is cancelled; its record stays in the history.'})}));
  }
  if (job.state === 'failed' || job.state === 'cancelled') {
    buttons.push(el('button', {type: 'button', text: 'Retry', title: 'Queue it again at the tail of its node',
      onclick: () => act('retry', 'POST', 'retry')}));
  }
  actions.replaceChildren(...buttons);
}

async function act(what, method, suffix, confirmation) {
  if (confirmation && !(await confirmDialog(confirmation))) return;
  const path = `/api/jobs/${encodeURIComponent(jobId)}${suffix ? `/${suffix}` : ''}`;
  try {
    const r = await api(method, path);
    if (!r.ok) toast(`Could not ${what} ${jobId}: ${r.message} (${r.status})`);
  } catch (exc) {
    toast(`Could not ${what} ${jobId}: ${exc.message}`);
  }
  loadSoon();
}

// -- start ------------------------------------------------------------------------------------

liveEvents({
  onConnect: loadSoon,
  onChange: loadSoon,
  onTokens: (d) => { // only another's private job: this page's own stream counts the others
    if (!d || !J.job || !J.job.private || d.id !== J.job.id) return;
    J.since++;
    paintLive();
  },
  onStatus: (status) => setConnection(status),
});

setInterval(() => {
  tickSince(main);
  paintLive();
}, 1000);

loadSoon();
