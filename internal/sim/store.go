package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"
)

// Record is one request in the request log.
type Record struct {
	// Seq numbers requests in arrival order, from 1.
	Seq int64 `json:"seq"`
	// Time is when the request arrived (Config.Now).
	Time   time.Time `json:"time"`
	Method string    `json:"method"`
	Path   string    `json:"path"`
	// Status is the status answered; 0 when the connection was dropped
	// without a complete answer.
	Status int `json:"status"`
	// Answered is the status the handler produced for a request whose
	// answer a drop fault lost (simtest.DropAfterIngest, DropMidResponse).
	Answered int `json:"answered,omitempty"`
	// Fault names the fault applied: "", "status", "drop-<mode>", "down-<mode>".
	Fault string `json:"fault,omitempty"`
	// KeyLabel is KeyLabel(api_key) ("" when none could be read).
	KeyLabel string `json:"key_label,omitempty"`
	// Events is the number of events in the request (0 when unreadable).
	Events int `json:"events"`
	// Devices and Users are the distinct device_id / user_id values of the
	// request's events (ids below min_id_length removed), in first-seen order.
	Devices []string `json:"devices,omitempty"`
	Users   []string `json:"users,omitempty"`
	// Ingested and Duplicates count the events stored / recognised as
	// duplicates by this request.
	Ingested   int `json:"ingested"`
	Duplicates int `json:"duplicates"`
	// BodyBytes is the decoded body size; Gzip says it came gzip-encoded.
	BodyBytes int  `json:"body_bytes"`
	Gzip      bool `json:"gzip,omitempty"`
	// Throttled lists, for a 429 or a silenced 400, the devices ("d:"+id)
	// and users ("u:"+id) it named as throttled, each with its share: the
	// number of the request's events that were its own.
	Throttled []keyShare `json:"throttled,omitempty"`
}

// keyShare is a key named in a 429 and its events in the request.
type keyShare struct {
	Key   string `json:"key"`
	Share int    `json:"share"`
}

// KeyLabel is a short, non-secret label of an api_key (a hash prefix), as
// used in Record.KeyLabel.
func KeyLabel(apiKey string) string {
	h := sha256.Sum256([]byte(apiKey))
	return "k:" + hex.EncodeToString(h[:4])
}

// Ingested is one stored event.
type Ingested struct {
	// Seq numbers stored events in arrival order, from 1 (across keys).
	Seq int64 `json:"seq"`
	// Request is the Seq of the request that brought it.
	Request int64 `json:"request"`
	// EventType, DeviceID, UserID and InsertID are read from Raw (ids below
	// min_id_length are "").
	EventType string    `json:"event_type"`
	DeviceID  string    `json:"device_id,omitempty"`
	UserID    string    `json:"user_id,omitempty"`
	InsertID  string    `json:"insert_id,omitempty"`
	Time      time.Time `json:"time"`
	// APIKey is the envelope's api_key (not in the JSON form).
	APIKey string `json:"-"`
	// Raw is the event object exactly as received (byte-exact, also in
	// /sim/events). It must stay the last field (see control.go).
	Raw json.RawMessage `json:"raw"`
}

// Stats are the Sim's counters; they survive the memory bounds.
type Stats struct {
	Requests   int64         `json:"requests"`
	ByStatus   map[int]int64 `json:"by_status"`
	Ingested   int64         `json:"ingested"`
	Duplicates int64         `json:"duplicates"`
	// IngestedByKey counts ingested events per KeyLabel.
	IngestedByKey map[string]int64 `json:"ingested_by_key"`
	// Counted is the number of events CountOnly mode counted.
	Counted int64 `json:"counted"`
	// EventsDropped counts stored events forgotten because of Config.Keep.
	EventsDropped int64 `json:"events_dropped"`
	// DedupEvicted counts insert_ids forgotten early because of DedupMaxKeys.
	DedupEvicted int64 `json:"dedup_evicted"`
	// Connections counts connections accepted by Serve listeners (keep-alive
	// reuse shows as few connections for many requests).
	Connections int64 `json:"connections"`
	// Throttled and Silenced count 429 and silenced-400 answers.
	Throttled int64 `json:"throttled"`
	Silenced  int64 `json:"silenced"`
	// GroupIdentifies counts /groupidentify requests that stored their
	// identifications.
	GroupIdentifies int64 `json:"group_identifies"`
}

