package ingest

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Path labels of relay_ingest_requests_total; unknown paths share one label so
// that the series stay bounded.
type pathIdx uint8

const (
	pathHTTPAPI pathIdx = iota
	pathBatch
	pathHealthz
	pathOther
	numPaths
)

var pathLabels = [numPaths]string{"/2/httpapi", "/batch", "/healthz", "other"}

func classifyPath(p []byte) pathIdx {
	switch string(p) {
	case "/2/httpapi":
		return pathHTTPAPI
	case "/batch":
		return pathBatch
	case "/healthz":
		return pathHealthz
	}
	return pathOther
}

// Rejection reasons (the reason label).
const (
	reasonInvalidFields       = "invalid_fields"
	reasonMissingFields       = "missing_fields"
	reasonMissingField        = "missing_field"
	reasonInvalidJSON         = "invalid_json"
	reasonInvalidEventJSON    = "invalid_event_json"
	reasonMissingBody         = "missing_body"
	reasonInvalidAPIKey       = "invalid_api_key"
	reasonInvalidRequest      = "invalid_request"
	reasonTooLarge            = "too_large"
	reasonBadGzip             = "bad_gzip"
	reasonUnsupportedEncoding = "unsupported_encoding"
	reasonSpoolFull           = "spool_full"
	reasonDiskLow             = "disk_low"
	reasonTooManyLanes        = "too_many_lanes"     // --max-lanes
	reasonTooManyKeyLanes     = "too_many_key_lanes" // --max-lanes-per-key
	reasonShuttingDown        = "shutting_down"
	reasonSpoolError          = "spool_error"
	reasonBadHTTP             = "bad_http"
	reasonTimeout             = "timeout"
	reasonPanic               = "panic"
	reasonOriginNotAllowed    = "origin_not_allowed"
	reasonAPIKeyNotAllowed    = "api_key_not_allowed"
	reasonClientRateLimit     = "client_rate_limited"
)

// codes that get a pre-resolved counter (others are resolved per request).
var knownCodes = []int{200, 204, 400, 403, 404, 405, 408, 413, 415, 429, 431, 500, 503}

type metrics struct {
	requests      *prometheus.CounterVec
	codeCounters  [numPaths]map[int]prometheus.Counter // read-only after newMetrics
	accepted      prometheus.Counter
	rejected      *prometheus.CounterVec // events, by reason
	rejectedReqs  *prometheus.CounterVec // requests, by reason
	seconds       prometheus.Histogram
	bytes         prometheus.Histogram
	reasonCounter map[string][2]prometheus.Counter // [events, requests], read-only

	// The listener's.
	acceptRetries  prometheus.Counter
	connsFull      prometheus.Counter
	clientRefusals prometheus.Counter
	connections    prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, conns chan struct{}) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	byReason := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"reason"})
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_ingest_requests_total",
			Help: "Ingest listener requests by path (unknown paths are \"other\") and status code.",
		}, []string{"path", "code"}),
		accepted: counter("relay_ingest_events_accepted_total", "Events committed to the spool and answered 200."),
		rejected: byReason("relay_ingest_events_rejected_total",
			"Events of rejected requests, by reason; requests rejected before their events were counted add nothing (see relay_ingest_rejected_requests_total)."),
		rejectedReqs: byReason("relay_ingest_rejected_requests_total", "Ingest requests answered with an error, by reason."),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_ingest_request_seconds",
			Help:    "Time from the handler's start to its answer (includes the spool commit).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 100µs .. 3.3s
		}),
		bytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_ingest_request_bytes",
			Help:    "Ingest request body sizes as received (compressed when gzip).",
			Buckets: prometheus.ExponentialBuckets(256, 4, 10), // 256 B .. 64 MiB
		}),
		reasonCounter: make(map[string][2]prometheus.Counter),
		acceptRetries: counter("relay_ingest_accept_retries_total",
			"Accept errors on the ingest listener (out of file descriptors, buffers...) retried after a pause."),
		connsFull: counter("relay_ingest_connection_limit_waits_total",
			"Times the ingest listener held new connections back because --max-connections were open."),
		clientRefusals: counter("relay_ingest_client_connection_refusals_total",
			"Ingest connections closed at accept because their client address (IPv6: its /64) held --max-connections-per-client already."),
		connections: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relay_ingest_connections",
			Help: "Ingest connections open (at most --max-connections).",
		}, func() float64 { return float64(len(conns)) }),
	}
	for p := range numPaths {
		m.codeCounters[p] = make(map[int]prometheus.Counter, len(knownCodes))
		for _, c := range knownCodes {
			m.codeCounters[p][c] = m.requests.WithLabelValues(pathLabels[p], strconv.Itoa(c))
		}
	}
	for _, r := range []string{
		reasonInvalidFields, reasonMissingFields, reasonMissingField, reasonInvalidJSON,
		reasonInvalidEventJSON, reasonMissingBody, reasonInvalidAPIKey, reasonInvalidRequest,
		reasonTooLarge, reasonBadGzip, reasonUnsupportedEncoding, reasonSpoolFull, reasonDiskLow,
		reasonShuttingDown, reasonSpoolError, reasonBadHTTP, reasonTimeout, reasonPanic,
		reasonOriginNotAllowed, reasonAPIKeyNotAllowed, reasonClientRateLimit,
		reasonTooManyLanes, reasonTooManyKeyLanes,
	} {
		m.reasonCounter[r] = [2]prometheus.Counter{m.rejected.WithLabelValues(r), m.rejectedReqs.WithLabelValues(r)}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.accepted, m.rejected, m.rejectedReqs, m.seconds, m.bytes,
			m.acceptRetries, m.connsFull, m.clientRefusals, m.connections} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) request(p pathIdx, code int) {
	if c, ok := m.codeCounters[p][code]; ok {
		c.Inc()
		return
	}
	m.requests.WithLabelValues(pathLabels[p], strconv.Itoa(code)).Inc()
}

// reject counts one rejected request of events events.
func (m *metrics) reject(reason string, events int) {
	c, ok := m.reasonCounter[reason]
	if !ok {
		c = [2]prometheus.Counter{m.rejected.WithLabelValues(reason), m.rejectedReqs.WithLabelValues(reason)}
	}
	if events > 0 {
		c[0].Add(float64(events))
	}
	c[1].Inc()
}
