package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
)

// TestFleetInvalidKeyDoesNotStopPartition: with one partition, an api_key
// the upstream refuses ("Invalid API key") and a backlog of it larger than
// the partition's queue (1 MiB) sent before a valid key's events: the valid
// key's events are all delivered, and the refused key's messages stay in
// the stream (spilled: unacknowledged, none lost). Before the spilling the
// partition stopped behind the stopped lane.
func TestFleetInvalidKeyDoesNotStopPartition(t *testing.T) {
	cl, up, upURL := startFleetClusterWith(t, sim.Config{APIKeys: []string{"good-key"}})
	r := startFleetRelay(t, cl, upURL, "--spool-partitions", "1")
	const (
		badRequests = 150 // 150 x 50 events x ~230 bytes: about 1.7 MB
		perReq      = 50
		goodReqs    = 40
	)
	pad := strings.Repeat("p", 150)
	body := func(key string, dev, from int) []byte {
		var b strings.Builder
		fmt.Fprintf(&b, `{"api_key":%q,"events":[`, key)
		for i := range perReq {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"device_id":"device-%02d","event_type":"t","insert_id":"%s-%02d-%06d","event_properties":{"pad":%q}}`,
				dev, key, dev, from+i, pad)
		}
		b.WriteString("]}")
		return []byte(b.String())
	}
	client := &http.Client{Timeout: 20 * time.Second}
	post := func(b []byte) {
		t.Helper()
		polltest.Until(t, "the relay accepting a request", func() bool { return postEvents(client, r.ingest, b) == http.StatusOK })
	}
	for k := range badRequests {
		post(body("bad-key", k%3, k*perReq))
	}
	for k := range goodReqs {
		post(body("good-key", k%4, k*perReq))
	}
	want := goodReqs * perReq
	polltest.Until(t, "the good key's events delivered behind the refused key's backlog", func() bool {
		return distinct(up.Events("good-key")) >= want
	})
	_, lanes := getBody(t, r.admin+"/relay/v1/lanes")
	if !strings.Contains(lanes, "invalid API key") {
		t.Fatalf("the refused key's lane is not stopped: %s", lanes)
	}
	// The refused key's messages are all still in the stream.
	js := cl.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	polltest.Until(t, fmt.Sprintf("the events stream holding the refused key's %d messages only", badRequests), func() bool {
		s, err := js.Stream(ctx, "RELAY_EVENTS")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs == badRequests
	})
}
