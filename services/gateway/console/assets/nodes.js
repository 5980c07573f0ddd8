// Nodes (live list and search), one node (its fields, tools with generated
// forms, other commands) and the live event stream.

import { h, clear, errorBox, ago, fmtTime, json, uuid, busy, field, jaegerLink } from './lib.js';
import { buildForm } from './schemaform.js';
import { newTraceparent } from './gateway.js';
import { canInvoke, refreshNodes } from './app.js';

// Fields the pages lay out themselves; every other field of a node is shown
// as it comes, so new node kinds and states need no console change.
const known = new Set(['nodeId', 'displayName', 'connected', 'kind', 'transport', 'deviceFamily', 'lastSeenMs', 'connectedAtMs', 'upstream', 'tools', 'commands', 'caps', 'paired']);

function statusPill(n) {
  return h('span', { class: 'pill ' + (n.connected ? 'ok' : 'off'), text: n.connected ? 'connected' : 'offline' });
}

// summary renders any value in one line: objects by their state/status.
function summary(v) {
  if (v === undefined || v === null || v === '') return '';
  if (typeof v !== 'object') return String(v);
  for (const k of ['state', 'status', 'phase']) if (typeof v[k] === 'string') return v[k];
  const s = JSON.stringify(v);
  return s.length > 60 ? s.slice(0, 57) + '…' : s;
}

function lastSeen(n) {
  if (n.connected && !n.lastSeenMs) return 'now';
  return n.lastSeenMs ? ago(n.lastSeenMs) : '';
}

export function nodesPage({ main, state, onState }) {
  const search = h('input', { type: 'search', placeholder: 'Search nodes: id, name, family, tool…', 'aria-label': 'search nodes', value: sessionStorage.getItem('xiaoclaw.console.search') || '' });
  const onlyOnline = h('input', { type: 'checkbox', class: 'toggle', 'aria-label': 'connected only' });
  const body = h('div');
  const count = h('span', { class: 'muted' });
  clear(main,
    h('div', { class: 'pagehead' }, h('h1', { text: 'Nodes' }), count),
    h('div', { class: 'toolbar' }, search, h('label', { class: 'inline' }, onlyOnline, ' connected only')),
    body);

  function render() {
    const q = search.value.trim().toLowerCase();
    sessionStorage.setItem('xiaoclaw.console.search', search.value);
    const all = [...state.nodes.values()];
    const rows = all.filter(n => (!onlyOnline.checked || n.connected) && (!q || JSON.stringify(n).toLowerCase().includes(q)));
    count.textContent = all.length ? rows.length + ' of ' + all.length + ' · ' + all.filter(n => n.connected).length + ' connected' : '';
    if (state.nodesError) { clear(body, errorBox(state.nodesError)); return; }
    if (!all.length) {
      clear(body, h('div', { class: 'card empty' }, h('p', { text: state.gw && state.gw.status === 'online' ? 'No nodes in this tenant yet.' : 'Connecting to the gateway…' }),
        h('p', { class: 'muted', text: 'Devices appear here the moment they connect: a XiaoZhi device through the devicehub, or an OpenClaw node host through this gateway.' })));
      return;
    }
    const extra = [...new Set(all.flatMap(n => Object.keys(n).filter(k => k === 'upstream')))];
    clear(body, h('table', { class: 'grid nodes' },
      h('thead', {}, h('tr', {}, ['Node', 'Status', 'Kind', 'Transport', 'Device family', 'Last seen', ...extra.map(() => 'Upstream'), 'Tools'].map(t => h('th', { text: t })))),
      h('tbody', {}, rows.map(n => h('tr', { 'data-node': n.nodeId },
        h('td', { 'data-label': 'Node' }, h('div', {}, h('a', { href: '#/nodes/' + encodeURIComponent(n.nodeId) }, h('strong', { text: n.displayName || n.nodeId })),
          n.displayName ? h('div', { class: 'muted mono', text: n.nodeId }) : null)),
        h('td', { 'data-label': 'Status' }, statusPill(n)),
        h('td', { 'data-label': 'Kind', text: n.kind || '' }),
        h('td', { 'data-label': 'Transport', text: n.transport || '' }),
        h('td', { 'data-label': 'Device family', text: n.deviceFamily || n.platform || '' }),
        h('td', { 'data-label': 'Last seen', text: lastSeen(n), title: n.lastSeenMs ? fmtTime(n.lastSeenMs) : '' }),
        extra.map(() => h('td', { 'data-label': 'Upstream', text: summary(n.upstream) })),
        h('td', { 'data-label': 'Tools', class: 'num', text: String((n.tools || []).length) }))))));
  }
  search.addEventListener('input', render);
  onlyOnline.addEventListener('change', render);
  onState(kind => { if (kind !== 'event') render(); });
  render();
  search.focus();
}

function valueCell(v) {
  if (v === undefined || v === null) return '';
  if (typeof v === 'object') return h('pre', { class: 'mono small', text: json(v) });
  return String(v);
}

