// Audit trail, policy (rules and explain) and credentials (tenants,
// operator tokens, device keys): the pages over the audit and admin APIs.

import { h, clear, api, errorBox, fmtTime, json, busy, field, formValues, jaegerLink } from './lib.js';
import { tenantPicker, isAdmin } from './app.js';

const seg = encodeURIComponent;

function needTenant(state, el) {
  if (state.tenant) return false;
  clear(el, h('p', { class: 'muted', text: 'No tenant to show: create one first.' }));
  return true;
}

// secretBox shows a new secret once, with a copy button.
function secretBox(label, secret) {
  const code = h('code', { class: 'secret', text: secret });
  const btn = h('button', { type: 'button', text: 'Copy', onclick: async () => {
    try { await navigator.clipboard.writeText(secret); btn.textContent = 'Copied'; } catch { btn.textContent = 'Select and copy by hand'; }
  } });
  return h('div', { class: 'secretbox', role: 'status' },
    h('strong', { text: label }), h('p', { class: 'warn', text: 'Shown this once: copy it now. The server keeps only its hash.' }),
    h('div', { class: 'row' }, code, btn));
}

// ---- Audit ----------------------------------------------------------------

const localInput = d => {
  const p = n => String(n).padStart(2, '0');
  return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + 'T' + p(d.getHours()) + ':' + p(d.getMinutes());
};

