// Small helpers shared by every page: DOM building, the HTTP API client,
// formatting.

// h builds an element: attrs may hold class, text, on<event> handlers and
// properties (value, checked, disabled, hidden); children are nodes,
// strings, or arrays of them; null and false are skipped.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k in el && typeof v !== 'string') el[k] = v;
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// ApiError is an answer of the admin or audit API that is not a success.
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const tokenKey = 'xiaoclaw.console.token';
export const session = {
  get token() { return sessionStorage.getItem(tokenKey) || ''; },
  set token(v) { if (v) sessionStorage.setItem(tokenKey, v); else sessionStorage.removeItem(tokenKey); },
};

// api calls the gateway's HTTP API with the session's bearer token and
// returns the decoded answer; a failure throws an ApiError whose message is
// the server's, in words.
export async function api(method, path, body) {
  const opts = { method, headers: { Authorization: 'Bearer ' + session.token }, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, opts);
  } catch (e) {
    throw new ApiError(0, 'unreachable', 'the gateway cannot be reached (' + e.message + ')');
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!res.ok) {
    if (data && data.error && data.error.message) throw new ApiError(res.status, data.error.code || '', data.error.message);
    if (res.status === 404 || res.status === 426) throw new ApiError(res.status, 'not_found', 'this gateway does not serve ' + path.split('?')[0] + ' (it runs without a database, so without the admin and audit APIs)');
    throw new ApiError(res.status, 'http_' + res.status, (text || res.statusText || 'request failed').trim().slice(0, 300));
  }
  return data;
}

// errorText turns any error into one sentence for the page.
export function errorText(e) {
  if (!e) return 'unknown error';
  if (e instanceof ApiError) return e.message + (e.code ? ' (' + e.code + (e.status ? ', HTTP ' + e.status : '') + ')' : '');
  if (e.gatewayError) {
    const g = e.gatewayError;
    let s = g.message || g.code || 'gateway error';
    if (g.code && !s.includes(g.code)) s += ' (' + g.code + ')';
    return s;
  }
  return e.message || String(e);
}

export function errorBox(e) {
  return h('div', { class: 'error', role: 'alert', text: errorText(e) });
}

export function fmtTime(v) {
  if (!v) return '';
  const d = typeof v === 'number' ? new Date(v) : new Date(v);
  if (isNaN(d)) return String(v);
  return d.toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' });
}

export function ago(ms) {
  if (!ms) return '';
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 5) return 'just now';
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return Math.round(s / 86400) + ' d ago';
}

export function json(v) {
  return JSON.stringify(v, null, 2);
}

export function randomHex(bytes) {
  const b = crypto.getRandomValues(new Uint8Array(bytes));
  return Array.from(b, x => x.toString(16).padStart(2, '0')).join('');
}

export function uuid() {
  return crypto.randomUUID ? crypto.randomUUID() : randomHex(16);
}

// form reads a form's named fields into an object of trimmed strings.
export function formValues(form) {
  const out = {};
  for (const [k, v] of new FormData(form)) out[k] = typeof v === 'string' ? v.trim() : v;
  return out;
}

// busy disables a form's controls while fn runs.
export async function busy(form, fn) {
  const controls = form.querySelectorAll('button, input, select, textarea');
  const was = Array.from(controls, c => c.disabled);
  controls.forEach(c => { c.disabled = true; });
  try {
    return await fn();
  } finally {
    controls.forEach((c, i) => { c.disabled = was[i]; });
  }
}

export function field(label, control, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'label', text: label }), control,
    hint ? h('small', { class: 'hint', text: hint }) : null);
}

export function jaegerLink(config, traceId) {
  if (!traceId || !config.jaegerUrl) return null;
  return h('a', { href: config.jaegerUrl + '/trace/' + encodeURIComponent(traceId), target: '_blank', rel: 'noopener noreferrer', class: 'jaeger', text: 'open trace in Jaeger' });
}
