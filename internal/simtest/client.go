package simtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/sim"
)

// Control drives a running Sim over its /sim/ routes, for black-box tests
// (a Sim in another process: test/e2e/harness's simserver). Its knob and
// fault methods need a simtest.Sim; the read-outs work on any sim.Sim.
type Control struct {
	// Base is the Sim's base URL, e.g. "http://127.0.0.1:9000".
	Base string
	// Client is the HTTP client; nil means one with a 10s time-out.
	Client *http.Client
}

func (c *Control) client() *http.Client {
	if c.Client != nil {
		return c.Client
	}
	return &http.Client{Timeout: 10 * time.Second}
}

func (c *Control) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("sim control %s: %w", path, err)
	}
	resp, err := c.client().Do(req)
	if err != nil {
		return fmt.Errorf("sim control %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("sim control %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sim control %s: %d %s", path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("sim control %s: %w", path, err)
		}
	}
	return nil
}

// Inject queues a fault (POST /sim/fault).
func (c *Control) Inject(ctx context.Context, f FaultSpec) error {
	b, _ := json.Marshal(f)
	return c.do(ctx, "POST", "/sim/fault", b, nil)
}

// ClearFaults removes queued faults and latency.
func (c *Control) ClearFaults(ctx context.Context) error {
	return c.do(ctx, "POST", "/sim/faults/clear", nil, nil)
}

// SetLatency delays every ingest request by d.
func (c *Control) SetLatency(ctx context.Context, d time.Duration) error {
	return c.do(ctx, "POST", "/sim/latency?d="+d.String(), nil, nil)
}

// Down takes the Sim down; upAfter > 0 brings it back by itself (needed for
// DownRefuse unless the control routes are served on their own listener).
func (c *Control) Down(ctx context.Context, mode DownMode, upAfter time.Duration) error {
	q := url.Values{"mode": {string(mode)}}
	if upAfter > 0 {
		q.Set("for", upAfter.String())
	}
	return c.do(ctx, "POST", "/sim/down?"+q.Encode(), nil, nil)
}

// Up ends a Down.
func (c *Control) Up(ctx context.Context) error { return c.do(ctx, "POST", "/sim/up", nil, nil) }

// Reset forgets everything stored and counted.
func (c *Control) Reset(ctx context.Context) error { return c.do(ctx, "POST", "/sim/reset", nil, nil) }

// Silence silences a device; Unsilence ends it.
func (c *Control) Silence(ctx context.Context, deviceID string) error {
	return c.do(ctx, "POST", "/sim/silence?device_id="+url.QueryEscape(deviceID), nil, nil)
}

// Unsilence ends Silence.
func (c *Control) Unsilence(ctx context.Context, deviceID string) error {
	return c.do(ctx, "POST", "/sim/unsilence?device_id="+url.QueryEscape(deviceID), nil, nil)
}

// SetDailyQuota sets the per-device daily quota (0 = none).
func (c *Control) SetDailyQuota(ctx context.Context, n int) error {
	return c.do(ctx, "POST", "/sim/quota?n="+strconv.Itoa(n), nil, nil)
}

// Stats reads the counters.
func (c *Control) Stats(ctx context.Context) (sim.Stats, error) {
	var st sim.Stats
	err := c.do(ctx, "GET", "/sim/stats", nil, &st)
	return st, err
}

// Events reads stored events of apiKey ("" = all keys) with Seq > after.
func (c *Control) Events(ctx context.Context, apiKey string, after int64) ([]sim.Ingested, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}}
	if apiKey != "" {
		q.Set("api_key", apiKey)
	}
	var out struct{ Events []sim.Ingested }
	err := c.do(ctx, "GET", "/sim/events?"+q.Encode(), nil, &out)
	return out.Events, err
}

// Requests reads the request log entries with Seq > after.
func (c *Control) Requests(ctx context.Context, after int64) ([]sim.Record, error) {
	var out struct{ Requests []sim.Record }
	err := c.do(ctx, "GET", "/sim/requests?after="+strconv.FormatInt(after, 10), nil, &out)
	return out.Requests, err
}

// SetDSAR changes the DSAR routes' configuration (POST /sim/dsar/config).
func (c *Control) SetDSAR(ctx context.Context, cfg DSARConfig) error {
	return c.do(ctx, "POST", "/sim/dsar/config", mustJSON(cfg), nil)
}

// SetExport changes the export route's configuration (POST /sim/export/config).
func (c *Control) SetExport(ctx context.Context, cfg ExportConfig) error {
	return c.do(ctx, "POST", "/sim/export/config", mustJSON(cfg), nil)
}

// ExportLog returns the export requests served so far (GET /sim/export/log).
func (c *Control) ExportLog(ctx context.Context) ([]sim.ExportServed, error) {
	var out struct {
		Served []sim.ExportServed `json:"served"`
	}
	err := c.do(ctx, "GET", "/sim/export/log", nil, &out)
	return out.Served, err
}

// FeedbackItems returns the stored items of a source of api key apiKey
// (GET /sim/feedback).
func (c *Control) FeedbackItems(ctx context.Context, apiKey, sourceID string) ([]sim.FeedbackItem, error) {
	var out struct {
		Items []sim.FeedbackItem `json:"items"`
	}
	q := url.Values{"api_key": {apiKey}, "source_id": {sourceID}}
	err := c.do(ctx, "GET", "/sim/feedback?"+q.Encode(), nil, &out)
	return out.Items, err
}

// GroupIdentifies reads the identifications stored for apiKey
// (GET /sim/groupidentify?api_key=K).
func (c *Control) GroupIdentifies(ctx context.Context, apiKey string) ([]sim.GroupIdentify, error) {
	var out []sim.GroupIdentify
	err := c.do(ctx, "GET", "/sim/groupidentify"+"?"+url.Values{"api_key": {apiKey}}.Encode(), nil, &out)
	return out, err
}

// UserMap reads the simulator's mapping calls, batches and 429 count
// (GET /sim/usermap).
func (c *Control) UserMap(ctx context.Context) (sim.UserMapState, error) {
	var out sim.UserMapState
	err := c.do(ctx, "GET", "/sim/usermap", nil, &out)
	return out, err
}

// SetUserMapRate sets the mapping rate limit (POST /sim/usermap?limit=&window=).
func (c *Control) SetUserMapRate(ctx context.Context, limit int, window time.Duration) error {
	return c.do(ctx, "POST", "/sim/usermap"+"?"+url.Values{"limit": {strconv.Itoa(limit)}, "window": {window.String()}}.Encode(), nil, nil)
}

// SetUserMapOrg puts apiKey in organization org (POST /sim/usermap?api_key=&org=).
func (c *Control) SetUserMapOrg(ctx context.Context, apiKey, org string) error {
	return c.do(ctx, "POST", "/sim/usermap"+"?"+url.Values{"api_key": {apiKey}, "org": {org}}.Encode(), nil, nil)
}

// SetSecretKey makes GET /api/2/usermap require secret for apiKey.
func (c *Control) SetSecretKey(ctx context.Context, apiKey, secret string) error {
	return c.do(ctx, "POST", "/sim/usermap"+"?"+url.Values{"api_key": {apiKey}, "secret": {secret}}.Encode(), nil, nil)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
