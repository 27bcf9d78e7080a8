package delivery

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/upstream"
)

// Outcome is what an upstream answer means for the records of the request
// it answered.
type Outcome uint8

const (
	// Delivered: the upstream took every record (200); they are done.
	Delivered Outcome = iota
	// DeadSome: the records Verdict.Dead names (by index in the request)
	// are dead letters; the others are sent again at once.
	DeadSome
	// Split: the request was refused as a whole (a 400 naming no record, a
	// 413): a lone record is a dead letter with Verdict.Reason; more are
	// sent again in halves (order kept), so the bad one ends up alone.
	Split
	// Throttled: a 429, or a 400 naming silenced devices or events. A kind
	// with per-key pauses (events) acts on the names in the answer; the
	// others wait as for Wait.
	Throttled
	// Wait: nothing was taken and nothing is wrong with the records (5xx,
	// time-out, broken connection): send them again after the retry wait.
	Wait
	// Stop: the upstream refuses the lane itself (its api_key, or the URL
	// or credentials): the lane stops with Verdict.Reason until resumed; its
	// records stay in the spool.
	Stop
)

// Reasons of dead letters and lane stops that Classify gives.
const (
	ReasonBadRequest    = "bad_request"
	ReasonTooLarge      = "too_large"
	ReasonInvalidAPIKey = "invalid API key"
)

// Verdict is a classified answer.
type Verdict struct {
	Outcome Outcome
	// Reason is the dead-letter reason of a lone record (Split) or why the
	// lane stops (Stop).
	Reason string
	// Dead maps the index of a record of the request to its dead-letter
	// reason (DeadSome).
	Dead map[int]string
}

// Classify is the answer rule every kind shares, for a request of n
// records (the contract's Delivery section): 200 delivers; a 400 naming
// invalid records by index dead-letters them; any other 400 or a 413
// splits; 429 and silenced answers are Throttled; an invalid API key or an
// answer saying the URL or credentials are wrong stops the lane; the rest
// waits. It allocates only for DeadSome and a fatal answer's reason.
func Classify(res *upstream.Result, n int) Verdict {
	switch res.Kind {
	case upstream.OK:
		return Verdict{Outcome: Delivered}
	case upstream.Throttled, upstream.Silenced:
		return Verdict{Outcome: Throttled}
	case upstream.Invalid:
		var dead map[int]string
		for i, r := range res.InvalidEvents {
			if i >= 0 && i < n {
				if dead == nil {
					dead = make(map[int]string, len(res.InvalidEvents))
				}
				dead[i] = r
			}
		}
		if dead != nil {
			return Verdict{Outcome: DeadSome, Dead: dead}
		}
		return Verdict{Outcome: Split, Reason: ReasonBadRequest}
	case upstream.BadRequest:
		return Verdict{Outcome: Split, Reason: ReasonBadRequest}
	case upstream.TooLarge:
		return Verdict{Outcome: Split, Reason: ReasonTooLarge}
	case upstream.InvalidAPIKey:
		return Verdict{Outcome: Stop, Reason: ReasonInvalidAPIKey}
	case upstream.Fatal:
		return Verdict{Outcome: Stop, Reason: "upstream answered " + string(res.Answer)}
	default: // Retryable
		return Verdict{Outcome: Wait}
	}
}

// Kind is what a lane kind plugs into a lane runner (FormLanes): how records
// are packed into a request, and what an answer means for them. The runner
// owns the rest: reading, lingering, pacing, retries, max age, dead
// letters, stop/resume and acknowledgements.
type Kind interface {
	// Pack returns how many of recs, from the first and at least one, go
	// into the next request of the lane with key.
	Pack(key spool.LaneKey, recs []spool.Record) int
	// Body appends to dst the body of the request carrying recs (as Pack
	// counted them) and returns it.
	Body(dst []byte, key spool.LaneKey, recs []spool.Record) []byte
	// ContentType is the Content-Type of the bodies.
	ContentType() string
	// Classify says what res, the answer to a request of n records, means
	// for them.
	Classify(res *upstream.Result, n int) Verdict
}

