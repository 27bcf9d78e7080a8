// Drives the official Node.js SDK (@amplitude/analytics-node, pinned in
// package.json) against a relay: node send.mjs <serverUrl> [batch|invalid]
//
// It tracks a plain event, an identify and a revenue event (user_id,
// device_id, event properties) and two more, flushes, and prints one JSON
// object on stdout: {"results":[{"code","message","event"}...]}, where event
// is the event exactly as the SDK sent it (with the insert_id and time it
// filled in), in the order tracked. sdk_test.go checks those events against
// what the simulated upstream ingested.
//
// batch: useBatch (the URL given should then end in /batch).
// invalid: a sixth event, second of the upload, has an all-zero device_id,
// which the upstream refuses (400, events_with_invalid_fields); the SDK then
// drops it and resends the other five after flushIntervalMillis.
import { createInstance, Identify, Revenue } from '@amplitude/analytics-node';

const [serverUrl, mode] = process.argv.slice(2);
if (!serverUrl) {
  console.error('usage: node send.mjs <serverUrl> [batch]');
  process.exit(2);
}
const useBatch = mode === 'batch';
const invalid = mode === 'invalid';
const apiKey = process.env.SDK_API_KEY || 'sdk-e2e-api-key';
const tag = mode || 'httpapi';

const client = createInstance();
await client.init(apiKey, {
  serverUrl,
  useBatch,
  // One explicit flush sends everything in one request; in the invalid
  // mode the timer sends, and resends after the 400.
  flushIntervalMillis: invalid ? 200 : 60000,
  flushQueueSize: 1000,
  // The Go test counts the relay's requests: an SDK retry would show.
  flushMaxRetries: 3,
  logLevel: 0, // None: stdout carries the JSON only
}).promise;

const user = `sdk-user-${tag}`;
const device = `sdk-device-${tag}-0001`;
const pending = [];

pending.push(client.track('sdk_button_clicked', {
  button: 'buy',
  count: 3,
  ratio: 0.25,
  nested: { list: [1, 'two', true], flag: false },
  unicode: 'zürich ✓',
}, { user_id: user, device_id: device, platform: 'node-e2e', app_version: '1.2.3' }).promise);

if (invalid) {
  pending.push(client.track('sdk_bad_device', { why: 'all-zero device_id' }, { device_id: '00000000-0000' }).promise);
}

const id = new Identify().set('plan', 'pro').add('logins', 1).setOnce('first_seen', '2026-01-01');
pending.push(client.identify(id, { user_id: user, device_id: device }).promise);

const rev = new Revenue().setProductId('sku-42').setPrice(9.99).setQuantity(2)
  .setRevenueType('purchase').setEventProperties({ coupon: 'E2E' });
pending.push(client.revenue(rev, { user_id: user, device_id: device }).promise);

// A second device and a user-only event.
pending.push(client.track('sdk_page_viewed', { page: '/home' }, { device_id: `sdk-device-${tag}-0002` }).promise);
pending.push(client.track('sdk_user_only', { k: 'v' }, { user_id: `${user}-only` }).promise);

// An explicit flush() sends without the SDK's retry handling (every event
// gets the answer as is); the timer's flush handles answers, so the invalid
// mode waits for it.
if (!invalid) {
  await client.flush().promise;
}
const results = await Promise.all(pending);
process.stdout.write(JSON.stringify({ results: results.map((r) => ({ code: r.code, message: r.message, event: r.event })) }) + '\n');
process.exit(0);