type dedupEntry struct {
	h uint64
	t int64
}

type rateStamp struct {
	t int64
	n int
}

type rateKey struct {
	stamps       []rateStamp
	sum          int
	penaltyUntil int64
}

func newRateKey() *rateKey { return &rateKey{} }

type quotaKey struct {
	day   int64
	n     int
	until int64 // QuotaRolling: refused until then (0: not refused yet)
}

// store is the Sim's state; guarded by Sim.mu.
type store struct {
	cfg  *Config
	seed maphash.Seed

	reqSeq, evSeq int64
	events        []Ingested // oldest first, as is dedupFIFO
	requests      []Record   // in the order logged
	stats         Stats

	dedup     map[uint64]int64
	dedupFIFO []dedupEntry

	rates    map[string]*rateKey
	sweepCtr int
	quotas   map[string]*quotaKey
	knobs    *Knobs
}

// pushKeep appends v to *q and drops the oldest entry when that makes more
// than keep; it reports whether it dropped one. The dropped front is
// reclaimed when append moves the slice to a larger array.
func pushKeep[T any](q *[]T, v T, keep int) bool {
	*q = append(*q, v)
	if len(*q) <= keep {
		return false
	}
	var zero T
	(*q)[0] = zero
	*q = (*q)[1:]
	return true
}

func (st *store) init(cfg *Config, seed maphash.Seed, knobs *Knobs) {
	*st = store{cfg: cfg, seed: seed, knobs: knobs, dedup: map[uint64]int64{}, rates: map[string]*rateKey{},
		quotas: map[string]*quotaKey{}, stats: Stats{ByStatus: map[int]int64{}, IngestedByKey: map[string]int64{}}}
}

// Log appends the Exchange's Rec to the request log.
func (x *Exchange) Log() {
	s, rec := x.s, x.Rec
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.store
	if ce := s.log.Check(zap.DebugLevel, "sim request"); ce != nil {
		ce.Write(zap.Int64("seq", rec.Seq), zap.String("path", rec.Path), zap.Int("status", rec.Status),
			zap.String("fault", rec.Fault), zap.String("key", rec.KeyLabel), zap.Int("events", rec.Events),
			zap.Int("ingested", rec.Ingested), zap.Int("duplicates", rec.Duplicates))
	}
	st.stats.Requests++
	st.stats.ByStatus[rec.Status]++
	if s.cfg.KeepRequests < 0 {
		return
	}
	pushKeep(&st.requests, *rec, s.cfg.KeepRequests)
}

func (st *store) rateKeyOf(apiKey, kind, id string) string {
	if st.cfg.RateAcrossKeys {
		apiKey = ""
	}
	return apiKey + "\x00" + kind + id
}

func (st *store) rateOf(k string, now int64) (*rateKey, float64) {
	rk := st.rates[k]
	if rk == nil {
		return nil, 0
	}
	// The dropped front is reclaimed when append moves the stamps.
	for ; len(rk.stamps) > 0 && rk.stamps[0].t <= now-int64(st.cfg.RateWindow); rk.stamps = rk.stamps[1:] {
		rk.sum -= rk.stamps[0].n
	}
	return rk, float64(rk.sum) / st.cfg.RateWindow.Seconds()
}

// sweep drops idle rate keys, now and then.
func (st *store) sweep(now int64) {
	st.sweepCtr++
	if st.sweepCtr < 1024 {
		return
	}
	st.sweepCtr = 0
	for k := range st.rates {
		rk, _ := st.rateOf(k, now)
		if rk.sum == 0 && rk.penaltyUntil <= now {
			delete(st.rates, k)
		}
	}
	today := utcDay(time.Unix(0, now))
	for k, q := range st.quotas {
		if (st.cfg.QuotaRolling && q.until != 0 && q.until <= now) || (!st.cfg.QuotaRolling && q.day != today) {
			delete(st.quotas, k)
		}
	}
}

