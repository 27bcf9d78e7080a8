package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/polltest"
)

// TestFleetLease runs the lease cases on a cluster of their own, alone
// (not parallel: they time a relay's renewals, which the other tests'
// load would delay).
func TestFleetLease(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	env := &testEnv{c: natstest.Start(t, natstest.Config{})}
	t.Run("SlowMembership", env.testSlowMembership)
	t.Run("SlowRelease", env.testSlowRelease)
	t.Run("LateRenewal", env.testLateRenewal)
}

// slowKV is the fleet's bucket whose heartbeat writes (Put) and member
// listings take until their context ends while slow is set, as a loaded
// cluster's answers may; the leases' operations (Create, Update, Delete)
// are the bucket's own.
type slowKV struct {
	jetstream.KeyValue
	slow  atomic.Bool
	slows atomic.Int64 // slow heartbeats and listings answered
}

func (kv *slowKV) wait(ctx context.Context) error {
	<-ctx.Done()
	kv.slows.Add(1)
	return ctx.Err()
}

func (kv *slowKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	if kv.slow.Load() {
		return 0, kv.wait(ctx)
	}
	return kv.KeyValue.Put(ctx, key, value)
}

func (kv *slowKV) ListKeysFiltered(ctx context.Context, filters ...string) (jetstream.KeyLister, error) {
	if kv.slow.Load() {
		return nil, kv.wait(ctx)
	}
	return kv.KeyValue.ListKeysFiltered(ctx, filters...)
}

// testSlowMembership: a relay whose heartbeat and member listing take
// their whole time (LeaseTTL/4 each) keeps its leases: renewing them
// waits for neither. (When it did, a tick's renewal came LeaseTTL/2 late,
// past the lease's margin: every partition was given up and read again.)
func (e *testEnv) testSlowMembership(t *testing.T) {
	// Three times the default: what is checked is that renewals do not wait
	// for the slow answers, not how fast a loaded cluster renews (every
	// LeaseTTL/3, before LeaseTTL minus its margin).
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1, LeaseTTL: 3 * DefaultLeaseTTL})
	kv := &slowKV{KeyValue: f.kv}
	f.kv = kv // before Run: nothing else reads it
	var taken, lost atomic.Int64
	stopping := make(chan struct{})
	stop := run(f, func(ctx context.Context, p *Partition) error {
		taken.Add(1)
		<-ctx.Done()
		select {
		case <-stopping:
		default:
			lost.Add(1)
		}
		return nil
	})
	polltest.Until(t, "every kind's partition taken", func() bool { return taken.Load() == int64(len(kinds)) })
	kv.slow.Store(true)
	// Four ticks with a slow heartbeat and listing each (two answers a
	// tick), however long a loaded machine takes for them.
	polltest.Until(t, "four slow ticks", func() bool { return kv.slows.Load() >= 8 || lost.Load() > 0 })
	close(stopping)
	stop()
	if n := lost.Load(); n > 0 {
		t.Fatalf("%d partitions lost while the heartbeat was slow (taken %d times for %d)", n, taken.Load(), len(kinds))
	}
	if n := taken.Load(); n != int64(len(kinds)) {
		t.Fatalf("partitions taken %d times, want %d", n, len(kinds))
	}
}

// delayKV is the fleet's bucket whose lease deletes answer after delay, as
// a loaded cluster's may.
type delayKV struct {
	jetstream.KeyValue
	delay time.Duration
}

func (kv *delayKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	select {
	case <-time.After(kv.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return kv.KeyValue.Delete(ctx, key, opts...)
}

// holdAll runs f, every partition held until stop, and returns once each
// kind's partition is taken.
func holdAll(t *testing.T, f *Fleet) (stop func()) {
	var taken atomic.Int64
	stop = run(f, func(ctx context.Context, p *Partition) error {
		taken.Add(1)
		<-ctx.Done()
		return nil
	})
	polltest.Until(t, "every kind's partition taken", func() bool { return taken.Load() == int64(len(kinds)) })
	return stop
}

// wantReleased fails t for each kind's lease of f still held, as the
// bucket's stream leader has it. Not kv.Get: a bucket's reads are direct
// gets, which a replica that has not applied the release yet may answer
// though the cluster acknowledged it; another relay's take-over is a
// write, which the leader decides.
func wantReleased(t *testing.T, f *Fleet) {
	t.Helper()
	bucket := f.n.fleetBucket()
	for _, k := range kinds {
		key := slot{kind: k, id: 0}.key()
		req := fmt.Appendf(nil, `{"last_by_subj":"$KV.%s.%s"}`, bucket, key)
		m, err := f.nc.RequestWithContext(bg(t), "$JS.API.STREAM.MSG.GET.KV_"+bucket, req)
		if err != nil {
			t.Fatalf("read lease %s: %v", key, err)
		}
		var resp struct {
			Message *struct {
				Hdrs []byte `json:"hdrs"`
			} `json:"message"`
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			t.Fatalf("read lease %s: %v", key, err)
		}
		switch {
		case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
			// Aged out (the bucket's TTL): nobody holds it either.
		case resp.Error != nil:
			t.Fatalf("read lease %s: %v", key, resp.Error)
		default:
			h, _ := nats.DecodeHeadersMsg(resp.Message.Hdrs) // a put may have none
			if op := h.Get("KV-Operation"); op != "DEL" && op != "PURGE" {
				t.Errorf("lease %s after the stop: still held, want it released", key)
			}
		}
	}
}

// testSlowRelease: a relay that stops gives its leases up even when the
// cluster takes longer than LeaseTTL/4 to delete them, as long as the
// leases have not expired by then: another relay takes them at once, not
// after their TTL. (When a release had LeaseTTL/4, a stop on a loaded
// machine left its leases to expire.)
func (e *testEnv) testSlowRelease(t *testing.T) {
	// The delete's delay is LeaseTTL/3: past LeaseTTL/4, and well inside
	// what is left of a lease renewed every LeaseTTL/3 (at least 2/3 of
	// the TTL at the stop), even with a renewal seconds late.
	const ttl = 12 * time.Second
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1, LeaseTTL: ttl})
	kv := &delayKV{KeyValue: f.kv, delay: ttl / 3}
	f.kv = kv // before Run: nothing else reads it
	stop := holdAll(t, f)
	stop()
	wantReleased(t, f)
}

// lateKV is the fleet's bucket whose lease renewals (Update), while late
// is set, are applied by the cluster but answered as timed out, as a
// loaded cluster's answer may come after the caller's context ended.
type lateKV struct {
	jetstream.KeyValue
	late  atomic.Bool
	lates atomic.Int64
}

func (kv *lateKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, value, last)
	if err == nil && kv.late.Load() {
		kv.lates.Add(1)
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

// testLateRenewal: a renewal the cluster applied but answered too late
// leaves the relay's revision behind the lease's; the lease is still this
// relay's (it holds its name), so the next renewal and the release go on
// with the lease's revision. (When they did not, the stop left every such
// lease to wait out its TTL, nobody delivering its partition.)
func (e *testEnv) testLateRenewal(t *testing.T) {
	// A TTL long enough that one renewal lost on a loaded machine does not
	// end the leases before the next.
	const ttl = 30 * time.Second
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1, LeaseTTL: ttl})
	kv := &lateKV{KeyValue: f.kv}
	f.kv = kv // before Run: nothing else reads it
	stop := holdAll(t, f)
	kv.late.Store(true)
	polltest.Until(t, "a late renewal of every lease", func() bool { return kv.lates.Load() >= int64(len(kinds)) })
	kv.late.Store(false)
	stop()
	wantReleased(t, f)
}
