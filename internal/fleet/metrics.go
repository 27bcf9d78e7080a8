package fleet

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the fleet's Prometheus metrics (this relay's view):
//
//	relay_fleet_append_seconds              Append latency (all its publishes acknowledged)
//	relay_fleet_append_failures_total{reason}  full, unavailable, other
//	relay_fleet_partitions_owned            partitions this relay delivers now
//	relay_fleet_messages_held               messages read and not yet acknowledged
//	relay_fleet_partition_backlog{partition}   messages of an owned partition not yet
//	                                        delivered to its reader, plus those delivered and
//	                                        not acknowledged (consumer lag; "events-3")
//
// The partition label takes at most 3 x Partitions values; a series is
// removed when this relay gives its partition up.
type metrics struct {
	appendSeconds prometheus.Histogram
	appendFails   *prometheus.CounterVec
	owned         atomic.Int64
	held          atomic.Int64
	backlog       *prometheus.GaugeVec
	batchRequests prometheus.Histogram
	multiStream   prometheus.Counter
	leaders       *prometheus.GaugeVec

	mu        sync.Mutex // leaderSet; never held across a call into prometheus
	leaderSet map[string]bool
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		appendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_fleet_append_seconds",
			Help:    "Duration of a fleet Append: every message of the request stored on a quorum.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		appendFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_fleet_append_failures_total",
			Help: "Fleet Appends that failed, by reason (full: stream at its bound; unavailable: no answer from the cluster in time).",
		}, []string{"reason"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relay_fleet_partition_backlog",
			Help: "Messages of a partition this relay owns that are not yet acknowledged (pending plus being delivered).",
		}, []string{"partition"}),
		batchRequests: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_fleet_batch_requests",
			Help:    "Requests' parts per atomic batch published to a stream (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		multiStream: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_fleet_multi_stream_appends_total",
			Help: "Appends whose records went to more than one stream (all or nothing per stream only, see the README).",
		}),
		leaders: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relay_fleet_stream_leaders",
			Help: "Events streams whose Raft leader each NATS server is, as last read (at start and by every /readyz).",
		}, []string{"node"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{
		m.appendSeconds, m.appendFails, m.backlog, m.batchRequests, m.multiStream, m.leaders,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relay_fleet_partitions_owned",
			Help: "Partitions (of every lane kind) this relay delivers now.",
		}, func() float64 { return float64(m.owned.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relay_fleet_messages_held",
			Help: "Messages read by this relay's partition readers and not yet acknowledged (paused keys' included).",
		}, func() float64 { return float64(m.held.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("fleet: register metrics: %w", err)
		}
	}
	return m, nil
}

// setLeaders replaces the leaders-per-node series with perNode's.
func (m *metrics) setLeaders(perNode map[string]int) {
	m.mu.Lock()
	var gone []string
	for n := range m.leaderSet {
		if _, ok := perNode[n]; !ok {
			gone = append(gone, n)
			delete(m.leaderSet, n)
		}
	}
	if m.leaderSet == nil {
		m.leaderSet = make(map[string]bool)
	}
	for n := range perNode {
		m.leaderSet[n] = true
	}
	m.mu.Unlock()
	for _, n := range gone {
		m.leaders.DeleteLabelValues(n)
	}
	for n, c := range perNode {
		m.leaders.WithLabelValues(n).Set(float64(c))
	}
}

func (m *metrics) appendFailed(err error) {
	reason := "other"
	switch {
	case errors.Is(err, ErrFull):
		reason = "full"
	case errors.Is(err, ErrUnavailable):
		reason = "unavailable"
	}
	m.appendFails.WithLabelValues(reason).Inc()
}