export function nodePage({ main, state, onState }, nodeId) {
  const head = h('div', { class: 'pagehead' });
  const props = h('div');
  const toolsEl = h('div');
  const cmdsEl = h('div');
  const err = h('div');
  clear(main, h('p', {}, h('a', { href: '#/nodes', text: '← All nodes' })), head, err, props, toolsEl, cmdsEl);
  let node = null;
  let toolsKey = '';

  async function load() {
    try {
      const res = await state.gw.request('node.describe', { nodeId });
      delete res.ts;
      node = res;
      clear(err);
    } catch (e) {
      node = state.nodes.get(nodeId) || null;
      clear(err, errorBox(e));
    }
    render();
  }

  function render() {
    if (!node) { clear(head, h('h1', { text: nodeId })); return; }
    clear(head, h('h1', { text: node.displayName || node.nodeId }), statusPill(node));
    const rows = [
      ['Node id', h('code', { text: node.nodeId })],
      ['Kind', node.kind], ['Transport', node.transport], ['Device family', node.deviceFamily],
      ['Connected since', node.connected && node.connectedAtMs ? fmtTime(node.connectedAtMs) : ''],
      ['Last seen', node.lastSeenMs ? fmtTime(node.lastSeenMs) + ' (' + ago(node.lastSeenMs) + ')' : ''],
      ['Upstream', node.upstream !== undefined ? valueCell(node.upstream) : ''],
      ['Capabilities', (node.caps || []).join(', ')],
    ];
    for (const [k, v] of Object.entries(node)) if (!known.has(k)) rows.push([k, valueCell(v)]);
    clear(props, h('section', { class: 'card' }, h('h2', { text: 'Details' }),
      h('dl', { class: 'props' }, rows.filter(([, v]) => v !== '' && v !== undefined && v !== null).map(([k, v]) => [h('dt', { text: k }), h('dd', {}, v)]))));
    // Tools are rebuilt only when the catalog changes, so typed values stay.
    const key = JSON.stringify(node.tools || []) + canInvoke() + node.connected;
    if (key !== toolsKey) {
      toolsKey = key;
      renderTools();
      renderCommands();
    }
  }

  function renderTools() {
    const tools = node.tools || [];
    clear(toolsEl, h('section', { class: 'card' },
      h('h2', {}, 'Tools ', h('span', { class: 'muted', text: '(' + tools.length + ')' })),
      !canInvoke() ? h('p', { class: 'muted', text: 'Your token may read only: calling tools needs an operator or admin token.' }) : null,
      !node.connected ? h('p', { class: 'muted', text: 'The node is offline: calls fail until it reconnects.' }) : null,
      tools.length ? tools.map(t => toolForm(t)) : h('p', { class: 'muted', text: 'This node has no MCP tools you may call.' })));
  }

  function toolForm(t) {
    const form = buildForm(t.inputSchema);
    const out = h('div', { class: 'result' });
    const f = h('form', { class: 'tool', novalidate: true, onsubmit: async ev => {
      ev.preventDefault();
      let args;
      try { args = form.read(); } catch (e) { clear(out, errorBox(e)); return; }
      await busy(f, () => invoke('mcp.tools.call', { name: t.name, arguments: args }, out));
    } },
    form.el,
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', disabled: !canInvoke(), text: 'Call ' + t.name })),
    out);
    return h('details', { class: 'toolbox', 'data-tool': t.name },
      h('summary', {}, h('code', { text: t.name }), t.description ? h('span', { class: 'muted', text: ' — ' + t.description }) : null),
      f);
  }

  function renderCommands() {
    const cmds = (node.commands || []).filter(c => c !== 'mcp.tools.call');
    if (!cmds.length) { clear(cmdsEl); return; }
    const sel = h('select', { name: 'command' }, cmds.map(c => h('option', { value: c, text: c })));
    const params = h('textarea', { name: 'params', rows: 4, class: 'mono', spellcheck: 'false', value: '{}' });
    const out = h('div', { class: 'result' });
    const f = h('form', { onsubmit: async ev => {
      ev.preventDefault();
      let p;
      try { p = params.value.trim() ? JSON.parse(params.value) : undefined; } catch (e) { clear(out, errorBox(new Error('params are not valid JSON: ' + e.message))); return; }
      await busy(f, () => invoke(sel.value, p, out));
    } }, field('Command', sel), field('Params (JSON)', params),
    h('div', { class: 'actions' }, h('button', { type: 'submit', disabled: !canInvoke(), text: 'Invoke' })), out);
    clear(cmdsEl, h('section', { class: 'card' }, h('h2', { text: 'Other commands' }), f));
  }

  async function invoke(command, params, out) {
    const { traceId, traceparent } = newTraceparent();
    const started = performance.now();
    clear(out, h('p', { class: 'muted', text: 'Calling…' }));
    const trace = () => h('div', { class: 'trace' }, 'trace ', h('code', { class: 'traceid', text: traceId }), ' ',
      jaegerLink(state.config, traceId), ' ', h('a', { href: '#/audit?trace=' + traceId + '&node=' + encodeURIComponent(nodeId), text: 'find in audit' }));
    try {
      const params2 = { nodeId, command, idempotencyKey: uuid(), timeoutMs: 30000 };
      if (params !== undefined) params2.params = params;
      const res = await state.gw.request('node.invoke', params2, { traceparent });
      const ms = Math.round(performance.now() - started);
      const payload = res.payload !== undefined ? res.payload : res;
      const isError = payload && payload.isError === true;
      const texts = payload && Array.isArray(payload.content) ? payload.content.filter(c => c && c.type === 'text').map(c => c.text) : [];
      clear(out,
        h('div', { class: isError ? 'error' : 'ok', role: 'status' }, isError ? 'The tool reported an error' : 'OK', ' in ' + ms + ' ms'),
        texts.length ? h('pre', { class: 'mono text', text: texts.join('\n') }) : null,
        h('details', { open: !texts.length }, h('summary', { text: 'result JSON' }), h('pre', { class: 'mono small', text: json(payload) })),
        trace());
    } catch (e) {
      const g = e.gatewayError || {};
      const d = g.details || {};
      clear(out, errorBox(e),
        d.ruleId ? h('p', {}, 'Decided by policy rule ', h('code', { class: 'rule', text: d.ruleId }), d.reason ? ': ' + d.reason : '') : null,
        Object.keys(d).length ? h('details', {}, h('summary', { text: 'error details' }), h('pre', { class: 'mono small', text: json(d) })) : null,
        trace());
    }
  }

  onState(kind => {
    if (kind === 'nodes') {
      const n = state.nodes.get(nodeId);
      // A catalog or presence change: describe again.
      if (n && node && (JSON.stringify(n.tools || []) !== JSON.stringify(node.tools || []) || n.connected !== node.connected || n.lastSeenMs !== node.lastSeenMs)) load();
    } else if (kind === 'status' && state.gw.status === 'online') load();
    else if (kind === 'tick') render();
  });
  if (state.gw.status === 'online') load(); else render();
}

