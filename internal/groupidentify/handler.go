package groupidentify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/groupidentify/lanedeliver"
	"github.com/svcrelay/relay/internal/spool"
)

// Operations are the group property operations of the API reference.
var operations = map[string]bool{"$set": true, "$setOnce": true, "$add": true, "$append": true, "$unset": true}

// Identification is one parsed, validated identification.
type Identification struct {
	GroupType, GroupValue string
	// Properties is the number of group properties (see Properties).
	Properties int
	// Data is the compacted JSON object as it is sent upstream.
	Data []byte
}

// ValidationError is a request the relay refuses locally.
type ValidationError struct {
	Status int // 400 or 413
	Msg    string
	Reason string // metric label
}

func (e *ValidationError) Error() string { return e.Msg }

func bad(reason, format string, args ...any) *ValidationError {
	return &ValidationError{Status: fasthttp.StatusBadRequest, Msg: fmt.Sprintf(format, args...), Reason: reason}
}

// Parse validates the identification parameter (a JSON array of objects, or
// one object) against the limits and returns the identifications. apiKey
// is only used to check that each identification fits an upstream request.
func Parse(apiKey string, identification []byte, maxIdentifies, maxProperties, maxBodyBytes int) ([]Identification, *ValidationError) {
	v := bytes.TrimSpace(identification)
	if len(v) == 0 {
		return nil, bad("missing_field", "identification: missing or empty")
	}
	var raws []json.RawMessage
	switch v[0] {
	case '[':
		if err := json.Unmarshal(v, &raws); err != nil {
			return nil, bad("invalid_json", "identification: invalid JSON array of objects: %s", jsonErr(err))
		}
	case '{':
		if !json.Valid(v) {
			return nil, bad("invalid_json", "identification: invalid JSON object")
		}
		raws = []json.RawMessage{v}
	default:
		return nil, bad("invalid_json", "identification: must be a JSON array of objects (or one object)")
	}
	if len(raws) == 0 {
		return nil, bad("missing_field", "identification: empty array")
	}
	if len(raws) > maxIdentifies {
		return nil, bad("too_many_identifies", "identification: %d group identifies; at most %d per request", len(raws), maxIdentifies)
	}
	overhead := lanedeliver.BodyOverhead(apiKey, "identification")
	out := make([]Identification, 0, len(raws))
	total := 0
	for i, raw := range raws {
		id, err := parseOne(raw)
		if err != nil {
			sep := "."
			if strings.HasPrefix(err.Msg, ":") {
				sep = ""
			}
			err.Msg = fmt.Sprintf("identification[%d]%s%s", i, sep, err.Msg)
			return nil, err
		}
		total += id.Properties
		if total > maxProperties {
			return nil, bad("too_many_properties", "identification: more than %d group properties in one request (at identification[%d])", maxProperties, i)
		}
		if overhead+lanedeliver.EscapedLen(id.Data) >= maxBodyBytes {
			return nil, &ValidationError{Status: fasthttp.StatusRequestEntityTooLarge, Reason: "too_large",
				Msg: fmt.Sprintf("identification[%d]: too large for one upstream request (1 MB)", i)}
		}
		out = append(out, id)
	}
	return out, nil
}

func parseOne(raw json.RawMessage) (Identification, *ValidationError) {
	var obj map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &obj) != nil {
		return Identification{}, bad("invalid_type", ": must be an object")
	}
	var id Identification
	for k, v := range obj {
		switch k {
		case "group_type", "group_value":
			var s string
			if isNull(v) {
				continue
			}
			if json.Unmarshal(v, &s) != nil {
				return id, bad("invalid_type", "%s: must be a string", k)
			}
			if k == "group_type" {
				id.GroupType = s
			} else {
				id.GroupValue = s
			}
		case "group_properties":
		default:
			return id, bad("unknown_field", "%s: unknown field (allowed: group_type, group_value, group_properties)", k)
		}
	}
	if id.GroupType == "" {
		return id, bad("missing_field", "group_type: missing or empty")
	}
	if id.GroupValue == "" {
		return id, bad("missing_field", "group_value: missing or empty")
	}
	gp, ok := obj["group_properties"]
	if !ok || isNull(gp) {
		return id, bad("missing_field", "group_properties: missing")
	}
	var props map[string]json.RawMessage
	if gp[0] != '{' || json.Unmarshal(gp, &props) != nil {
		return id, bad("invalid_type", "group_properties: must be an object")
	}
	for k, v := range props {
		if len(k) > 0 && k[0] == '$' {
			if !operations[k] {
				return id, bad("unknown_operation", "group_properties.%s: unknown operation (allowed: $set, $setOnce, $add, $append, $unset)", k)
			}
			var op map[string]json.RawMessage
			if len(v) == 0 || v[0] != '{' || json.Unmarshal(v, &op) != nil {
				return id, bad("invalid_type", "group_properties.%s: must be an object", k)
			}
			id.Properties += len(op)
		} else {
			id.Properties++
		}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return id, bad("invalid_json", ": invalid JSON")
	}
	id.Data = buf.Bytes()
	return id, nil
}

