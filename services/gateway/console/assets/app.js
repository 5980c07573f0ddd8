// The console's shell: sign-in, the session's state (who the token is, the
// gateway connection, the tenant's nodes and live events), the menu and the
// router. Pages live in nodes.js (nodes, node, events) and manage.js
// (audit, policy, tenants and credentials).

import { h, clear, api, session, errorText, errorBox, busy, field } from './lib.js';
import { Gateway } from './gateway.js';
import { nodesPage, nodePage, eventsPage } from './nodes.js';
import { auditPage, policyPage, adminPage } from './manage.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const whoEl = document.getElementById('who');
const banner = document.getElementById('banner');

const maxEvents = 1000;

// state is the signed-in session.
export const state = {
  config: {},
  who: null, // /api/whoami, or what hello-ok tells
  gw: null,
  nodes: new Map(), // nodeId → NodeListNode
  nodesError: null,
  events: [], // newest last
  tenant: '', // the tenant pages act on
  tenants: [], // for a global admin
  listeners: new Set(), // re-render hooks of the current page
};

// notify tells the current page that state changed (kind: 'nodes', 'event', 'status').
export function notify(kind, detail) {
  for (const fn of state.listeners) {
    try { fn(kind, detail); } catch (e) { console.error(e); }
  }
}

export function isAdmin() { return state.who && state.who.role === 'admin'; }
export function canInvoke() { return state.who && !state.who.global && (state.who.role === 'admin' || state.who.role === 'operator'); }

function showBanner(msg) {
  if (!msg) { banner.hidden = true; return; }
  banner.hidden = false;
  banner.textContent = msg;
}

let refreshTimer = null;
// refreshNodes reloads node.list; events call it (debounced).
export function refreshNodes(soon) {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(async () => {
    if (!state.gw || state.gw.status !== 'online') return;
    try {
      const res = await state.gw.request('node.list', {});
      state.nodes = new Map((res.nodes || []).map(n => [n.nodeId, n]));
      state.nodesError = null;
    } catch (e) {
      state.nodesError = e;
    }
    notify('nodes');
  }, soon ? 150 : 0);
}

function onGatewayEvent(ev) {
  const f = ev.detail;
  if (f.event === 'tick' || f.event === 'connect.challenge') return;
  const item = { ts: Date.now(), event: f.event, payload: f.payload, seq: f.seq };
  if (f.event === 'node.event' && f.payload) {
    item.nodeId = f.payload.nodeId;
    item.kind = f.payload.event;
    item.data = f.payload.payload;
    if (f.payload.ts) item.ts = f.payload.ts;
    // Presence and catalog changes change the node list.
    if (/^node\.|tools/.test(item.kind || '')) refreshNodes(true);
  } else {
    item.kind = f.event;
    item.data = f.payload;
  }
  state.events.push(item);
  if (state.events.length > maxEvents) state.events.splice(0, state.events.length - maxEvents);
  notify('event', item);
}

function onGatewayStatus(ev) {
  const { status, detail } = ev.detail;
  renderWho();
  if (status === 'online') {
    showBanner('');
    refreshNodes();
  } else if (status === 'offline') {
    showBanner('The connection to the gateway was lost; reconnecting…' + (detail ? ' (' + detail + ')' : ''));
  } else if (status === 'refused') {
    showBanner('The gateway refused this token: ' + detail);
  }
  state.events.push({ ts: Date.now(), kind: 'console.connection', data: { status, detail } });
  notify('status', status);
}

function renderWho() {
  const w = state.who;
  if (!w) { whoEl.hidden = true; return; }
  whoEl.hidden = false;
  const status = state.gw ? state.gw.status : (w.global ? 'admin API' : 'offline');
  clear(whoEl,
    h('span', { class: 'dot ' + (state.gw ? state.gw.status : 'none'), title: 'gateway connection: ' + status }),
    h('span', { class: 'tenant', text: w.global ? 'global admin' : w.tenant || '' }),
    h('span', { class: 'role', text: w.role }),
    h('button', { class: 'link', type: 'button', text: 'Sign out', onclick: signOut }));
}

function renderNav() {
  const items = [];
  if (!state.who.global) items.push(['#/nodes', 'Nodes'], ['#/events', 'Events']);
  items.push(['#/audit', 'Audit']);
  if (isAdmin()) items.push(['#/policy', 'Policy'], ['#/admin', state.who.global ? 'Tenants & credentials' : 'Credentials']);
  nav.hidden = false;
  const here = location.hash.split('?')[0].split('/').slice(0, 2).join('/') || '#/nodes';
  clear(nav, items.map(([href, text]) => h('a', { href, text, class: here === href ? 'active' : '', 'aria-current': here === href ? 'page' : false })));
}

