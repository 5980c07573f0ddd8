// Browser test of the operator console: a real `xiaoclaw dev` stack, real
// simulated devices (`xiaoclaw sim`), headless Chromium driven by
// playwright-core. Run by `make test-ui`; screenshots and measurements go to
// .tmp/ui-screenshots/.
//
//   XIAOCLAW_BIN   the xiaoclaw binary (default ../../../../bin/xiaoclaw)
//   CHROMIUM       the browser (default /usr/bin/chromium)
//   SHOTS          screenshot directory (default ../../../../.tmp/ui-screenshots)

import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../../../..');
const bin = process.env.XIAOCLAW_BIN || join(root, 'bin/xiaoclaw');
const shots = process.env.SHOTS || join(root, '.tmp/ui-screenshots');
const browserPath = process.env.CHROMIUM || '/usr/bin/chromium';
const T = 20000; // how long any awaited condition may take

const children = [];
const temp = [];
let failures = 0;
let current = null; // the page, for a screenshot on failure
let browser = null; // the browser context, closed at the end

function log(...a) { console.log('[ui-test]', ...a); }

function fail(msg) {
  throw new Error(msg);
}

// start runs a child process and resolves once a line of its output matches.
function start(name, args, waitFor) {
  return new Promise((resolveStart, reject) => {
    const p = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(p);
    let out = '';
    const timer = setTimeout(() => reject(new Error(name + ' did not start in time; output:\n' + out)), 60000);
    const onData = d => {
      out += d.toString();
      const m = waitFor && out.match(waitFor);
      if (m) { clearTimeout(timer); resolveStart({ proc: p, match: m, output: () => out }); }
    };
    p.stdout.on('data', onData);
    p.stderr.on('data', d => { out += d.toString(); if (!waitFor) onData(d); });
    p.on('exit', code => { clearTimeout(timer); reject(new Error(name + ' exited with ' + code + ':\n' + out)); });
    if (!waitFor) { clearTimeout(timer); resolveStart({ proc: p, output: () => out }); }
  });
}

function stop(p) {
  if (p.exitCode === null) p.kill('SIGTERM');
}

