package sim

import (
	"encoding/json"
	"net/http"
)

func (s *Sim) registerHTTPAPI() {
	h := routeHandler{serve: s.serveHTTPAPI, describe: s.describeHTTPAPI}
	if s.cfg.CountOnly != nil {
		h = routeHandler{serve: s.serveCountOnly}
	}
	s.route("/2/httpapi", h)
	s.route("/batch", h)
}

// refuseIngest answers what every ingest endpoint refuses before reading
// the body (not a POST, too large, a body that does not decode); status 0
// when it refuses nothing.
func refuseIngest(r *http.Request, in *incoming) (int, any) {
	switch {
	case r.Method != http.MethodPost:
		return codeError(http.StatusBadRequest, ErrTextInvalidPath)
	case in.TooLarge:
		return codeError(http.StatusRequestEntityTooLarge, ErrTextTooLarge)
	case in.BadEncoding:
		return codeError(http.StatusBadRequest, ErrTextInvalidJSON)
	}
	return 0, nil
}

func (s *Sim) serveHTTPAPI(w http.ResponseWriter, r *http.Request, in *incoming) (int, any) {
	if status, body := refuseIngest(r, in); status != 0 {
		return status, body
	}
	env, verr := validate(in.Body, s.validKey, s.cfg.MaxEvents)
	if verr != nil {
		s.describeHTTPAPI(in)
		return verr.Code, verr
	}
	fillRecord(in.Rec, env)
	if in.IngestHalf {
		env = &envelope{apiKey: env.apiKey, minIDLen: env.minIDLen, raw: env.raw[:len(env.raw)/2], info: env.info[:len(env.info)/2]}
	}
	return s.accept(env, len(in.Body), in.Rec)
}

// describeHTTPAPI fills the record of a request that is not processed (a
// fault answered it, or it is invalid) as far as the body can be read.
func (s *Sim) describeHTTPAPI(in *incoming) {
	var top struct {
		APIKey  any               `json:"api_key"`
		Events  []json.RawMessage `json:"events"`
		Options struct {
			MinIDLength *int `json:"min_id_length"`
		} `json:"options"`
	}
	if json.Unmarshal(in.Body, &top) != nil {
		return
	}
	env := &envelope{raw: top.Events, minIDLen: 5, info: make([]evInfo, len(top.Events))}
	env.apiKey, _ = top.APIKey.(string)
	if top.Options.MinIDLength != nil {
		env.minIDLen = *top.Options.MinIDLength
	}
	id := func(v any) string { // "" when not a string or too short
		if s, _ := v.(string); len([]rune(s)) >= env.minIDLen {
			return s
		}
		return ""
	}
	for i, raw := range top.Events {
		var ev struct {
			DeviceID any `json:"device_id"`
			UserID   any `json:"user_id"`
		}
		if json.Unmarshal(raw, &ev) == nil {
			env.info[i].deviceID, env.info[i].userID = id(ev.DeviceID), id(ev.UserID)
		}
	}
	fillRecord(in.Rec, env)
}

func fillRecord(rec *Record, env *envelope) {
	if env.apiKey != "" {
		rec.KeyLabel = KeyLabel(env.apiKey)
	}
	rec.Events = len(env.raw)
	seen := make(map[string]bool)
	for _, ev := range env.info {
		if ev.deviceID != "" && !seen["d"+ev.deviceID] {
			seen["d"+ev.deviceID] = true
			rec.Devices = append(rec.Devices, ev.deviceID)
		}
		if ev.userID != "" && !seen["u"+ev.userID] {
			seen["u"+ev.userID] = true
			rec.Users = append(rec.Users, ev.userID)
		}
	}
}

// codeError is the ingestion APIs' {"code": status, "error": text} answer.
func codeError(status int, text string) (int, any) { return status, errBody{Code: status, Error: text} }

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeAnswer(w, status, v, "application/json")
}

// serveCountOnly is /2/httpapi in CountOnly mode: count, answer 200.
func (s *Sim) serveCountOnly(w http.ResponseWriter, r *http.Request, in *incoming) (int, any) {
	if in.TooLarge {
		return codeError(http.StatusRequestEntityTooLarge, ErrTextTooLarge)
	}
	n := s.cfg.CountOnly(in.Body)
	in.Rec.Events = n
	s.counted.Add(int64(n))
	return http.StatusOK, successBody{Code: 200, EventsIngested: n, PayloadSizeBytes: len(in.Body),
		ServerUploadTime: s.cfg.Now().UnixMilli()}
}
