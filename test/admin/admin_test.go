package admin

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// Keys the sim accepts besides the projects' (it refuses every other key
// with "Invalid API key").
const (
	keySilenced = "k-silenced"
	keyOther    = "k-other"
	keyPaused   = "k-paused"
	keyInvalid  = "k-invalid" // not in the sim's list
)

type deadLetter struct {
	ID       uint64         `json:"id"`
	Lane     string         `json:"lane"`
	Kind     string         `json:"kind"`
	Reason   string         `json:"reason"`
	Answer   string         `json:"answer"`
	Accepted time.Time      `json:"accepted"`
	Died     time.Time      `json:"died"`
	Data     map[string]any `json:"data"`
}

type deadList struct {
	DeadLetters []deadLetter `json:"dead_letters"`
	NextAfter   uint64       `json:"next_after"`
	More        bool         `json:"more"`
	Total       int64        `json:"total"`
}

type lane struct {
	Label        string  `json:"label"`
	Kind         string  `json:"kind"`
	Records      int64   `json:"records"`
	Chunks       int64   `json:"chunks"`
	Bytes        int64   `json:"bytes"`
	OldestAge    float64 `json:"oldest_age_seconds"`
	Controllable bool    `json:"controllable"`
	Running      bool    `json:"running"`
	Stopped      bool    `json:"stopped"`
	StopReason   string  `json:"stop_reason"`
	PausedKeys   int64   `json:"paused_keys"`
}

// TestAdmin runs one relay binary with an admin token and a credentials file
// against the sim and checks, over real HTTP, the token on every route, the
// credential injection and pass-through, the dead-letter and lane routes, and
// finally that no secret reached the logs or any answer.
func TestAdmin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the relay binary")
	}
	s, simURL := forwardtest.StartSim(t, sim.Config{
		APIKeys:         []string{projAPIKey, proj2APIKey, keySilenced, keyOther, keyPaused},
		ThrottlePenalty: -1,
	})
	simtest.SetSecretKey(s, projAPIKey, projSecret)
	simtest.SetSecretKey(s, proj2APIKey, proj2Secret)
	rec1, rec1URL := startHeaderRecorder(t, simURL) // --analytics-url
	rec2, rec2URL := startHeaderRecorder(t, simURL) // web-eu's analytics_url override
	dir := t.TempDir()
	creds, tokenFile := writeFiles(t, dir, rec2URL)
	log := &syncBuf{}
	r := startRelay(t, dir+"/data", log,
		"--ingest-url", simURL, "--alias-url", simURL, "--analytics-url", rec1URL,
		"--credentials", creds, "--admin-token-file", tokenFile)

	t.Run("auth", func(t *testing.T) { testAuth(t, r, s, rec1, rec2) })
	t.Run("deadletters", func(t *testing.T) { testDeadLetters(t, r, s) })
	t.Run("deadletters of every kind", func(t *testing.T) { testDeadKinds(t, r, s) })
	t.Run("lanes", func(t *testing.T) { testLanes(t, r, s) })
	t.Run("no secrets", func(t *testing.T) { testNoSecrets(t, r, s) })
}

