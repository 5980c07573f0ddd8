// The operator WebSocket: the OpenClaw gateway protocol as a browser
// speaks it. Wait for connect.challenge, send connect with the token, then
// requests (node.list, node.describe, node.invoke) and node.event events.

import { randomHex, uuid } from './lib.js';

const requestTimeoutMs = 40000;

// GatewayError carries an error frame of the gateway: {code, message, details}.
export class GatewayError extends Error {
  constructor(err) {
    super((err && err.message) || 'gateway error');
    this.gatewayError = err || {};
  }
}

export class Gateway extends EventTarget {
  constructor(token, version) {
    super();
    this.token = token;
    this.version = version || 'dev';
    this.pending = new Map();
    this.status = 'offline';
    this.closed = false;
    this.backoff = 1000;
    this.hello = null;
  }

  url() {
    return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/';
  }

  setStatus(s, detail) {
    this.status = s;
    this.dispatchEvent(new CustomEvent('status', { detail: { status: s, detail } }));
  }

  // open connects and resolves with hello-ok; it rejects with the gateway's
  // refusal (bad token) and then does not reconnect.
  open() {
    return new Promise((resolve, reject) => {
      let settled = false;
      const done = (err, hello) => {
        if (settled) return;
        settled = true;
        if (err) reject(err); else resolve(hello);
      };
      this.setStatus('connecting');
      const ws = new WebSocket(this.url());
      this.ws = ws;
      ws.onmessage = ev => {
        let f;
        try { f = JSON.parse(ev.data); } catch { return; }
        if (f.type === 'event' && f.event === 'connect.challenge') {
          const id = uuid();
          this.pending.set(id, {
            resolve: hello => {
              this.hello = hello;
              this.backoff = 1000;
              this.setStatus('online');
              done(null, hello);
            },
            reject: err => {
              this.closed = true; // a refused token does not get better by retrying
              this.setStatus('refused', err.message);
              done(err);
            },
          });
          this.sendFrame({
            type: 'req', id, method: 'connect', params: {
              minProtocol: 3, maxProtocol: 4,
              client: { id: 'openclaw-control-ui', displayName: 'xiaoclaw console', version: this.version, platform: 'web', mode: 'ui', instanceId: uuid() },
              role: 'operator', scopes: ['operator.read', 'operator.write', 'operator.admin'],
              auth: { token: this.token }, userAgent: navigator.userAgent, locale: navigator.language,
            },
          });
          return;
        }
        if (f.type === 'res') {
          const p = this.pending.get(f.id);
          if (!p) return;
          this.pending.delete(f.id);
          clearTimeout(p.timer);
          if (f.ok) p.resolve(f.payload); else p.reject(new GatewayError(f.error));
          return;
        }
        if (f.type === 'event') {
          this.dispatchEvent(new CustomEvent('event', { detail: f }));
        }
      };
      ws.onclose = ev => {
        for (const p of this.pending.values()) {
          clearTimeout(p.timer);
          p.reject(new GatewayError({ code: 'UNAVAILABLE', message: 'the gateway connection closed' + (ev.reason ? ': ' + ev.reason : '') }));
        }
        this.pending.clear();
        if (!settled) {
          done(new GatewayError({ code: 'UNAVAILABLE', message: 'the gateway closed the connection' + (ev.reason ? ': ' + ev.reason : ' (code ' + ev.code + ')') }));
        }
        if (this.closed) return;
        this.setStatus('offline', ev.reason);
        const wait = this.backoff;
        this.backoff = Math.min(this.backoff * 2, 15000);
        this.retry = setTimeout(() => { this.open().catch(() => {}); }, wait);
      };
    });
  }

  sendFrame(f) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(f));
  }

  // request sends a request and resolves with its payload; extra fields
  // (traceparent) go on the frame.
  request(method, params, extra = {}) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN || this.status !== 'online') {
      return Promise.reject(new GatewayError({ code: 'UNAVAILABLE', message: 'not connected to the gateway; retrying' }));
    }
    const id = uuid();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new GatewayError({ code: 'TIMEOUT', message: method + ': no answer from the gateway in ' + requestTimeoutMs / 1000 + ' s' }));
      }, requestTimeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.sendFrame({ type: 'req', id, method, params, ...extra });
    });
  }

  close() {
    this.closed = true;
    clearTimeout(this.retry);
    if (this.ws) this.ws.close(1000, 'signed out');
  }
}

// newTraceparent starts a W3C trace context for one call, so the page knows
// the trace id the gateway and the audit row will carry.
export function newTraceparent() {
  const traceId = randomHex(16);
  return { traceId, traceparent: '00-' + traceId + '-' + randomHex(8) + '-01' };
}
