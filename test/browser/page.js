// The page's use of the official browser SDK, as a team would put it under
// its own domain: serverUrl points at the relay. The query string names the
// relay (?relay=http://127.0.0.1:PORT), the api_key, the transport (fetch,
// the default, or beacon), gzip=1 for the SDK's request compression, and a
// tag that makes this visit's ids unique.
//
// window.relayE2E.ready resolves once the SDK is initialised; clicking
// #buy tracks "Buy Clicked"; window.relayE2E.finish() flushes and returns
// {sent, results, gzipUploads}: every event the SDK uploaded to the relay,
// as it went on the wire (fetch and navigator.sendBeacon are wrapped to
// record it), the SDK's verdict on each event tracked here explicitly, and
// the number of gzip uploads.
(function () {
  const q = new URLSearchParams(window.location.search);
  const relay = q.get('relay');
  const apiKey = q.get('key');
  const transport = q.get('transport') || 'fetch';
  const tag = q.get('tag') || 'visit';
  const gzip = q.get('gzip') === '1';
  const sent = [];
  const seen = [];
  const tracked = [];

  // Every upload to the relay, recorded off the wire: the events exactly as
  // the SDK sent them (a gzip body, under ?gzip=1, is inflated to read it).
  const inflating = [];
  let gzipUploads = 0;
  const record = (url, body) => {
    if (!String(url).startsWith(relay)) return;
    if (typeof body === 'string') {
      sent.push(...JSON.parse(body).events);
      return;
    }
    gzipUploads++;
    const s = new Blob([body]).stream().pipeThrough(new DecompressionStream('gzip'));
    inflating.push(new Response(s).text().then((t) => sent.push(...JSON.parse(t).events)));
  };
  const fetch0 = window.fetch.bind(window);
  window.fetch = (url, opts) => {
    record(url, opts && opts.body);
    return fetch0(url, opts);
  };
  const beacon0 = navigator.sendBeacon.bind(navigator);
  navigator.sendBeacon = (url, data) => {
    record(url, data);
    return beacon0(url, data);
  };

  const amp = window.amplitude.createInstance();
  // Event types as the SDK makes them (to wait for autocapture).
  amp.add({
    name: 'relay-e2e-seen',
    type: 'enrichment',
    execute: async (event) => {
      seen.push(event.event_type);
      return event;
    },
  });

  const ready = amp.init(apiKey, {
    serverUrl: relay + '/2/httpapi',
    transport: transport,
    deviceId: 'browser-device-' + tag,
    // Nothing but the relay may be contacted.
    fetchRemoteConfig: false,
    enableDiagnostics: false,
    autocapture: {
      pageViews: true,
      // Clicks, but not the timed viewport events (they would come after
      // finish, on page hide, unrecorded).
      elementInteractions: { viewportContentUpdated: { enabled: false } },
      attribution: false,
      sessions: false,
      formInteractions: false,
      fileDownloads: false,
      frustrationInteractions: false,
      networkTracking: false,
      webVitals: false,
      performance: false,
      pageUrlEnrichment: false,
    },
    enableRequestBodyCompression: gzip, // above 2 KiB bodies
    // Everything goes in the explicit flush; one try for a refused page.
    flushIntervalMillis: 60000,
    flushQueueSize: 1000,
    flushMaxRetries: 1,
    logLevel: 0,
  }).promise;

  window.addEventListener('DOMContentLoaded', () => {
    document.getElementById('buy').addEventListener('click', () => {
      tracked.push(amp.track('Buy Clicked', { sku: 'sku-42', tag: tag }).promise);
    });
  });

  window.relayE2E = {
    ready: ready.then(() => true),
    // Event types the SDK made so far (for waiting on autocapture).
    types: () => seen.slice(),
    finish: async (waitMs) => {
      // 3 KB of properties: over the SDK's threshold for compression.
      tracked.push(amp.track('Checkout Started', { items: 1, tag: tag, note: 'n'.repeat(3000) }).promise);
      await amp.flush().promise;
      // A refused upload is retried once, later: wait for the verdicts, but
      // not for ever.
      const verdicts = Promise.all(tracked).then((rs) => rs.map((r) => ({ code: r.code, message: r.message, insert_id: r.event.insert_id })));
      const timeout = new Promise((resolve) => setTimeout(() => resolve(null), waitMs));
      const results = await Promise.race([verdicts, timeout]);
      await Promise.all(inflating);
      // Nothing more from this page: what was recorded is all it sends.
      amp.setOptOut(true);
      return { sent: sent, results: results, gzipUploads: gzipUploads };
    },
  };
})();