func testAuth(t *testing.T, r *relay, s *simtest.Sim, rec1, rec2 *headerRecorder) {
	// The open routes.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if a := call(t, "GET", r.admin+p, ""); a.status != 200 {
			t.Errorf("GET %s without token: %d", p, a.status)
		}
	}

	gi := form("api_key", projAPIKey, "identification",
		`[{"group_type":"org","group_value":"auth-test","group_properties":{"$set":{"plan":"gold"}}}]`)
	um := "/usermap?" + form("api_key", projAPIKey, "mapping", `{"user_id":"auth-u1","global_user_id":"auth-g1"}`)
	own := []struct {
		method, path, body string
		hdr                []string
		want               int
	}{
		{"GET", "/debug/pprof/", "", nil, 200},
		{"GET", "/debug/pprof/cmdline", "", nil, 200},
		{"GET", "/relay/v1/deadletters", "", nil, 200},
		{"POST", "/relay/v1/deadletters/replay", `{"ids":[999999]}`, nil, 200},
		{"POST", "/relay/v1/deadletters/purge", `{"ids":[999999]}`, nil, 200},
		{"GET", "/relay/v1/lanes", "", nil, 200},
		{"GET", "/relay/v1/lanes/nope", "", nil, 404},
		{"POST", "/relay/v1/lanes/nope/pause", "", nil, 404},
		{"POST", "/relay/v1/lanes/nope/resume", "", nil, 404},
		{"POST", "/groupidentify", gi, []string{"Content-Type", formType}, 200},
		{"POST", um, "", nil, 200},
	}
	for _, rt := range own {
		name := rt.method + " " + strings.SplitN(rt.path, "?", 2)[0]
		t.Run(name, func(t *testing.T) {
			try := func(want int, hdr ...string) answer {
				t.Helper()
				a := call(t, rt.method, r.admin+rt.path, rt.body, append(slices.Clone(rt.hdr), hdr...)...)
				if a.status != want {
					t.Errorf("%v: %d %.200s, want %d", hdr, a.status, a.body, want)
				}
				return a
			}
			if a := try(401); a.header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			try(403, "Authorization", bearer(wrongToken))
			try(401, "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(projAPIKey+":"+projSecret)))
			try(rt.want, "Authorization", bearer(adminToken))
			try(rt.want, "Proxy-Authorization", bearer(adminToken))
		})
	}

	// The forwarding route: GET /api/2/usermap against the sim, which checks
	// Basic auth.
	polltest.Until(t, "the mapping of auth-u1 at the sim", func() bool {
		g, ok := simtest.MappedTo(s, projAPIKey, "auth-u1")
		return ok && g == "auth-g1"
	})
	read := "/api/2/usermap?user_ids=auth-u1"
	basic := func(k, sec string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(k+":"+sec))
	}
	fwd := func(want int, hdr ...string) answer {
		t.Helper()
		a := call(t, "GET", r.admin+read, "", hdr...)
		if a.status != want {
			t.Errorf("GET /api/2/usermap %v: %d %.200s, want %d", redactHdr(hdr), a.status, a.body, want)
		}
		return a
	}
	n0 := len(simtest.MappingReads(s))
	if a := fwd(401); a.header.Get("Proxy-Authenticate") == "" {
		t.Error("forwarding 401 without Proxy-Authenticate")
	}
	fwd(403, "Proxy-Authorization", bearer(wrongToken))
	// The caller's own Authorization is not the admin token slot here.
	fwd(401, "Authorization", bearer(adminToken))
	fwd(403, "Authorization", bearer(wrongToken), "X-Relay-Project", projectName)
	if got := len(simtest.MappingReads(s)); got != n0 {
		t.Fatalf("%d refused requests reached the sim", got-n0)
	}

	// Pass-through: the caller's Basic auth reaches the upstream untouched,
	// the admin token does not.
	a := fwd(200, "Proxy-Authorization", bearer(adminToken), "Authorization", basic(projAPIKey, projSecret))
	if !strings.Contains(string(a.body), "auth-g1") {
		t.Errorf("pass-through answer %s lacks the mapping", a.body)
	}
	h := rec1.last()
	if h.Get("Authorization") != basic(projAPIKey, projSecret) || h.Get("Proxy-Authorization") != "" {
		t.Errorf("pass-through upstream saw Authorization set=%v, Proxy-Authorization set=%v", h.Get("Authorization") != "", h.Get("Proxy-Authorization") != "")
	}
	// A wrong secret of the caller's own is the upstream's 401, passed back.
	if a := fwd(401, "Proxy-Authorization", bearer(adminToken), "Authorization", basic(projAPIKey, "nope")); !strings.Contains(string(a.body), "Invalid credentials") {
		t.Errorf("upstream 401 not passed back: %s", a.body)
	}

	// Injection: X-Relay-Project names the project, the admin token travels
	// in Authorization (or Proxy-Authorization).
	for _, tokHdr := range []string{"Authorization", "Proxy-Authorization"} {
		fwd(200, tokHdr, bearer(adminToken), "X-Relay-Project", projectName)
		h = rec1.last()
		if h.Get("Authorization") != basic(projAPIKey, projSecret) {
			t.Errorf("%s: upstream did not get the project's Basic credentials", tokHdr)
		}
		if h.Get("Proxy-Authorization") != "" || h.Get("X-Relay-Project") != "" {
			t.Errorf("%s: upstream saw Proxy-Authorization or X-Relay-Project", tokHdr)
		}
	}
	// The second project's analytics_url override.
	n2 := rec2.count()
	fwd(200, "Authorization", bearer(adminToken), "X-Relay-Project", project2Name)
	if rec2.count() != n2+1 || rec2.last().Get("Authorization") != basic(proj2APIKey, proj2Secret) {
		t.Error("web-eu's request did not go to its analytics_url with its credentials")
	}
	// An unknown project is refused before anything is sent.
	n1 := rec1.count()
	if a := fwd(400, "Authorization", bearer(adminToken), "X-Relay-Project", "nope"); rec1.count() != n1 {
		t.Errorf("unknown project forwarded: %s", a.body)
	}
	reads := simtest.MappingReads(s)
	for _, rd := range reads[n0:] {
		if rd.Status == 200 && rd.User != sim.KeyLabel(projAPIKey) && rd.User != sim.KeyLabel(proj2APIKey) {
			t.Errorf("sim read by %s", rd.User)
		}
	}

	// The admin token, whatever scheme carries it in
	// Authorization, never reaches the upstream.
	for _, v := range []string{"Token " + adminToken, basic(adminToken, "x"), basic("user", adminToken), adminToken} {
		n := rec1.count()
		call(t, "GET", r.admin+read, "", "Proxy-Authorization", bearer(adminToken), "Authorization", v)
		if rec1.count() != n+1 {
			t.Fatalf("pass-through call not forwarded")
		}
		if got := rec1.last(); got.Get("Authorization") != "" || got.Get("Proxy-Authorization") != "" {
			t.Errorf("the admin token in Authorization (%s) reached the upstream", strings.Fields(redactHdr([]string{"", v})[1])[0])
		}
	}
	// Routing and forwarding see one path; an encoded traversal
	// is refused locally and reaches no upstream.
	n1 = rec1.count()
	for _, p := range []string{
		"/scim/1/Users/..%2F..%2F..%2Fapi%2F2%2Fexport?start=20260101T00&end=20260101T01",
		"/api/2/deletions/users%2F..%2F..%2F..%2Fapi%2F2%2Fexport?start=20260101T00&end=20260101T01",
		"/api/2/usermap%2F..%2Fexport?start=20260101T00&end=20260101T01",
	} {
		if a := call(t, "GET", r.admin+p, "", "Authorization", bearer(adminToken), "X-Relay-Project", projectName); a.status != 400 ||
			!strings.Contains(string(a.body), `"source":"relay"`) {
			t.Errorf("GET %s: %d %.200s, want the relay's 400", p, a.status, a.body)
		}
	}
	if rec1.count() != n1 {
		t.Errorf("an encoded traversal reached the upstream")
	}
}

