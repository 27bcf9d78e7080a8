package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/event"
)

// The relay (internal/event) must reject exactly what the upstream rejects,
// with the same status and body; the sim is our upstream, with a validator
// written independently on top of encoding/json. TestAgree and FuzzAgree run
// both on the same bodies and require the same verdict, the same error body
// (compared as decoded JSON), and for an accepted body the same api_key,
// events (byte for byte) and ids after min_id_length.
//
// The one rule they do not share is the upstream's "under 2000 events": the
// relay takes any number of events and re-batches them, so validate runs
// here with no event limit.

// agreeCases are the points the document leaves open, as the lead decided
// them, and the edges around them.
var agreeCases = []struct{ name, body string }{
	// 1. neither id: missing user_id and device_id
	{"no ids", `{"api_key":"k","events":[{"event_type":"e"}]}`},
	{"null and empty ids", `{"api_key":"k","events":[{"event_type":"e","user_id":null,"device_id":""}]}`},
	// 2. ids removed by min_id_length: invalid in the removed field(s)
	{"short user", `{"api_key":"k","events":[{"event_type":"e","user_id":"abcd"}]}`},
	{"short both", `{"api_key":"k","events":[{"event_type":"e","user_id":"abcd","device_id":"abc"}]}`},
	{"short device, empty user", `{"api_key":"k","events":[{"event_type":"e","user_id":"","device_id":"abc"}]}`},
	{"short user, typed-wrong device", `{"api_key":"k","events":[{"event_type":"e","user_id":"abc","device_id":[]}]}`},
	{"short user, all-zero device", `{"api_key":"k","events":[{"event_type":"e","user_id":"abc","device_id":"0-0"}]}`},
	{"short after options", `{"api_key":"k","events":[{"event_type":"e","user_id":"abcdef"}],"options":{"min_id_length":7}}`},
	{"short in runes", `{"api_key":"k","events":[{"event_type":"e","user_id":"\u00e9\ud83d\ude00\u00e9\ud800"}]}`},
	{"invalid utf8 runes", "{\"api_key\":\"k\",\"events\":[{\"event_type\":\"e\",\"user_id\":\"\xff\xfe\xfd\xfc\"}]}"},
	{"invalid utf8 runes ok", "{\"api_key\":\"k\xff\",\"events\":[{\"event_type\":\"e\",\"user_id\":\"\xff\xfe\xfd\xfc\xfb\"}]}"},
	{"min_id_length 0", `{"api_key":"k","events":[{"event_type":"e","device_id":"d"}],"options":{"min_id_length":0}}`},
	{"min_id_length -0", `{"api_key":"k","events":[{"event_type":"e","device_id":"d"}],"options":{"min_id_length":-0}}`},
	// 3. missing and invalid together
	{"missing and invalid", `{"api_key":"k","events":[{"user_id":"user1","time":"x"},{"event_type":"e"}]}`},
	{"missing type and short id", `{"api_key":"k","events":[{"user_id":"0"}]}`},
	// 4. bad options / min_id_length: invalid JSON body, before api_key
	{"options string", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":"x"}`},
	{"options before api_key", `{"options":[],"events":5}`},
	{"min_id_length float", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"min_id_length":5.0}}`},
	{"min_id_length int32 max", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"min_id_length":2147483647}}`},
	{"min_id_length int32 max+1", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"min_id_length":2147483648}}`},
	{"min_id_length beyond int64", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"min_id_length":99999999999999999999}}`},
	{"min_id_length bad then good", `{"api_key":"k","events":[{"event_type":"e","user_id":"ab"}],"options":{"min_id_length":"x","min_id_length":2}}`},
	{"min_id_length fully escaped", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"\u006d\u0069\u006e\u005f\u0069\u0064\u005f\u006c\u0065\u006e\u0067\u0074\u0068":"x"}}`},
	{"min_id_length fully escaped, applied", `{"api_key":"k","events":[{"event_type":"e","user_id":"ab"}],"options":{"\u006d\u0069\u006e\u005f\u0069\u0064\u005f\u006c\u0065\u006e\u0067\u0074\u0068":2}}`},
	{"options bad then null", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":1,"options":null}`},
	// 5. api_key: absent, null, "" missing; other types invalid
	{"api_key number", `{"api_key":5,"events":[{"event_type":"e","user_id":"user1"}]}`},
	{"api_key false", `{"api_key":false}`},
	{"api_key object before missing events", `{"api_key":{}}`},
	{"api_key empty", `{"api_key":"","events":[{"event_type":"e","user_id":"user1"}]}`},
	{"api_key escaped", `{"api_key":"\u006b","events":[{"event_type":"e","user_id":"user1"}]}`},
	{"api_key duplicate", `{"api_key":1,"api_key":"k","events":[{"event_type":"e","user_id":"user1"}]}`},
	{"api_key escaped name", `{"api\u005fkey":1,"events":[{"event_type":"e","user_id":"user1"}]}`},
	// 6. events: absent, null, [] missing; other types invalid
	{"events object", `{"api_key":"k","events":{"event_type":"e","user_id":"user1"}}`},
	{"events number", `{"api_key":"k","events":0}`},
	{"events empty with space", `{"api_key":"k","events":[ ]}`},
	{"events duplicate", `{"api_key":"k","events":"x","events":[{"event_type":"e","user_id":"user1"}]}`},
	{"element not object", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"},"x"]}`},
	{"element not object after field error", `{"api_key":"k","events":[{"time":"x"},null]}`},
	// 7. whitespace: JSON's only
	{"spaces", "  "},
	{"json whitespace", " \t\r\n"},
	{"vertical tab", "\v"},
	{"form feed", "\f"},
	{"no-break space", "\u00a0"},
	{"next line", "\u0085"},
	{"form feed around object", "\f{\"api_key\":\"k\",\"events\":[{\"event_type\":\"e\",\"user_id\":\"user1\"}]}\f"},
	{"nbsp after object", "{\"api_key\":\"k\",\"events\":[{\"event_type\":\"e\",\"user_id\":\"user1\"}]}\u00a0"},
	{"json whitespace around object", "\r\n {\"api_key\":\"k\",\"events\":[{\"event_type\":\"e\",\"user_id\":\"user1\"}]}\t\n"},
	{"nul byte", "\x00"},
	// 8. depth: event_properties and user_properties only
	{"group_properties deep", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","group_properties":` + tooDeep + `}]}`},
	{"event_properties deep", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","event_properties":` + tooDeep + `}]}`},
	{"user_properties 40", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","user_properties":` + deep + `}]}`},
	{"depth with brackets in strings", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","event_properties":{"a":"[[[[\"{{{{\\"}}}"}}]}`},
	// other edges of both validators
	{"escaped field names", `{"api_key":"k","events":[{"event\u005ftype":"e","user\u005fid":"user1","ti\u006de":"x"}]}`},
	{"duplicate fields", `{"api_key":"k","events":[{"event_type":5,"event_type":"e","user_id":"user1","time":1,"time":"x"}]}`},
	{"time -0", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":-0}]}`},
	{"time 1E3", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":1E3}]}`},
	{"quantity int64 min", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","quantity":-9223372036854775808}]}`},
	{"quantity below int64", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","quantity":-9223372036854775809}]}`},
	{"all-zero escaped device", `{"api_key":"k","events":[{"event_type":"e","device_id":"\u0030\u002d0"}]}`},
	{"lone surrogate id", `{"api_key":"k","events":[{"event_type":"e","device_id":"\udc00abcd"}]}`},
	{"invalid JSON after field errors", `{"api_key":"k","events":[{"time":"x"}],}`},
	{"top-level not object", ` [{"api_key":"k"}]`},
	{"2000 events pass", `{"api_key":"k","events":[` + strings.Repeat(`{"event_type":"e","user_id":"user1"},`, 1999) + `{"event_type":"e","user_id":"user1"}]}`},
}

// agreeBodies are every body of both packages' validation tables and the
// seeds of their fuzz targets.
func agreeBodies(t testing.TB) [][]byte {
	t.Helper()
	var bodies [][]byte
	for _, c := range agreeCases {
		bodies = append(bodies, []byte(c.body))
	}
	for _, c := range validationCases {
		bodies = append(bodies, []byte(c.body))
	}
	for _, s := range validateSeeds {
		bodies = append(bodies, []byte(s))
	}

	// internal/event's TestParse table, written out by its TestBodiesFile.
	f, err := os.Open("../event/testdata/validation-bodies.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		_, quoted, ok := strings.Cut(line, "\t")
		body, err := strconv.Unquote(quoted)
		if !ok || err != nil {
			t.Fatalf("bad line %.80q: %v", line, err)
		}
		bodies = append(bodies, []byte(body))
		n++
	}
	if err := sc.Err(); err != nil || n < 50 {
		t.Fatalf("read %d bodies of event's table: %v", n, err)
	}

	// internal/event's FuzzParse corpus (go test fuzz v1, one []byte).
	files, _ := filepath.Glob("../event/testdata/fuzz/FuzzParse/*")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		_, arg, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		body, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(arg, "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		bodies = append(bodies, []byte(body))
	}
	return bodies
}

func TestAgree(t *testing.T) {
	var req event.Request
	for _, body := range agreeBodies(t) {
		checkAgree(t, body, &req)
	}
}

func FuzzAgree(f *testing.F) {
	for _, body := range agreeBodies(f) {
		// Huge seeds (10000-deep nesting, 2000 events) stall mutation and
		// minimization; TestAgree runs them.
		if len(body) <= 4<<10 {
			f.Add(body)
		}
	}
	var req event.Request
	f.Fuzz(func(t *testing.T, body []byte) {
		checkAgree(t, body, &req)
	})
}

// FuzzAgreeEvents fuzzes events and options inside a fixed envelope, so that
// mutations are spent on event fields rather than on the framing.
func FuzzAgreeEvents(f *testing.F) {
	f.Add([]byte(`{"event_type":"e","user_id":"user1","time":1,"event_properties":{"a":[1]}}`), []byte(`{"min_id_length":5}`))
	f.Add([]byte(`{"event_type":"e","user_id":"ab\u00e9","device_id":"0-0"},{"device_id":"abc","user_id":""}`), []byte(`{"min_id_length":3}`))
	f.Add([]byte(`{"event_type":"$groupidentify","device_id":"dev-1","groups":{"a":"b"},"group_properties":`+tooDeep+`}`), []byte(`null`))
	f.Add([]byte(`{"user_id":"user1","price":"1","quantity":1.5,"$skip_user_properties_sync":1,"plan":[]},{}`), []byte(`{}`))
	f.Add([]byte(`{"event\u005ftype":5,"event_type":"e","user_id":null,"device_id":"d\ud800vice"}`), []byte(`{"min_id_length":-0}`))
	var req event.Request
	f.Fuzz(func(t *testing.T, events, options []byte) {
		body := make([]byte, 0, len(events)+len(options)+64)
		body = append(body, `{"api_key":"k","events":[`...)
		body = append(body, events...)
		body = append(body, `],"options":`...)
		body = append(body, options...)
		body = append(body, '}')
		checkAgree(t, body, &req)
	})
}

// checkAgree fails t unless event.Parse and validate agree on body.
func checkAgree(t testing.TB, body []byte, req *event.Request) {
	t.Helper()
	perr := event.Parse(body, req)
	env, verr := validate(body, nil, math.MaxInt)
	var relay, sim []byte
	if perr != nil {
		relay = perr.AppendJSON(nil)
	}
	if verr != nil {
		sim = appendJSON(nil, verr)
	}
	show := func() string {
		return "\nbody  " + strconv.Quote(string(truncate(body))) +
			"\nrelay " + orAccepted(relay) + "\nsim   " + orAccepted(sim)
	}
	if (perr == nil) != (verr == nil) {
		t.Fatalf("verdicts differ:%s", show())
	}
	if perr != nil {
		if perr.Status != verr.Code {
			t.Fatalf("status %d, sim %d:%s", perr.Status, verr.Code, show())
		}
		var r, s any
		if err := json.Unmarshal(relay, &r); err != nil {
			t.Fatalf("relay's error body: %v:%s", err, show())
		}
		if err := json.Unmarshal(sim, &s); err != nil {
			t.Fatalf("sim's error body: %v:%s", err, show())
		}
		if !reflect.DeepEqual(r, s) {
			t.Fatalf("error bodies differ:%s", show())
		}
		return
	}

	// Accepted by both: the same request as far as delivery goes.
	if decoded(req.APIKey) != env.apiKey {
		t.Fatalf("api_key %q, sim %q:%s", req.APIKey, env.apiKey, show())
	}
	if len(req.Events) != len(env.raw) || len(env.raw) != len(env.info) {
		t.Fatalf("%d events, sim %d:%s", len(req.Events), len(env.raw), show())
	}
	for i := range req.Events {
		e, info := &req.Events[i], &env.info[i]
		if !bytes.Equal(e.Raw, env.raw[i]) {
			t.Fatalf("event %d: raw %q, sim %q:%s", i, truncate(e.Raw), truncate(env.raw[i]), show())
		}
		if decoded(e.DeviceID) != info.deviceID || decoded(e.UserID) != info.userID {
			t.Fatalf("event %d: ids %q %q, sim %q %q:%s", i, e.DeviceID, e.UserID, info.deviceID, info.userID, show())
		}
	}
}

// decoded is the string encoding/json makes of bytes Parse keeps raw (each
// invalid UTF-8 byte becomes U+FFFD).
func decoded(b []byte) string { return string([]rune(string(b))) }

func orAccepted(b []byte) string {
	if b == nil {
		return "<accepted>"
	}
	return string(b)
}

func truncate(b []byte) []byte {
	if len(b) > 300 {
		return append(b[:300:300], "..."...)
	}
	return b
}
