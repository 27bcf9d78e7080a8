package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

// apiCall sends method url with Basic key:secret (key "" sends none).
func apiCall(t testing.TB, method, url, key string, body []byte) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.SetBasicAuth(key, "secret")
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{Status: resp.StatusCode, Body: b}
	json.Unmarshal(b, &a.JSON)
	return a
}

func TestFeedbackIngest(t *testing.T) {
	s, url := start(t, Config{APIKeys: []string{"key-one"}})
	_ = s
	u := url + "/api/1/ai-feedback/ingest"
	long := strings.Repeat("x", FeedbackMaxBody+1)
	items := func(n int) string {
		var b []string
		for i := range n {
			b = append(b, fmt.Sprintf(`{"unique_id":"i%d","body":"b%d"}`, i, i))
		}
		return `{"source_id":"src","items":[` + strings.Join(b, ",") + `]}`
	}
	for _, tc := range []struct {
		name, key, body string
		status          int
		ingested        float64
		failed          []string // unique_ids in errors
	}{
		{"no auth", "", items(1), 401, 0, nil},
		{"unknown key", "other", items(1), 401, 0, nil},
		{"not json", "key-one", `{`, 400, 0, nil},
		{"no source", "key-one", `{"items":[{"unique_id":"a"}]}`, 400, 0, nil},
		{"no items", "key-one", `{"source_id":"s","items":[]}`, 400, 0, nil},
		{"101 items", "key-one", items(101), 400, 0, nil},
		{"100 items", "key-one", items(100), 200, 100, nil},
		{"one bad among good", "key-one", `{"source_id":"src","items":[{"unique_id":"g1","body":"ok"},` +
			`{"unique_id":"bad","body":"` + long + `"},{"unique_id":"g2","author":"ann","url":"u1","conversation_parts":[{"unique_id":"p1","body":"hi"}]}]}`,
			200, 2, []string{"bad"}},
		{"nested part", "key-one", `{"source_id":"src","items":[{"unique_id":"n","conversation_parts":[{"unique_id":"p","body":"x","conversation_parts":[{"unique_id":"q","body":"y"}]}]}]}`, 200, 0, []string{"n"}},
		{"part without body", "key-one", `{"source_id":"src","items":[{"unique_id":"e","conversation_parts":[{"unique_id":"p"}]}]}`, 200, 0, []string{"e"}},
		{"no unique_id", "key-one", `{"source_id":"src","items":[{"body":"x"}]}`, 200, 0, []string{""}},
		{"mistyped", "key-one", `{"source_id":"src","items":[{"body":5,"unique_id":"t"},"x",{"unique_id":7}]}`, 200, 0, []string{"t", "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := apiCall(t, "POST", u, tc.key, []byte(tc.body))
			if a.Status != tc.status {
				t.Fatalf("status %d, want %d: %s", a.Status, tc.status, a.Body)
			}
			if tc.status != 200 {
				if a.JSON["error"] == nil {
					t.Errorf("no error text: %s", a.Body)
				}
				return
			}
			var ans feedbackAnswer
			json.Unmarshal(a.Body, &ans)
			if float64(ans.Ingested) != tc.ingested || ans.Failed != len(tc.failed) || len(ans.Errors) != len(tc.failed) {
				t.Fatalf("answer %s", a.Body)
			}
			for i, id := range tc.failed {
				if ans.Errors[i].UniqueID != id || ans.Errors[i].Error == "" {
					t.Errorf("errors[%d] = %+v, want unique_id %q", i, ans.Errors[i], id)
				}
			}
		})
	}
	if a := apiCall(t, "POST", u, "key-one", bytes.Repeat([]byte(" "), FeedbackMaxBytes+1)); a.Status != 413 {
		t.Errorf("6 MB body: %d", a.Status)
	}
	// Upsert: re-sending g2 with a new part, a body and a url appends the part
	// and sets the two fields; its author stays.
	a := apiCall(t, "POST", u, "key-one", []byte(`{"source_id":"src","items":[{"unique_id":"g2","body":"now","url":"u2","conversation_parts":[{"unique_id":"p1","body":"hi"},{"unique_id":"p2","body":"more"}]}]}`))
	if a.Status != 200 {
		t.Fatal(a.Status, string(a.Body))
	}
	var stored struct {
		Items []FeedbackItem `json:"items"`
	}
	wiretest.GetJSON(t, url+"/sim/feedback?api_key=key-one&source_id=src", &stored)
	got := stored.Items
	var g2 *FeedbackItem
	for i := range got {
		if got[i].UniqueID == "g2" {
			g2 = &got[i]
		}
		if got[i].UniqueID == "bad" || got[i].UniqueID == "n" || got[i].UniqueID == "e" {
			t.Errorf("failed item %s stored", got[i].UniqueID)
		}
	}
	if len(got) != 102 || g2 == nil || g2.Body != "now" || g2.Author != "ann" || g2.URL != "u2" || g2.Updates != 2 || len(g2.ConversationParts) != 2 ||
		g2.ConversationParts[0].Updates != 2 {
		t.Fatalf("stored %d items, g2 %+v", len(got), g2)
	}
}

// TestDataAPIAuthAndEncoding pins what every data API checks before its
// handler: Basic authentication with an accepted api key (the key's label
// logged either way) and the body's Content-Encoding.
func TestDataAPIAuthAndEncoding(t *testing.T) {
	s, url := start(t, Config{APIKeys: []string{"key-one"}})
	body := []byte(`{"source_id":"src","items":[{"unique_id":"i1"}]}`)
	for _, tc := range []struct {
		name, key, enc string
		body           []byte
		status         int
		answer, label  string
	}{
		{"no auth", "", "", body, 401, `{"error":"invalid or missing Basic authentication"}`, ""},
		{"unknown key", "key-two", "", body, 401, `{"error":"invalid or missing Basic authentication"}`, KeyLabel("key-two")},
		{"brotli", "key-one", "br", body, 415, `{"error":"unsupported Content-Encoding"}`, KeyLabel("key-one")},
		{"bad gzip", "key-one", "gzip", body, 400, `{"error":"undecodable gzip body"}`, KeyLabel("key-one")},
		{"gzip", "key-one", "gzip", gz(body), 200, `{"ingested":1,"failed":0,"errors":[]}`, KeyLabel("key-one")},
	} {
		req, _ := http.NewRequest("POST", url+"/api/1/ai-feedback/ingest", bytes.NewReader(tc.body))
		if tc.key != "" {
			req.SetBasicAuth(tc.key, "secret")
		}
		if tc.enc != "" {
			req.Header.Set("Content-Encoding", tc.enc)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := strings.TrimSpace(string(b)); resp.StatusCode != tc.status || got != tc.answer {
			t.Errorf("%s: %d %s, want %d %s", tc.name, resp.StatusCode, got, tc.status, tc.answer)
		}
		if ch := resp.Header.Get("WWW-Authenticate"); (tc.status == 401) != (ch == `Basic realm="svc"`) {
			t.Errorf("%s: challenge %q", tc.name, ch)
		}
		if reqs := s.Requests(); reqs[len(reqs)-1].KeyLabel != tc.label {
			t.Errorf("%s: logged key label %q, want %q", tc.name, reqs[len(reqs)-1].KeyLabel, tc.label)
		}
	}
}