func utcDay(t time.Time) int64 { return t.UTC().Unix() / 86400 }

type throttleBody struct {
	Code             int            `json:"code"`
	Error            string         `json:"error"`
	EPSThreshold     int            `json:"eps_threshold"`
	ThrottledDevices map[string]int `json:"throttled_devices"`
	ThrottledUsers   map[string]int `json:"throttled_users"`
	ThrottledEvents  []int          `json:"throttled_events"`
}

type silenceBody struct {
	Code                      int            `json:"code"`
	Error                     string         `json:"error"`
	EPSThreshold              int            `json:"eps_threshold"`
	ExceededDailyQuotaDevices map[string]int `json:"exceeded_daily_quota_devices"`
	SilencedDevices           []string       `json:"silenced_devices"`
	SilencedEvents            []int          `json:"silenced_events"`
	ThrottledDevices          map[string]int `json:"throttled_devices"`
	ThrottledEvents           []int          `json:"throttled_events"`
}

type successBody struct {
	Code             int   `json:"code"`
	EventsIngested   int   `json:"events_ingested"`
	PayloadSizeBytes int   `json:"payload_size_bytes"`
	ServerUploadTime int64 `json:"server_upload_time"`
}

// accept applies silencing, quotas, rate limits and dedup to a valid
// request and stores it when accepted. It returns the status and answer.
func (s *Sim) accept(env *envelope, bodyLen int, rec *Record) (int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.store
	nowT := s.cfg.Now()
	now := nowT.UnixNano()
	day := utcDay(nowT)
	st.sweep(now)

	// Silenced devices and daily quotas.
	var silDevs []string
	var silEvents, quotaEvents []int
	quota := map[string]int{}
	for i, ev := range env.info {
		if ev.deviceID == "" {
			continue
		}
		if st.knobs.Silenced[ev.deviceID] {
			if !slices.Contains(silDevs, ev.deviceID) {
				silDevs = append(silDevs, ev.deviceID)
			}
			silEvents = append(silEvents, i)
		}
		if st.knobs.DailyQuota > 0 {
			if q := st.overQuotaLocked(env.apiKey+"\x00"+ev.deviceID, day, now); q != nil {
				quota[ev.deviceID] = q.n
				quotaEvents = append(quotaEvents, i)
			}
		}
	}

	// Rate limits: on ingested events, and (the strict reading, unless
	// LenientRate) the request's own events of the key.
	own := keyCounts(env.info)
	thrDevs, thrUsers := map[string]int{}, map[string]int{}
	var thrEvents []int
	checked := map[string]bool{} // kind+id -> throttled
	check := func(kind, id string, out map[string]int) bool {
		if id == "" {
			return false
		}
		if thr, done := checked[kind+id]; done {
			return thr
		}
		rk, rate := st.rateOf(st.rateKeyOf(env.apiKey, kind, id), now)
		if !s.cfg.LenientRate {
			rate += float64(own[kind+id]) / st.cfg.RateWindow.Seconds()
		}
		thr := rate > float64(s.cfg.EPSThreshold) || (rk != nil && rk.penaltyUntil > now)
		if thr {
			out[id] = int(math.Ceil(rate))
		}
		checked[kind+id] = thr
		return thr
	}
	for i, ev := range env.info {
		d := check("d", ev.deviceID, thrDevs)
		u := check("u", ev.userID, thrUsers)
		if d || u {
			thrEvents = append(thrEvents, i)
		}
	}
	for kind, m := range map[string]map[string]int{"d": thrDevs, "u": thrUsers} { // empty unless some are throttled
		for id := range m {
			rk := entry(st.rates, st.rateKeyOf(env.apiKey, kind, id), newRateKey)
			if s.cfg.ThrottlePenalty >= 0 && rk.penaltyUntil <= now {
				rk.penaltyUntil = now + int64(s.cfg.ThrottlePenalty)
			}
			rec.Throttled = append(rec.Throttled, keyShare{Key: kind + ":" + id, Share: own[kind+id]})
		}
	}
	sort.Slice(rec.Throttled, func(i, j int) bool { return rec.Throttled[i].Key < rec.Throttled[j].Key })

	if len(silDevs) > 0 || len(quota) > 0 {
		if s.cfg.PartialSilence {
			s.storeLocked(env.without(silEvents, thrEvents, quotaEvents), rec, nowT)
		}
		st.stats.Silenced++
		return 400, silenceBody{Code: 400, Error: ErrTextSilenced, EPSThreshold: s.cfg.EPSThreshold,
			ExceededDailyQuotaDevices: quota, SilencedDevices: nonNil(silDevs), SilencedEvents: nonNil(silEvents),
			ThrottledDevices: thrDevs, ThrottledEvents: nonNil(thrEvents)}
	}
	if len(thrEvents) > 0 {
		if s.cfg.PartialThrottle {
			s.storeLocked(env.without(thrEvents), rec, nowT)
		}
		st.stats.Throttled++
		return 429, throttleBody{Code: 429, Error: ErrTextTooManyRequest, EPSThreshold: s.cfg.EPSThreshold,
			ThrottledDevices: thrDevs, ThrottledUsers: thrUsers, ThrottledEvents: thrEvents}
	}

	s.storeLocked(env, rec, nowT)
	return 200, successBody{Code: 200, EventsIngested: len(env.raw), PayloadSizeBytes: bodyLen,
		ServerUploadTime: nowT.UnixMilli()}
}

