package adminapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// The dead letters of a lane keep its label after the lane was
// retired (empty and idle): they list under it and a filter by it selects
// them; a label that names no lane nor dead letter is still 404.
func TestDeadLettersOfRetiredLane(t *testing.T) {
	f := newRelayFixture(t, spool.Config{RetireIdle: 10 * time.Millisecond}, nil)
	key := storage.LaneKey{Kind: storage.KindEvents, APIKey: "gone"}
	l := f.lane(key)
	label := l.Key().Label()
	f.dead(key, "silenced", `{"event_type":"a"}`, `{"event_type":"b"}`)
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	_, _, err := l.NextPart(ctx, 0, nil) // returns once the empty lane is retired
	cancel()
	if !errors.Is(err, storage.ErrRetired) {
		t.Fatalf("the empty lane was not retired: %v", err)
	}
	var out struct {
		DeadLetters []struct {
			Lane string `json:"lane"`
		} `json:"dead_letters"`
	}
	if code := f.do("GET", "/relay/v1/deadletters", "", &out); code != 200 || len(out.DeadLetters) != 2 || out.DeadLetters[0].Lane != label {
		t.Fatalf("list: %d %+v, want lane %s", code, out, label)
	}
	out.DeadLetters = nil
	if code := f.do("GET", "/relay/v1/deadletters?lane="+label, "", &out); code != 200 || len(out.DeadLetters) != 2 {
		t.Fatalf("by the retired lane's label: %d %+v", code, out)
	}
	if code := f.do("GET", "/relay/v1/deadletters?lane=events-00000000", "", nil); code != 404 {
		t.Fatalf("unknown label: %d, want 404", code)
	}
	var purged struct {
		Purged int `json:"purged"`
	}
	if code := f.do("POST", "/relay/v1/deadletters/purge", `{"filter":{"lane":"`+label+`"}}`, &purged); code != 200 || purged.Purged != 2 {
		t.Fatalf("purge by the retired lane's label: %d %+v", code, purged)
	}
}
