package delivery

import (
	"net/url"

	"github.com/svcrelay/relay/internal/storage"
)

// Kind is what a lane kind plugs into the lane runner: how its records are
// packed into a request. The runner owns the rest. Form (group identify,
// user mappings) and the events kind implement it.
type Kind interface {
	// Frame returns how the requests of the lane with key are packed.
	Frame(key storage.LaneKey) Frame
}

// Frame is how one lane's requests are packed: the bytes around and between
// the records, how a record is written, and the limits of one request.
// Runners pack one record at a time (Open; per record Record, Fits, Add;
// Close); a plain value whose methods inline, so the events' loop calls no
// interface.
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
	// Check, when not nil, is asked about each record every time it is
	// packed, with its storage.Record.Verdict: it returns the record to
	// send (data itself, or a rewritten copy), or a non-empty dead-letter
	// reason and answer (the tracking plan, internal/plan).
	Check func(data []byte, verdict uint64) (rec []byte, reason string, answer []byte)
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
// mappings.
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

// Frame is the form-encoded "api_key=K&<Field>=%5B" records "%2C"... "%5D".
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

// appendEscaped appends b to dst as url.QueryEscape escapes it.
func appendEscaped(dst, b []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == '~':
			dst = append(dst, c)
		case c == ' ':
			dst = append(dst, '+')
		default:
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		}
	}
	return dst
}
