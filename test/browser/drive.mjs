// Drives headless Chromium (the system's, through puppeteer-core, which
// downloads no browser) over the pages browser_test.go serves:
//   node drive.mjs <chromium> <visits.json>
// visits.json: [{"name","url","click","waitMs"}]. For each visit, in one
// browser but a context of its own: open the page, wait for the SDK, click #buy (and wait for the
// SDK's autocaptured click), call relayE2E.finish(), and wait until every
// request to a 127.0.0.1 port has finished. Prints one JSON object:
// {"visits":{name:{sent,results,requests,error}},"outside":[urls]}, where
// requests lists "METHOD URL STATUS|failed:reason" of the visit and
// outside every request to any other host (there must be none).
import fs from 'node:fs';
import puppeteer from 'puppeteer-core';

const [chromium, visitsFile] = process.argv.slice(2);
const visits = JSON.parse(fs.readFileSync(visitsFile, 'utf8'));

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: [
    '--no-sandbox', // CI runs as root
    '--disable-dev-shm-usage',
    // Nothing leaves the machine: names do not resolve, and any other
    // address goes to a closed proxy port (loopback bypasses proxies).
    '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
    '--proxy-server=127.0.0.1:9',
  ],
});
const out = { visits: {}, outside: [] };
try {
  for (const v of visits) {
    // Each visit in its own context: no cookie or storage of another.
    const context = await browser.createBrowserContext();
    const page = await context.newPage();
    const requests = [];
    const pending = new Set();
    const isLocal = (u) => u.startsWith('http://127.0.0.1:');
    page.on('request', (r) => {
      if (!isLocal(r.url())) {
        if (!r.url().startsWith('data:')) out.outside.push(r.url());
        return;
      }
      pending.add(r);
    });
    page.on('requestfinished', (r) => {
      if (!pending.delete(r)) return;
      requests.push(`${r.method()} ${r.url()} ${r.response() ? r.response().status() : 0}`);
    });
    page.on('requestfailed', (r) => {
      if (!pending.delete(r)) return;
      requests.push(`${r.method()} ${r.url()} failed:${r.failure() ? r.failure().errorText : '?'}`);
    });
    const res = { requests };
    try {
      await page.goto(v.url, { waitUntil: 'load', timeout: 15000 });
      await page.evaluate(() => window.relayE2E.ready);
      if (v.click) {
        await page.click('#buy');
        // The SDK's own click capture is asynchronous: wait for it.
        await page.waitForFunction(
          () => window.relayE2E.types().includes('[Amplitude] Element Clicked'),
          { timeout: 10000 });
      }
      Object.assign(res, await page.evaluate((ms) => window.relayE2E.finish(ms), v.waitMs || 3000));
      // Beacons and retries finish after finish() returns.
      const deadline = Date.now() + 10000;
      while (pending.size > 0 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 50));
      }
      if (pending.size > 0) res.error = `${pending.size} requests still pending`;
    } catch (e) {
      res.error = String(e && e.stack || e);
    }
    out.visits[v.name] = res;
    await context.close();
  }
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + '\n');