func redactHdr(hdr []string) []string {
	out := slices.Clone(hdr)
	for i := 1; i < len(out); i += 2 {
		for _, sec := range append(secrets, wrongToken) {
			out[i] = strings.ReplaceAll(out[i], sec, "<secret>")
		}
		if strings.HasPrefix(out[i], "Basic ") {
			out[i] = "Basic <credentials>"
		}
	}
	return out
}

// listDead lists dead letters with the query q and wants 200.
func listDead(t *testing.T, r *relay, q string) deadList {
	t.Helper()
	a := r.own("GET", "/relay/v1/deadletters?"+q, "")
	if a.status != 200 {
		t.Fatalf("list %s: %d %s", q, a.status, a.body)
	}
	var l deadList
	decode(t, a, &l)
	return l
}

func insertIDs(evs []sim.Ingested) []string {
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.InsertID)
	}
	slices.Sort(ids)
	return ids
}

func testDeadLetters(t *testing.T, r *relay, s *simtest.Sim) {
	simtest.Silence(s, "dev-s1")
	simtest.Silence(s, "dev-s2")
	var want1, want2 []string
	var evs1, evs2 []string
	for i := range 5 {
		id := fmt.Sprintf("s1-%d", i)
		want1, evs1 = append(want1, id), append(evs1, event("dev-s1", id))
	}
	for i := range 3 {
		id := fmt.Sprintf("s2-%d", i)
		want2, evs2 = append(want2, id), append(evs2, event("dev-s2", id))
	}
	r.postEvents(keySilenced, append(evs1, event("dev-ok", "ok-1"))...)
	r.postEvents(keyOther, evs2...)
	polltest.Until(t, "8 silenced dead letters", func() bool {
		return len(listDead(t, r, "reason=silenced").DeadLetters) == 8
	})
	// ok-1 is resent after the silenced ones are committed as dead letters
	// (delivery dropAndResend): wait for it rather than race it.
	polltest.Until(t, "ok-1 delivered", func() bool { return len(s.Events(keySilenced)) > 0 })
	if got := s.Events(keySilenced); len(got) != 1 || got[0].InsertID != "ok-1" {
		t.Fatalf("the sim got %d events of %s, want only ok-1", len(got), keySilenced)
	}

	// Paging: 3 + 3 + 2, ids increasing, cursors chained.
	var all []deadLetter
	after := uint64(0)
	for page := 0; ; page++ {
		l := listDead(t, r, fmt.Sprintf("reason=silenced&limit=3&after=%d", after))
		all = append(all, l.DeadLetters...)
		if page < 2 && (!l.More || len(l.DeadLetters) != 3) || page == 2 && (l.More || len(l.DeadLetters) != 2) {
			t.Fatalf("page %d: %d items, more %v", page, len(l.DeadLetters), l.More)
		}
		if len(l.DeadLetters) > 0 && l.NextAfter != l.DeadLetters[len(l.DeadLetters)-1].ID {
			t.Fatalf("next_after %d is not the last id", l.NextAfter)
		}
		if l.Total < 8 {
			t.Fatalf("total %d", l.Total)
		}
		after = l.NextAfter
		if !l.More {
			break
		}
	}
	if !slices.IsSortedFunc(all, func(a, b deadLetter) int { return int(a.ID) - int(b.ID) }) || len(all) != 8 {
		t.Fatalf("paged ids not increasing or not 8: %v", all)
	}
	labels := map[string]string{} // device -> lane label
	for _, d := range all {
		dev, _ := d.Data["device_id"].(string)
		if d.Kind != "events" || d.Reason != "silenced" || !strings.HasPrefix(d.Answer, "HTTP 400") ||
			d.Accepted.IsZero() || d.Died.Before(d.Accepted) || d.Data["insert_id"] == nil || !strings.HasPrefix(d.Lane, "events-") {
			t.Fatalf("dead letter %+v", d)
		}
		if l, ok := labels[dev]; ok && l != d.Lane {
			t.Fatalf("device %s in two lanes", dev)
		}
		labels[dev] = d.Lane
	}
	lane1, lane2 := labels["dev-s1"], labels["dev-s2"]
	if lane1 == "" || lane2 == "" || lane1 == lane2 {
		t.Fatalf("lanes %q %q", lane1, lane2)
	}
	if l := listDead(t, r, "lane="+lane1); len(l.DeadLetters) != 5 {
		t.Fatalf("lane filter: %d, want 5", len(l.DeadLetters))
	}
	if l := listDead(t, r, "lane="+lane2+"&reason=silenced"); len(l.DeadLetters) != 3 {
		t.Fatalf("lane+reason filter: %d, want 3", len(l.DeadLetters))
	}
	if l := listDead(t, r, "reason=nope"); len(l.DeadLetters) != 0 || l.More {
		t.Fatalf("reason=nope: %+v", l)
	}
	for q, want := range map[string]int{"lane=events-00000000": 404, "limit=0": 400, "limit=abc": 400, "limit=1001": 400, "after=-1": 400, "frobnicate=1": 400} {
		if a := r.own("GET", "/relay/v1/deadletters?"+q, ""); a.status != want {
			t.Errorf("list %s: %d %s, want %d", q, a.status, a.body, want)
		}
	}
	for body, want := range map[string]int{
		`{}`:                                    400,
		`{"ids":[1],"filter":{}}`:               400,
		`{"ids":[]}`:                            400,
		`{"filter":{"lane":"events-00000000"}}`: 404,
		`{"ids":[1],"api_key":"a\nb"}`:          400,
		`{"ids":[1],"api_key":" padded"}`:       400,
		`{"ids":[1],"nope":1}`:                  400,
		`not json`:                              400,
		`{"ids":[1],"limit":-1}`:                400,
	} {
		if a := r.own("POST", "/relay/v1/deadletters/replay", body); a.status != want {
			t.Errorf("replay %s: %d %s, want %d", body, a.status, a.body, want)
		}
	}
	if a := r.own("POST", "/relay/v1/deadletters/purge", `{"ids":[1],"api_key":"x"}`); a.status != 400 {
		t.Errorf("purge with api_key: %d", a.status)
	}

	// Replay lane 1 under a corrected api_key (one of the credentials file:
	// it must not show in any answer or log).
	simtest.Unsilence(s, "dev-s1")
	simtest.Unsilence(s, "dev-s2")
	a := r.own("POST", "/relay/v1/deadletters/replay", fmt.Sprintf(`{"filter":{"lane":%q},"api_key":%q}`, lane1, projAPIKey))
	var rp struct {
		Replayed int `json:"replayed"`
		Lanes    []struct {
			Lane    string `json:"lane"`
			Kind    string `json:"kind"`
			Records int    `json:"records"`
		} `json:"lanes"`
		NotFound []uint64 `json:"not_found"`
		More     bool     `json:"more"`
	}
	decode(t, a, &rp)
	if a.status != 200 || rp.Replayed != 5 || len(rp.Lanes) != 1 || rp.Lanes[0].Records != 5 || rp.Lanes[0].Kind != "events" || rp.Lanes[0].Lane == lane1 || rp.More {
		t.Fatalf("replay lane 1: %d %s", a.status, a.body)
	}
	polltest.Until(t, "the replayed events under the corrected key", func() bool {
		return len(s.Events(projAPIKey)) >= 5
	})
	if got := insertIDs(s.Events(projAPIKey)); !slices.Equal(got, want1) {
		t.Fatalf("sim got %v under the corrected key, want %v", got, want1)
	}
	if l := listDead(t, r, "lane="+lane1); len(l.DeadLetters) != 0 {
		t.Fatalf("%d dead letters left in lane 1 after replay", len(l.DeadLetters))
	}

	// Replay lane 2 by ids under its own key; an unknown id is reported.
	var ids []string
	for _, d := range all {
		if d.Lane == lane2 {
			ids = append(ids, fmt.Sprint(d.ID))
		}
	}
	a = r.own("POST", "/relay/v1/deadletters/replay", fmt.Sprintf(`{"ids":[%s,999999]}`, strings.Join(ids, ",")))
	decode(t, a, &rp)
	if a.status != 200 || rp.Replayed != 3 || !slices.Equal(rp.NotFound, []uint64{999999}) || len(rp.Lanes) != 1 || rp.Lanes[0].Lane != lane2 {
		t.Fatalf("replay by ids: %d %s", a.status, a.body)
	}
	polltest.Until(t, "the replayed events of lane 2", func() bool { return len(s.Events(keyOther)) >= 3 })
	if got := insertIDs(s.Events(keyOther)); !slices.Equal(got, want2) {
		t.Fatalf("sim got %v, want %v", got, want2)
	}
	// Replaying the same ids again finds nothing: nothing is sent twice.
	a = r.own("POST", "/relay/v1/deadletters/replay", fmt.Sprintf(`{"ids":[%s]}`, strings.Join(ids, ",")))
	decode(t, a, &rp)
	if rp.Replayed != 0 || len(rp.NotFound) != 3 {
		t.Fatalf("second replay: %s", a.body)
	}

	// Purge: by ids (an unknown id reported), then by filter.
	simtest.Silence(s, "dev-p")
	r.postEvents(keyOther, event("dev-p", "p-1"), event("dev-p", "p-2"))
	var dead []deadLetter
	polltest.Until(t, "2 dead letters to purge", func() bool {
		dead = listDead(t, r, "reason=silenced").DeadLetters
		return len(dead) == 2
	})
	var pg struct {
		Purged   int      `json:"purged"`
		NotFound []uint64 `json:"not_found"`
	}
	a = r.own("POST", "/relay/v1/deadletters/purge", fmt.Sprintf(`{"ids":[%d,999999]}`, dead[0].ID))
	decode(t, a, &pg)
	if a.status != 200 || pg.Purged != 1 || !slices.Equal(pg.NotFound, []uint64{999999}) {
		t.Fatalf("purge by id: %d %s", a.status, a.body)
	}
	a = r.own("POST", "/relay/v1/deadletters/purge", `{"filter":{"reason":"silenced"}}`)
	decode(t, a, &pg)
	if a.status != 200 || pg.Purged != 1 {
		t.Fatalf("purge by filter: %d %s", a.status, a.body)
	}
	if l := listDead(t, r, ""); len(l.DeadLetters) != 0 || l.Total != 0 {
		t.Fatalf("after purge: %+v", l)
	}
	simtest.Unsilence(s, "dev-p")
}