function signOut() {
  session.token = '';
  if (state.gw) state.gw.close();
  Object.assign(state, { who: null, gw: null, nodes: new Map(), events: [], tenant: '', tenants: [] });
  state.listeners.clear();
  nav.hidden = true;
  renderWho();
  showBanner('');
  location.hash = '';
  signInPage();
}

function signInPage(error) {
  state.listeners.clear();
  const input = h('input', { name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false', placeholder: 'xco_… or the dev operator token' });
  const msg = h('div');
  if (error) msg.append(errorBox(error));
  const form = h('form', { class: 'card signin', onsubmit: async ev => {
    ev.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    clear(msg);
    await busy(form, async () => {
      try {
        await signIn(token);
      } catch (e) {
        session.token = '';
        clear(msg, errorBox(e));
      }
    });
  } },
  h('h1', { text: 'Sign in' }),
  h('p', { class: 'muted', text: 'Paste an operator or admin token of your tenant, or a global admin token. It is kept in this tab only and sent as a bearer token.' }),
  field('Token', input),
  h('button', { type: 'submit', class: 'primary', text: 'Sign in' }),
  msg);
  clear(main, form);
  input.focus();
}

// signIn checks the token (whoami, then the gateway WebSocket) and opens
// the console.
async function signIn(token) {
  session.token = token;
  let who = null;
  try {
    who = await api('GET', '/api/whoami');
  } catch (e) {
    if (e.status === 401) throw e;
    if (e.status !== 404 && e.status !== 426) throw e;
    // No admin API on this gateway: the WebSocket alone tells the role.
  }
  let gw = null;
  if (!who || !who.global) {
    gw = new Gateway(token, state.config.version);
    const hello = await gw.open();
    if (!who) {
      const scopes = (hello.auth && hello.auth.scopes) || [];
      who = { global: false, role: scopes.includes('operator.admin') ? 'admin' : scopes.includes('operator.write') ? 'operator' : 'viewer', tenant: '' };
    }
    gw.addEventListener('event', onGatewayEvent);
    gw.addEventListener('status', onGatewayStatus);
  }
  state.who = who;
  state.gw = gw;
  state.tenant = who.tenant || '';
  if (who.global) {
    try {
      state.tenants = (await api('GET', '/api/tenants')).tenants || [];
      if (!state.tenant && state.tenants.length) state.tenant = state.tenants[0].id;
    } catch (e) {
      showBanner('Cannot list tenants: ' + errorText(e));
    }
  }
  renderWho();
  if (gw) refreshNodes();
  if (!location.hash || location.hash === '#/' || location.hash === '#') location.hash = who.global ? '#/admin' : '#/nodes';
  else route();
}

// tenantPicker lets a global admin choose the tenant a page acts on.
export function tenantPicker(onChange) {
  if (!state.who.global) return null;
  const sel = h('select', { name: 'tenant', 'aria-label': 'tenant', onchange: () => { state.tenant = sel.value; onChange(); } },
    state.tenants.map(t => h('option', { value: t.id, text: t.id + (t.displayName ? ' — ' + t.displayName : '') })));
  sel.value = state.tenant;
  return field('Tenant', sel);
}

function route() {
  if (!state.who) { signInPage(); return; }
  state.listeners.clear();
  renderNav();
  const [path, query] = location.hash.replace(/^#\/?/, '').split('?');
  const parts = path.split('/');
  const page = parts[0] || (state.who.global ? 'admin' : 'nodes');
  const ctx = { main, state, onState: fn => state.listeners.add(fn), query: new URLSearchParams(query || '') };
  window.scrollTo(0, 0);
  switch (page) {
    case 'nodes':
      if (parts[1]) nodePage(ctx, decodeURIComponent(parts.slice(1).join('/')));
      else nodesPage(ctx);
      break;
    case 'events': eventsPage(ctx); break;
    case 'audit': auditPage(ctx); break;
    case 'policy': policyPage(ctx); break;
    case 'admin': adminPage(ctx); break;
    default: clear(main, h('div', { class: 'card' }, h('h1', { text: 'Not found' }), h('p', {}, 'No page ', h('code', { text: location.hash }), '. ', h('a', { href: '#/nodes', text: 'Nodes' }))));
  }
}

async function start() {
  try {
    const res = await fetch('config.json', { cache: 'no-store' });
    if (res.ok) state.config = await res.json();
  } catch { /* the defaults do */ }
  document.getElementById('footer').textContent = 'xiaoclaw ' + (state.config.version || '') + (state.config.jaegerUrl ? ' · traces: ' + state.config.jaegerUrl : '');
  window.addEventListener('hashchange', route);
  setInterval(() => notify('tick'), 10000); // "last seen" ages
  if (session.token) {
    try {
      await signIn(session.token);
      return;
    } catch (e) {
      session.token = '';
      signInPage(e);
      return;
    }
  }
  signInPage();
}

start();