// Form is the Kind of an upstream form endpoint that takes
// "api_key=K&<Field>=[record,record,...]": group identify and user
// mappings, which differ only in the field, the limits and a record's
// weight.
type Form struct {
	// Field is the form field holding the JSON array of records. Required.
	Field string
	// MaxItems bounds the records of one request. Required (> 0).
	MaxItems int
	// MaxBodyBytes: a form body is strictly shorter. Required (> 0).
	MaxBodyBytes int
	// MaxWeight bounds the summed Weight of one request; zero means no bound.
	MaxWeight int
	// Weight is a record's weight (e.g. its group properties); nil means 0.
	Weight func(data []byte) int
}

var _ Kind = (*Form)(nil)

// Validate reports a configuration error.
func (f *Form) Validate() error {
	switch {
	case f.Field == "":
		return errors.New("delivery: Form.Field required")
	case f.MaxItems <= 0:
		return fmt.Errorf("delivery: Form.MaxItems %d <= 0", f.MaxItems)
	case f.MaxBodyBytes <= 0:
		return fmt.Errorf("delivery: Form.MaxBodyBytes %d <= 0", f.MaxBodyBytes)
	case f.MaxWeight < 0:
		return errors.New("delivery: negative Form.MaxWeight")
	}
	return nil
}

// Pack fills a request up to each limit (at least one record).
func (f *Form) Pack(key spool.LaneKey, recs []spool.Record) int {
	size := BodyOverhead(key.APIKey, f.Field) // with %5B ... %5D
	weight := 0
	i := 0
	for ; i < len(recs) && i < f.MaxItems; i++ {
		add := escLen(recs[i].Data)
		if i > 0 {
			add += 3 // %2C
		}
		w := 0
		if f.Weight != nil {
			w = f.Weight(recs[i].Data)
		}
		if i > 0 && (size+add >= f.MaxBodyBytes || (f.MaxWeight > 0 && weight+w > f.MaxWeight)) {
			break
		}
		size += add
		weight += w
	}
	return i
}

// Body appends "api_key=K&<Field>=[recs...]", form-encoded.
func (f *Form) Body(dst []byte, key spool.LaneKey, recs []spool.Record) []byte {
	dst = append(dst, "api_key="...)
	dst = appendEscaped(dst, []byte(key.APIKey))
	dst = append(dst, '&')
	dst = appendEscaped(dst, []byte(f.Field))
	dst = append(dst, "=%5B"...)
	for i := range recs {
		if i > 0 {
			dst = append(dst, "%2C"...)
		}
		dst = appendEscaped(dst, recs[i].Data)
	}
	return append(dst, "%5D"...)
}

// ContentType is application/x-www-form-urlencoded.
func (f *Form) ContentType() string { return "application/x-www-form-urlencoded" }

// Classify is the shared Classify, except that a form endpoint's silenced
// answer is a 400 like any other (Split) and a 429 waits (no per-key
// pauses here).
func (f *Form) Classify(res *upstream.Result, n int) Verdict {
	v := Classify(res, n)
	if v.Outcome == Throttled && res.Kind == upstream.Silenced {
		return Verdict{Outcome: Split, Reason: ReasonBadRequest}
	}
	return v
}

// shouldEscape reports whether c is escaped by url.QueryEscape.
func shouldEscape(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return false
	case c == '-' || c == '_' || c == '.' || c == '~':
		return false
	}
	return true
}

// EscapedLen is the length of url.QueryEscape(string(b)).
func EscapedLen(b []byte) int { return escLen(b) }

func escLen(b []byte) int {
	n := 0
	for _, c := range b {
		if shouldEscape(c) && c != ' ' {
			n += 3
		} else {
			n++
		}
	}
	return n
}

func appendEscaped(dst, b []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range b {
		switch {
		case c == ' ':
			dst = append(dst, '+')
		case shouldEscape(c):
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// BodyOverhead is the size of a form body holding one record besides the
// record's escaped bytes: "api_key=<escaped key>&<field>=%5B...%5D".
func BodyOverhead(apiKey, field string) int {
	return len("api_key=") + len(url.QueryEscape(apiKey)) + 1 + len(url.QueryEscape(field)) + 1 + 6
}