// testDeadKinds: group identifies and mappings the upstream refuses become
// dead letters of their kind; a replay sends them again (the sim refuses
// them again: new dead letters, the old ones gone, no loop).
func testDeadKinds(t *testing.T, r *relay, s *simtest.Sim) {
	simtest.RejectGroupValue(s, "rej-g")
	simtest.RejectUserID(s, "rej-u")
	if a := r.own("POST", "/groupidentify", form("api_key", keyOther, "identification",
		`[{"group_type":"org","group_value":"ok-g","group_properties":{"a":1}},{"group_type":"org","group_value":"rej-g","group_properties":{"a":2}}]`),
		"Content-Type", formType); a.status != 200 {
		t.Fatalf("groupidentify: %d %s", a.status, a.body)
	}
	if a := r.own("POST", "/usermap?"+form("api_key", keyOther, "mapping", `[{"user_id":"ok-u","global_user_id":"g"},{"user_id":"rej-u","global_user_id":"g"}]`), ""); a.status != 200 {
		t.Fatalf("usermap: %d %s", a.status, a.body)
	}
	var dead []deadLetter
	polltest.Until(t, "a dead letter of each kind", func() bool {
		dead = listDead(t, r, "").DeadLetters
		return len(dead) == 2
	})
	byKind := map[string]deadLetter{}
	for _, d := range dead {
		byKind[d.Kind] = d
	}
	gi, um := byKind["groupidentify"], byKind["usermap"]
	if gi.Data["group_value"] != "rej-g" || !strings.HasPrefix(gi.Lane, "groupidentify-") || gi.Reason == "" {
		t.Fatalf("groupidentify dead letter %+v", gi)
	}
	if um.Data["user_id"] != "rej-u" || !strings.HasPrefix(um.Lane, "usermap-") || um.Reason == "" {
		t.Fatalf("usermap dead letter %+v", um)
	}
	if g := simtest.GroupIdentifies(s, keyOther); len(g) != 1 || g[0].GroupValue != "ok-g" {
		t.Fatalf("sim group identifies %+v", g)
	}
	a := r.own("POST", "/relay/v1/deadletters/replay", `{"filter":{}}`)
	var rp struct {
		Replayed int `json:"replayed"`
	}
	if decode(t, a, &rp); a.status != 200 || rp.Replayed != 2 {
		t.Fatalf("replay: %d %s", a.status, a.body)
	}
	polltest.Until(t, "both to die again", func() bool {
		dead = listDead(t, r, "").DeadLetters
		return len(dead) == 2 && dead[0].ID > max(gi.ID, um.ID)
	})
	if a := r.own("POST", "/relay/v1/deadletters/purge", `{"filter":{}}`); a.status != 200 {
		t.Fatalf("purge: %d %s", a.status, a.body)
	}
}

