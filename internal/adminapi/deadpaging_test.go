package adminapi

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/plan"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// TestListDeadPaging: pages of limit, following next_after, list every
// dead letter once in id order with more set on all but the last and the
// store's total; a plan filter reads on past pages that hold no match.
func TestListDeadPaging(t *testing.T) {
	f := newRelayFixture(t, spool.Config{}, nil)
	key := storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}
	ids := f.dead(key, "silenced", `{"n":1}`, `{"n":2}`, `{"n":3}`, `{"n":4}`, `{"n":5}`)
	var got []uint64
	after := uint64(0)
	for page := 0; ; page++ {
		var l deadListJSON
		if code := f.do("GET", fmt.Sprintf("/relay/v1/deadletters?limit=2&after=%d", after), "", &l); code != 200 || l.Total != 5 {
			t.Fatalf("page %d: %d %+v", page, code, l)
		}
		for _, d := range l.DeadLetters {
			got = append(got, d.ID)
		}
		if want := page < 2; l.More != want || len(l.DeadLetters) == 0 || l.NextAfter != got[len(got)-1] {
			t.Fatalf("page %d: more %v next_after %d, got %+v", page, l.More, l.NextAfter, l)
		}
		if !l.More {
			break
		}
		after = l.NextAfter
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("listed %v, want %v", got, ids)
	}

	// Plan dead letters after many that the plan filter skips.
	var dls []storage.DeadLetter
	for i := range 7 {
		et := "Other"
		if i >= 5 {
			et = "Viewed"
		}
		dls = append(dls, storage.DeadLetter{Lane: key, Reason: plan.ReasonPlan, Died: time.Now(),
			Answer: fmt.Appendf(nil, `{"project":"p","event_type":%q,"violations":[{"kind":"wrong_type"}]}`, et),
			Record: storage.Record{Data: []byte(`{}`)}})
	}
	if err := f.sp.PutDead(context.Background(), dls); err != nil {
		t.Fatal(err)
	}
	q := url.Values{"project": {"p"}, "event_type": {"Viewed"}, "violation": {"wrong_type"}, "limit": {"1"}}
	var l deadListJSON
	if code := f.do("GET", "/relay/v1/deadletters?"+q.Encode(), "", &l); code != 200 || len(l.DeadLetters) != 1 ||
		l.DeadLetters[0].ID != dls[5].ID || !l.More || l.NextAfter != dls[5].ID || l.Total != 12 {
		t.Fatalf("plan filter: %d %+v", code, l)
	}
	q.Set("after", fmt.Sprint(l.NextAfter))
	if code := f.do("GET", "/relay/v1/deadletters?"+q.Encode(), "", &l); code != 200 || len(l.DeadLetters) != 1 ||
		l.DeadLetters[0].ID != dls[6].ID || l.More {
		t.Fatalf("plan filter, second page: %d %+v", code, l)
	}
	// A lane no lane nor dead letter has: 404, nothing purged.
	code, _, body := getBody(t, "POST", f.base+"/relay/v1/deadletters/purge", `{"filter":{"lane":"events-00000000"}}`, "Authorization", "Bearer tok")
	if code != 404 || !strings.Contains(body, "filter.lane: no lane has that label") {
		t.Fatalf("purge of an unknown lane: %d %s", code, body)
	}
	if f.do("GET", "/relay/v1/deadletters", "", &l); l.Total != 12 {
		t.Fatalf("%d dead letters left, want 12", l.Total)
	}
}

// dyingStore is a store whose appended records die again at once, as a
// deliverer could make them die while a replay runs.
type dyingStore struct{ Store }

func (s dyingStore) Append(ctx context.Context, req storage.Request) error {
	var dls []storage.DeadLetter
	for _, r := range req.Batch.Records() {
		dls = append(dls, storage.DeadLetter{Lane: storage.LaneKey{Kind: req.Kind, APIKey: string(req.APIKey), Options: string(req.Options)},
			Reason: "silenced", Died: time.Now(), Record: storage.Record{Data: slices.Clone(r.Data)}})
	}
	if err := s.Store.Append(ctx, req); err != nil {
		return err
	}
	return s.PutDead(ctx, dls)
}

// TestReplayStopsAtNewest: a filter replay ends at the newest dead letter
// matching when it started, leaving those its own records became; an ids
// replay finds ids more than a store read apart.
func TestReplayStopsAtNewest(t *testing.T) {
	f := newRelayFixture(t, spool.Config{}, nil, func(s Store) Store { return dyingStore{s} })
	key := storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}
	data := make([]string, bulkPage+3)
	for i := range data {
		data[i] = fmt.Sprintf(`{"n":%d}`, i)
	}
	ids := f.dead(key, "silenced", data...)
	var ans replayAnswer
	if code := f.do("POST", "/relay/v1/deadletters/replay", `{"filter":{"reason":"silenced"}}`, &ans); code != 200 || ans.Replayed != len(ids) || ans.More {
		t.Fatalf("replay: %d %+v", code, ans)
	}
	left, err := f.sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
	if err != nil || len(left) != len(ids) || left[0].ID <= ids[len(ids)-1] {
		t.Fatalf("%d dead letters left (%v), want the %d replayed records died again", len(left), err, len(ids))
	}

	first, last := left[0].ID, left[len(left)-1].ID
	// ids[0] was replayed: not found.
	body := fmt.Sprintf(`{"ids":[%d,%d,%d]}`, last, first, ids[0])
	if code := f.do("POST", "/relay/v1/deadletters/replay", body, &ans); code != 200 || ans.Replayed != 2 ||
		!slices.Equal(ans.NotFound, []uint64{ids[0]}) || !strings.Contains(fmt.Sprint(ans.Lanes), key.Label()) {
		t.Fatalf("ids replay: %d %+v", code, ans)
	}
}