// Properties counts the group properties of one identification's JSON: the
// keys of each $operation object plus each plain key of group_properties.
// Unreadable input counts 0.
func Properties(data []byte) int {
	var obj struct {
		GroupProperties map[string]json.RawMessage `json:"group_properties"`
	}
	if json.Unmarshal(data, &obj) != nil {
		return 0
	}
	n := 0
	for k, v := range obj.GroupProperties {
		if len(k) > 0 && k[0] == '$' {
			var op map[string]json.RawMessage
			if json.Unmarshal(v, &op) == nil {
				n += len(op)
				continue
			}
		}
		n++
	}
	return n
}

func isNull(v json.RawMessage) bool { return string(v) == "null" }

func jsonErr(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("an element is %s, not an object", te.Value)
	}
	return "malformed"
}

func (g *GroupIdentify) serve(ctx *fasthttp.RequestCtx) {
	if n := len(ctx.PostBody()); n >= g.cfg.MaxBodyBytes {
		g.reject(ctx, &ValidationError{Status: fasthttp.StatusRequestEntityTooLarge, Reason: "too_large",
			Msg: fmt.Sprintf("Payload too large: body of %d bytes; the limit is under %d bytes (1 MB)", n, g.cfg.MaxBodyBytes)})
		return
	}
	apiKey := formValue(ctx, "api_key")
	if name := ctx.Request.Header.Peek("X-Relay-Project"); len(name) > 0 {
		key, verr := projectKey(g.creds, name, apiKey)
		if verr != nil {
			g.reject(ctx, verr)
			return
		}
		apiKey = key
	}
	if len(apiKey) == 0 {
		g.reject(ctx, bad("missing_field", "api_key: missing or empty"))
		return
	}
	ids, verr := Parse(string(apiKey), formValue(ctx, "identification"), g.cfg.MaxIdentifies, g.cfg.MaxProperties, g.cfg.MaxBodyBytes)
	if verr != nil {
		g.reject(ctx, verr)
		return
	}
	var b spool.Batch
	for _, id := range ids {
		key := make([]byte, 0, len(id.GroupType)+1+len(id.GroupValue))
		key = append(append(append(key, id.GroupType...), 0), id.GroupValue...)
		b.Add(spool.Record{OrderKey: key, Data: id.Data})
	}
	rctx := context.Background()
	lane, err := g.sp.Lane(rctx, spool.LaneKey{Kind: spool.KindGroupIdentify, APIKey: string(apiKey)})
	if err == nil {
		err = g.sp.Append(rctx, lane, &b)
	}
	if err != nil {
		g.spoolFailed(ctx, err)
		return
	}
	g.accepted.Add(float64(len(ids)))
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	fmt.Fprintf(ctx, `{"code":200,"identifications_accepted":%d}`, len(ids))
}

// projectKey returns the api_key of the project X-Relay-Project names; the
// request must not carry an api_key of its own.
func projectKey(creds *credentials.Store, name, apiKey []byte) ([]byte, *ValidationError) {
	if len(apiKey) > 0 {
		return nil, bad("conflict", "api_key and X-Relay-Project: give one, not both")
	}
	p, ok := creds.Project(string(name))
	if !ok {
		return nil, bad("unknown_project", "X-Relay-Project: no project of that name in the credentials file")
	}
	return []byte(p.APIKey.Reveal()), nil
}

// formValue reads a form field of the body, else of the query.
func formValue(ctx *fasthttp.RequestCtx, name string) []byte {
	if v := ctx.PostArgs().Peek(name); v != nil {
		return v
	}
	return ctx.QueryArgs().Peek(name)
}

func (g *GroupIdentify) spoolFailed(ctx *fasthttp.RequestCtx, err error) {
	msg, reason := "Service unavailable", "spool_error"
	switch {
	case errors.Is(err, spool.ErrFull):
		msg, reason = "Spool full, retry later", "spool_full"
	case errors.Is(err, spool.ErrDiskLow):
		msg, reason = "Disk space low, retry later", "disk_low"
	case errors.Is(err, spool.ErrClosed):
		msg, reason = "Service is shutting down", "shutting_down"
	default:
		g.log.Error("groupidentify: spool append failed", zap.Error(err))
	}
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, g.retryAfter)
	g.reject(ctx, &ValidationError{Status: fasthttp.StatusServiceUnavailable, Msg: msg, Reason: reason})
}

func (g *GroupIdentify) reject(ctx *fasthttp.RequestCtx, e *ValidationError) {
	g.rejected.WithLabelValues(e.Reason).Inc()
	writeError(ctx, e.Status, e.Msg)
}

// writeError answers {"code":status,"error":msg}.
func writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	b, _ := json.Marshal(struct {
		Code  int    `json:"code"`
		Error string `json:"error"`
	}{status, msg})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
