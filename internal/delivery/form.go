package delivery

import (
	"cmp"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// NewForm returns the pipeline of the form kind fc describes (group
// identify, user mappings) over fc.Store, in both modes: a store whose
// queues are lanes (the local spool) or fleet partitions. log and reg may
// be nil.
func NewForm(fc FormConfig, send Sender, log *zap.Logger, reg prometheus.Registerer) (*Pipeline, error) {
	if err := fc.Validate(); err != nil {
		return nil, err
	}
	if send == nil {
		return nil, errors.New("delivery: sender required")
	}
	fr := fc.Kind.Frame(storage.LaneKey{}) // the limits of every lane
	linger := cmp.Or(fc.Linger, formLinger)
	if linger < 0 {
		linger = time.Nanosecond // no wait
	}
	cfg := Config{Live: Live{MaxBatchEvents: fr.MaxRecords, MaxBatchBytes: fr.MaxBytes, FlushInterval: linger,
		MaxEventAge: cmp.Or(fc.MaxAge, DefaultMaxEventAge), Gzip: fc.Gzip}, ShardsPerLane: 1,
		MaxReadAheadBytes: cmp.Or(fc.ReadBytes, formReadBytes),
		RetryInitial:      cmp.Or(fc.RetryInitial, DefaultRetryInitial),
		RetryMax:          cmp.Or(fc.RetryMax, formRetryMax),
		MaxRetryAfter:     cmp.Or(fc.MaxRetryAfter, formMaxRetryAfter)}
	p := newPipeline(cfg, fc.Store, send, nil, log)
	p.name, p.lanes, p.kind, p.form = fc.Name, fc.Lanes, fc.Kind, &fc
	p.log = p.log.With(zap.String("kind", fc.Name))
	// The store's lanes run as lanes; its fleet partitions (when it hands
	// them) on runners per lane and partition, as the events'.
	p.fl = &fleetState{stops: make(map[storage.LaneKey]string)}
	p.m = newFormMetrics(reg, p)
	return p, nil
}

// newFormMetrics are a form kind's metrics, relay_<name>_...
func newFormMetrics(reg prometheus.Registerer, p *Pipeline) *metrics {
	f := promauto.With(reg)
	pre := "relay_" + p.name + "_"
	m := &metrics{
		delivered: f.NewCounter(prometheus.CounterOpts{Name: pre + "delivered_total", Help: "Records delivered upstream (200)."}),
		retried:   prometheus.NewCounter(prometheus.CounterOpts{Name: pre + "records_retried"}), // not exported: retries_total counts requests
		dead:      f.NewCounterVec(prometheus.CounterOpts{Name: pre + "dead_letters_total", Help: "Records stored as dead letters, by reason."}, []string{"reason"}),
		requests:  f.NewCounterVec(prometheus.CounterOpts{Name: pre + "requests_total", Help: "Upstream requests by answer class."}, []string{"result"}),
		retries:   f.NewCounter(prometheus.CounterOpts{Name: pre + "retries_total", Help: "Requests retried after a retryable answer or a 429."}),
		lanes:     f.NewGauge(prometheus.GaugeOpts{Name: pre + "lanes", Help: "Lanes being delivered."}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: pre + "lanes_stopped",
		Help: "Lanes stopped: the upstream refused the api_key (or the URL), or an operator stopped them."},
		func() (n float64) {
			for _, s := range p.LaneStatus() {
				n += stopped(s)
			}
			return n
		})
	registerLanes(reg, p)
	return m
}
