package delivery

import (
	"sync"
	"testing"

	"github.com/svcrelay/relay/internal/storage"
)

// TestFleetStopStateLandsInOrder: whatever the order in which the fleet's
// stops and resumes of a lane and the start of a runner of it interleave
// (a partition taken over while an operator resumes the lane; a relay's
// own call and its watcher's applying a stop and a resume at once), once
// they returned every runner of the lane is in the state last recorded.
// A resume applied while a runner starts, between its reading the stop and
// putting it on, left the runner stopped for good: its records were never
// sent again.
func TestFleetStopStateLandsInOrder(t *testing.T) {
	p, err := NewFleet(Config{Live: Live{IngestURL: "http://127.0.0.1:1"}}, &partitionStore{}, nil, nil, &fakeSender{}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	lane := storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}
	const reason = "stopped by operator"
	rounds := 100000 // enough for the interleavings that lose a state to occur
	if raceEnabled {
		rounds = 30000
	}
	for i := range rounds {
		p.laneStopChanged(lane, true, reason)
		var wg sync.WaitGroup
		start := make(chan struct{})
		var lr *laneRunner
		wg.Go(func() { <-start; lr = p.startFeed(&Feed{key: lane}, "events-0") })
		wg.Go(func() { <-start; p.laneStopChanged(lane, false, "") })
		if i%2 == 1 { // and a second stop beside them
			wg.Go(func() { <-start; p.laneStopChanged(lane, true, reason) })
		}
		close(start)
		wg.Wait()
		_, want := p.fl.stops[lane]
		for _, r := range p.runnerList() {
			if got, _ := r.stop.State(); got != want {
				t.Fatalf("round %d: a runner %s stopped %v, the lane recorded stopped %v", i, r.label, got, want)
			}
		}
		p.forget(lr.id, lr)
	}
}
