package delivery

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/poll"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// Group identify (and user mapping) lanes are bounded like event
// lanes: once delivered and idle they are retired by the spool, and their
// deliverer goroutine ends and forgets them; a later record of the same key
// makes a new lane that delivers.
func TestRetiredLanesForgotten(t *testing.T) {
	s, url, cli := startUpstream(t)
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1, RetireIdle: 50 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewFormLanes(FormConfig{Name: "groupidentify", Lanes: storage.KindGroupIdentify, URL: func(string) string { return url + "/groupidentify" },
		Kind: &Form{Field: "identification", MaxItems: 1024, MaxBodyBytes: 1 << 20}, FormTiming: FormTiming{Linger: -1, RetryInitial: 5 * time.Millisecond}, Store: spool.NewBackend(sp, nil)}, cli, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runForms(t, ctx, cancel, d, sp)
	// laneGoroutines counts the goroutines running a lane (laneRun.Run): the
	// whole process's count also holds the upstream client's connections,
	// which vary with the machine's speed.
	laneGoroutines := func() int {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				return strings.Count(string(buf[:n]), "delivery.(*laneRun).Run(")
			}
			buf = make([]byte, 2*len(buf))
		}
	}
	add := func(key string, i int) {
		l, err := sp.Lane(ctx, storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: key})
		if err != nil {
			t.Fatal(err)
		}
		var b storage.Batch
		b.Add(storage.Record{OrderKey: []byte("org\x00acme"), Data: fmt.Appendf(nil, `{"group_type":"org","group_value":"acme-%d","group_properties":{"$set":{"n":%d}}}`, i, i)})
		if err := sp.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(poll.Max)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (lanes %d, status %d, lane goroutines %d)", what, poll.Max, sp.Stats().Lanes, len(d.LaneStatus()), laneGoroutines())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	const keys = 50
	for i := range keys {
		add(fmt.Sprintf("key-%d", i), i)
	}
	waitFor("delivered", func() bool { return len(s.GroupIdentifies("key-49")) == 1 && len(s.GroupIdentifies("key-0")) == 1 })

	waitFor("retired and forgotten", func() bool { return sp.Stats().Lanes == 0 && len(d.LaneStatus()) == 0 })
	waitFor("lane goroutines ended", func() bool { return laneGoroutines() == 0 })
	add("key-0", 100)
	waitFor("a new lane of a retired key delivers", func() bool { return len(s.GroupIdentifies("key-0")) == 2 })
}