func lanes(t *testing.T, r *relay) map[string]lane {
	t.Helper()
	a := r.own("GET", "/relay/v1/lanes", "")
	if a.status != 200 {
		t.Fatalf("lanes: %d %s", a.status, a.body)
	}
	var out struct {
		Lanes []lane `json:"lanes"`
	}
	decode(t, a, &out)
	m := map[string]lane{}
	for _, l := range out.Lanes {
		m[l.Label] = l
	}
	return m
}

// newLane posts events under key and returns the label of the lane that
// appeared.
func newLane(t *testing.T, r *relay, key string, events ...string) string {
	t.Helper()
	before := lanes(t, r)
	r.postEvents(key, events...)
	for l := range lanes(t, r) {
		if _, ok := before[l]; !ok {
			return l
		}
	}
	t.Fatal("no new lane")
	return ""
}

func testLanes(t *testing.T, r *relay, s *simtest.Sim) {
	label := newLane(t, r, keyPaused, event("dev-l", "l-0"))
	polltest.Until(t, "the first event of the paused lane", func() bool { return len(s.Events(keyPaused)) == 1 })

	a := r.own("POST", "/relay/v1/lanes/"+label+"/pause", "")
	var l lane
	decode(t, a, &l)
	if a.status != 200 || !l.Stopped || l.StopReason != "stopped by operator" || !l.Controllable || l.Kind != "events" {
		t.Fatalf("pause: %d %s", a.status, a.body)
	}
	r.postEvents(keyPaused, event("dev-l", "l-1"), event("dev-l", "l-2"), event("dev-l", "l-3"))
	time.Sleep(300 * time.Millisecond) // 15 flush intervals
	if n := len(s.Events(keyPaused)); n != 1 {
		t.Fatalf("paused lane delivered %d events", n)
	}
	if l := lanes(t, r)[label]; !l.Stopped || l.Records != 3 || l.Bytes <= 0 || l.OldestAge <= 0 {
		t.Fatalf("paused lane listed as %+v", l)
	}
	a = r.own("POST", "/relay/v1/lanes/"+label+"/resume", "")
	decode(t, a, &l)
	if a.status != 200 || l.Stopped {
		t.Fatalf("resume: %d %s", a.status, a.body)
	}
	polltest.Until(t, "the held events after resume", func() bool { return len(s.Events(keyPaused)) == 4 })
	polltest.Until(t, "the lane to drain", func() bool { return lanes(t, r)[label].Records == 0 })

	// An api_key the upstream refuses stops its lane; it is listed with the
	// reason (and its label, never the key), its records kept.
	bad := newLane(t, r, keyInvalid, event("dev-i", "i-0"))
	polltest.Until(t, "the invalid-key lane to stop", func() bool { return lanes(t, r)[bad].Stopped })
	if l := lanes(t, r)[bad]; l.StopReason != "invalid API key" || l.Records != 1 {
		t.Fatalf("invalid-key lane %+v", l)
	}
	if a := r.own("POST", "/relay/v1/lanes/"+bad+"/resume", ""); a.status != 200 {
		t.Fatalf("resume invalid-key lane: %d %s", a.status, a.body)
	}
	// The sim still refuses the key: it stops again, nothing is lost.
	polltest.Until(t, "the invalid-key lane to stop again", func() bool { return lanes(t, r)[bad].Stopped })
	if l := lanes(t, r)[bad]; l.Records != 1 {
		t.Fatalf("invalid-key lane lost its record: %+v", l)
	}

	// Group identify lanes pause and resume the same way.
	giLane := labelOf(t, storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: projAPIKey})
	if _, ok := lanes(t, r)[giLane]; !ok {
		t.Fatalf("groupidentify lane %s not listed", giLane)
	}
	polltest.Until(t, "the auth test's group identifies", func() bool { return len(simtest.GroupIdentifies(s, projAPIKey)) == 2 })
	a = r.own("POST", "/relay/v1/lanes/"+giLane+"/pause", "")
	if decode(t, a, &l); a.status != 200 || !l.Stopped || !l.Controllable {
		t.Fatalf("pause groupidentify lane: %d %s", a.status, a.body)
	}
	a = r.own("POST", "/groupidentify", form("api_key", projAPIKey, "identification",
		`{"group_type":"org","group_value":"paused","group_properties":{"plan":"x"}}`), "Content-Type", formType)
	if a.status != 200 {
		t.Fatalf("groupidentify: %d %s", a.status, a.body)
	}
	time.Sleep(300 * time.Millisecond) // 15 flush intervals: a delivery of the paused lane would show by now
	if n := len(simtest.GroupIdentifies(s, projAPIKey)); n != 2 {
		t.Fatalf("paused groupidentify lane delivered: %d", n)
	}
	if l := lanes(t, r)[giLane]; l.Records != 1 || !l.Stopped {
		t.Fatalf("paused groupidentify lane %+v", l)
	}
	if a := r.own("POST", "/relay/v1/lanes/"+giLane+"/resume", ""); a.status != 200 {
		t.Fatalf("resume groupidentify lane: %d %s", a.status, a.body)
	}
	polltest.Until(t, "the held group identify", func() bool { return len(simtest.GroupIdentifies(s, projAPIKey)) == 3 })

	// Unknown lanes and actions: 404.
	for _, p := range []string{"/relay/v1/lanes/" + label + "/frobnicate", "/relay/v1/lanes/events-00000000/pause"} {
		if a := r.own("POST", p, ""); a.status != 404 {
			t.Errorf("POST %s: %d", p, a.status)
		}
	}
	if a := r.own("GET", "/relay/v1/lanes/"+label, ""); a.status != 200 {
		t.Errorf("GET one lane: %d", a.status)
	}
}

