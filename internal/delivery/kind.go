package delivery

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/svcrelay/relay/internal/storage"
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

// Kind is what a lane kind plugs into a lane runner: how its records are
// packed into a request (the lane's Frame) and what an answer means for
// them. The runner owns the rest: reading, batching, pacing, retries, max
// age, dead letters, stop/resume and acknowledgements. Form (group
// identify, user mappings) and internal/batcher's events kind implement it;
// internal/batcher's lane runner runs both.
type Kind interface {
	// Frame returns how the requests of the lane with key are packed; a
	// runner asks once per lane.
	Frame(key storage.LaneKey) Frame
	// Classify says what res, the answer to a request of n records, means
	// for them.
	Classify(res *upstream.Result, n int) Verdict
}

// Frame is how one lane's requests are packed: the bytes around and
// between the records, how a record is written, and the limits of one
// request. Runners pack with its methods, one record at a time (Open; per
// record Record, Fits, Add; Close), so a runner that takes records from
// its own queues (pauses, pacing) copies nothing; it is a plain value and
// its methods inline, so the events' loop calls no interface.
type Frame struct {
	// ContentType of the bodies; "" means application/json.
	ContentType string
	// Prefix and Suffix enclose the records; Sep goes between two.
	Prefix, Suffix, Sep string
	// Encode appends data as a request carries it to dst and returns it
	// with its weight; nil means as it is, weight 0.
	Encode func(dst, data []byte) ([]byte, int)
	// MaxRecords bounds the records of a request.
	MaxRecords int
	// MaxBytes: a body is strictly shorter (uncompressed).
	MaxBytes int
	// MaxWeight bounds the summed weight of a request; zero means no bound.
	MaxWeight int
	// Check, when not nil, is asked about each record when it is packed
	// (every time: a resend is checked again): it returns the record to
	// send (data itself, or a rewritten copy), or a non-empty dead-letter
	// reason and answer when the record must not be sent (the tracking
	// plan's quarantine; internal/plan).
	Check func(data []byte) (rec []byte, reason string, answer []byte)
}

// Packing is a request body being packed by a Frame.
type Packing struct {
	// Body is the Prefix and the records added so far.
	Body []byte
	// N is the number of records added.
	N      int
	weight int
}

// Open starts a body in dst's memory.
func (f *Frame) Open(dst []byte) Packing { return Packing{Body: append(dst[:0], f.Prefix...)} }

// Record returns data as a request carries it (Encode's, in dst's memory)
// and its weight: what Fits, Add and TooLarge take.
func (f *Frame) Record(dst, data []byte) ([]byte, int) {
	if f.Encode == nil {
		return data, 0
	}
	return f.Encode(dst, data)
}

// Fits reports whether the record rec of weight w may be added to p within
// the limits. The first record always fits (a request carries at least
// one; see TooLarge).
func (f *Frame) Fits(p *Packing, rec []byte, w int) bool {
	return p.N == 0 || p.N < f.MaxRecords && len(p.Body)+len(f.Sep)+len(rec)+len(f.Suffix) < f.MaxBytes &&
		(f.MaxWeight == 0 || p.weight+w <= f.MaxWeight)
}

// Add appends the record rec of weight w to p (after Sep unless it is the
// first).
func (f *Frame) Add(p *Packing, rec []byte, w int) {
	if p.N > 0 && len(f.Sep) == 1 {
		p.Body = append(p.Body, f.Sep[0]) // JSON's ',' without a copy call
	} else if p.N > 0 {
		p.Body = append(p.Body, f.Sep...)
	}
	p.Body = append(p.Body, rec...)
	p.weight += w
	p.N++
}

// Close appends the Suffix and returns the body.
func (f *Frame) Close(p *Packing) []byte { return append(p.Body, f.Suffix...) }

// TooLarge reports whether a body of the record rec alone would reach
// MaxBytes.
func (f *Frame) TooLarge(rec []byte) bool { return len(f.Prefix)+len(rec)+len(f.Suffix) >= f.MaxBytes }

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

// Frame: "api_key=K&<Field>=%5B" records escaped and separated by "%2C"
// "%5D", form-encoded; the limits and a record's weight are the Form's.
func (f *Form) Frame(key storage.LaneKey) Frame {
	return Frame{ContentType: "application/x-www-form-urlencoded",
		Prefix: "api_key=" + url.QueryEscape(key.APIKey) + "&" + url.QueryEscape(f.Field) + "=%5B", Suffix: "%5D", Sep: "%2C",
		Encode: func(dst, data []byte) ([]byte, int) {
			w := 0
			if f.Weight != nil {
				w = f.Weight(data)
			}
			return appendEscaped(dst[:0], data), w
		},
		MaxRecords: f.MaxItems, MaxBytes: f.MaxBodyBytes, MaxWeight: f.MaxWeight}
}

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