export function auditPage({ main, state, query: params }) {
  const results = h('div');
  const more = h('div');
  const sel = (name, opts) => h('select', { name }, opts.map(([v, t]) => h('option', { value: v, text: t })));
  const form = h('form', { class: 'filters', onsubmit: ev => { ev.preventDefault(); search(); } },
    field('Since', h('input', { type: 'datetime-local', name: 'since', value: localInput(new Date(Date.now() - 24 * 3600e3)) })),
    field('Until', h('input', { type: 'datetime-local', name: 'until' })),
    field('Principal', h('input', { name: 'principal', placeholder: 'token id, e.g. tok_…', autocomplete: 'off' })),
    field('Node', h('input', { name: 'node', placeholder: 'node id', autocomplete: 'off', value: params.get('node') || '' })),
    field('Tool', h('input', { name: 'tool', placeholder: 'tool name', autocomplete: 'off' })),
    field('Kind', sel('kind', [['', 'any'], ['node.invoke', 'node.invoke'], ['operator.connect', 'operator.connect'], ['operator.auth_failed', 'operator.auth_failed'],
      ['device.connect', 'device.connect'], ['device.disconnect', 'device.disconnect'], ['device.auth_failed', 'device.auth_failed'], ['tenancy.change', 'tenancy.change']])),
    field('Decision', sel('decision', [['', 'any'], ['allow', 'allow'], ['deny', 'deny']])),
    field('Outcome', sel('outcome', [['', 'any'], ['ok', 'ok'], ['denied', 'denied'], ['error', 'error'], ['timeout', 'timeout'], ['rejected', 'rejected']])),
    field('Page size', sel('limit', [['50', '50'], ['100', '100'], ['500', '500']])),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', text: 'Search' })));
  const picker = tenantPicker(() => search());
  clear(main, h('div', { class: 'pagehead' }, h('h1', { text: 'Audit trail' })),
    h('p', { class: 'muted', text: 'Every call, connection and change of your tenant, newest first. Open a row for its details.' }),
    picker, form, results, more);
  const highlight = params.get('trace') || '';
  let rows = [];

  // query reads the filters; call it before busy() disables the fields,
  // as FormData skips disabled fields.
  function query(cursor) {
    const v = formValues(form);
    const p = new URLSearchParams();
    if (state.who.global) p.set('tenant', state.tenant);
    for (const k of ['principal', 'node', 'tool', 'kind', 'decision', 'outcome', 'limit']) if (v[k]) p.set(k, v[k]);
    for (const k of ['since', 'until']) {
      if (!v[k]) continue;
      const d = new Date(v[k]);
      if (isNaN(d)) throw new Error(k + ' is not a valid time');
      p.set(k, d.toISOString());
    }
    if (cursor) p.set('cursor', cursor);
    return '/api/audit/events?' + p.toString();
  }

  async function search(cursor) {
    if (state.who.global && needTenant(state, results)) return;
    let path;
    try { path = query(cursor); } catch (e) { clear(results, errorBox(e)); return; }
    await busy(form, async () => {
      try {
        const page = await api('GET', path);
        rows = cursor ? rows.concat(page.events || []) : (page.events || []);
        render(page.nextCursor);
      } catch (e) {
        clear(results, errorBox(e));
        clear(more);
      }
    });
  }

  function render(next) {
    if (!rows.length) { clear(results, h('p', { class: 'muted empty', text: 'No audit events match.' })); clear(more); return; }
    clear(results, h('table', { class: 'grid audit' },
      h('thead', {}, h('tr', {}, ['Time', 'Kind', 'Principal', 'Node', 'Tool / command', 'Decision', 'Outcome', 'Latency'].map(t => h('th', { text: t })))),
      h('tbody', {}, rows.map(e => row(e)))));
    clear(more, next ? h('button', { type: 'button', text: 'Load older events', onclick: () => search(next) }) : h('p', { class: 'muted', text: rows.length + ' events; no more.' }));
  }

  function row(e) {
    const detail = h('tr', { class: 'detail', hidden: true }, h('td', { colspan: 8 },
      h('div', { class: 'row' }, e.traceId ? ['trace ', h('code', { text: e.traceId }), ' ', jaegerLink(state.config, e.traceId)] : null),
      e.ruleId ? h('p', {}, 'Rule ', h('code', { class: 'rule', text: e.ruleId }), e.detail ? ': ' + e.detail : '') : null,
      h('pre', { class: 'mono small', text: json(e) })));
    const tr = h('tr', { class: 'clickable' + (highlight && e.traceId === highlight ? ' highlight' : ''), tabindex: 0, 'data-trace': e.traceId || '',
      onclick: () => { detail.hidden = !detail.hidden; },
      onkeydown: ev => { if (ev.key === 'Enter') detail.hidden = !detail.hidden; } },
    h('td', { 'data-label': 'Time', text: fmtTime(e.time) }),
    h('td', { 'data-label': 'Kind', text: e.kind }),
    h('td', { 'data-label': 'Principal', text: e.principalName || e.principal || '', title: e.principal || '' }),
    h('td', { 'data-label': 'Node', class: 'mono', text: e.node || '' }),
    h('td', { 'data-label': 'Tool', text: e.tool || e.command || '' }),
    h('td', { 'data-label': 'Decision' }, e.decision ? h('span', { class: 'pill ' + (e.decision === 'allow' ? 'ok' : 'bad'), text: e.decision }) : ''),
    h('td', { 'data-label': 'Outcome', text: (e.outcome || '') + (e.errorCode ? ' (' + e.errorCode + ')' : '') }),
    h('td', { 'data-label': 'Latency', class: 'num', text: e.latencyUs ? (e.latencyUs / 1000).toFixed(1) + ' ms' : '' }));
    if (highlight && e.traceId === highlight) detail.hidden = false;
    return [tr, detail];
  }
  search();
}

// ---- Policy ---------------------------------------------------------------

export function policyPage({ main, state }) {
  if (!isAdmin()) { clear(main, h('p', { class: 'muted', text: 'Policy needs an admin token.' })); return; }
  const rulesEl = h('div');
  const addOut = h('div');
  const explainOut = h('div');
  const actions = [...new Set([...state.nodes.values()].flatMap(n => (n.tools || []).map(t => 'mcp.tools.call:' + t.name)))].sort();
  const nodeIds = [...state.nodes.keys()].sort();
  const lists = h('div', {},
    h('datalist', { id: 'dl-actions' }, actions.map(a => h('option', { value: a }))),
    h('datalist', { id: 'dl-nodes' }, nodeIds.map(a => h('option', { value: a }))));

  const addForm = h('form', { class: 'filters', onsubmit: async ev => {
    ev.preventDefault();
    const v = formValues(addForm);
    const body = { effect: v.effect, subject: v.subject, object: v.object, action: v.action };
    if (v.when) body.when = v.when;
    if (v.description) body.description = v.description;
    await busy(addForm, async () => {
      try {
        const r = await api('POST', '/api/tenants/' + seg(state.tenant) + '/policy/rules', body);
        clear(addOut, h('p', { class: 'ok', role: 'status' }, 'Added rule ', h('code', { text: r.id }), '.'));
        loadRules();
      } catch (e) { clear(addOut, errorBox(e)); }
    });
  } },
  field('Effect', h('select', { name: 'effect' }, h('option', { value: 'deny', text: 'deny' }), h('option', { value: 'allow', text: 'allow' }))),
  field('Subject', h('input', { name: 'subject', value: '*', required: true }), '* · role:operator · a token id'),
  field('Object', h('input', { name: 'object', value: '*', required: true, list: 'dl-nodes' }), 'node id or glob, e.g. xz-*'),
  field('Action', h('input', { name: 'action', required: true, list: 'dl-actions', placeholder: 'mcp.tools.call:<tool>' }), 'a command, or mcp.tools.call:<tool>'),
  field('When', h('input', { name: 'when', placeholder: 'volume>60' }), 'optional predicate over the arguments'),
  field('Description', h('input', { name: 'description' })),
  h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', text: 'Add rule' })));

  const explainForm = h('form', { class: 'filters', onsubmit: async ev => {
    ev.preventDefault();
    const v = formValues(explainForm);
    const body = { subject: v.subject, object: v.object, action: v.action };
    if (v.args) {
      try { body.args = JSON.parse(v.args); } catch (e) { clear(explainOut, errorBox(new Error('arguments are not valid JSON: ' + e.message))); return; }
    }
    await busy(explainForm, async () => {
      try {
        const r = await api('POST', '/api/tenants/' + seg(state.tenant) + '/policy/explain', body);
        clear(explainOut, h('div', { class: r.allowed ? 'ok' : 'error', role: 'status' },
          h('strong', { text: r.allowed ? 'Allowed' : 'Denied' }),
          r.ruleId ? [' by rule ', h('code', { class: 'rule', text: r.ruleId })] : (r.default ? ' by the tenant\'s default' : ''),
          r.reason ? ': ' + r.reason : ''),
        (r.matched || []).length ? h('table', { class: 'grid' }, h('thead', {}, h('tr', {}, ['Matching rule', 'Effect', 'When', 'Applies'].map(t => h('th', { text: t })))),
          h('tbody', {}, r.matched.map(m => h('tr', {}, h('td', { class: 'mono', text: m.id }), h('td', { text: m.effect }), h('td', { class: 'mono', text: m.when || '' }), h('td', { text: m.applies ? 'yes' : 'no (predicate false)' }))))) : h('p', { class: 'muted', text: 'No rule matches.' }));
      } catch (e) { clear(explainOut, errorBox(e)); }
    });
  } },
  field('Subject', h('input', { name: 'subject', value: 'role:operator', required: true }), 'a token id, a role (role:operator) or *'),
  field('Node', h('input', { name: 'object', required: true, list: 'dl-nodes', value: nodeIds[0] || '' })),
  field('Action', h('input', { name: 'action', required: true, list: 'dl-actions', value: actions[0] || '' })),
  field('Arguments (JSON)', h('textarea', { name: 'args', rows: 2, class: 'mono', placeholder: '{"volume":80}' })),
  h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', text: 'Explain' })));

  clear(main, lists, h('div', { class: 'pagehead' }, h('h1', { text: 'Policy' })),
    tenantPicker(() => policyPage({ main, state })),
    h('section', { class: 'card' }, h('h2', { text: 'Rules' }), h('p', { class: 'muted', text: 'A deny rule that applies wins over any allow; with no rule the tenant\'s default decides.' }), rulesEl),
    h('section', { class: 'card' }, h('h2', { text: 'Add a rule' }), addForm, addOut),
    h('section', { class: 'card' }, h('h2', { text: 'Explain a decision' }),
      h('p', { class: 'muted', text: 'May this principal call this on this node with these arguments, and which rule decides?' }), explainForm, explainOut));

  async function loadRules() {
    if (needTenant(state, rulesEl)) return;
    try {
      const r = await api('GET', '/api/tenants/' + seg(state.tenant) + '/policy/rules');
      const rules = r.rules || [];
      clear(rulesEl, rules.length ? h('table', { class: 'grid rules' },
        h('thead', {}, h('tr', {}, ['Rule', 'Effect', 'Subject', 'Object', 'Action', 'When', 'Description', ''].map(t => h('th', { text: t })))),
        h('tbody', {}, rules.map(rule => {
          const out = h('span');
          return h('tr', { 'data-rule': rule.id },
            h('td', { 'data-label': 'Rule', class: 'mono', text: rule.id }),
            h('td', { 'data-label': 'Effect' }, h('span', { class: 'pill ' + (rule.effect === 'allow' ? 'ok' : 'bad'), text: rule.effect })),
            h('td', { 'data-label': 'Subject', class: 'mono', text: rule.subject }),
            h('td', { 'data-label': 'Object', class: 'mono', text: rule.object }),
            h('td', { 'data-label': 'Action', class: 'mono', text: rule.action }),
            h('td', { 'data-label': 'When', class: 'mono', text: rule.when || '' }),
            h('td', { 'data-label': 'Description', text: rule.description || '' }),
            h('td', {}, h('button', { type: 'button', class: 'danger', text: 'Remove', onclick: async ev => {
              if (!confirm('Remove rule ' + rule.id + '?')) return;
              ev.target.disabled = true;
              try {
                await api('DELETE', '/api/tenants/' + seg(state.tenant) + '/policy/rules/' + seg(rule.id));
                loadRules();
              } catch (e) { ev.target.disabled = false; clear(out, errorBox(e)); }
            } }), out));
        }))) : h('p', { class: 'muted', text: 'No rules: the tenant\'s default decides every call.' }));
    } catch (e) { clear(rulesEl, errorBox(e)); }
  }
  loadRules();
}

// ---- Tenants and credentials ---------------------------------------------

export function adminPage({ main, state }) {
  if (!isAdmin()) { clear(main, h('p', { class: 'muted', text: 'Credentials need an admin token.' })); return; }
  const tenantsEl = h('div');
  const tokensEl = h('div');
  const keysEl = h('div');
  const rerender = () => adminPage({ main, state });

  clear(main, h('div', { class: 'pagehead' }, h('h1', { text: state.who.global ? 'Tenants & credentials' : 'Credentials' })),
    h('section', { class: 'card' }, h('h2', { text: state.who.global ? 'Tenants' : 'Tenant' }), tenantsEl),
    tenantPicker(rerender),
    h('section', { class: 'card' }, h('h2', { text: 'Operator tokens' }), tokensEl),
    h('section', { class: 'card' }, h('h2', { text: 'Device keys' }), h('p', { class: 'muted', text: 'HMAC keys that sign the credentials devices get from OTA.' }), keysEl));

  async function loadTenants() {
    try {
      const list = (await api('GET', '/api/tenants')).tenants || [];
      if (state.who.global) state.tenants = list;
      const out = h('div');
      const table = h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['Tenant', 'Name', 'Status', 'Default', 'Created', ''].map(t => h('th', { text: t })))),
        h('tbody', {}, list.map(t => h('tr', { 'data-tenant': t.id },
          h('td', { 'data-label': 'Tenant', class: 'mono', text: t.id }),
          h('td', { 'data-label': 'Name', text: t.displayName || '' }),
          h('td', { 'data-label': 'Status' }, h('span', { class: 'pill ' + (t.status === 'active' ? 'ok' : 'bad'), text: t.status })),
          h('td', { 'data-label': 'Default', text: t.defaultEffect }),
          h('td', { 'data-label': 'Created', text: fmtTime(t.createdAt) }),
          h('td', {}, state.who.global ? h('button', { type: 'button', text: t.status === 'active' ? 'Suspend' : 'Resume', class: t.status === 'active' ? 'danger' : '',
            onclick: async () => {
              if (t.status === 'active' && !confirm('Suspend tenant ' + t.id + '? Its operators and devices are cut off.')) return;
              try { await api('POST', '/api/tenants/' + seg(t.id) + (t.status === 'active' ? '/suspend' : '/resume')); loadTenants(); } catch (e) { clear(out, errorBox(e)); }
            } }) : null)))));
      let create = null;
      if (state.who.global) {
        const res = h('div');
        create = h('form', { class: 'filters', onsubmit: async ev => {
          ev.preventDefault();
          const v = formValues(create);
          const body = { id: v.id };
          if (v.displayName) body.displayName = v.displayName;
          if (v.defaultEffect) body.defaultEffect = v.defaultEffect;
          await busy(create, async () => {
            try {
              const t = await api('POST', '/api/tenants', body);
              state.tenant = t.id;
              state.tenants = [...state.tenants, t];
              rerender();
            } catch (e) { clear(res, errorBox(e)); }
          });
        } },
        field('New tenant id', h('input', { name: 'id', required: true, pattern: '[a-z0-9][a-z0-9\\-]{0,62}', maxlength: 63, placeholder: 'acme', autocomplete: 'off' }), 'lower-case letters, digits and dashes'),
        field('Display name', h('input', { name: 'displayName' })),
        field('Default effect', h('select', { name: 'defaultEffect' }, h('option', { value: 'allow', text: 'allow' }), h('option', { value: 'deny', text: 'deny' }))),
        h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', text: 'Create tenant' })), res);
      }
      clear(tenantsEl, table, out, create);
    } catch (e) { clear(tenantsEl, errorBox(e)); }
  }

  async function loadTokens(fresh) {
    if (needTenant(state, tokensEl)) return;
    const base = '/api/tenants/' + seg(state.tenant);
    try {
      const list = (await api('GET', base + '/tokens')).tokens || [];
      const out = h('div');
      const now = Date.now();
      const res = h('div');
      const form = h('form', { class: 'filters', onsubmit: async ev => {
        ev.preventDefault();
        const v = formValues(form);
        const body = { role: v.role };
        if (v.name) body.name = v.name;
        if (v.expiresIn) body.expiresIn = v.expiresIn;
        await busy(form, async () => {
          try {
            const r = await api('POST', base + '/tokens', body);
            loadTokens(secretBox('New ' + r.token.role + ' token ' + r.token.id + ' for ' + state.tenant, r.secret));
          } catch (e) { clear(res, errorBox(e)); }
        });
      } },
      field('Name', h('input', { name: 'name', placeholder: 'ci, wall screen…' })),
      field('Role', h('select', { name: 'role' }, ['operator', 'viewer', 'admin'].map(r => h('option', { value: r, text: r })))),
      field('Expires in', h('input', { name: 'expiresIn', placeholder: '720h', pattern: '([0-9]+(\\.[0-9]+)?(h|m|s|ms))+' }), 'a duration such as 720h; empty: 90 days'),
      h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', text: 'Create token' })), res);
      clear(tokensEl, fresh || null, list.length ? h('table', { class: 'grid tokens' },
        h('thead', {}, h('tr', {}, ['Token', 'Name', 'Role', 'Created', 'Expires', 'State', ''].map(t => h('th', { text: t })))),
        h('tbody', {}, list.map(t => {
          const revoked = !!t.revokedAt;
          const expired = t.expiresAt && Date.parse(t.expiresAt) <= now;
          return h('tr', { 'data-token': t.id },
            h('td', { 'data-label': 'Token', class: 'mono', text: t.id }),
            h('td', { 'data-label': 'Name', text: t.name || '' }),
            h('td', { 'data-label': 'Role', text: t.role }),
            h('td', { 'data-label': 'Created', text: fmtTime(t.createdAt) }),
            h('td', { 'data-label': 'Expires', text: t.expiresAt ? fmtTime(t.expiresAt) : 'never' }),
            h('td', { 'data-label': 'State' }, h('span', { class: 'pill ' + (revoked || expired ? 'off' : 'ok'), text: revoked ? 'revoked' : expired ? 'expired' : 'active' })),
            h('td', {}, revoked ? null : h('button', { type: 'button', class: 'danger', text: 'Revoke', onclick: async () => {
              if (!confirm('Revoke token ' + t.id + (t.name ? ' (' + t.name + ')' : '') + '? Its sessions are closed.')) return;
              try { await api('POST', '/api/tokens/' + seg(t.id) + '/revoke'); loadTokens(); } catch (e) { clear(out, errorBox(e)); }
            } })));
        }))) : h('p', { class: 'muted', text: 'No tokens stored for this tenant (static tokens from the command line are not listed).' }), out, form);
    } catch (e) { clear(tokensEl, errorBox(e)); }
  }

  async function loadKeys(fresh) {
    if (needTenant(state, keysEl)) return;
    const base = '/api/tenants/' + seg(state.tenant) + '/device-keys';
    try {
      const list = (await api('GET', base)).keys || [];
      const res = h('div');
      const overlap = h('input', { name: 'overlap', placeholder: '24h', size: 6 });
      const make = (label, path, body) => h('button', { type: 'button', text: label, onclick: async ev => {
        ev.target.disabled = true;
        try {
          const r = await api('POST', path, body());
          loadKeys(secretBox('New device key ' + r.key.id, r.secret));
        } catch (e) { ev.target.disabled = false; clear(res, errorBox(e)); }
      } });
      clear(keysEl, fresh || null, list.length ? h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['Key', 'Created', 'Retires'].map(t => h('th', { text: t })))),
        h('tbody', {}, list.map(k => h('tr', {},
          h('td', { 'data-label': 'Key', class: 'mono', text: k.id }),
          h('td', { 'data-label': 'Created', text: fmtTime(k.createdAt) }),
          h('td', { 'data-label': 'Retires', text: k.retireAt ? fmtTime(k.retireAt) : 'never' }))))) : h('p', { class: 'muted', text: 'No device keys yet.' }),
      h('div', { class: 'toolbar' }, make('Create key', base, () => undefined),
        make('Rotate keys', base + '/rotate', () => (overlap.value.trim() ? { overlap: overlap.value.trim() } : undefined)),
        h('label', { class: 'inline' }, 'old keys verify for ', overlap)), res);
    } catch (e) { clear(keysEl, errorBox(e)); }
  }

  loadTenants();
  loadTokens();
  loadKeys();
}