async function main() {
  rmSync(shots, { recursive: true, force: true });
  mkdirSync(shots, { recursive: true });
  const dataDir = mkdtempSync(join(tmpdir(), 'xiaoclaw-ui-'));
  temp.push(dataDir);
  const tok = p => p + randomBytes(12).toString('hex');
  const operatorToken = tok('devop_');
  const adminToken = tok('devadmin_');
  const deviceToken = tok('devdev_');

  const dev = await start('xiaoclaw dev', ['dev', '--data-dir', dataDir, '--gateway-addr', '127.0.0.1:0', '--device-addr', '127.0.0.1:0',
    '--mqtt-addr', '', '--operator-token', operatorToken, '--admin-token', adminToken, '--device-token', deviceToken,
    '--jaeger-url', 'http://127.0.0.1:16686', '--log-level', 'warn'], /console\s+(http:\/\/\S+\/ui\/)/);
  const consoleURL = dev.match[1];
  const deviceURL = dev.output().match(/devices\s+(ws:\/\/\S+)/)[1];
  log('console at', consoleURL, 'devices at', deviceURL);

  const profile = mkdtempSync(join(tmpdir(), 'xiaoclaw-ui-chromium-'));
  temp.push(profile);
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: browserPath,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
    viewport: { width: 1280, height: 860 },
  });
  browser = context;
  const page = context.pages()[0] || await context.newPage();
  current = page;
  const problems = [];
  // The browser logs each non-2xx answer; the test provokes exactly two
  // (a bad token, a bad rule), which the page shows in words.
  const expected = [/status of 401/, /status of 400/];
  page.on('console', m => {
    if (m.type() !== 'error') return;
    const i = expected.findIndex(re => re.test(m.text()));
    if (i >= 0) expected.splice(i, 1); else problems.push('console error: ' + m.text());
  });
  page.on('pageerror', e => problems.push('page error: ' + e.message));
  // Every byte the page receives, to check another tenant's data never arrives.
  let received = [];
  page.on('websocket', ws => ws.on('framereceived', f => received.push(String(f.payload))));
  page.on('response', async r => {
    try { if (r.request().resourceType() !== 'document' && r.url().includes('/api/')) received.push(await r.text()); } catch { /* navigated away */ }
  });

  const shot = async name => {
    await page.screenshot({ path: join(shots, name + '.png'), fullPage: true });
    log('screenshot', name + '.png');
  };
  const text = sel => page.locator(sel).first().innerText({ timeout: T });
  const signIn = async token => {
    await page.fill('input[name=token]', token);
    await page.click('form.signin button[type=submit]');
  };
  const signOut = async () => {
    await page.click('#who button');
    await page.waitForSelector('form.signin', { timeout: T });
  };

  // --- Load: size and time to interactive on a fresh profile. ---
  const t0 = Date.now();
  await page.goto(consoleURL);
  await page.waitForSelector('form.signin input[name=token]', { timeout: T });
  const ttiMs = Date.now() - t0;
  const perf = await page.evaluate(() => {
    const nav = performance.getEntriesByType('navigation')[0];
    const res = performance.getEntriesByType('resource');
    return {
      transferBytes: nav.transferSize + res.reduce((s, r) => s + r.transferSize, 0),
      decodedBytes: nav.decodedBodySize + res.reduce((s, r) => s + r.decodedBodySize, 0),
      requests: 1 + res.length,
      domInteractiveMs: Math.round(nav.domInteractive),
      signInReadyMs: Math.round(performance.now()),
    };
  });
  perf.loadToSignInMs = ttiMs;
  // Again with the files cached (each revalidated: 304s).
  const t1 = Date.now();
  await page.reload();
  await page.waitForSelector('form.signin input[name=token]', { timeout: T });
  perf.reloadToSignInMs = Date.now() - t1;
  log('page load', JSON.stringify(perf));
  await shot('01-signin');

  // --- A bad token is refused in words. ---
  await signIn('not-a-token');
  const refusal = await text('form.signin .error');
  if (!/invalid, expired or revoked token/.test(refusal)) fail('bad token: ' + refusal);

  // --- Sign in as the dev tenant's admin operator; no devices yet. ---
  await signIn(operatorToken);
  await page.waitForSelector('text=No nodes in this tenant yet', { timeout: T });
  if (!(await text('#who')).includes('dev')) fail('who shows no tenant');

  // --- A simulated device appears live, without a reload. ---
  await start('xiaoclaw sim', ['sim', '--url', deviceURL, '--token', deviceToken, '--count', '2', '--stats', '0', '--log-level', 'warn']);
  await page.waitForSelector('table.nodes tbody tr', { timeout: T });
  await page.waitForFunction(() => document.querySelectorAll('table.nodes tbody tr').length === 2 &&
    [...document.querySelectorAll('table.nodes .pill')].every(p => p.textContent === 'connected'), null, { timeout: T });
  const nodeId = await page.locator('table.nodes tbody tr').first().getAttribute('data-node');
  log('node appeared', nodeId);
  await page.fill('input[type=search]', nodeId);
  await page.waitForFunction(() => document.querySelectorAll('table.nodes tbody tr').length === 1, null, { timeout: T });
  await page.fill('input[type=search]', '');
  await shot('02-nodes');

  // --- Live events show the devices connecting. ---
  await page.click('nav a[href="#/events"]');
  await page.waitForSelector('.event.kind-node-connected', { timeout: T });
  await shot('03-events');

  // --- The node page: a form generated from the tool's schema. ---
  await page.goto(consoleURL + '#/nodes/' + nodeId);
  const volume = page.locator('details[data-tool="self.audio_speaker.set_volume"]');
  await volume.locator('summary').click();
  if (await volume.locator('input[type=range]').count() !== 1) fail('set_volume has no slider');
  // Out of range: refused by the form, nothing is sent.
  await volume.locator('input[type=number]').fill('150');
  await volume.locator('button[type=submit]').click();
  const bound = await volume.locator('.result .error').innerText({ timeout: T });
  if (!/at most 100/.test(bound)) fail('out-of-range volume: ' + bound);
  await volume.locator('input[type=number]').fill('30');
  await volume.locator('button[type=submit]').click();
  await volume.locator('.result .ok').waitFor({ timeout: T });
  const traceId = await volume.locator('.result .traceid').innerText();
  if (!/^[0-9a-f]{32}$/.test(traceId)) fail('trace id: ' + traceId);
  const theme = page.locator('details[data-tool="self.get_device_status"]');
  await theme.locator('summary').click();
  await theme.locator('button[type=submit]').click();
  await theme.locator('.result pre.text').waitFor({ timeout: T });
  if (!(await theme.locator('.result pre.text').innerText()).includes('"volume":30')) fail('device status does not show volume 30');
  await shot('04-node');

  // --- The call is in the audit trail, with its trace. ---
  await page.click('nav a[href="#/audit"]');
  const row = page.locator(`tr[data-trace="${traceId}"]`);
  await row.waitFor({ timeout: T });
  if (!/self\.audio_speaker\.set_volume/.test(await row.innerText()) || !/allow/.test(await row.innerText())) fail('audit row: ' + await row.innerText());
  await row.click();
  const jaeger = await page.locator(`tr[data-trace="${traceId}"] + tr.detail a.jaeger`).getAttribute("href", { timeout: T });
  if (jaeger !== 'http://127.0.0.1:16686/trace/' + traceId) fail('jaeger link: ' + jaeger);
  await shot('05-audit');

  // --- Phone width. ---
  await page.setViewportSize({ width: 390, height: 844 });
  await page.click('nav a[href="#/nodes"]');
  await page.waitForSelector('table.nodes tbody tr', { timeout: T });
  await shot('06-phone-nodes');
  await page.goto(consoleURL + '#/nodes/' + nodeId);
  await page.locator('details[data-tool="self.audio_speaker.set_volume"] summary').click();
  await shot('07-phone-node');
  await page.goto(consoleURL + '#/audit');
  await page.waitForSelector('table.audit tbody tr', { timeout: T });
  await shot('08-phone-audit');
  await page.setViewportSize({ width: 1280, height: 860 });

  // --- Policy: add a deny rule, explain it. ---
  await page.click('nav a[href="#/policy"]');
  const add = page.locator('form', { has: page.locator('button:text("Add rule")') });
  await add.locator('select[name=effect]').selectOption('deny');
  await add.locator('input[name=object]').fill('xz-*');
  await add.locator('input[name=action]').fill('mcp.tools.call:self.audio_speaker.set_volume');
  await add.locator('input[name=when]').fill('volume>60');
  await add.locator('input[name=description]').fill('no loud speakers');
  await add.locator('button[type=submit]').click();
  const added = await page.locator('.ok:has-text("Added rule")').innerText({ timeout: T });
  const ruleId = added.match(/Added rule (\S+)\./)[1];
  await page.waitForSelector(`tr[data-rule="${ruleId}"]`, { timeout: T });
  // A rule the API refuses is shown in words.
  await add.locator('input[name=when]').fill('volume >>> 60');
  await add.locator('button[type=submit]').click();
  const badRule = await page.locator('section:has(h2:text("Add a rule")) .error').innerText({ timeout: T });
  if (!badRule.includes('invalid_argument')) fail('bad rule: ' + badRule);
  const explain = page.locator('form', { has: page.locator('button:text("Explain")') });
  await explain.locator('input[name=subject]').fill('*');
  await explain.locator('input[name=object]').fill(nodeId);
  await explain.locator('input[name=action]').fill('mcp.tools.call:self.audio_speaker.set_volume');
  await explain.locator('textarea[name=args]').fill('{"volume":80}');
  await explain.locator('button[type=submit]').click();
  const verdict = await page.locator('section:has(h2:text("Explain a decision")) [role=status]').innerText({ timeout: T });
  if (!verdict.includes('Denied') || !verdict.includes(ruleId)) fail('explain: ' + verdict);
  await shot('09-policy');

  // --- The next loud call is refused, naming the rule. ---
  await page.goto(consoleURL + '#/nodes/' + nodeId);
  const vol2 = page.locator('details[data-tool="self.audio_speaker.set_volume"]');
  await vol2.locator('summary').click();
  await vol2.locator('input[type=number]').fill('80');
  await vol2.locator('button[type=submit]').click();
  const denied = await vol2.locator('.result').innerText({ timeout: T });
  await vol2.locator('.result .error').waitFor({ timeout: T });
  const deniedText = await vol2.locator('.result').innerText();
  if (!deniedText.includes('denied by policy') || !deniedText.includes(ruleId)) fail('denied call: ' + deniedText + ' / ' + denied);
  await shot('10-denied');
  await page.click('nav a[href="#/audit"]');
  await page.selectOption('select[name=decision]', 'deny');
  await page.click('form.filters button[type=submit]');
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('table.audit tbody tr.clickable')];
    return rows.length > 0 && rows.every(r => r.innerText.includes('deny'));
  }, null, { timeout: T });

  // --- A viewer token of dev, made on the credentials page. ---
  await page.click('nav a[href="#/admin"]');
  const viewerForm = page.locator('form', { has: page.locator('button:text("Create token")') });
  await viewerForm.locator('input[name=name]').fill('wall screen');
  await viewerForm.locator('select[name=role]').selectOption('viewer');
  await viewerForm.locator('button[type=submit]').click();
  const viewerToken = (await page.locator('.secretbox code.secret').innerText({ timeout: T })).trim();

  // --- The global admin: a new tenant and its admin token, shown once. ---
  await signOut();
  await signIn(adminToken);
  await page.waitForSelector('tr[data-tenant="dev"]', { timeout: T });
  const create = page.locator('form', { has: page.locator('button:text("Create tenant")') });
  await create.locator('input[name=id]').fill('acme');
  await create.locator('input[name=displayName]').fill('Acme Robotics');
  await create.locator('button[type=submit]').click();
  await page.waitForSelector('tr[data-tenant="acme"]', { timeout: T });
  const tokenForm = page.locator('form', { has: page.locator('button:text("Create token")') });
  await tokenForm.locator('input[name=name]').fill('acme root');
  await tokenForm.locator('select[name=role]').selectOption('admin');
  await tokenForm.locator('button[type=submit]').click();
  const acmeToken = (await page.locator('.secretbox code.secret').innerText({ timeout: T })).trim();
  if (!acmeToken.startsWith('xco_')) fail('acme token: ' + acmeToken);
  await shot('11-tenants-tokens');

  // --- Another tenant sees none of dev's nodes, events, calls or rules. ---
  await signOut();
  received = [];
  await signIn(acmeToken);
  await page.waitForSelector('text=No nodes in this tenant yet', { timeout: T });
  await page.click('nav a[href="#/audit"]');
  await page.waitForSelector('table.audit tbody tr, p.empty', { timeout: T });
  await page.click('nav a[href="#/policy"]');
  await page.waitForSelector('text=No rules', { timeout: T });
  await page.click('nav a[href="#/events"]');
  await page.waitForSelector('.events', { timeout: T });
  await shot('12-other-tenant');
  const leaked = received.filter(b => b.includes(nodeId) || b.includes(ruleId) || b.includes('set_volume'));
  if (leaked.length) fail('another tenant received dev data: ' + leaked[0].slice(0, 300));
  const body = await page.locator('body').innerText();
  if (body.includes(nodeId)) fail('another tenant sees a dev node');

  // --- The role decides what the page offers: a viewer reads only. ---
  await signOut();
  await signIn(viewerToken);
  await page.waitForSelector('table.nodes tbody tr', { timeout: T });
  if (await page.locator('nav a[href="#/policy"], nav a[href="#/admin"]').count() !== 0) fail('a viewer is offered policy or credentials');
  await page.goto(consoleURL + '#/nodes/' + nodeId);
  const viewerCall = page.locator('details[data-tool="self.audio_speaker.set_volume"] button[type=submit]');
  await viewerCall.waitFor({ state: 'attached', timeout: T });
  if (!(await viewerCall.isDisabled())) fail('a viewer may call a tool');
  await shot('13-viewer');

  if (problems.length) fail('the page logged errors:\n' + problems.join('\n'));
  writeFileSync(join(shots, 'metrics.json'), JSON.stringify(perf, null, 2) + '\n');
  await context.close();
  log('PASS; screenshots in', shots);
}

try {
  await main();
} catch (e) {
  failures++;
  console.error('[ui-test] FAIL:', e.message);
  if (current) {
    try {
      await current.screenshot({ path: join(shots, 'failure.png'), fullPage: true });
      console.error('[ui-test] page at failure (failure.png):\n' + (await current.locator('main').innerText()).slice(0, 2000));
    } catch { /* the browser is gone */ }
  }
} finally {
  if (browser) await browser.close().catch(() => {});
  for (const p of children.reverse()) stop(p);
  await new Promise(r => setTimeout(r, 300));
  for (const d of temp) {
    try { rmSync(d, { recursive: true, force: true }); } catch (e) { console.error('[ui-test] cannot remove', d, e.message); }
  }
}
process.exit(failures ? 1 : 0);