// nonNil returns s, or an empty slice for nil (an answer's [] that is never null).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// without returns env without the events whose index is in one of skip.
func (env *envelope) without(skip ...[]int) *envelope {
	drop := make([]bool, len(env.raw))
	for _, is := range skip {
		for _, i := range is {
			drop[i] = true
		}
	}
	out := &envelope{apiKey: env.apiKey, minIDLen: env.minIDLen}
	for i := range env.raw {
		if !drop[i] {
			out.raw = append(out.raw, env.raw[i])
			out.info = append(out.info, env.info[i])
		}
	}
	return out
}

// overQuotaLocked returns the quota counter of a device over its daily
// quota, nil when it is not over.
func (st *store) overQuotaLocked(qk string, day, now int64) *quotaKey {
	q := st.quotas[qk]
	switch {
	case q == nil || q.n < st.knobs.DailyQuota || (!st.cfg.QuotaRolling && q.day != day):
		return nil
	case !st.cfg.QuotaRolling:
		return q
	case q.until == 0: // refused for 24 hours from now
		q.until = now + int64(24*time.Hour)
	}
	if q.until <= now {
		delete(st.quotas, qk)
		return nil
	}
	return q
}

// storeLocked dedups, stores and counts env's events (a request accepted,
// or the part of one a reading lets in) and adds them to the rates and
// quotas.
func (s *Sim) storeLocked(env *envelope, rec *Record, nowT time.Time) {
	st := &s.store
	now := nowT.UnixNano()
	day := utcDay(nowT)
	label := KeyLabel(env.apiKey)
	for i, ev := range env.info {
		if ev.insertID != "" && st.seenLocked(env.apiKey, ev, now) {
			rec.Duplicates++
			st.stats.Duplicates++
			continue
		}
		rec.Ingested++
		st.stats.Ingested++
		st.stats.IngestedByKey[label]++
		st.evSeq++
		if s.cfg.Keep < 0 {
			continue
		}
		// env.raw[i] is encoding/json's own copy, not the pooled body.
		if pushKeep(&st.events, Ingested{Seq: st.evSeq, Request: rec.Seq, Raw: env.raw[i], EventType: ev.eventType,
			DeviceID: ev.deviceID, UserID: ev.userID, InsertID: ev.insertID, Time: nowT, APIKey: env.apiKey}, s.cfg.Keep) {
			st.stats.EventsDropped++
		}
	}
	for k, n := range keyCounts(env.info) {
		rk := entry(st.rates, st.rateKeyOf(env.apiKey, k[:1], k[1:]), newRateKey)
		if l := len(rk.stamps); l > 0 && rk.stamps[l-1].t == now {
			rk.stamps[l-1].n += n
		} else {
			rk.stamps = append(rk.stamps, rateStamp{now, n})
		}
		rk.sum += n
		if k[0] == 'd' && st.knobs.DailyQuota > 0 {
			qk := env.apiKey + "\x00" + k[1:]
			q := st.quotas[qk]
			if q == nil || (!s.cfg.QuotaRolling && q.day != day) {
				q = &quotaKey{day: day}
				st.quotas[qk] = q
			}
			q.n += n
		}
	}
}

