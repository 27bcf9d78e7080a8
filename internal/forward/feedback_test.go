package forward_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

func feedbackItems(n int) string {
	var l []string
	for i := range n {
		l = append(l, fmt.Sprintf(`{"unique_id":"i%d","body":"text %d"}`, i, i))
	}
	return strings.Join(l, ",")
}

func TestFeedbackCheckRequest(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       error
		bad        []string // unique_ids of bad feedbackItems
	}{
		{"ok", `{"source_id":"s","items":[` + feedbackItems(100) + `]}`, nil, nil},
		{"101 items", `{"source_id":"s","items":[` + feedbackItems(101) + `]}`, forward.ErrBadFeedback, nil},
		{"no items", `{"source_id":"s","items":[]}`, forward.ErrBadFeedback, nil},
		{"items missing", `{"source_id":"s"}`, forward.ErrBadFeedback, nil},
		{"no source", `{"items":[` + feedbackItems(1) + `]}`, forward.ErrBadFeedback, nil},
		{"not an object", `[1]`, forward.ErrBadFeedback, nil},
		{"transcript: parts only", `{"source_id":"s","items":[{"unique_id":"c","conversation_parts":[{"unique_id":"p","body":"hi"}]}]}`, nil, nil},
		{"part without body", `{"source_id":"s","items":[` + feedbackItems(2) + `,{"unique_id":"x","conversation_parts":[{"unique_id":"p"}]}]}`, forward.ErrBadFeedbackItem, []string{"x"}},
		{"part with empty body", `{"source_id":"s","items":[{"unique_id":"y","conversation_parts":[{"body":""}]}]}`, forward.ErrBadFeedbackItem, []string{"y"}},
		{"nested parts", `{"source_id":"s","items":[{"unique_id":"z","conversation_parts":[{"body":"a","conversation_parts":[{"body":"b"}]}]},{"unique_id":"w","conversation_parts":"no"}]}`, forward.ErrBadFeedbackItem, []string{"z", "w"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := forward.CheckFeedback([]byte(tc.body))
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			var re *forward.FeedbackError
			if errors.As(err, &re) {
				var got []string
				for _, it := range re.Items {
					got = append(got, it.UniqueID)
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.bad) {
					t.Fatalf("bad items %v, want %v", got, tc.bad)
				}
			}
		})
	}
}

func TestFeedbackChunk(t *testing.T) {
	var its []json.RawMessage
	for i := range 250 {
		its = append(its, json.RawMessage(fmt.Sprintf(`{"unique_id":"i%03d","body":"%s"}`, i, strings.Repeat("x", 100))))
	}
	its = append(its, json.RawMessage(`{"unique_id":"huge","body":"`+strings.Repeat("y", 3000)+`"}`))
	bodies, members, tooLarge := forward.ChunkFeedback("src", its, 2000)
	if len(tooLarge) != 1 || tooLarge[0] != 250 {
		t.Fatalf("tooLarge %v", tooLarge)
	}
	n := 0
	for i, b := range bodies {
		if len(b) > 2000 || forward.CheckFeedback(b) != nil || len(members[i]) > forward.FeedbackMaxItems {
			t.Fatalf("body %d: %d bytes, %v", i, len(b), forward.CheckFeedback(b))
		}
		n += len(members[i])
	}
	if n != 250 {
		t.Fatalf("%d items chunked", n)
	}
	bodies, members, _ = forward.ChunkFeedback("src", its[:250], 0)
	if len(bodies) != 3 || len(members[0]) != 100 || len(members[2]) != 50 {
		t.Fatalf("by count: %d bodies", len(bodies))
	}
}