export function eventsPage({ main, state, onState }) {
  const nodeSel = h('select', { 'aria-label': 'filter by node' });
  const kindSel = h('select', { 'aria-label': 'filter by kind' });
  const text = h('input', { type: 'search', placeholder: 'Search payloads…', 'aria-label': 'search events' });
  const paused = h('input', { type: 'checkbox', class: 'toggle', 'aria-label': 'pause' });
  const list = h('div', { class: 'events' });
  const count = h('span', { class: 'muted' });
  clear(main,
    h('div', { class: 'pagehead' }, h('h1', { text: 'Live events' }), count),
    h('p', { class: 'muted', text: 'Presence, device notifications and tool-catalog changes of your tenant as they happen, since you signed in.' }),
    h('div', { class: 'toolbar' }, field('Node', nodeSel), field('Kind', kindSel), text,
      h('label', { class: 'inline' }, paused, ' pause'),
      h('button', { type: 'button', text: 'Clear', onclick: () => { state.events.length = 0; render(); } })),
    list);

  function options(sel, values, all) {
    const cur = sel.value;
    clear(sel, h('option', { value: '', text: all }), [...values].sort().map(v => h('option', { value: v, text: v })));
    sel.value = values.has(cur) ? cur : '';
  }

  function render() {
    options(nodeSel, new Set([...state.events.map(e => e.nodeId).filter(Boolean), ...state.nodes.keys()]), 'all nodes');
    options(kindSel, new Set(state.events.map(e => e.kind).filter(Boolean)), 'all kinds');
    const q = text.value.trim().toLowerCase();
    const shown = state.events.filter(e => (!nodeSel.value || e.nodeId === nodeSel.value) && (!kindSel.value || e.kind === kindSel.value) &&
      (!q || JSON.stringify(e).toLowerCase().includes(q))).slice(-300).reverse();
    count.textContent = shown.length + ' of ' + state.events.length;
    clear(list, shown.length ? shown.map(e => h('div', { class: 'event kind-' + (e.kind || '').replace(/[^a-z0-9]+/gi, '-') },
      h('time', { text: fmtTime(e.ts) }),
      h('span', { class: 'badge', text: e.kind || e.event }),
      e.nodeId ? h('a', { href: '#/nodes/' + encodeURIComponent(e.nodeId), class: 'mono', text: e.nodeId }) : h('span'),
      e.data !== undefined ? h('code', { class: 'payload', text: summaryJSON(e.data) }) : null))
      : h('p', { class: 'muted empty', text: state.events.length ? 'No event matches the filters.' : 'Waiting for events… connect or disconnect a device to see one.' }));
  }
  for (const c of [nodeSel, kindSel]) c.addEventListener('change', render);
  text.addEventListener('input', render);
  paused.addEventListener('change', () => { if (!paused.checked) render(); });
  onState(kind => { if ((kind === 'event' || kind === 'status') && !paused.checked) render(); });
  render();
  if (state.gw && state.gw.status === 'online') refreshNodes();
}

function summaryJSON(v) {
  const s = JSON.stringify(v);
  return s && s.length > 400 ? s.slice(0, 397) + '…' : s;
}