func testNoSecrets(t *testing.T, r *relay, s *simtest.Sim) {
	// Answers worth searching besides those of the other subtests.
	for _, p := range []string{"/metrics", "/readyz", "/nope"} {
		call(t, "GET", r.admin+p, "")
	}
	for _, p := range []string{"/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=2", "/relay/v1/lanes", "/relay/v1/deadletters"} {
		r.own("GET", p, "")
	}
	call(t, "GET", r.admin+"/api/2/usermap?user_ids=x", "", "Authorization", bearer(adminToken), "X-Relay-Project", project2Name)
	// The project's api_key injected into a group identify and a mapping.
	if a := call(t, "POST", r.admin+"/groupidentify", form("identification", `{"group_type":"org","group_value":"injected","group_properties":{"a":1}}`),
		"Authorization", bearer(adminToken), "Content-Type", formType, "X-Relay-Project", projectName); a.status != 200 {
		t.Errorf("groupidentify with X-Relay-Project: %d %s", a.status, a.body)
	}
	if a := call(t, "POST", r.admin+"/usermap?"+form("mapping", `{"user_id":"inj-u","global_user_id":"inj-g"}`), "",
		"Authorization", bearer(adminToken), "X-Relay-Project", projectName); a.status != 200 {
		t.Errorf("usermap with X-Relay-Project: %d %s", a.status, a.body)
	}
	polltest.Until(t, "the injected mapping at the sim", func() bool {
		g, ok := simtest.MappedTo(s, projAPIKey, "inj-u")
		return ok && g == "inj-g"
	})
	call(t, "POST", r.admin+"/groupidentify", form("api_key", projAPIKey, "identification", "[{]"), "Authorization", bearer(adminToken), "Content-Type", formType)
	call(t, "POST", r.admin+"/usermap?"+form("api_key", projAPIKey, "mapping", `{"user_id":1}`), "", "Authorization", bearer(adminToken))
	call(t, "POST", r.admin+"/usermap?"+form("api_key", projAPIKey, "mapping", `{"user_id":1}`), "", "Authorization", bearer(wrongToken))
	// Malformed HTTP carrying the token and a key: fasthttp's error log must
	// not quote it.
	for _, raw := range []string{
		"GET /relay/v1/lanes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + adminToken + "\r\nBroken header " + projSecret + "\r\n\r\n",
		"POST /usermap?api_key=" + projAPIKey + " HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(r.admin, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(polltest.Max))
		c.Write([]byte(raw))
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		answers.add(answer{body: []byte(line)})
	}
	// A client connected and silent must not hold the stop.
	silent, err := net.Dial("tcp", strings.TrimPrefix(r.admin, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// Stop the relay cleanly so every log line is written.
	r.stopClean()

	logText := r.log.String()
	if !strings.Contains(logText, "credentials loaded") || !strings.Contains(logText, "dead letters replayed") {
		t.Fatalf("the log lacks expected lines; is it captured?\n%.2000s", logText)
	}
	for _, sec := range secrets {
		if strings.Contains(logText, sec) {
			i := strings.Index(logText, sec)
			t.Errorf("secret %.8s... in the log: %q", sec, logText[max(0, i-200):min(len(logText), i+50)])
		}
		for _, a := range answers.all() {
			if strings.Contains(string(a.body), sec) {
				t.Errorf("secret %.8s... in an answer (%d): %.300s", sec, a.status, a.body)
			}
			for k, vs := range a.header {
				for _, v := range vs {
					if strings.Contains(v, sec) {
						t.Errorf("secret %.8s... in answer header %s", sec, k)
					}
				}
			}
		}
	}
	if n := len(answers.all()); n < 100 {
		t.Fatalf("only %d answers searched", n)
	}
}

// labelOf returns the label a spool gives the lane of key (a hash of the
// key: the same in every spool).
func labelOf(t *testing.T, key storage.LaneKey) string {
	t.Helper()
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	l, err := sp.Lane(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return l.Key().Label()
}