func FuzzFeedbackCheckRequest(f *testing.F) {
	f.Add([]byte(`{"source_id":"s","items":[{"unique_id":"z","conversation_parts":[{"body":"a"}]}]}`))
	f.Add([]byte(`{"source_id":"s","items":[{"conversation_parts":[{"body":1}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := forward.CheckFeedback(b)
		var re *forward.FeedbackError
		if errors.As(err, &re) && len(re.Items) == 0 {
			t.Fatal("RequestError without items")
		}
	})
}

func TestFeedbackThroughRelay(t *testing.T) {
	_, up := forwardtest.StartSim(t, sim.Config{})
	relay := forwardtest.ServeAdmin(t, forwardtest.Build(t, forward.Config{}, forwardtest.WebCreds(t), forward.Feedback(forward.APIConfig{URL: baseurl.NewRef(up)})))
	inj := []string{"X-Relay-Project: web", "Authorization: Bearer " + forwardtest.AdminToken}
	send := func(body string) forwardtest.Answer {
		return forwardtest.Call(t, "POST", relay+forward.FeedbackPath, strings.NewReader(body), inj...)
	}

	// One item the upstream refuses among good ones: its per-item error passes back.
	long := strings.Repeat("x", sim.FeedbackMaxBody+1)
	r := send(`{"source_id":"src","items":[` + feedbackItems(3) + `,{"unique_id":"long","body":"` + long + `"}]}`)
	var ans forward.FeedbackAnswer
	if json.Unmarshal(r.Body, &ans); r.Status != 200 || ans.Ingested != 3 || ans.Failed != 1 || ans.Errors[0].UniqueID != "long" {
		t.Fatalf("upstream per-item error: %v", r)
	}
	// One item breaking the documented part rules: refused locally, naming it.
	r = send(`{"source_id":"src","items":[` + feedbackItems(2) + `,{"unique_id":"nested","conversation_parts":[{"body":"a","conversation_parts":[]}]}]}`)
	ans = forward.FeedbackAnswer{}
	if json.Unmarshal(r.Body, &ans); r.Status != 400 || ans.Failed != 1 || ans.Errors[0].UniqueID != "nested" ||
		!bytes.Contains(r.Body, []byte(`"source":"relay"`)) {
		t.Fatalf("local per-item refusal: %v", r)
	}
	if r := send(`{"source_id":"src","items":[` + feedbackItems(101) + `]}`); r.Status != 400 {
		t.Fatalf("101 items: %v", r)
	}
	if r := send(`{"source_id":"src","items":[{"unique_id":"b","body":"` + strings.Repeat("x", forward.FeedbackMaxBytes) + `"}]}`); r.Status != 413 {
		t.Fatalf("over 5 MB: %v", r)
	}
	// gzip-encoded bodies are checked decoded and forwarded as sent.
	gz := func(s string) *bytes.Reader {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
		return bytes.NewReader(b.Bytes())
	}
	r = forwardtest.Call(t, "POST", relay+forward.FeedbackPath, gz(`{"source_id":"src","items":[{"unique_id":"z1","conversation_parts":[{"unique_id":"p"}]}]}`),
		append(inj, "Content-Encoding: gzip")...)
	if r.Status != 400 || !bytes.Contains(r.Body, []byte(`"unique_id":"z1"`)) {
		t.Fatalf("gzip body with a bad part: %v", r)
	}
	r = forwardtest.Call(t, "POST", relay+forward.FeedbackPath, gz(`{"source_id":"src","items":[{"unique_id":"z2","body":"zipped"}]}`), append(inj, "Content-Encoding: gzip")...)
	if r.Status != 200 || !bytes.Contains(r.Body, []byte(`"ingested":1`)) {
		t.Fatalf("gzip body: %v", r)
	}
	if r := forwardtest.Call(t, "POST", relay+forward.FeedbackPath, strings.NewReader("not gzip"), append(inj, "Content-Encoding: gzip")...); r.Status != 400 {
		t.Fatalf("undecodable body: %v", r)
	}
	got, err := (&simtest.Control{Base: up}).FeedbackItems(context.Background(), "proj", "src")
	if err != nil || len(got) != 4 {
		t.Fatalf("upstream holds %d items (%v), want the 4 good ones", len(got), err)
	}
}