// keyCounts counts the events of each device ("d"+id) and user ("u"+id).
func keyCounts(info []evInfo) map[string]int {
	n := map[string]int{}
	for _, ev := range info {
		if ev.deviceID != "" {
			n["d"+ev.deviceID]++
		}
		if ev.userID != "" {
			n["u"+ev.userID]++
		}
	}
	return n
}

// seenLocked reports whether ev's insert_id was seen for its device within
// the dedup window, remembering it otherwise.
func (st *store) seenLocked(apiKey string, ev evInfo, now int64) bool {
	var h maphash.Hash
	h.SetSeed(st.seed)
	h.WriteString(apiKey)
	h.WriteByte(0)
	if ev.deviceID != "" {
		h.WriteString("d")
		h.WriteString(ev.deviceID)
	} else {
		h.WriteString("u") // the upstream's "hashed user_id" device
		h.WriteString(ev.userID)
	}
	h.WriteByte(0)
	h.WriteString(ev.insertID)
	k := h.Sum64()
	window := int64(st.cfg.DedupWindow)
	if t, ok := st.dedup[k]; ok && t > now-window {
		return true
	}
	// Forget expired entries, and the oldest while full.
	for ; len(st.dedupFIFO) > 0; st.dedupFIFO = st.dedupFIFO[1:] {
		e := st.dedupFIFO[0]
		expired := e.t <= now-window
		if !expired && len(st.dedup) < st.cfg.DedupMaxKeys {
			break
		}
		if st.dedup[e.h] == e.t {
			delete(st.dedup, e.h)
			if !expired {
				st.stats.DedupEvicted++
			}
		}
	}
	st.dedup[k] = now
	st.dedupFIFO = append(st.dedupFIFO, dedupEntry{k, now})
	return false
}

// Events returns the stored events of apiKey in arrival order (copies of
// the kept ones; see Config.Keep).
func (s *Sim) Events(apiKey string) []Ingested {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Ingested
	for _, e := range s.store.events {
		if e.APIKey == apiKey {
			out = append(out, e)
		}
	}
	return out
}

// AllEvents returns every stored event in arrival order.
func (s *Sim) AllEvents() []Ingested {
	return locked(&s.mu, func() []Ingested { return append([]Ingested(nil), s.store.events...) })
}

// Requests returns the request log in arrival order (see Config.KeepRequests).
func (s *Sim) Requests() []Record {
	out := locked(&s.mu, func() []Record { return slices.Clone(s.store.requests) })
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// Stats returns a copy of the counters.
func (s *Sim) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.store.stats
	st.Counted, st.Connections = s.counted.Load(), s.connections.Load()
	st.ByStatus, st.IngestedByKey = maps.Clone(st.ByStatus), maps.Clone(st.IngestedByKey)
	return st
}

// Reset forgets every stored event, counter, request, insert_id, rate and
// quota, and the group identify, user mapping and management APIs' data,
// logs, counters and rejections; the knobs otherwise stay (accepted keys,
// secrets, rate limits, silenced devices). simtest's Reset clears its
// faults too.
func (s *Sim) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store.init(&s.cfg, s.seed, &s.knobs)
	s.counted.Store(0)
	s.connections.Store(0)
	s.knobs.RejectedUserIDs, s.knobs.RejectedGroupValues = map[string]bool{}, map[string]bool{}
	for _, reset := range s.resets {
		reset()
	}
}
