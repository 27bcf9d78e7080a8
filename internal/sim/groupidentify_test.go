package sim

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func giForm(key, ident string) []byte {
	return []byte(url.Values{"api_key": {key}, "identification": {ident}}.Encode())
}

const formCT = "application/x-www-form-urlencoded"

func TestGroupIdentifyValidation(t *testing.T) {
	s, base := start(t, Config{APIKeys: []string{"k1"}})
	many := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`{"group_type":"org","group_value":"v%d","group_properties":{"a":1}}`, i)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	props := func(n int) string {
		kv := make([]string, n)
		for i := range kv {
			kv[i] = fmt.Sprintf(`"p%d":1`, i)
		}
		return `[{"group_type":"org","group_value":"v","group_properties":{"$set":{` + strings.Join(kv, ",") + `}}}]`
	}
	tests := []struct {
		name   string
		body   []byte
		status int
		err    string
	}{
		{"ok array", giForm("k1", `[{"group_type":"org","group_value":"acme","group_properties":{"$set":{"plan":"pro"}}}]`), 200, ""},
		{"ok object", giForm("k1", `{"group_type":"org","group_value":"acme2","group_properties":{"plan":"pro"}}`), 200, ""},
		{"missing api_key", giForm("", `[]`), 400, ErrTextMissingField},
		{"invalid api_key", giForm("nope", `[{"group_type":"a","group_value":"b"}]`), 400, ErrTextInvalidAPIKey},
		{"missing identification", giForm("k1", ""), 400, ErrTextMissingField},
		{"bad json", giForm("k1", `[{`), 400, ErrTextInvalidJSON},
		{"missing group_type", giForm("k1", `[{"group_value":"b"}]`), 400, ErrTextInvalidGroupIdentify},
		{"number group_value", giForm("k1", `[{"group_type":"a","group_value":3}]`), 400, ErrTextInvalidGroupIdentify},
		{"unknown op", giForm("k1", `[{"group_type":"a","group_value":"b","group_properties":{"$inc":{"x":1}}}]`), 400, ErrTextInvalidGroupIdentify},
		// "at most 1024 group identifies, 1024 group properties, 1 MB"
		{"1024 identifies", giForm("k1", many(1024)), 200, ""},
		{"1025 identifies", giForm("k1", many(1025)), 400, ErrTextInvalidGroupIdentify},
		{"1024 properties", giForm("k1", props(1024)), 200, ""},
		{"1025 properties", giForm("k1", props(1025)), 400, ErrTextInvalidGroupIdentify},
		{"1 MB", giForm("k1", `[{"group_type":"a","group_value":"`+strings.Repeat("x", 1_000_000)+`"}]`), 413, ErrTextTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := wiretest.Post(t, base+"/groupidentify", tc.body, "Content-Type", formCT)
			if a.Status != tc.status {
				t.Fatalf("status %d, want %d: %s", a.Status, tc.status, a.Body)
			}
			if tc.err != "" && a.JSON["error"] != tc.err {
				t.Fatalf("error %v, want %q", a.JSON["error"], tc.err)
			}
		})
	}
	got := readOut[[]GroupIdentify](t, s, "/sim/groupidentify?api_key="+"k1")
	if len(got) != 2+1024+1 || got[0].GroupValue != "acme" || got[1].GroupValue != "acme2" {
		t.Fatalf("stored %d, first %+v", len(got), got[0])
	}
	if s.Stats().GroupIdentifies != 4 {
		t.Fatalf("requests %d", s.Stats().GroupIdentifies)
	}
	var ctl []GroupIdentify
	wiretest.GetJSON(t, base+"/sim/groupidentify?api_key=k1", &ctl)
	if len(ctl) != len(got) {
		t.Fatalf("control route %d, want %d", len(ctl), len(got))
	}
}

func TestGroupIdentifyReject(t *testing.T) {
	s, base := start(t, Config{})
	s.Knobs(func(k *Knobs) { k.RejectedGroupValues["bad"] = true })
	body := giForm("k", `[{"group_type":"a","group_value":"ok"}]`)
	if a := wiretest.Post(t, base+"/groupidentify", giForm("k", `[{"group_type":"a","group_value":"ok"},{"group_type":"a","group_value":"bad"}]`), "Content-Type", formCT); a.Status != 400 {
		t.Fatalf("rejected value: %d", a.Status)
	}
	if a := wiretest.Post(t, base+"/groupidentify", body, "Content-Type", formCT); a.Status != 200 {
		t.Fatalf("accepted value: %d", a.Status)
	}
	if n := len(readOut[[]GroupIdentify](t, s, "/sim/groupidentify?api_key="+"k")); n != 1 {
		t.Fatalf("stored %d, want 1", n)
	}
}

// TestFormFieldPrecedence: a field in both the body and the query is the
// body's for /groupidentify and the query's for /usermap.
func TestFormFieldPrecedence(t *testing.T) {
	s, base := start(t, Config{APIKeys: []string{"kb", "kq"}})
	ident := `[{"group_type":"org","group_value":"acme"}]`
	if a := wiretest.Post(t, base+"/groupidentify?api_key=kq", giForm("kb", ident), "Content-Type", formCT); a.Status != 200 {
		t.Fatalf("groupidentify: %d %s", a.Status, a.Body)
	}
	if n, m := len(readOut[[]GroupIdentify](t, s, "/sim/groupidentify?api_key=kb")), len(readOut[[]GroupIdentify](t, s, "/sim/groupidentify?api_key=kq")); n != 1 || m != 0 {
		t.Errorf("groupidentify stored for the body's key %d, the query's %d (want 1, 0)", n, m)
	}
	body := url.Values{"api_key": {"kb"}, "mapping": {`[{"user_id":"u1","global_user_id":"g"}]`}}.Encode()
	if a := wiretest.Post(t, base+"/usermap?api_key=kq", []byte(body), "Content-Type", formCT); a.Status != 200 {
		t.Fatalf("usermap: %d %s", a.Status, a.Body)
	}
	if um := readOut[UserMapState](t, s, "/sim/usermap"); len(um.Calls) != 1 || um.Calls[0].KeyLabel != KeyLabel("kq") {
		t.Errorf("usermap calls %+v, want one of the query's key %s", um.Calls, KeyLabel("kq"))
	}
}

// refuseAll is a Faults that answers every request 503 without handling it.
type refuseAll struct{}

func (refuseAll) Serve(x *Exchange) {
	x.Describe()
	x.Rec.Fault, x.Rec.Status = "status", http.StatusServiceUnavailable
	x.Log()
	x.W.WriteHeader(x.Rec.Status)
}

func (refuseAll) Routes(*Sim, *http.ServeMux) {}

// TestFormRecordOfUnhandled: a form request failed without being handled
// is logged with the key label and item count its body gives.
func TestFormRecordOfUnhandled(t *testing.T) {
	s, base := start(t, Config{Faults: refuseAll{}})
	wiretest.Post(t, base+"/groupidentify", giForm("k1", `[{"group_type":"a","group_value":"b"},{}]`), "Content-Type", formCT)
	body := url.Values{"api_key": {"k2"}, "mapping": {`[{"user_id":"u1","global_user_id":"g"}]`}}.Encode()
	wiretest.Post(t, base+"/usermap", []byte(body), "Content-Type", formCT)
	reqs := s.Requests()
	if len(reqs) != 2 || reqs[0].KeyLabel != KeyLabel("k1") || reqs[0].Events != 2 || reqs[1].KeyLabel != KeyLabel("k2") || reqs[1].Events != 1 {
		t.Errorf("records %+v: want k1's 2 items, k2's 1", reqs)
	}
}
